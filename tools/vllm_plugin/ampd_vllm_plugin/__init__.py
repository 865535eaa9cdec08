"""ampd's vLLM general plugin: give NIXL's UCX progress thread a poll timeout.

vLLM loads ``vllm.general_plugins`` entry points in every process it starts
(API server, engine core, model workers) before a KV connector exists.
:func:`register` does nothing unless ``AMPD_NIXL_PROGRESS_DELAY_US`` is set;
``ampd up`` and ``ampd.serve.vllm_launch`` set it for NixlConnector servers.

Why: NIXL 1.5.1's Python agent sets ``nixlAgentConfig.pthrDelay = 0`` and
neither NIXL's Python API nor vLLM's ``kv_connector_extra_config`` exposes it.
The UCX backend's progress thread then calls ``poll()`` with a 0 ms timeout in
a loop and keeps one core busy per idle agent (bench/bench_nixl_idle.py: 0.994
of a core idle; with a delay of 1,000 us, 0.016). The thread still wakes at once on the UCX worker's
event fd, so the delay bounds only how long a missed wake-up waits; transfers
themselves are not slowed (docs/SERVING.md, "NIXL busy polling").
"""

from __future__ import annotations

import logging
import os

ENV_DELAY_US = "AMPD_NIXL_PROGRESS_DELAY_US"
log = logging.getLogger(__name__)


def register() -> None:
    """Wrap NIXL's agent constructor so each agent's progress thread polls with
    a timeout of ``$AMPD_NIXL_PROGRESS_DELAY_US`` microseconds.

    Raises:
        ValueError: the variable is set but not a positive integer.
    """
    raw = os.environ.get(ENV_DELAY_US)
    if not raw:
        return
    delay_us = int(raw)
    if delay_us <= 0:
        raise ValueError(f"{ENV_DELAY_US}={raw!r}: expected a positive number of microseconds")
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
