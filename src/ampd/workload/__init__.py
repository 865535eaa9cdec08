"""Workloads: the project's trace format, converters from public trace formats,
synthetic generators for the paper's workloads, arrival processes, and the real
traces shipped with the package. Depends on ``ampd.core`` only."""

from ampd.workload.arrivals import (
    arrival_rate_per_s, poisson_arrivals, rescale_rate, take, with_poisson_arrivals)
from ampd.workload.builtin import BUILTIN_TRACES, builtin_trace
from ampd.workload.convert import FORMATS, convert, guess_format, load_any
from ampd.workload.converters import (
    convert_mooncake, convert_session_delay, convert_tracelab, convert_trtllm)
from ampd.workload.specs import WORKLOADS, LogNormal, RoundCount, WorkloadSpec
from ampd.workload.stream import cycled, poisson_until, repeated, sampled, with_arrivals
from ampd.workload.synthetic import generate, synthetic_sessions
from ampd.workload.trace_format import load_trace, save_trace

__all__ = [
    "BUILTIN_TRACES", "FORMATS", "LogNormal", "RoundCount", "WORKLOADS", "WorkloadSpec",
    "arrival_rate_per_s", "builtin_trace", "convert", "convert_mooncake", "convert_session_delay",
    "convert_tracelab", "convert_trtllm", "cycled", "generate", "guess_format", "load_any", "load_trace",
    "poisson_arrivals", "poisson_until", "repeated", "rescale_rate", "save_trace", "synthetic_sessions",
    "sampled", "take", "with_arrivals", "with_poisson_arrivals",
]
