"""``ModelSpec`` and ``GpuSpec`` as JSON objects, so that a saved perf model needs no catalog
(format ``ampd.perf.alphabeta/2``, docs/PERF_MODEL.md section 5)."""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, fields

from ampd.core.errors import InputError
from ampd.perf.catalog import GpuSpec, ModelSpec


def spec_to_dict(spec: ModelSpec | GpuSpec) -> dict:
    """Every field of ``spec``, by name."""
    return asdict(spec)


def model_spec_from_dict(data: object) -> ModelSpec:
    """A ``ModelSpec`` from the object ``spec_to_dict`` writes; fields with a default
    (``num_experts``, ``experts_per_token``, ``bytes_per_param``) may be left out.

    Raises:
        InputError: a missing, unknown, mistyped or non-positive field, named as
            ``model.<field>``; more experts per token than experts, or more active
            parameters than parameters.
    """
    spec = _spec_from_dict("model", ModelSpec, data)
    if spec.experts_per_token > spec.num_experts:
        raise InputError(f"model.experts_per_token: {spec.experts_per_token} is more than num_experts "
                         f"({spec.num_experts})")
    if spec.active_params > spec.params:
        raise InputError(f"model.active_params: {spec.active_params} is more than params ({spec.params})")
    return spec


def gpu_spec_from_dict(data: object) -> GpuSpec:
    """A ``GpuSpec`` from the object ``spec_to_dict`` writes.

    Raises:
        InputError: a missing, unknown, mistyped or non-positive field, named as ``gpu.<field>``.
    """
    return _spec_from_dict("gpu", GpuSpec, data)


def _spec_from_dict(kind: str, cls: type, data: object):
    if not isinstance(data, dict):
        raise InputError(f"{kind}: expected an object with the {cls.__name__} fields, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise InputError(f"{kind}: unknown field {unknown[0]!r}; known: {', '.join(known)}")
    values = {}
    for name, f in known.items():
        if name not in data:
            if f.default is MISSING:
                raise InputError(f"{kind}: missing {name!r}")
            continue
        values[name] = check_field(f"{kind}.{name}", f.type, data[name])
    return cls(**values)


def check_field(where: str, type_name: str, value: object) -> object:
    """``value`` if it is of the field's type (``str``, ``int`` or ``float``: the
    annotations of the spec classes) and, for a number, finite and > 0 (every size,
    count and rate of a spec is). Also checks the fields of a Hugging Face
    ``config.json`` (``ampd.perf.hf_config``), so both inputs obey one rule.

    Raises:
        InputError: naming ``where``, the expected type and the value.
    """
    if type_name == "str":
        if not isinstance(value, str) or not value.strip():
            raise InputError(f"{where}: expected a non-empty string, got {value!r}")
        return value
    kinds = (int,) if type_name == "int" else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value <= 0:
        expected = "an integer" if type_name == "int" else "a number"
        raise InputError(f"{where}: expected {expected} > 0, got {value!r}")
    return value if type_name == "int" else float(value)
