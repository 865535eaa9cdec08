"""The layering rule of DESIGN.md section 2: inner layers never import outer ones,
and the policy layer does no I/O and reads no clock."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "ampd"
# What each layer may import from ampd (besides itself).
ALLOWED = {
    "core": set(),
    "perf": {"core"},
    "policy": {"core", "perf"},
    "planner": {"core", "perf", "policy"},
    "workload": {"core"},
    "metrics": {"core"},
    "sim": {"core", "perf", "policy", "metrics"},
    "measure": {"core", "perf", "metrics"},
    # the run pipeline: a configuration resolved (run.resolve), the simulator, the planner's adapter
    "run": {"core", "perf", "policy", "planner", "workload", "metrics", "sim", "measure", "config"},
    # engine clients and launch; the mock engine is the simulator's worker models behind vLLM's API
    "engines": {"core", "perf", "policy", "metrics", "config", "run"},
    "engines/mock": {"core", "perf", "policy", "metrics", "config", "run", "sim"},
    # the coordinator: the policies, never the simulator, the planner or the CLI
    "serve": {"core", "perf", "policy", "metrics", "workload", "config", "run", "engines"},
    "cluster": {"core", "perf", "policy", "metrics", "workload", "config", "run", "measure", "engines"},
}
# Inner rooms of a layer: each may import only the rooms after it in its list.
ROOMS = {
    "serve": ["build", "api", "coordinator", "upkeep", "rounds", "replica", "state"],
    "engines": ["local_vllm", "tiny_model", "mock", "nixl_warmup", "history_export", "vllm_launch", "client"],
}
# Layers that may load ``ampd.sim`` only through these modules of theirs.
SIM_FREE = {"serve": set(), "cluster": set(), "engines": {"engines.mock"}, "run": {"run.simulate", "run.runner",
            "run.planning", "run.plan_refine", "run.capacity_search", "run.sweep"}}
FORBIDDEN_IN_POLICY = {"time", "datetime", "os", "socket", "subprocess", "pathlib", "io", "requests", "httpx",
                       "redis", "asyncio", "shutil", "tempfile", "urllib"}


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _files(layer: str) -> list[Path]:
    return sorted((SRC / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_inner_layers(layer):
    """A folder of a layer with an entry of its own (``engines/mock``) follows that one instead."""
    bad = []
    top = layer.split("/")[0]
    for path in _files(layer):
        own = str(path.parent.relative_to(SRC))
        if own != layer and own in ALLOWED:
            continue
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "ampd" and len(parts) > 1 and parts[1] != top and parts[1] not in ALLOWED[layer]:
                bad.append(f"{path.relative_to(SRC)} imports {name}")
    assert not bad, "\n".join(bad)


def _room(layer: str, parts: list[str]) -> str | None:
    """The room of ``layer`` a module path (below the layer) is in; None for the layer's package itself."""
    name = parts[0].removesuffix(".py") if parts else None
    return name if name in ROOMS[layer] else None


@pytest.mark.parametrize("layer", sorted(ROOMS))
def test_rooms_import_only_the_rooms_after_them(layer):
    order = ROOMS[layer]
    assert {_room(layer, [p.name]) for p in (SRC / layer).iterdir() if p.name != "__init__.py"
            and not p.name.startswith("__")} == set(order), f"every module of {layer} is in one room of ROOMS"
    bad = []
    for path in _files(layer):
        room = _room(layer, list(path.relative_to(SRC / layer).parts))
        for name in _imports(path):
            parts = name.split(".")
            if parts[:2] != ["ampd", layer] or len(parts) < 3:
                continue
            other = _room(layer, parts[2:])
            if other is not None and other != room and order.index(other) < order.index(room):
                bad.append(f"{path.relative_to(SRC)} ({room}) imports {name} ({other})")
    assert not bad, "\n".join(bad)


def test_serving_never_loads_the_simulator():
    """A second method to the static rules: a fresh interpreter imports every
    module of the coordinator, the cluster launcher and the engines (the mock
    engine aside), and the run pipeline's resolver, and no module of
    ``ampd.sim`` or ``ampd.planner`` is loaded."""
    modules = [".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
               for layer, exempt in SIM_FREE.items() for path in _files(layer)
               if not any(".".join(path.relative_to(SRC.parent).parts[1:]).startswith(e) for e in exempt)]
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('ampd.sim', 'ampd.planner'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "ampd.serve.coordinator" in modules and "ampd.run.resolve" in modules
    assert loaded.strip() == "[]"


def test_policy_does_no_io_and_reads_no_clock():
    bad = []
    for path in _files("policy"):
        tree = ast.parse(path.read_text())
        for name in _imports(path):
            if name.split(".")[0] in FORBIDDEN_IN_POLICY:
                bad.append(f"{path.name} imports {name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("open", "print"):
                bad.append(f"{path.name} calls {node.func.id}()")
            # randomness only through a generator passed in, never the module's global one
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "random"
                    and node.attr != "Random"):
                bad.append(f"{path.name} uses random.{node.attr}")
    assert not bad, "\n".join(bad)


def test_test_files_are_named_after_the_folder_they_test():
    """README "Layout": ``tests/test_<package>_<what>.py``, <package> a folder of
    src/ampd (``config`` its module), or tools/; a few cut across."""
    across = {"agents", "bad", "docs", "layers"}
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and not p.name.startswith("__")} | {"config", "tools"}
    tests = Path(__file__).resolve().parent
    bad = [p.name for p in tests.glob("test_*.py") if p.stem.split("_")[1] not in packages | across]
    assert not bad, bad
