"""Running batches of simulation points, each one ``simulate`` of a resolved
configuration: in this process, on a process pool (the default, every core), or
on a Ray cluster (``ray_address``) when a sweep outgrows one machine.

Points are independent and deterministic, so where they run changes nothing in
their rows. With a cache folder, a point that ran before with the same
configuration and the same code is read back instead of simulated again; the
cache is read and written here, on the driver, so remote workers need no shared
disk.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

from ampd.config import RunConfig
from ampd.core.errors import InputError
from ampd.run.simulate import simulate


def _point(config_data: dict) -> dict:
    """One point's row, from a configuration in JSON form (what crosses process
    and machine boundaries)."""
    return simulate(RunConfig.model_validate(config_data)).row()


# What a point's row depends on: ``simulate`` and everything it imports (not the CLI,
# serving, the planner or the reports, which change no simulation).
_POINT_CODE = ("core", "perf", "policy", "workload", "metrics", "sim", "measure", "config.py", "run/resolve.py",
               "run/simulate.py", "run/slo_rule.py", "run/runner.py")


@functools.cache
def _code_digest() -> str:
    """A digest of the sources a point's row depends on (``_POINT_CODE``): a cached
    point is reused only by code that would produce it again."""
    root = Path(__file__).resolve().parent.parent
    sha = hashlib.sha256()
    for name in _POINT_CODE:
        for path in sorted((root / name).rglob("*.py")) if (root / name).is_dir() else [root / name]:
            sha.update(str(path.relative_to(root)).encode())
            sha.update(path.read_bytes())
    return sha.hexdigest()


class PointRunner:
    """Runs batches of configurations and returns their rows, in order.

    Args:
        jobs: parallel points on this machine (default: every core); 1 runs them
            in this process.
        progress: show a progress bar per batch.
        cache_dir: the point cache (None: no cache).
        ray_address: run on this Ray cluster instead (``ray.init(address=...)``:
            ``auto``, ``ray://host:10001``, or ``local`` to start one here with
            ``jobs`` CPUs); the nodes need ``ampd`` installed.

    Raises:
        InputError: ``ray_address`` given but the ``ray`` package is missing.
    """

    def __init__(self, jobs: int | None = None, progress: bool = True, cache_dir: Path | None = None,
                 ray_address: str | None = None) -> None:
        self.jobs, self.progress, self.cache_dir = jobs or os.cpu_count() or 1, progress, cache_dir
        self._ray_point = None
        if ray_address is not None:
            self._ray_point = _connect_ray(ray_address, self.jobs)
        if cache_dir is not None:
            cache_dir.mkdir(parents=True, exist_ok=True)

    def __call__(self, configs: Sequence[RunConfig]) -> list[dict]:
        data = [c.model_dump(mode="json") for c in configs]
        rows: list[dict | None] = [self._cached(d) for d in data]
        todo = [i for i, row in enumerate(rows) if row is None]
        bar = tqdm(total=len(configs), initial=len(configs) - len(todo), desc="simulating", unit="run",
                   disable=not self.progress)
        for k, row in self._run([data[i] for i in todo], bar):
            rows[todo[k]] = row
            self._store(data[todo[k]], row)
        bar.close()
        return rows

    def _run(self, data: list[dict], bar: tqdm) -> Iterator[tuple[int, dict]]:
        """Each point's index in ``data`` and its row, as each finishes, so the cache
        keeps every finished point when a later one fails or the batch is interrupted."""
        if self._ray_point is not None:
            import ray
            pending = {self._ray_point.remote(d): k for k, d in enumerate(data)}
            while pending:
                (done,), _ = ray.wait(list(pending), num_returns=1)
                bar.update()
                yield pending.pop(done), ray.get(done)
            return
        if self.jobs == 1 or len(data) <= 1:
            for k, d in enumerate(data):
                row = _point(d)
                bar.update()
                yield k, row
            return
        with ProcessPoolExecutor(min(self.jobs, len(data))) as pool:
            futures = {pool.submit(_point, d): k for k, d in enumerate(data)}
            for f in as_completed(futures):
                bar.update()
                yield futures[f], f.result()

    def _path(self, data: dict) -> Path:
        text = _code_digest() + json.dumps(data, sort_keys=True)
        return self.cache_dir / f"{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"

    def _cached(self, data: dict) -> dict | None:
        """The cached row, or None (also for a file an interrupted write or a disk
        error left unreadable: the point runs again and overwrites it)."""
        if self.cache_dir is None:
            return None
        try:
            return json.loads(self._path(data).read_text())["row"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _store(self, data: dict, row: dict) -> None:
        """Written atomically, so an interrupted sweep resumes from what finished."""
        if self.cache_dir is None:
            return
        path = self._path(data)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"config": data, "row": row}))
        tmp.replace(path)


def _connect_ray(address: str, jobs: int):
    """``_point`` as a Ray remote function on the cluster at ``address``."""
    try:
        import ray
    except ImportError:
        raise InputError("--ray needs the ray package: pip install 'ampd[ray]'") from None
    if not ray.is_initialized():
        options = {"num_cpus": jobs} if address == "local" else {}
        try:
            ray.init(address=address, include_dashboard=False, logging_level="ERROR", **options)
        except (ValueError, ConnectionError, RuntimeError) as err:
            raise InputError(f"--ray {address!r}: cannot connect to a Ray cluster there ({err})") from None
    return ray.remote(_point)
