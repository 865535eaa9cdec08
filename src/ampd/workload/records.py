"""Validating one parsed record with pydantic and turning failures into
``InputError`` messages of the form ``"<where>: <field>: <what is wrong>"``."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ampd.core.errors import InputError

Model = TypeVar("Model", bound=BaseModel)

_MAX_SHOWN_CHARS = 60


def input_error(where: str, field: str, what: str) -> InputError:
    """The project's error for one bad field: ``"<where>: <field>: <what>"``,
    ``where`` being ``"<file>:<line>"`` or ``"<file>: events[<i>]"``."""
    return InputError(f"{where}: {field}: {what}")


def parse_record(model: type[Model], data: object, where: str) -> Model:
    """Validate ``data`` against ``model``.

    Raises:
        InputError: naming ``where``, then every failing field with pydantic's
            reason and the offending value.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        raise InputError(f"{where}: {problems}") from exc


def _describe(error: dict) -> str:
    field = _field_path(error["loc"])
    if error["type"] == "missing":
        return f"{field}: missing"
    shown = repr(error.get("input"))
    if len(shown) > _MAX_SHOWN_CHARS:
        shown = shown[:_MAX_SHOWN_CHARS] + "..."
    return f"{field}: {error['msg']} (got {shown})"


def _field_path(loc: tuple) -> str:
    """``("rounds", 1, "input_tokens")`` -> ``"rounds[1].input_tokens"``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "record"
