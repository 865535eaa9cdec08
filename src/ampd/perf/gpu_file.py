"""``gpu_from_toml``: a ``GpuSpec`` from a small TOML file of datasheet figures, for a GPU
outside the catalog (docs/PERF_MODEL.md section 2a; an example: configs/gpus/h100-pcie.toml)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from ampd.core.errors import InputError
from ampd.perf.catalog import GpuSpec
from ampd.perf.spec_json import gpu_spec_from_dict


def gpu_from_toml(path: str | Path) -> GpuSpec:
    """The GPU whose figures the TOML file ``path`` holds: top-level keys named as
    ``GpuSpec``'s fields (``name``, ``bf16_dense_tflops``, ``hbm_gb_per_s``, ``memory_gb``,
    ``nvlink_gb_per_s``), in the units their names and ``GpuSpec``'s docstring give.

    Checked by the same reader as the GPU a perf model file embeds
    (``spec_json.gpu_spec_from_dict``), so both accept exactly the same figures.

    Raises:
        InputError: the file cannot be read or is not TOML; a missing, unknown, mistyped or
            non-positive field. The message starts with the file and names the field,
            e.g. ``gpus/l4.toml: gpu: missing 'hbm_gb_per_s'``.
    """
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the GPU file: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from None
    try:
        return gpu_spec_from_dict(data)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
