"""``AlphaBetaPerfModel``: the ``PerfModel`` every runtime times work with, its JSON form,
and ``build_perf_model``, which builds it from a model's and a GPU's specs.

JSON formats: ``ampd.perf.alphabeta/2`` (written): model and GPU as full spec objects, so
the file needs no catalog, plus the optional measured fields of ``ampd.perf.measured``;
``ampd.perf.alphabeta/1`` (still read): model and GPU by catalog name."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ampd.core.deployment import WorkerSpec
from ampd.core.errors import AmpdError, InputError
from ampd.perf.alphabeta import DecodeCost, PrefillCost
from ampd.perf.calibrate import efficiency_for
from ampd.perf.catalog import GpuSpec, ModelSpec, gpu, kv_bytes_per_token, model
from ampd.perf.from_roofline import fit_from_roofline
from ampd.perf.interface import RemoteStages, RoundPaths, paper_remote_stages
from ampd.perf.measured import (EngineBatching, Measured, RequestPaths, ServingStack, measured_from_dict,
                                measured_to_dict)
from ampd.perf.memory import replica_kv_capacity_tokens
from ampd.perf.resolve import resolve_gpu, resolve_model
from ampd.perf.roofline import Roofline
from ampd.perf.spec_json import gpu_spec_from_dict, model_spec_from_dict, spec_to_dict
from ampd.perf.topology import Topology, default_topology

FORMAT = "ampd.perf.alphabeta/2"
FORMAT_V1 = "ampd.perf.alphabeta/1"
# Top-level keys of a /2 object; any other is refused (a misspelt optional field would
# otherwise be dropped without a word).
_V2_KEYS = {"format", "model", "gpu", "topology", "tps", "fit_report", "kv_transfer", "kv_capacity_tokens",
            "kv_bytes_per_token", "batching", "request_overhead_s", "remote_path", "serving_stack",
            "shared_host"}
# No measured serving stack: nothing added (one tuple, as round_paths_s runs on every routing estimate).
_NO_STACK = ServingStack(0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class AlphaBetaPerfModel:
    """Piecewise alpha-beta cost functions of one model on one GPU type, per TP degree.

    Implements ``ampd.perf.interface.PerfModel``; all times are seconds.

    Attributes:
        model: the model's shape.
        gpu: the GPU type.
        topology: links KV transfers use.
        prefill: ``T_pre`` per TP degree.
        decode: ``T_dec`` per TP degree.
        fit_report: free-form facts about the fit (source, errors on its samples),
            saved with the model.
        measured: what a profile measured (``ampd.perf.measured.Measured``); each field
            that is set replaces the figure derived from the specs.
    """

    model: ModelSpec
    gpu: GpuSpec
    topology: Topology
    prefill: dict[int, PrefillCost]
    decode: dict[int, DecodeCost]
    fit_report: dict = field(default_factory=dict, compare=False)
    measured: Measured = Measured()

    def __post_init__(self) -> None:
        if not self.prefill or set(self.prefill) != set(self.decode):
            raise InputError(f"perf model: prefill TPs {sorted(self.prefill)} and decode TPs "
                             f"{sorted(self.decode)} must be the same, non-empty set")
        for name in ("kv_capacity_tokens", "remote_path"):
            unknown = sorted(set(getattr(self.measured, name) or {}) - set(self.prefill))
            if unknown:
                raise InputError(f"perf model: {name} for TP={unknown[0]}, which has no cost function; "
                                 f"TPs: {sorted(self.prefill)}")

    @property
    def tps(self) -> tuple[int, ...]:
        """TP degrees the model has cost functions for."""
        return tuple(sorted(self.prefill))

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes of one token, whole model: the measured figure when there is
        one, else ``catalog.kv_bytes_per_token`` of the model's shape."""
        return self.measured.kv_bytes_per_token or kv_bytes_per_token(self.model)

    @property
    def batching(self) -> EngineBatching | None:
        """How the profiled engine mixes a local prefill with decode steps; None when
        the model does not say (a catalog build)."""
        return self.measured.batching

    @property
    def request_overhead_s(self) -> float:
        """One engine request's latency beyond the engine's own TTFT, seconds: the
        measured figure, else 0 (a catalog build times the engines alone)."""
        return self.measured.request_overhead_s or 0.0

    @property
    def decode_step_factor_beside_prefill(self) -> float:
        """How many times longer a decode step takes while a prefill engine on the same
        host computes: the measured ``SharedHost`` factor, else 1 (a catalog build's
        engines share no compute)."""
        host = self.measured.shared_host
        return 1.0 if host is None else host.decode_step_factor

    def prefill_s(self, hist_tokens: int, new_tokens: int, tp: int) -> float:
        """``T_pre``: prefill ``new_tokens`` on ``hist_tokens`` of history at TP ``tp``.

        Raises:
            InputError: no cost function for ``tp``.
        """
        try:
            return self.prefill[tp](hist_tokens, new_tokens)
        except KeyError:
            raise self._unknown_tp(tp) from None

    def prefill_array_s(self, hist_tokens: np.ndarray, new_tokens: np.ndarray, tp: int) -> np.ndarray:
        """``prefill_s`` of every task (``PerfModel.prefill_array_s``).

        Raises:
            InputError: no cost function for ``tp``.
        """
        try:
            cost = self.prefill[tp]
        except KeyError:
            raise self._unknown_tp(tp) from None
        return cost.array_s(hist_tokens, new_tokens)

    def decode_step_s(self, batch_size: int, context_tokens: int, tp: int) -> float:
        """``T_dec``: one decode iteration of ``batch_size`` sequences, ``context_tokens``
        KV tokens in all, at TP ``tp``.

        Raises:
            InputError: no cost function for ``tp``.
        """
        try:
            return self.decode[tp](batch_size, context_tokens)
        except KeyError:
            raise self._unknown_tp(tp) from None

    def kv_transfer_s(self, tokens: int, src: WorkerSpec, dst: WorkerSpec) -> float:
        """``T_kv``: move ``tokens`` tokens of KV from ``src`` to ``dst``, seconds: 0 when
        they are the same worker; else over the measured link when there is one
        (``KvLink.transfer_s``, whatever the two workers' servers), or over the topology
        (``Topology.transfer_s``)."""
        num_bytes = tokens * self.kv_bytes_per_token
        link = self.measured.kv_link
        if link is None:
            return self.topology.transfer_s(num_bytes, src, dst)
        return 0.0 if src.worker_id == dst.worker_id else link.transfer_s(num_bytes)

    def remote_stages_s(self, hist_tokens: int, new_tokens: int, prefill: WorkerSpec,
                        decode: WorkerSpec) -> RemoteStages:
        """A remote prefill's stages, seconds. Where both workers' TP has a measured
        ``RemotePath``: read 0; compute = the export request then the prefill engine's
        request, each with its serving path (``remote_request_paths_s``; no export
        without history), since serving sends both from the prefill worker's one slot
        (docs/SERVING.md, "The KV path on NIXL"), so the export cannot overlap the
        previous task; send = the join, the decode engine's request, with its serving
        path, to its first token. Else ``paper_remote_stages``, which hold no request's
        serving path (``round_paths_s`` adds them). A profile times both roles at one TP,
        so all three requests are read at the prefill worker's TP (both workers' TP must
        have been measured). A profile's engines were on one host: a cross-server pair is
        timed as they were.

        Raises:
            InputError: no cost function for the prefill's TP.
        """
        if not self.reads_measured_requests(prefill.tp, decode.tp):
            return paper_remote_stages(self, hist_tokens, new_tokens, prefill, decode)
        path = self.measured.remote_path[prefill.tp]
        paths = self.remote_request_paths_s(prefill.tp)
        return RemoteStages(0.0, self.remote_export_s(hist_tokens, prefill, decode)
                            + path.prefill(hist_tokens, new_tokens) + paths.prefill, path.join(new_tokens) + paths.join)

    def remote_stages_array_s(self, hist_tokens: np.ndarray, new_tokens: np.ndarray, prefill: WorkerSpec,
                              decode: WorkerSpec) -> RemoteStages:
        """``remote_stages_s`` of every task (``PerfModel.remote_stages_array_s``): the same
        arithmetic in the same order on arrays.

        Raises:
            InputError: no cost function for the prefill's TP.
        """
        if not self.reads_measured_requests(prefill.tp, decode.tp):
            return RemoteStages(self._kv_transfer_array_s(hist_tokens, decode, prefill),
                                self.prefill_array_s(hist_tokens, new_tokens, prefill.tp),
                                self._kv_transfer_array_s(new_tokens, prefill, decode))
        path = self.measured.remote_path[prefill.tp]
        paths = self.remote_request_paths_s(prefill.tp)
        export_s = np.where(hist_tokens > 0, paths.export + path.export(hist_tokens), 0.0)
        return RemoteStages(np.zeros(hist_tokens.shape), export_s + path.prefill.array_s(hist_tokens, new_tokens)
                            + paths.prefill, path.join(new_tokens) + paths.join)

    def _kv_transfer_array_s(self, tokens: np.ndarray, src: WorkerSpec, dst: WorkerSpec) -> np.ndarray:
        """``kv_transfer_s`` of every element of ``tokens``: its arithmetic is elementwise,
        and its 0 between one worker and itself is spread to the shape."""
        return np.broadcast_to(np.asarray(self.kv_transfer_s(tokens, src, dst), dtype=np.float64), tokens.shape)

    def remote_export_s(self, hist_tokens: int, prefill: WorkerSpec, decode: WorkerSpec) -> float:
        """The history export that leads a measured remote round's compute stage: its
        request and its serving path; none without history, and 0 on the paper's stages
        (``PerfModel.remote_export_s``)."""
        if hist_tokens <= 0 or not self.reads_measured_requests(prefill.tp, decode.tp):
            return 0.0
        return self.remote_request_paths_s(prefill.tp).export + self.measured.remote_path[prefill.tp].export(hist_tokens)

    def round_paths_s(self, prefill_tp: int | None, decode_tp: int) -> RoundPaths:
        """A round's serving time outside what its stages hold (``RoundPaths``): a local
        round (``prefill_tp`` None) makes one engine request (``request_overhead_s``); a
        remote one makes two beside the paper's stages, none beside measured requests,
        whose stages hold their paths (``remote_stages_s``). A measured serving stack
        adds the coordinator's route and the client's leg to every round, and the
        coordinator's dispatch and handoff to a remote one (``ServingStack``).
        """
        stack = self.measured.serving_stack or _NO_STACK
        entry_s = stack.route_s + stack.client_s
        if prefill_tp is None:
            return RoundPaths(entry_s + self.request_overhead_s, 0.0)
        engine_s = 0.0 if self.reads_measured_requests(prefill_tp, decode_tp) else self.request_overhead_s
        return RoundPaths(entry_s + stack.dispatch_s + engine_s, stack.handoff_s + engine_s)

    def measured_remote_path(self, tp: int) -> bool:
        """Whether a profile measured a remote round's engine requests at TP ``tp``."""
        return tp in (self.measured.remote_path or {})

    def reads_measured_requests(self, prefill_tp: int, decode_tp: int) -> bool:
        """Whether a remote round from a prefill worker of ``prefill_tp`` to a decode
        worker of ``decode_tp`` is timed by measured engine requests (both TPs measured)."""
        return self.measured_remote_path(prefill_tp) and self.measured_remote_path(decode_tp)

    def remote_request_paths_s(self, tp: int) -> RequestPaths:
        """The serving path of each of a remote round's requests at TP ``tp``, seconds:
        as the profile timed them, else each a plain request's (``request_overhead_s``)."""
        path = (self.measured.remote_path or {}).get(tp)
        if path is None or path.paths_s is None:
            return RequestPaths(*(self.request_overhead_s,) * 3)
        return path.paths_s

    def kv_capacity_tokens(self, tp: int) -> int:
        """KV tokens one replica of ``tp`` GPUs holds: the measured figure for ``tp`` when
        there is one, else ``replica_kv_capacity_tokens`` with this model's KV bytes per
        token."""
        measured = (self.measured.kv_capacity_tokens or {}).get(tp)
        if measured is not None:
            return measured
        return replica_kv_capacity_tokens(self.model, self.gpu, tp, self.kv_bytes_per_token)

    def _unknown_tp(self, tp: int) -> InputError:
        return InputError(f"perf model {self.model.name} on {self.gpu.name}: no cost function for TP={tp}; "
                          f"fitted TPs: {list(self.tps)}")

    def to_json(self) -> str:
        """JSON text in format ``FORMAT``: the model's and GPU's specs, topology,
        coefficients per TP, fit report, and the measured fields that are set."""
        return json.dumps({
            "format": FORMAT, "model": spec_to_dict(self.model), "gpu": spec_to_dict(self.gpu),
            "topology": asdict(self.topology),
            "tps": {str(tp): {"prefill": self.prefill[tp].to_dict(), "decode": self.decode[tp].to_dict()}
                    for tp in self.tps},
            "fit_report": self.fit_report, **measured_to_dict(self.measured),
        }, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "AlphaBetaPerfModel":
        """Inverse of ``to_json``; also reads ``FORMAT_V1`` (model and GPU looked up in
        the catalog by name).

        Raises:
            InputError: not JSON or not one of these formats, missing fields, unknown
                names, bad spec or measured fields (named).
            ImpossibleFitError: coefficients that give negative or non-monotone times.
        """
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"perf model JSON: not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InputError(f"perf model JSON: expected an object at the top, got {type(data).__name__}")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict) -> "AlphaBetaPerfModel":
        """``from_json`` of an already parsed JSON object (a profile holds one).

        Raises:
            InputError, ImpossibleFitError: as ``from_json``.
        """
        fmt = data.get("format")
        if fmt not in (FORMAT, FORMAT_V1):
            raise InputError(f"perf model JSON: format {fmt!r}, expected {FORMAT!r} (or {FORMAT_V1!r})")
        if fmt == FORMAT:
            unknown = sorted(set(data) - _V2_KEYS)
            if unknown:
                raise InputError(f"perf model JSON: unknown field {unknown[0]!r}; known: {', '.join(sorted(_V2_KEYS))}")
        try:
            tps = {int(tp): costs for tp, costs in data["tps"].items()}
            if fmt == FORMAT_V1:
                spec, device, measured = model(data["model"]), gpu(data["gpu"]), Measured()
            else:
                spec, device = model_spec_from_dict(data["model"]), gpu_spec_from_dict(data["gpu"])
                measured = measured_from_dict(data)
            # A profile need not know the servers' links: the GPU's datasheet NVLink then.
            topology = Topology(**data["topology"]) if "topology" in data else default_topology(device)
            return cls(spec, device, topology,
                       {tp: PrefillCost.from_dict(c["prefill"]) for tp, c in tps.items()},
                       {tp: DecodeCost.from_dict(c["decode"]) for tp, c in tps.items()},
                       data.get("fit_report", {}), measured)
        except AmpdError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise InputError(f"perf model JSON: missing or malformed field: {exc}") from None

    def save(self, path: str | Path) -> None:
        """Write ``to_json()`` to ``path``."""
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "AlphaBetaPerfModel":
        """Read a model written by ``save``.

        Raises:
            InputError: the file cannot be read, or any error of ``from_json``,
                its message prefixed by the file.
        """
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read the perf model: {exc}") from None
        try:
            return cls.from_json(text)
        except AmpdError as exc:
            raise InputError(f"{path}: {exc}") from None


def build_perf_model(model_or_name: str | ModelSpec, gpu_or_name: str | GpuSpec, topology: Topology | None = None,
                     tps: tuple[int, ...] = (1, 2, 4, 8)) -> AlphaBetaPerfModel:
    """The alpha-beta performance model of a model on a GPU, each a spec or as a user names
    it: a catalog name or a file outside the catalog (``resolve.resolve_model`` and
    ``resolve_gpu``).

    Samples the roofline calibrated on the Splitwise measurements (``calibrate``; a GPU
    outside the catalog borrows ``calibrate.efficiency_of``'s) and fits ``T_pre`` and
    ``T_dec`` per TP degree in ``tps``. A TP whose weights do not fit still gets cost
    functions; its ``kv_capacity_tokens`` is 0. Built once per argument set (cached on the
    specs' values; the result is shared and must not be changed).

    Args:
        topology: links for KV transfers; default: the paper's (``default_topology``).

    Raises:
        InputError: unknown model or GPU name (the message lists the known ones), an
            unreadable or invalid model or GPU file (named), or a TP degree below 1.
    """
    spec = resolve_model(model_or_name) if isinstance(model_or_name, str) else model_or_name
    device = resolve_gpu(gpu_or_name) if isinstance(gpu_or_name, str) else gpu_or_name
    if not tps or any(int(tp) < 1 for tp in tps):
        raise InputError(f"build_perf_model: TP degrees must be >= 1, got {tps!r}")
    return _build(spec, device, topology or default_topology(device), tuple(sorted({int(tp) for tp in tps})))


@lru_cache(maxsize=64)
def _build(spec: ModelSpec, device: GpuSpec, topology: Topology, tps: tuple[int, ...]) -> AlphaBetaPerfModel:
    roof = Roofline(spec, device, efficiency_for(device.name))
    prefill, decode, report = fit_from_roofline(roof, tps)
    return AlphaBetaPerfModel(roof.model, roof.gpu, topology, prefill, decode, report)
