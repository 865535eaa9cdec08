"""The documentation's examples run, so they cannot rot (issue 15): every
```python block of README.md and docs/*.md, each in a fresh namespace in a
scratch folder (a block that talks to a coordinator at ``COORDINATOR_URL`` gets
the cluster of configs/serve_mock.toml, started on free ports); and CONFIG.md's
configuration is one the code accepts."""

import json
import re
import tomllib
from pathlib import Path

import pytest

from ampd.config import RunConfig, SweepConfig, load_config, override
from ampd.policy.systems import SYSTEMS
from ampd.cluster.up import LocalCluster, free_serve_ports

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[tuple[str, str]]:
    """(``page:line``, code) of every fenced block in ``language`` on the pages."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) == language:
                found.append((f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}", m.group(2)))
    return found


PYTHON = blocks("python")
COORDINATOR_URL = "http://127.0.0.1:8000"  # where the docs' client examples find `ampd up`


@pytest.fixture(scope="module")
def mock_cluster(tmp_path_factory):
    """The documented mock cluster (configs/serve_mock.toml) on free ports: its
    coordinator's URL."""
    config, _ = load_config(ROOT / "configs" / "serve_mock.toml")
    with LocalCluster(override(config, serve=free_serve_ports(coordinators=1)), tmp_path_factory.mktemp("docs"),
                      coordinators=1) as cluster:
        yield cluster.urls[0]


def test_the_docs_have_python_examples():
    assert {where.split(":")[0] for where, _ in PYTHON} >= {"docs/PERF_MODEL.md", "docs/PLANNER.md"}


@pytest.mark.parametrize("code", [code for _, code in PYTHON], ids=[where for where, _ in PYTHON])
def test_python_block_runs(code, tmp_path, monkeypatch, request):
    monkeypatch.chdir(tmp_path)  # a block may write files (perf.json)
    if COORDINATOR_URL in code:
        code = code.replace(COORDINATOR_URL, request.getfixturevalue("mock_cluster"))
    exec(compile(code, "<doc block>", "exec"), {"__name__": "__doc_block__"})


def test_config_md_is_a_valid_configuration_naming_every_system():
    where, text = next((w, c) for w, c in blocks("toml") if w.startswith("docs/CONFIG.md"))
    data = tomllib.loads(text)
    SweepConfig.model_validate(data.pop("sweep"))
    RunConfig.model_validate(data)
    first, second = text.splitlines()[:2]  # `system = ...` and its comment's second line
    listed = " ".join(line.split("#", 1)[1] for line in (first, second)).replace("|", " ").split()
    assert sorted(listed) == sorted(SYSTEMS), where


def _refuse(constant: str):
    raise ValueError(f"{constant} is not JSON (a figure that does not exist is null)")


@pytest.mark.parametrize("path", sorted((ROOT / "bench" / "results").rglob("*.json")), ids=lambda p: p.name)
def test_bench_results_are_standard_json(path):
    # What the docs quote must load in any JSON reader: NaN and Infinity are Python's, not JSON's.
    json.loads(path.read_text(), parse_constant=_refuse)
