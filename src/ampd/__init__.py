"""AMPD: multi-round LLM inference over prefill/decode-disaggregated serving.

Layers (dependencies point inward only, see docs/DESIGN.md):
``core <- perf <- policy <- planner``, and ``sim``, ``serve``, ``workload``,
``metrics``, ``cli`` on the outside.
"""

__version__ = "0.1.0"
