"""``load_perf_model``: the one reader of a perf model file given to ``--perf-model`` or
``[cluster] perf_model`` (docs/CONFIG.md): an alpha-beta model's JSON, or a profile's JSON
that holds one."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ampd.core.errors import AmpdError, InputError
from ampd.perf.model import AlphaBetaPerfModel

PROFILE_FORMAT = "ampd.profile/1"


def load_perf_model(path: str | Path) -> AlphaBetaPerfModel:
    """The performance model in the JSON file ``path``: either an alpha-beta model
    (``ampd.perf.alphabeta/1`` or ``/2``, ``AlphaBetaPerfModel.to_json``) or a profile
    (top-level ``"format": "ampd.profile/1"``) whose ``"perf_model"`` key holds one.

    Read once per file version (cached on the path, its modification time and size:
    a run asks for it at every step); the result is shared and must not be changed.

    Raises:
        InputError: the file cannot be read, is not JSON, is neither kind, or any error
            of ``AlphaBetaPerfModel.from_dict``; the message starts with the file.
        ImpossibleFitError: coefficients that give negative or non-monotone times.
    """
    try:
        stat = Path(path).stat()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the perf model: {exc.strerror or exc}") from None
    return _load(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int, size: int) -> AlphaBetaPerfModel:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the perf model: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object at the top, got {type(data).__name__}")
    if data.get("format") == PROFILE_FORMAT:
        data = data.get("perf_model")
        if not isinstance(data, dict):
            raise InputError(f"{path}: a profile ({PROFILE_FORMAT}) without a 'perf_model' object")
    try:
        return AlphaBetaPerfModel.from_dict(data)
    except AmpdError as exc:
        raise type(exc)(f"{path}: {exc}") from None
