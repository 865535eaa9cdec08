"""The one reader of a model or GPU as a user gives it (``[cluster] model`` / ``gpu``,
``--model`` / ``--gpu``): a catalog name, or a file describing one outside the catalog
(docs/PERF_MODEL.md section 2a). In a module of its own because the file readers build on
the catalog's spec classes."""

from __future__ import annotations

from pathlib import Path

from ampd.core.errors import InputError
from ampd.perf import catalog
from ampd.perf.catalog import GpuSpec, ModelSpec
from ampd.perf.gpu_file import gpu_from_toml
from ampd.perf.hf_config import model_from_hf_config


def resolve_model(name_or_path: str) -> ModelSpec:
    """The model ``name_or_path`` names: a catalog model (case-insensitive), else the
    Hugging Face ``config.json`` at that path (the file or its folder; relative to the
    working directory).

    Raises:
        InputError: a name neither in the catalog nor a path (the message lists the known
            names, closest first); any error of ``hf_config.model_from_hf_config``.
    """
    return _resolve(name_or_path, catalog.MODELS, catalog.model, model_from_hf_config,
                    "a Hugging Face config.json or its folder")


def resolve_gpu(name_or_path: str) -> GpuSpec:
    """The GPU ``name_or_path`` names: a catalog GPU (case-insensitive), else the TOML file
    of figures at that path (relative to the working directory).

    Raises:
        InputError: a name neither in the catalog nor a path (the message lists the known
            names, closest first); any error of ``gpu_file.gpu_from_toml``.
    """
    return _resolve(name_or_path, catalog.GPUS, catalog.gpu, gpu_from_toml, "a TOML file of its figures")


def _resolve(text: str, table: tuple, lookup, read, file_kind: str):
    # A catalog name wins over a file of the same name in the working directory, so a
    # configuration that names a catalog entry means the same wherever it runs.
    if str(text).strip().lower() in {entry.name.lower() for entry in table}:
        return lookup(text)
    if _looks_like_path(text):
        return read(text)
    try:
        return lookup(text)  # raises: not a catalog name
    except InputError as err:
        raise InputError(f"{err}; or a path to {file_kind}") from None


def _looks_like_path(text: str) -> bool:
    """A string that exists on disk or is written as a path (a folder separator or a file
    suffix: ``config.json``, ``l4.toml``), so that a missing file is reported as one, not as
    an unknown catalog name. Catalog names have neither."""
    path = Path(text)
    return path.exists() or "/" in text or "\\" in text or path.suffix.lower() in (".json", ".toml")
