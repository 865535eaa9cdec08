"""Performance model: hardware and model catalog, calibrated roofline, piecewise alpha-beta
cost functions fitted from it, KV transfer over the topology (AMPD.md section 2;
docs/PERF_MODEL.md)."""

from ampd.perf.alphabeta import DecodeCost, ImpossibleFitError, PrefillCost, Segments, fit_decode, fit_prefill
from ampd.perf.calibrate import CALIBRATED, efficiency_for, fit_efficiency, refit
from ampd.perf.catalog import GPUS, MODELS, GpuSpec, ModelSpec, gpu, kv_bytes_per_token, model
from ampd.perf.interface import PerfModel
from ampd.perf.measured import BATCHING_MODES, EngineBatching, KvLink, Measured
from ampd.perf.memory import USABLE_MEMORY_FRACTION, replica_kv_capacity_tokens
from ampd.perf.model import AlphaBetaPerfModel, build_perf_model
from ampd.perf.perf_file import load_perf_model
from ampd.perf.resolve import resolve_gpu, resolve_model
from ampd.perf.report import MapeRow, format_table, mape_table
from ampd.perf.roofline import Efficiency, Roofline
from ampd.perf.splitwise import MeasuredPoint, Profile, load_profile
from ampd.perf.topology import Topology, default_topology

__all__ = [
    "AlphaBetaPerfModel", "BATCHING_MODES", "CALIBRATED", "DecodeCost", "Efficiency", "EngineBatching", "GPUS",
    "GpuSpec", "ImpossibleFitError", "KvLink", "MODELS", "MapeRow", "Measured", "MeasuredPoint", "ModelSpec",
    "PerfModel", "PrefillCost", "Profile", "Roofline", "Segments", "Topology", "USABLE_MEMORY_FRACTION",
    "build_perf_model", "default_topology", "efficiency_for", "fit_decode", "fit_efficiency", "fit_prefill",
    "format_table", "gpu", "kv_bytes_per_token", "load_perf_model", "load_profile", "mape_table", "model", "refit",
    "replica_kv_capacity_tokens", "resolve_gpu", "resolve_model",
]
