"""``AlphaBetaPerfModel``: the ``PerfModel`` every runtime times work with, its JSON form,
and ``build_perf_model``, which builds it from the catalog."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from ampd.core.deployment import WorkerSpec
from ampd.core.errors import AmpdError, InputError
from ampd.perf.alphabeta import DecodeCost, PrefillCost
from ampd.perf.calibrate import efficiency_for
from ampd.perf.catalog import GpuSpec, ModelSpec, gpu, kv_bytes_per_token, model
from ampd.perf.from_roofline import fit_from_roofline
from ampd.perf.memory import replica_kv_capacity_tokens
from ampd.perf.roofline import Roofline
from ampd.perf.topology import Topology, default_topology

FORMAT = "ampd.perf.alphabeta/1"


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
    """

    model: ModelSpec
    gpu: GpuSpec
    topology: Topology
    prefill: dict[int, PrefillCost]
    decode: dict[int, DecodeCost]
    fit_report: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.prefill or set(self.prefill) != set(self.decode):
            raise InputError(f"perf model: prefill TPs {sorted(self.prefill)} and decode TPs "
                             f"{sorted(self.decode)} must be the same, non-empty set")

    @property
    def tps(self) -> tuple[int, ...]:
        """TP degrees the model has cost functions for."""
        return tuple(sorted(self.prefill))

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes of one token, whole model (``catalog.kv_bytes_per_token``)."""
        return kv_bytes_per_token(self.model)

    def prefill_s(self, hist_tokens: int, new_tokens: int, tp: int) -> float:
        """``T_pre``: prefill ``new_tokens`` on ``hist_tokens`` of history at TP ``tp``.

        Raises:
            InputError: no cost function for ``tp``.
        """
        try:
            return self.prefill[tp](hist_tokens, new_tokens)
        except KeyError:
            raise self._unknown_tp(tp) from None

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
        """``T_kv``: move ``tokens`` tokens of KV from ``src`` to ``dst`` (``Topology.transfer_s``)."""
        return self.topology.transfer_s(tokens * self.kv_bytes_per_token, src, dst)

    def kv_capacity_tokens(self, tp: int) -> int:
        """KV tokens one replica of ``tp`` GPUs holds (``replica_kv_capacity_tokens``)."""
        return replica_kv_capacity_tokens(self.model, self.gpu, tp)

    def _unknown_tp(self, tp: int) -> InputError:
        return InputError(f"perf model {self.model.name} on {self.gpu.name}: no cost function for TP={tp}; "
                          f"fitted TPs: {list(self.tps)}")

    def to_json(self) -> str:
        """JSON text: format tag, model and GPU names, topology, coefficients per TP, fit report."""
        return json.dumps({
            "format": FORMAT, "model": self.model.name, "gpu": self.gpu.name,
            "topology": asdict(self.topology),
            "tps": {str(tp): {"prefill": self.prefill[tp].to_dict(), "decode": self.decode[tp].to_dict()}
                    for tp in self.tps},
            "fit_report": self.fit_report,
        }, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "AlphaBetaPerfModel":
        """Inverse of ``to_json``; model and GPU are looked up in the catalog by name.

        Raises:
            InputError: not this format, missing fields, or unknown names.
            ImpossibleFitError: coefficients that give negative or non-monotone times.
        """
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"perf model JSON: not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InputError(f"perf model JSON: expected an object at the top, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise InputError(f"perf model JSON: format {data.get('format')!r}, expected {FORMAT!r}")
        try:
            tps = {int(tp): costs for tp, costs in data["tps"].items()}
            return cls(model(data["model"]), gpu(data["gpu"]), Topology(**data["topology"]),
                       {tp: PrefillCost.from_dict(c["prefill"]) for tp, c in tps.items()},
                       {tp: DecodeCost.from_dict(c["decode"]) for tp, c in tps.items()},
                       data.get("fit_report", {}))
        except AmpdError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
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


def build_perf_model(model_name: str, gpu_name: str, topology: Topology | None = None,
                     tps: tuple[int, ...] = (1, 2, 4, 8)) -> AlphaBetaPerfModel:
    """The alpha-beta performance model of a catalog model on a catalog GPU.

    Samples the roofline calibrated on the Splitwise measurements (``calibrate``) and fits
    ``T_pre`` and ``T_dec`` per TP degree in ``tps``. A TP whose weights do not fit still
    gets cost functions; its ``kv_capacity_tokens`` is 0. Built once per argument set
    (cached; the result is shared and must not be changed).

    Args:
        topology: links for KV transfers; default: the paper's (``default_topology``).

    Raises:
        InputError: unknown model or GPU name (the message lists the known ones), or a
            TP degree below 1.
    """
    model_key, gpu_key = model(model_name).name, gpu(gpu_name).name
    if not tps or any(int(tp) < 1 for tp in tps):
        raise InputError(f"build_perf_model: TP degrees must be >= 1, got {tps!r}")
    return _build(model_key, gpu_key, topology or default_topology(gpu(gpu_key)),
                  tuple(sorted({int(tp) for tp in tps})))


@lru_cache(maxsize=64)
def _build(model_name: str, gpu_name: str, topology: Topology, tps: tuple[int, ...]) -> AlphaBetaPerfModel:
    roof = Roofline(model(model_name), gpu(gpu_name), efficiency_for(gpu_name))
    prefill, decode, report = fit_from_roofline(roof, tps)
    return AlphaBetaPerfModel(roof.model, roof.gpu, topology, prefill, decode, report)
