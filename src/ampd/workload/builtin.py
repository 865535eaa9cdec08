"""Real multi-round traces shipped with the package, already converted to the
project's format (``ampd/data/traces``; provenance in its SOURCE.md)."""

from __future__ import annotations

from importlib.resources import as_file, files

from ampd.core.errors import InputError
from ampd.core.names import unknown_name
from ampd.core.session import Session
from ampd.workload.trace_format import load_trace

BUILTIN_TRACES: dict[str, str] = {
    "mooncake-conversation": "mooncake_conversation.jsonl",
    "trtllm-swebench": "trtllm_swebench.jsonl",
}


def builtin_trace(name: str) -> list[Session]:
    """Load a shipped trace by name: ``mooncake-conversation`` (Kimi chat,
    Mooncake FAST'25, sessions rebuilt from prefix hashes) or ``trtllm-swebench``
    (two SWE-bench coding-agent runs from TensorRT-LLM).

    Returns:
        Sessions sorted by arrival.

    Raises:
        InputError: unknown name (the message lists the known ones).
    """
    if name not in BUILTIN_TRACES:
        raise InputError(unknown_name("built-in trace", name, BUILTIN_TRACES))
    resource = files("ampd").joinpath("data", "traces", BUILTIN_TRACES[name])
    with as_file(resource) as path:
        return load_trace(path)
