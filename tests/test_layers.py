"""The layering rule of DESIGN.md section 2: inner layers never import outer ones,
and the policy layer does no I/O and reads no clock."""

import ast
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
    "measure": {"core", "perf", "metrics", "sim"},
    # serving drives the policies and (mock engines) the simulator's worker models; never the CLI
    "serve": {"core", "perf", "policy", "metrics", "sim", "workload", "config", "experiment", "planning", "measure"},
}
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
    bad = []
    for path in _files(layer):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "ampd" and len(parts) > 1 and parts[1] != layer and parts[1] not in ALLOWED[layer]:
                bad.append(f"{path.relative_to(SRC)} imports {name}")
    assert not bad, "\n".join(bad)


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
