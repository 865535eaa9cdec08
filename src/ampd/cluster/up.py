"""``ampd up``: a whole local cluster from one configuration file: a Redis
server (when ``serve.redis_port`` is set), one engine server per worker of
``cluster.deployment`` (mock engines, or vLLM servers), and the coordinator
replicas; wait until every part answers, stop them all on exit.

Every part is a child process in its own process group, logging to
``<log_dir>/<name>.log``; a part that dies while starting is reported with the
end of its log.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from ampd.config import AUTO_DEPLOYMENT, EngineWorker, RunConfig, override
from ampd.core.deployment import Deployment, Role, WorkerSpec
from ampd.core.errors import InputError
from ampd.run.resolve import batching_for, perf_model_for, require_tp
from ampd.metrics.report import write_json
from ampd.cluster.redis_server import redis_command, wait_for_redis

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0


@dataclass
class Child:
    """A started part of the cluster, and how to start it again."""

    name: str
    process: subprocess.Popen
    log_path: Path
    argv: list[str]
    env: dict[str, str] | None = None
    health_url: str | None = None
    reported: bool = False


def free_port_block(count: int) -> int:
    """A port ``p`` such that ``p .. p + count - 1`` are all free on loopback now
    (for throwaway clusters: tests, benchmarks).

    Blocks come from below the OS's ephemeral range
    (``/proc/sys/net/ipv4/ip_local_port_range``; IANA's 49152-65535 where that file
    is missing): a port the OS hands out is also what every outgoing connection
    (an HTTP client, a Redis client) may be given as its local port between this
    check and the server's bind, which is how a CI run lost a test to "address
    already in use". Successive calls in one process return disjoint blocks, and
    processes start at different offsets (from the pid), so two clusters chosen
    before either binds do not collide.

    Raises:
        InputError: no free block below the ephemeral range.
    """
    global _next_port
    low, high = _PORT_FLOOR, _ephemeral_low() - count
    if high <= low:
        raise InputError(f"no room for {count} consecutive ports below the ephemeral range")
    span = high - low
    if _next_port is None:
        _next_port = low + (os.getpid() * 7919) % span
    for step in range(0, span, count):
        port = low + (_next_port - low + step) % span
        if all(_port_free(p) for p in range(port, port + count)):
            _next_port = port + count
            return port
    raise InputError(f"no {count} consecutive free ports found in {low}-{high + count - 1}")


# [our choice] above the registered services most machines run (databases, 8000s web servers).
_PORT_FLOOR = 10000
_next_port: int | None = None


def _ephemeral_low() -> int:
    """The first port of the OS's ephemeral range (49152, IANA's, where unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def free_serve_ports(coordinators: int = 2, engines: int = 32) -> dict[str, int]:
    """``serve`` fields for a throwaway local cluster on free ports: coordinators
    from ``port``, Redis on the next port, engines from ``base_port`` after that.

    Raises:
        InputError: no block of free ports found.
    """
    port = free_port_block(coordinators + 1 + engines)
    return {"port": port, "redis_port": port + coordinators, "base_port": port + coordinators + 1}


def _port_free(port: int) -> bool:
    """True when a server could listen on ``port`` now. SO_REUSEADDR, as every
    server started here sets it: connections of a stopped server lingering in
    TIME-WAIT do not keep its port (only a socket bound to it does)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LocalCluster:
    """Redis, engines and coordinators of one configuration on this machine.

    Args:
        config: the run configuration (``cluster.deployment`` may be ``auto``).
        log_dir: where logs and the resolved configuration go.
        coordinators: coordinator replicas to start (ports ``serve.port``, +1, ...).
        engines_timed_by: for mock engines, the configuration whose ``cluster`` (model,
            GPU, links, perf model) times them (default: ``config``): ``ampd validate``
            emulates hardware with the catalog's model while the coordinators route by
            a profile of it.

    Use as a context manager, or ``start()`` / ``stop()``.
    """

    def __init__(self, config: RunConfig, log_dir: str | Path, coordinators: int = 1,
                 engines_timed_by: RunConfig | None = None) -> None:
        if config.cluster.deployment == AUTO_DEPLOYMENT:
            # Only a deployment left to the planner loads it (and the simulator it refines
            # plans with); any other cluster starts without them.
            from ampd.run.planning import resolve_deployment
            config = resolve_deployment(config)
        self.config = config
        self.engines_timed_by = engines_timed_by or config
        # Before any engine starts: a profile may lack a TP the deployment asks for.
        perf = perf_model_for(self.config)
        for spec in self.specs():
            require_tp(perf, spec.tp, f"cluster.deployment {self.config.cluster.deployment!r}")
        self.log_dir = Path(log_dir)
        self.num_coordinators = coordinators
        self.children: list[Child] = []
        self.engines: dict[int, Child] = {}

    @property
    def urls(self) -> list[str]:
        """Base URLs of the coordinator replicas."""
        serve = self.config.serve
        return [f"http://{serve.host}:{serve.port + i}" for i in range(self.num_coordinators)]

    def specs(self) -> tuple[WorkerSpec, ...]:
        c = self.config.cluster
        return Deployment.parse(c.deployment).workers(c.num_gpus, c.gpus_per_server)

    def start(self) -> RunConfig:
        """Start everything and wait until it answers; the configuration the
        coordinators run (engine URLs and Redis filled in).

        Raises:
            InputError: a part died or stayed silent while starting (with its log's end).
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._check_ports()
        try:
            serve = self._start_redis()
            workers = [self._start_engine(spec) for spec in self.specs()]
            self.config = override(self.config, serve={**serve, "workers": workers})
            self._wait_healthy(list(self.engines.values()))
            config_path = self.log_dir / "config.json"
            write_json(config_path, self.config.model_dump(mode="json"))
            coordinators = [self._start_coordinator(config_path, i) for i in range(self.num_coordinators)]
            self._wait_healthy(coordinators)
        except BaseException:
            self.stop()
            raise
        return self.config

    def _ports(self) -> dict[int, str]:
        """Every port the cluster will listen on, and what for."""
        serve = self.config.serve
        ports: dict[int, list[str]] = {}
        for i in range(self.num_coordinators):
            ports.setdefault(serve.port + i, []).append(f"coordinator {i} (serve.port + {i})")
        if serve.redis_port:
            ports.setdefault(serve.redis_port, []).append("Redis (serve.redis_port)")
        for spec in self.specs():
            ports.setdefault(serve.base_port + spec.worker_id, []).append(
                f"engine {spec.worker_id} (serve.base_port + {spec.worker_id})")
        clashes = [" and ".join(users) for users in ports.values() if len(users) > 1]
        if clashes:
            raise InputError(f"ports clash: {'; '.join(clashes)} would listen on the same port")
        return {port: users[0] for port, users in ports.items()}

    def _check_ports(self) -> None:
        """Refuse to start when a port is taken: a stale server answering there
        would pass for a part of this cluster."""
        busy = [f"{port} ({user})" for port, user in self._ports().items() if not _port_free(port)]
        if busy:
            raise InputError(f"already in use: {', '.join(busy)}; stop what holds them or change the ports")

    def exited(self) -> list[Child]:
        """Parts that have stopped since they started (each reported once)."""
        gone = [c for c in self.children if c.process.poll() is not None and not c.reported]
        for child in gone:
            child.reported = True
        return gone

    def _spawn(self, name: str, argv: list[str], health_url: str | None = None,
               env: dict[str, str] | None = None) -> Child:
        log_path = self.log_dir / f"{name}.log"
        child = Child(name, _popen(argv, log_path, env, "w"), log_path, argv, env, health_url)
        self.children.append(child)
        return child

    def _start_redis(self) -> dict:
        port = self.config.serve.redis_port
        if not port:
            return {}
        child = self._spawn("redis", redis_command(port))
        url = f"redis://127.0.0.1:{port}/0"
        try:
            wait_for_redis(url, child.process)
        except InputError as err:
            raise InputError(f"{err}:\n{_tail(child.log_path)}") from None
        return {"redis_url": url}

    def _start_engine(self, spec: WorkerSpec) -> dict:
        serve, cluster = self.config.serve, self.engines_timed_by.cluster
        port = serve.base_port + spec.worker_id
        role = "prefill" if spec.role is Role.PREFILL else "decode"
        url = f"http://127.0.0.1:{port}"
        name = f"engine-{spec.worker_id}-{role}"
        if serve.engine == "mock":
            argv = [sys.executable, "-m", "ampd.engines.mock.server", "--role", role, "--worker-id",
                    str(spec.worker_id), "--tp", str(spec.tp), "--server", str(spec.server), "--port", str(port),
                    "--model", cluster.model, "--gpu", cluster.gpu, "--time-scale", str(serve.time_scale),
                    "--window-s", str(self.config.policy.window_s), "--seed", str(self.config.seed),
                    "--kv-fail-rate", str(serve.mock_kv_fail_rate), "--network-gb-per-s",
                    str(cluster.network_gb_per_s)]
            if cluster.nvlink_gb_per_s is not None:
                argv += ["--nvlink-gb-per-s", str(cluster.nvlink_gb_per_s)]
            if cluster.perf_model is not None:
                argv += ["--perf-model", cluster.perf_model]
            if spec.role is Role.DECODE:
                # The emulated decode engine batches local prefills as the simulator's
                # decode workers of this configuration do, and as the router estimates.
                batching = batching_for(self.engines_timed_by, perf_model_for(self.engines_timed_by))
                argv += ["--batching", batching.mode, "--chunk-tokens", str(batching.chunk_tokens)]
            child = self._spawn(name, argv, url)
        else:
            from ampd.engines import vllm_launch  # only real-engine clusters need it
            argv, env = vllm_launch.server_command(self.config, role, port, self.log_dir)
            child = self._spawn(name, argv, url, env)
        self.engines[spec.worker_id] = child
        return EngineWorker(url=url, role=role, tp=spec.tp, server=spec.server).model_dump()

    def _start_coordinator(self, config_path: Path, index: int) -> Child:
        port = self.config.serve.port + index
        argv = [sys.executable, "-m", "ampd.cli.main", "serve", "--config", str(config_path), "--port", str(port),
                "--replica-id", f"coordinator-{index}"]
        return self._spawn(f"coordinator-{index}", argv, f"http://{self.config.serve.host}:{port}")

    def _wait_healthy(self, children: list[Child]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        waiting = list(children)
        while waiting:
            child = waiting[0]
            if child.process.poll() is not None:
                # Code 0 with nothing logged: it returned without serving (e.g. a module run with -m
                # that never calls its main), not a crash.
                why = " before it served" if child.process.returncode == 0 else ""
                raise InputError(f"{child.name} exited while starting (code {child.process.returncode}{why}); "
                                 f"{child.log_path}:\n{_tail(child.log_path)}")
            if _healthy(child.health_url):
                waiting.pop(0)
            elif time.monotonic() > deadline:
                raise InputError(f"{child.name} not healthy after {START_TIMEOUT_S:g} s; "
                                 f"{child.log_path}:\n{_tail(child.log_path)}")
            else:
                time.sleep(0.1)

    def child(self, name: str) -> Child:
        """The part named ``name`` (``redis``, ``coordinator-0``, ``engine-2-decode``...).

        Raises:
            KeyError: no such part.
        """
        found = [c for c in self.children if c.name == name]
        if not found:
            raise KeyError(f"no part named {name!r}: {', '.join(c.name for c in self.children)}")
        return found[0]

    def kill(self, name: str) -> None:
        """Kill a part at once (SIGKILL): the fault tests' and benchmarks' failure."""
        child = self.child(name)
        _signal(child, signal.SIGKILL)
        child.process.wait()

    def restart(self, name: str) -> None:
        """Start a part that stopped again, same command and port (its log goes
        on), and wait until it answers.

        Raises:
            InputError: it is still running, or did not come back.
        """
        child = self.child(name)
        if child.process.poll() is None:
            raise InputError(f"{name} is still running")
        child.process = _popen(child.argv, child.log_path, child.env, "a")
        child.reported = False
        if child.name == "redis":
            wait_for_redis(self.config.serve.redis_url, child.process)
        else:
            self._wait_healthy([child])

    def stop(self) -> None:
        """Stop every part, newest first (coordinators, then engines, then Redis,
        so none outlives what it depends on): SIGTERM, then SIGKILL after a grace
        period."""
        for child in reversed(self.children):
            if child.process.poll() is None:
                _signal(child, signal.SIGTERM)
                try:
                    child.process.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    _signal(child, signal.SIGKILL)
                    child.process.wait()
        self.children.clear()
        self.engines.clear()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _popen(argv: list[str], log_path: Path, env: dict[str, str] | None, mode: str) -> subprocess.Popen:
    """A part in its own process group (stopped with everything it starts), logging to ``log_path``."""
    with log_path.open(mode) as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})


def _signal(child: Child, sig: int) -> None:
    try:
        os.killpg(child.process.pid, sig)
    except ProcessLookupError:
        pass


def _healthy(url: str | None) -> bool:
    if url is None:
        return True
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False
