"""The measured Splitwise profiles of Llama-2-70B on DGX-A100 and DGX-H100
(``ampd/data/profiles/splitwise_perf_model.csv``, MIT; see ``SOURCE.md`` beside it)."""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ampd.perf.catalog import gpu, model
from ampd.perf.roofline import Efficiency, Roofline

MODEL_NAME = "Llama-2-70B"
# Splitwise's hardware labels -> catalog names; "h100-80gb-pcap" (power-capped) is left out.
GPU_NAMES = {"a100-80gb": "A100-80GB", "h100-80gb": "H100-SXM"}

# Only peaks and shapes matter for the bound, so any valid efficiency serves.
_PEAK = Efficiency(1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class MeasuredPoint:
    """One measured configuration (median over its repeats).

    Attributes:
        gpu: catalog GPU name.
        tp: tensor-parallel degree.
        phase: ``"prefill"`` (the whole batch's prompts, from zero history) or
            ``"decode"`` (one iteration).
        batch_size: sequences in the batch.
        prompt_tokens: tokens of each prompt.
        context_tokens: decode only: KV tokens of the whole batch, taken as
            ``batch_size x (prompt + generated / 2)`` (the mean over the generation);
            0 for prefill.
        time_s: measured time, seconds.
    """

    gpu: str
    tp: int
    phase: str
    batch_size: int
    prompt_tokens: int
    context_tokens: int
    time_s: float


@dataclass(frozen=True, slots=True)
class Profile:
    """Usable points, and the configurations dropped as physically impossible."""

    points: tuple[MeasuredPoint, ...]
    dropped: tuple[str, ...]


def default_path() -> Path:
    """Path of the copied Splitwise CSV inside the package."""
    return Path(str(resources.files("ampd") / "data" / "profiles" / "splitwise_perf_model.csv"))


def load_profile(path: Path | None = None) -> Profile:
    """Read the Splitwise CSV: Llama-2-70B rows on A100-80GB and H100-SXM, medians over
    repeats (prefill keyed by GPU, TP, prompt, batch; decode also by generated tokens).

    A configuration whose prefill is faster than the dense matmuls at 100% of the GPU's
    peak cannot be right (TP 2, batch 64: e.g. 0.79 s measured where 7.2 s is the bound
    on A100); its prefill and decode points are both dropped and listed in ``dropped``.
    """
    prefill_ms, decode_ms = _read_rows(path or default_path())
    impossible = {key for key, times in prefill_ms.items() if _beats_peak(key, statistics.median(times) / 1e3)}
    points = [MeasuredPoint(g, tp, "prefill", b, p, 0, statistics.median(t) / 1e3)
              for (g, tp, p, b), t in sorted(prefill_ms.items()) if (g, tp, p, b) not in impossible]
    points += [MeasuredPoint(g, tp, "decode", b, p, b * (p + n // 2), statistics.median(t) / 1e3)
               for (g, tp, p, b, n), t in sorted(decode_ms.items()) if (g, tp, p, b) not in impossible]
    dropped = tuple(f"{g} TP={tp} prompt={p} batch={b}" for g, tp, p, b in sorted(impossible))
    return Profile(tuple(points), dropped)


def _read_rows(path: Path) -> tuple[dict, dict]:
    prefill_ms: dict[tuple, list[float]] = defaultdict(list)
    decode_ms: dict[tuple, list[float]] = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            name = GPU_NAMES.get(row["hardware"])
            if row["model"] != "llama2-70b" or name is None:
                continue
            key = (name, int(row["tensor_parallel"]), int(row["prompt_size"]), int(row["batch_size"]))
            prefill_ms[key].append(float(row["prompt_time"]))
            decode_ms[key + (int(row["token_size"]),)].append(float(row["token_time"]))
    return prefill_ms, decode_ms


def _beats_peak(key: tuple, time_s: float) -> bool:
    gpu_name, tp, prompt_tokens, batch_size = key
    bound = Roofline(model(MODEL_NAME), gpu(gpu_name), _PEAK)
    return time_s < bound.compute_bound_s(prompt_tokens * batch_size, tp)
