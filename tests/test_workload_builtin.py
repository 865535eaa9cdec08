"""Shipped traces load by name; the workload package imports nothing but core."""

import ast
from pathlib import Path

import pytest

import ampd.workload
from ampd.core.errors import InputError
from ampd.workload import builtin_trace


def test_trtllm_builtin_holds_both_runs():
    django, matplotlib = sorted(builtin_trace("trtllm-swebench"), key=lambda s: s.session_id)
    assert django.session_id == "django__django-16801"
    assert [r.input_tokens for r in django.rounds] == [2426, 6881, 22, 225]
    # matplotlib: 23 assistant messages, first prompt 4320 tokens (SOURCE.md)
    assert (len(matplotlib.rounds), matplotlib.rounds[0].input_tokens) == (23, 4320)


def test_mooncake_builtin_loads():
    sessions = builtin_trace("mooncake-conversation")
    assert any(len(s.rounds) > 1 for s in sessions)
    assert sessions == sorted(sessions, key=lambda s: s.arrival_s)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(InputError, match="mooncake-conversation.*trtllm-swebench"):
        builtin_trace("sharegpt")


def test_workload_imports_only_core():
    package_dir = Path(ampd.workload.__file__).parent
    for file in package_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                if name.startswith("ampd"):
                    assert name.startswith(("ampd.core", "ampd.workload")), f"{file}: imports {name}"
