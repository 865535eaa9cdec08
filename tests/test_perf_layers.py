"""``ampd.perf`` depends only on ``ampd.core`` (DESIGN.md section 2)."""

import ast
from pathlib import Path

import ampd.perf


def test_perf_imports_only_core_and_itself():
    for path in Path(ampd.perf.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                if name.startswith("ampd"):
                    assert name.startswith(("ampd.core", "ampd.perf")), f"{path.name} imports {name}"
