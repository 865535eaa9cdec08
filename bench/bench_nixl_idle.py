"""What an idle NIXL agent costs in CPU, with NIXL's own progress-thread setting
(poll timeout 0) and with ampd's vLLM plugin (tools/vllm_plugin) setting it to
1,000 us: the figures docs/SERVING.md, "Busy polling on a host with few cores", quotes.

Each case runs in .venv-vllm: vLLM's plugins load, one agent is built as vLLM's
NixlConnector builds it (UCX, ``num_threads`` 4, telemetry), 4 MiB of DRAM is
registered, and the process's CPU time over ``IDLE_S`` wall seconds of sleep is
read. The cases alternate, ``REPEATS`` times each.

Run: ``python bench/bench_nixl_idle.py`` -> ``bench/results/nixl_idle.json`` (~1 min).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
IDLE_S = 5.0
REPEATS = 3
DELAY_US = 1000
SCRIPT = f"""
import time
from vllm.plugins import load_general_plugins
load_general_plugins()
import torch
from nixl._api import nixl_agent, nixl_agent_config
agent = nixl_agent("idle", nixl_agent_config(num_threads=4, capture_telemetry=True))
buffer = torch.zeros(4 << 20, dtype=torch.uint8)
agent.register_memory(agent.get_reg_descs([(buffer.data_ptr(), buffer.numel(), 0, "")], "DRAM"))
cpu_s, wall_s = time.process_time(), time.time()
time.sleep({IDLE_S})
print((time.process_time() - cpu_s) / (time.time() - wall_s))
"""


def _cores(delay_us: int | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != "AMPD_NIXL_PROGRESS_DELAY_US"}
    if delay_us is not None:
        env["AMPD_NIXL_PROGRESS_DELAY_US"] = str(delay_us)
    done = subprocess.run([str(VLLM_PYTHON), "-c", SCRIPT], capture_output=True, text=True, check=True, env=env,
                          timeout=300)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    samples: dict[str, list[float]] = {"nixl_default": [], "ampd_plugin": []}
    for _ in range(REPEATS):
        samples["nixl_default"].append(_cores(None))
        samples["ampd_plugin"].append(_cores(DELAY_US))
    figures = {name: {"idle_cores_median": round(statistics.median(v), 3), "samples": [round(x, 3) for x in v]}
               for name, v in samples.items()}
    print(figures)
    write_result("nixl_idle", {"idle_s": IDLE_S, "progress_delay_us": DELAY_US, "nixl": "1.5.1 (UCX backend)",
                               **figures})


if __name__ == "__main__":
    main()
