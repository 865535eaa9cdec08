"""Run configurations for tests that start a cluster: a TOML file with free ports."""

import json
from pathlib import Path

from ampd.cluster.up import free_serve_ports


def write_run_config(path: Path, system: str, cluster: dict, workload: dict, serve: dict, engines: int = 2) -> Path:
    """Write ``system`` and the ``[cluster]``, ``[workload]`` and ``[serve]`` tables (flat
    values) to ``path``, with free ports for one coordinator, Redis and ``engines``
    engines in ``[serve]``; the path."""
    tables = {"cluster": cluster, "workload": workload,
              "serve": {**serve, **free_serve_ports(coordinators=1, engines=engines)}}
    lines = [f"system = {json.dumps(system)}"]  # a JSON string or number is a TOML one
    for name, values in tables.items():
        lines += [f"[{name}]", *(f"{key} = {json.dumps(value)}" for key, value in values.items())]
    path.write_text("\n".join(lines) + "\n")
    return path
