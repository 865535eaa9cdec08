"""What each kind of engine a cluster can run can do (docs/SERVING.md, "Engine
capabilities"): facts the simulator's performance model and the serving
coordinator both act on.

"vllm-nixl": vLLM with NixlConnector in bidirectional mode, whose prefill engine
reads a session's history KV from its decode engine (``ampd.engines.history_export``).
"""

READS_HISTORY = {"mock": True, "vllm": False, "vllm-nixl": True}
# How a prefill engine that reads history learns where it is: the mock engine from
# hints in the request, a vllm-nixl one from the decode engine's export.
EXPORTS_HISTORY = {"mock": False, "vllm": False, "vllm-nixl": True}
PREFILL_SLOTS = {"mock": 2, "vllm": 1, "vllm-nixl": 1}
