"""ampd's vLLM plugin (tools/vllm_plugin) in the real vLLM environment: vLLM loads
it through its entry point, and each patch does what docs/SERVING.md, "Busy polling
on a host with few cores", says, checked on the objects vLLM builds."""

import os
import subprocess

from ampd.config import RunConfig
from ampd.engines.vllm_launch import NIXL_PROGRESS_DELAY_ENV, SHM_RECHECK_ENV, server_command
from ampd.engines.local_vllm import VLLM_PYTHON


def _run_in_vllm(script: str, env: dict[str, str]) -> None:
    done = subprocess.run([str(VLLM_PYTHON), "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env, "VLLM_PLUGINS": "ampd"})
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_the_plugin_gives_every_nixl_agent_a_progress_timeout():
    """vLLM loads the plugin, which wraps NIXL's agent constructor; an agent built
    the way vLLM builds one still starts."""
    _run_in_vllm("""
import nixl._api as api
from nixl._api import nixl_agent, nixl_agent_config
from vllm.plugins import load_general_plugins
load_general_plugins()
assert api.nixlBind.nixlAgent._ampd_delay_us == 2500
nixl_agent("probe", nixl_agent_config(num_threads=4, capture_telemetry=True))
config = api.nixlBind.nixlAgentConfig()  # what nixl_agent builds, with its pthrDelay 0
config.pthrDelay = 0
api.nixlBind.nixlAgent("probe-config", config)
assert config.pthrDelay == 2500, config.pthrDelay
print("ok")
""", {NIXL_PROGRESS_DELAY_ENV: "2500"})


def test_queue_readers_sleep_with_a_recheck_where_vllm_spins():
    """A queue reader built as vLLM builds one (its one-second spin window) that
    waits just after a read sleeps on its notify socket for the recheck period
    instead of yielding the core in a loop; one idle past the window sleeps for
    the timeout vLLM asked for. A reader built before the plugin loaded is
    covered too (the patch is on the class)."""
    _run_in_vllm("""
import time
import zmq
from vllm.distributed.device_communicators import shm_broadcast
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
ctx = zmq.Context()
early = SpinCondition(True, ctx, "inproc://early")
from vllm.plugins import load_general_plugins
load_general_plugins()
late = SpinCondition(True, ctx, "inproc://late")
for reader in (early, late):
    assert reader.busy_loop_s == 1
    timeouts = []
    reader.poller.poll = lambda timeout=None: timeouts.append(timeout) or []
    shm_broadcast.sched_yield = lambda: timeouts.append("spun")
    reader.record_read()
    reader.wait(timeout_ms=5000)   # inside vLLM's 1 s spin window
    reader.wait(timeout_ms=None)
    reader.last_read = time.monotonic() - 2
    reader.wait(timeout_ms=5000)   # idle past the window
    assert timeouts == [3, 3, 5000], timeouts
print("ok")
""", {SHM_RECHECK_ENV: "3"})


def test_ampd_up_sets_the_recheck_on_every_vllm_engine(tmp_path):
    """1 ms by default for both roles and both engine kinds; null gives vLLM's
    spinning back (no variable set)."""
    python = tmp_path / "python"
    python.touch()
    for engine in ("vllm", "vllm-nixl"):
        config = RunConfig(serve={"engine": engine, "vllm_python": str(python), "vllm_model": str(tmp_path)})
        for role in ("prefill", "decode"):
            assert server_command(config, role, 8100, tmp_path)[1][SHM_RECHECK_ENV] == "1"
    config = RunConfig(serve={"engine": "vllm", "vllm_python": str(python), "vllm_model": str(tmp_path),
                              "vllm_shm_recheck_ms": None})
    assert SHM_RECHECK_ENV not in server_command(config, "decode", 8100, tmp_path)[1]
