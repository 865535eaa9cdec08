"""The tau table: tau_pre(n, k) and tau_dec(n, k) for every degree n and count k a
plan on N GPUs can use (AMPD.md section 2, [our choice]; docs/PLANNER.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ampd.core.errors import InputError
from ampd.core.session import Session
from ampd.perf.interface import PerfModel
from ampd.policy.batching import Batching
from ampd.planner.cells import TauCell
from ampd.planner.decode_tau import LocalLoad, decode_cells, decode_replica, mixed_decode_cells, spread_locals
from ampd.planner.prefill_tau import mixed_prefill_cells, prefill_cells, prefill_chains
from ampd.planner.stream import NominalStream, build_stream
from ampd.policy.routing import SloThresholds

DEGREES = (1, 2, 4, 8)
"""Tensor-parallel degrees the planner considers (AMPD.md section 2: T = {1, 2, 4, 8})."""

SCOPES = ("mean", "strict")
"""What a tau's P95 is over, as SLO attainment's scopes (AMPD.md section 1): ``mean``, over
sessions of their mean TTFT and mean ITL; ``strict``, over rounds (TTFT) and tokens (ITL),
the paper's P95 latency."""

AMPD_LOCAL_SHARE = 0.2
"""[our choice] Share of prefills AMPD's routing runs locally, inside the paper's 13.9-31.7 %
(AMPD.md section 3.1); plain PD disaggregation runs none."""


@dataclass(frozen=True)
class TauTable:
    """Every (role, n, k) cell a plan may use, each as if its k replicas carried the
    role's whole load (one degree per role; docs/PLANNER.md, "What a plan is").

    Attributes:
        prefill, decode: cells, by degree then count.
        slo: the thresholds the taus are normalised by.
        num_gpus, gpus_per_server: the cluster.
        local_share: share of prefills run locally on decode replicas.
        scope: what the P95s are over (``SCOPES``).
        degrees: degrees whose replica holds the weights and leaves room for the other role.
    """

    prefill: tuple[TauCell, ...]
    decode: tuple[TauCell, ...]
    slo: SloThresholds
    num_gpus: int
    gpus_per_server: int
    local_share: float
    scope: str
    degrees: tuple[int, ...]

    @property
    def cells(self) -> tuple[TauCell, ...]:
        """Prefill cells, then decode cells."""
        return self.prefill + self.decode


def usable_degrees(perf: PerfModel, num_gpus: int, gpus_per_server: int,
                   degrees: Sequence[int] = DEGREES) -> tuple[int, ...]:
    """Degrees a plan on ``num_gpus`` GPUs may use: among ``perf.tps`` (a profile has
    only the degrees it measured), at most one server, holding the weights with room
    for KV (``kv_capacity_tokens > 0``), and leaving room for one replica of the other
    role at the smallest such degree.

    Raises:
        InputError: ``num_gpus`` or ``gpus_per_server`` below 1; the weights fit at no
            degree; too few GPUs for one prefill and one decode replica.
    """
    if num_gpus < 1 or gpus_per_server < 1:
        raise InputError(f"num_gpus ({num_gpus}) and gpus_per_server ({gpus_per_server}) must be >= 1")
    offered = [n for n in degrees if n in perf.tps]
    fitting = sorted(n for n in offered if n <= gpus_per_server and perf.kv_capacity_tokens(n) > 0)
    if not fitting:
        raise InputError(f"the model does not fit in memory at any degree: no replica of "
                         f"{'/'.join(map(str, offered)) or 'no'} GPUs (at most {gpus_per_server}, one server; the "
                         f"performance model has TP={', '.join(map(str, perf.tps))}) holds its weights with room "
                         f"for KV cache")
    smallest = fitting[0]
    if 2 * smallest > num_gpus:
        raise InputError(f"too few GPUs: the smallest replica that holds the weights has {smallest} GPU(s), so one "
                         f"prefill and one decode replica need {2 * smallest}; the cluster has {num_gpus}")
    return tuple(n for n in fitting if n + smallest <= num_gpus)


@dataclass(frozen=True)
class TauSides:
    """The pieces a tau table is built from, so the co-design's fixed point
    (``codesign``) can rebuild the decode side for another local load.

    Attributes:
        stream: the nominal stream.
        perf, slo, num_gpus, gpus_per_server, scope, batching, mixed_degrees: as
            ``estimate_tau``'s.
        degrees: the usable degrees (``usable_degrees``).
    """

    stream: NominalStream
    perf: PerfModel
    slo: SloThresholds
    num_gpus: int
    gpus_per_server: int
    scope: str
    batching: Batching
    degrees: tuple[int, ...]
    mixed_degrees: bool = False

    def _max_dp(self, n: int) -> int:
        return (self.num_gpus - self.degrees[0]) // n

    def prefill(self, local_above_s: float = math.inf) -> tuple[TauCell, ...]:
        """Every prefill cell (``prefill_tau.prefill_cells``; ``local_above_s``: its router model),
        then, with ``mixed_degrees``, every two-degree one (``prefill_tau.mixed_prefill_cells``)."""
        cross_server = self.num_gpus > self.gpus_per_server
        chains = {n: prefill_chains(self.stream, self.perf, n, cross_server) for n in self.degrees}
        cells = tuple(c for n in self.degrees for c in prefill_cells(
            self.stream, self.perf, n, self._max_dp(n), self.slo.ttft_s, cross_server, self.scope, local_above_s,
            chains[n]))
        if not self.mixed_degrees:
            return cells
        return cells + tuple(mixed_prefill_cells(self.stream, self.perf, self.degrees, self.num_gpus - self.degrees[0],
                                                 self.slo.ttft_s, cross_server, self.scope, local_above_s, chains))

    def decode(self, local: LocalLoad) -> tuple[TauCell, ...]:
        """Every decode cell carrying the local prefills ``local`` (``decode_tau.decode_cells``),
        then, with ``mixed_degrees``, every two-degree one (``decode_tau.mixed_decode_cells``)."""
        replicas = [decode_replica(self.stream, self.perf, n, self.batching, local) for n in self.degrees]
        cells = tuple(c for r in replicas for c in decode_cells(r, self._max_dp(r.tp), self.slo.itl_s, self.scope))
        if not self.mixed_degrees:
            return cells
        return cells + tuple(mixed_decode_cells(replicas, self.num_gpus - self.degrees[0], self.slo.itl_s,
                                                self.scope))

    def table(self, prefill: tuple[TauCell, ...], decode: tuple[TauCell, ...], local_share: float) -> TauTable:
        """The table of these cells; ``local_share``: the share the decode side carries."""
        return TauTable(prefill, decode, self.slo, self.num_gpus, self.gpus_per_server, local_share, self.scope,
                        self.degrees)


def tau_sides(sessions: Sequence[Session], perf: PerfModel, slo: SloThresholds, num_gpus: int,
              gpus_per_server: int = 8, local_share: float = AMPD_LOCAL_SHARE, scope: str = "mean",
              degrees: Sequence[int] = DEGREES, window_s: tuple[float, float] | None = None,
              batching: Batching = Batching(), mixed_degrees: bool = False) -> TauSides:
    """The nominal stream of ``sessions`` (``stream.build_stream``, ``local_share`` of
    its tasks local) and what the cells need; arguments as ``estimate_tau``.

    Raises:
        InputError: as ``estimate_tau``.
    """
    if scope not in SCOPES:
        raise InputError(f"unknown scope {scope!r}; known: {', '.join(SCOPES)}")
    if not isinstance(mixed_degrees, bool):
        raise InputError(f"mixed_degrees must be True or False, got {mixed_degrees!r}")
    usable = usable_degrees(perf, num_gpus, gpus_per_server, degrees)
    stream = build_stream(sessions, slo.itl_s, local_share, window_s)
    return TauSides(stream, perf, slo, num_gpus, gpus_per_server, scope, batching, usable, mixed_degrees)


def estimate_tau(sessions: Sequence[Session], perf: PerfModel, slo: SloThresholds, num_gpus: int,
                 gpus_per_server: int = 8, local_share: float = AMPD_LOCAL_SHARE, scope: str = "mean",
                 degrees: Sequence[int] = DEGREES, window_s: tuple[float, float] | None = None,
                 batching: Batching = Batching(), mixed_degrees: bool = False) -> TauTable:
    """tau_pre(n, k) (``prefill_tau``) and tau_dec(n, k) (``decode_tau``) over the nominal
    stream of ``sessions`` (``stream``), for every usable degree n and every k with
    ``n k`` plus one smallest replica of the other role within ``num_gpus``, with a
    fixed share of local prefills (the router model's table: ``codesign``).

    Args:
        sessions: the workload, with arrival times (its rate is the load planned for).
        perf: cost functions of the model on the GPU type.
        slo: thresholds; tau = P95 / threshold (TTFT for prefill, ITL for decode).
        local_share: share of prefills the routing runs locally, in [0, 1):
            ``AMPD_LOCAL_SHARE`` for AMPD, 0 for plain PD disaggregation.
        scope: one of ``SCOPES``; plan in the scope attainment will be judged in.
        window_s: a steady-state stream's measurement window (``stream.build_stream``);
            None: the whole stream.
        batching: how the decode replicas' engine runs a local prefill (``decode_tau``);
            default the paper's pause.
        mixed_degrees: also the cells of two degrees, both roles (``decode_tau``, ``prefill_tau``, "Mixed
            degrees"); default one degree per role.

    Raises:
        InputError: as ``usable_degrees`` and ``stream.build_stream``; an unknown scope;
            ``mixed_degrees`` not a bool.
    """
    sides = tau_sides(sessions, perf, slo, num_gpus, gpus_per_server, local_share, scope, degrees, window_s,
                      batching, mixed_degrees)
    return sides.table(sides.prefill(), sides.decode(spread_locals(sides.stream)), local_share)
