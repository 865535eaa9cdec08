"""Efficiencies of the roofline, fitted to the measured Splitwise profiles.

The fitted constants ship in ``CALIBRATED`` so building a performance model never refits;
``refit()`` reproduces them (a test checks that it does). GPUs without measurements
borrow a measured GPU's efficiencies (``BORROWED``).
"""

from __future__ import annotations

import numpy as np

from ampd.core.errors import InputError
from ampd.perf.catalog import GPUS, gpu, model
from ampd.perf.roofline import Efficiency, Roofline
from ampd.perf.splitwise import MODEL_NAME, MeasuredPoint, Profile, load_profile

FIT_DATE = "2026-11-30"
FIT_SOURCE = ("Splitwise perf_model.csv (Mutinifni/splitwise-sim@8f99e7d, MIT): Llama-2-70B, "
              "TP 2/4/8, medians over repeats; scipy least_squares on relative error")

# Output of refit() on FIT_DATE, rounded to 4 significant digits (times below 1 ns to 0).
CALIBRATED: dict[str, Efficiency] = {
    "A100-80GB": Efficiency(compute_eff=0.6996, memory_eff=0.9597, allreduce_small_eff=0.8803,
                            allreduce_large_eff=0.1822, allreduce_step_s=7.124e-06, prefill_fixed_s=0.0023,
                            decode_fixed_s=0.01947, prefill_per_seq_s=0.02942, decode_per_seq_s=0.0003538),
    "H100-SXM": Efficiency(compute_eff=0.6117, memory_eff=0.8035, allreduce_small_eff=0.5923,
                           allreduce_large_eff=0.1745, allreduce_step_s=6.266e-06, prefill_fixed_s=0.0231,
                           decode_fixed_s=0.009752, prefill_per_seq_s=0.0, decode_per_seq_s=0.0002909),
}

# Same generation (Hopper) for H20 and H200; L40S (Ada, PCIe, no NVLink) is closer to A100's
# engine behaviour than to Hopper's.
BORROWED = {"H20": "H100-SXM", "H200": "H100-SXM", "L40S": "A100-80GB"}
# [our choice] A GPU outside the catalog: the most recent generation measured. Its figures
# (peak FLOP/s, bandwidth) still set the roofline; only the achieved fractions and the engine's
# fixed overheads are borrowed. `ampd profile` measures them instead.
OUTSIDE_CATALOG = "H100-SXM"

# Starting points and upper bounds of the fitted fields, in Efficiency's order (times in s).
_START = (0.5, 0.7, 0.5, 0.5, 1e-5, 0.01, 0.01, 1e-3, 1e-4)
_UPPER = (1.0, 1.0, 1.0, 1.0, 1e-3, 0.2, 0.2, 0.1, 0.01)


def efficiency_of(gpu_name: str) -> str:
    """The measured GPU whose calibrated efficiencies ``gpu_name`` uses: itself when
    measured, ``BORROWED``'s for an unmeasured catalog GPU, ``OUTSIDE_CATALOG`` for a GPU
    outside the catalog (a TOML file's, ``ampd.perf.gpu_file``). Case-insensitive."""
    by_key = {g.name.lower(): g.name for g in GPUS}
    name = by_key.get(str(gpu_name).strip().lower())
    if name is None:
        return OUTSIDE_CATALOG
    return BORROWED.get(name, name)


def efficiency_for(gpu_name: str) -> Efficiency:
    """Calibrated efficiency of the GPU called ``gpu_name`` (``efficiency_of``'s)."""
    return CALIBRATED[efficiency_of(gpu_name)]


def fit_efficiency(points: tuple[MeasuredPoint, ...], gpu_name: str) -> Efficiency:
    """Least-squares fit of every ``Efficiency`` field but the switch size, minimising
    the relative error of the roofline over ``points`` of one GPU (Llama-2-70B).

    Raises:
        InputError: no points for that GPU.
    """
    mine = [p for p in points if p.gpu == gpu_name]
    if not mine:
        raise InputError(f"calibration: no measured points for GPU {gpu_name!r}")
    measured_s = np.array([p.time_s for p in mine])

    def residuals(x: np.ndarray) -> np.ndarray:
        roof = Roofline(model(MODEL_NAME), gpu(gpu_name), Efficiency(*x))
        return np.array([predict_s(roof, p) for p in mine]) / measured_s - 1.0

    lower = np.array([1e-3] * 4 + [0.0] * 5)
    from scipy.optimize import least_squares  # here: scipy.optimize costs ~0.8 s to import

    fit = least_squares(residuals, np.array(_START), bounds=(lower, np.array(_UPPER)),
                        x_scale=np.array(_START), method="trf")
    return Efficiency(*(float(v) for v in fit.x))


def predict_s(roof: Roofline, point: MeasuredPoint) -> float:
    """The roofline's time for a measured configuration, seconds."""
    if point.phase == "prefill":
        return roof.prefill_s(0, point.prompt_tokens, point.tp, point.batch_size)
    return roof.decode_step_s(point.batch_size, point.context_tokens, point.tp)


def refit(profile: Profile | None = None) -> dict[str, Efficiency]:
    """Fit the efficiency of every measured GPU from the Splitwise profile."""
    profile = profile or load_profile()
    return {name: fit_efficiency(profile.points, name) for name in sorted({p.gpu for p in profile.points})}

