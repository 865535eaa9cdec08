"""Converters from public trace formats into ``list[Session]``, one per file."""

from ampd.workload.converters.mooncake import convert_mooncake
from ampd.workload.converters.session_delay import convert_session_delay
from ampd.workload.converters.tracelab import convert_tracelab
from ampd.workload.converters.trtllm import convert_trtllm

__all__ = ["convert_mooncake", "convert_session_delay", "convert_tracelab", "convert_trtllm"]
