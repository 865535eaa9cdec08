"""Real vLLM servers on this machine, for the tests, the benchmarks and a first
try of ``ampd`` on real engines: the tiny model written (``tiny_model.py``,
run by the vLLM interpreter), and a set of servers started, awaited and stopped
together. The vLLM interpreter is ``AMPD_VLLM_PYTHON``, else the checkout's
``.venv-vllm`` (``make test`` builds it with tools/vllm_venv.sh)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from ampd.core.errors import InputError
from ampd.engines import tiny_model
from ampd.engines.vllm_launch import ServerSpec, start_server, stop_server, wait_ready

# src/ampd/engines/ -> the checkout's root, where make builds .venv-vllm
CHECKOUT = Path(__file__).resolve().parents[3]
VLLM_PYTHON = Path(os.environ.get("AMPD_VLLM_PYTHON", CHECKOUT / ".venv-vllm" / "bin" / "python"))
MODEL_NAME = "tiny-llama"  # the served model name every configuration of the tiny model uses
# [our choice] a server starts in 30-60 s on 2 idle cores; several at once, under load, far slower
READY_TIMEOUT_S = 400


def write_tiny_model(work: Path, tokenizer: str = "words") -> Path:
    """Write the tiny model into ``work/model`` and return that folder
    (``tokenizer`` "bytes": the byte-level one, which spells JSON; ~4 s).

    Raises:
        InputError: no vLLM interpreter at ``VLLM_PYTHON`` (naming it and how to
            get one).
        subprocess.CalledProcessError: the writer failed.
    """
    if not VLLM_PYTHON.exists():
        raise InputError(f"no vLLM interpreter at {VLLM_PYTHON}: run `make test` (it builds .venv-vllm), "
                         "or set AMPD_VLLM_PYTHON")
    model_dir = work / "model"
    subprocess.run([str(VLLM_PYTHON), tiny_model.__file__, str(model_dir), "--tokenizer", tokenizer], check=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True)
    return model_dir


@contextlib.contextmanager
def servers_running(specs: dict[str, ServerSpec], log_dir: Path,
                    ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[dict]:
    """Start every server (logs ``log_dir/<name>.log``), wait until all answer,
    yield their processes by name (a caller may replace one), stop them all at
    the end, whatever happened.

    Raises:
        VllmServerError: a server that exits or does not answer within
            ``ready_timeout_s`` (``wait_ready``), naming its log.
    """
    processes = {name: start_server(spec, log_dir / f"{name}.log") for name, spec in specs.items()}
    try:
        for name, spec in specs.items():
            wait_ready(processes[name], spec, log_dir / f"{name}.log", timeout_s=ready_timeout_s)
        yield processes
    finally:
        for process in processes.values():
            stop_server(process)
