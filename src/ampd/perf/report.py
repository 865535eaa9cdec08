"""How far the performance model is from the measured Splitwise profiles.

For each GPU, TP degree and function: the mean absolute percentage error (MAPE) of
(a) the calibrated roofline and (b) the alpha-beta model built from it, against the
measured Llama-2-70B points. Functions: ``prefill`` (one prompt, what ``T_pre`` models),
``prefill_batched`` (several prompts in one forward: roofline only, ``T_pre`` has no batch)
and ``decode`` (one iteration).
"""

from __future__ import annotations

from dataclasses import dataclass

from ampd.perf.calibrate import CALIBRATED, predict_s
from ampd.perf.catalog import gpu, model
from ampd.perf.model import AlphaBetaPerfModel, build_perf_model
from ampd.perf.roofline import Roofline
from ampd.perf.splitwise import MODEL_NAME, MeasuredPoint, Profile, load_profile

FUNCTIONS = ("prefill", "prefill_batched", "decode")


@dataclass(frozen=True, slots=True)
class MapeRow:
    """Errors of one (GPU, TP, function) cell; ``tp`` 0 means all TP degrees together.

    Attributes:
        roofline_mape, alphabeta_mape: mean |predicted / measured - 1| (a fraction; None
            where the model has no such function).
        roofline_max, alphabeta_max: the largest of those errors.
    """

    gpu: str
    tp: int
    function: str
    num_points: int
    roofline_mape: float
    roofline_max: float
    alphabeta_mape: float | None
    alphabeta_max: float | None


def mape_table(profile: Profile | None = None) -> list[MapeRow]:
    """One row per measured GPU x (each TP, then all TPs) x function with points."""
    profile = profile or load_profile()
    rows = []
    for gpu_name in sorted({p.gpu for p in profile.points}):
        roof = Roofline(model(MODEL_NAME), gpu(gpu_name), CALIBRATED[gpu_name])
        alphabeta = build_perf_model(MODEL_NAME, gpu_name)
        mine = [p for p in profile.points if p.gpu == gpu_name]
        for tp in sorted({p.tp for p in mine}) + [0]:
            for function in FUNCTIONS:
                cell = [p for p in mine if _function(p) == function and tp in (0, p.tp)]
                if cell:
                    rows.append(_row(gpu_name, tp, function, cell, roof, alphabeta))
    return rows


def format_table(rows: list[MapeRow]) -> str:
    """Markdown table of ``rows``, errors in percent."""
    lines = ["| GPU | TP | function | points | roofline MAPE (max) | alpha-beta MAPE (max) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ab = "n/a" if r.alphabeta_mape is None else f"{100 * r.alphabeta_mape:.1f}% ({100 * r.alphabeta_max:.0f}%)"
        lines.append(f"| {r.gpu} | {r.tp or 'all'} | {r.function} | {r.num_points} | "
                     f"{100 * r.roofline_mape:.1f}% ({100 * r.roofline_max:.0f}%) | {ab} |")
    return "\n".join(lines)


def _function(point: MeasuredPoint) -> str:
    if point.phase == "decode":
        return "decode"
    return "prefill" if point.batch_size == 1 else "prefill_batched"


def _alphabeta_s(alphabeta: AlphaBetaPerfModel, point: MeasuredPoint) -> float | None:
    if point.phase == "decode":
        return alphabeta.decode_step_s(point.batch_size, point.context_tokens, point.tp)
    if point.batch_size == 1:
        return alphabeta.prefill_s(0, point.prompt_tokens, point.tp)
    return None


def _row(gpu_name: str, tp: int, function: str, cell: list[MeasuredPoint],
         roof: Roofline, alphabeta: AlphaBetaPerfModel) -> MapeRow:
    roof_err = [abs(predict_s(roof, p) / p.time_s - 1) for p in cell]
    predicted = [_alphabeta_s(alphabeta, p) for p in cell]
    ab_err = [abs(s / p.time_s - 1) for s, p in zip(predicted, cell) if s is not None]
    return MapeRow(gpu_name, tp, function, len(cell), sum(roof_err) / len(roof_err), max(roof_err),
                   sum(ab_err) / len(ab_err) if ab_err else None, max(ab_err) if ab_err else None)
