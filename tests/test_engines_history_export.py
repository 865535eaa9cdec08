"""The pieces of AMPD's KV path on vLLM NIXL engines that need no engine: which path
a round's history took (worked out by hand) and the command lines `ampd up` gives a
``vllm-nixl`` engine (ampd's vLLM plugin: tests/test_tools_vllm_plugin.py).
tests/test_serve_vllm_nixl.py runs the path end to end on real engines."""

import json

import pytest

from ampd.config import RunConfig
from ampd.engines.history_export import kv_path
from ampd.engines.vllm_launch import NIXL_PROGRESS_DELAY_ENV, NIXL_SIDE_CHANNEL_OFFSET, server_command


def _export(exported=True, decode_cached=352, error=None):
    return {"exported": exported, "decode_cached_tokens": decode_cached, "error": error}


@pytest.mark.parametrize("history, export, prefill_cached, expected", [
    (0, None, 0, ("no-history", None)),                       # round 1: nothing to read
    (380, _export(), 380, ("history-read", None)),            # 288 own cache + 92 read
    (380, _export(), 317, ("history-read", None)),            # 63 recomputed: under the 64-token threshold
    (380, _export(), 315, ("history-recomputed", "history-recomputed")),  # 65 recomputed: a declined read
    (380, _export(exported=False, decode_cached=None, error="connect: refused"), 288,
     ("history-recomputed", "history-export-failed")),       # no params: the prefill engine recomputed 92
    (380, _export(decode_cached=0), 380, ("history-read", "history-lost")),  # restarted decode engine
    (380, _export(decode_cached=190), 380, ("history-read", None)),  # half still cached: not lost
])
def test_the_path_a_history_took(history, export, prefill_cached, expected):
    assert kv_path(history, export, prefill_cached, read_min_tokens=64) == expected


def test_up_starts_vllm_nixl_engines_with_bidirectional_nixl(tmp_path):
    python = tmp_path / "python"
    python.touch()
    config = RunConfig(serve={"engine": "vllm-nixl", "vllm_python": str(python), "vllm_model": str(tmp_path),
                              "nixl_decoder_kv_ttl_s": 20, "nixl_ucx_tls": "tcp"})
    commands = {role: server_command(config, role, 8100, tmp_path) for role in ("prefill", "decode")}
    for role, (argv, env) in commands.items():
        transfer = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert transfer == {
            "kv_connector": "NixlConnector", "kv_role": {"prefill": "kv_producer", "decode": "kv_consumer"}[role],
            "kv_buffer_device": "cpu",
            "kv_load_failure_policy": "fail",
            "kv_connector_extra_config": {"kv_lease_duration": 30, "bidirectional_kv_xfer": True,
                                          "decoder_kv_blocks_ttl": 20, "kv_recompute_threshold": 64}}
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(8100 + NIXL_SIDE_CHANNEL_OFFSET)
        assert env[NIXL_PROGRESS_DELAY_ENV] == "1000" and env["UCX_TLS"] == "tcp"

