"""The nominal task stream the planner's tau estimates run on (AMPD.md section 2,
[our choice]; docs/PLANNER.md, "The nominal stream").

Built once per workload, independent of any deployment:

- **pace**: every output token takes the ITL threshold (the slowest pace a deployment
  that meets the SLO allows, and one that needs no TP degree); a round lasts
  ``output_tokens`` x that, its first token's slot standing for the prefill;
- **prefill tasks**: one per round, ready at the session's arrival (round 0) or when
  its previous round's tool returns;
- **local prefills**: a share ``local_share`` of the tasks, spread evenly over the
  stream (task i is local when ``floor((i + 1)(1 - s)) == floor(i (1 - s))``), runs on
  the decode replicas and leaves the prefill stream; no randomness is involved;
- **chains**: each task knows its session's next round and the time from its first
  token to that round being ready (the rest of its decode at this pace, then the tool),
  so the prefill queue can delay later rounds as the simulator does (``queueing``);
- **decode load**: ``decode_load.DecodeLoad``, tabulated over paces;
- **window** (steady-state streams, AMPD.md section 6): the load (rates,
  utilisation, concurrency, KV) is read inside the measurement window and the
  P95s are over the sessions arriving in it, while the warm-up and drain around
  it still queue ahead of and behind them; without a window, the whole stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ampd.core.errors import InputError
from ampd.core.session import Session
from ampd.planner.decode_load import DecodeLoad, build_decode_load
from ampd.planner.rounds import RoundTable


@dataclass(frozen=True)
class NominalStream:
    """Every round's prefill in ready order, and the decode load.

    Attributes:
        ready_s, hist_tokens, new_tokens, session: shape (m,), one entry per round of
            every session, sorted by ready time (ties: session id, then round);
            ``session`` is the index of the round's session in the input.
        remote: shape (m,) bool; False for the tasks run locally on decode replicas.
        next_task: shape (m,), index of the session's next round, -1 after its last.
        after_s: shape (m,), from the task's first token to its next round being ready:
            ``(output_tokens - 1) x pace + tool_s``.
        local_share: the share of local tasks asked for.
        decode: the decode load over paces.
        window_s: (from, to), seconds: where the load is read.
        measured: shape (m,) bool; the tasks whose session arrived in the window
            (the P95s are over them).
    """

    ready_s: np.ndarray
    hist_tokens: np.ndarray
    new_tokens: np.ndarray
    session: np.ndarray
    remote: np.ndarray
    next_task: np.ndarray
    after_s: np.ndarray
    local_share: float
    decode: DecodeLoad
    window_s: tuple[float, float]
    measured: np.ndarray

    @property
    def span_s(self) -> float:
        """Seconds the load is read over (the window)."""
        return self.window_s[1] - self.window_s[0]

    @property
    def in_window(self) -> np.ndarray:
        """Shape (m,) bool: the tasks ready inside the window, ends included (at the
        nominal pace; without a window given, every task)."""
        return (self.ready_s >= self.window_s[0]) & (self.ready_s <= self.window_s[1])

    @property
    def prefills_per_s(self) -> float:
        """Prefill tasks per second in the window."""
        return int(self.in_window.sum()) / self.span_s


def build_stream(sessions: Sequence[Session], itl_s: float, local_share: float,
                 window_s: tuple[float, float] | None = None) -> NominalStream:
    """The nominal stream of ``sessions`` (module docstring) at ``itl_s`` per token,
    read inside ``window_s`` (default: from the first to the last ready time).

    Raises:
        InputError: ``local_share`` outside [0, 1) or leaving no remote prefill; fewer
            than 2 sessions or all arriving at once (no rate to plan for); a window
            no session arrives in.
    """
    if not 0.0 <= local_share < 1.0:
        raise InputError(f"local_share must be in [0, 1), got {local_share}")
    if len({s.arrival_s for s in sessions}) < 2:
        raise InputError("the planner needs at least 2 sessions with different arrival times to know the load")
    table = RoundTable.of(sessions)
    after_all_s = (table.output_tokens - 1) * itl_s + table.tool_s
    ready_all_s = table.accumulate(table.arrival_s, itl_s + after_all_s)
    # ready order; ties by session id, round, history, input, then input order (an id given twice)
    rank_of = {session_id: rank for rank, session_id in enumerate(sorted({s.session_id for s in sessions}))}
    id_rank = np.array([rank_of[s.session_id] for s in sessions], dtype=np.int64)
    order = np.lexsort((table.session, table.input_tokens, table.history_tokens, table.round_index,
                        id_rank[table.session], ready_all_s))
    position = np.empty(order.size, dtype=np.int64)
    position[order] = np.arange(order.size)
    following = np.append(position[1:], -1)
    next_task = np.where(table.is_last, -1, following)[order]
    ready_s, hist, new, session, after_s = (column[order] for column in (
        ready_all_s, table.history_tokens, table.input_tokens, table.session, after_all_s))
    index = np.arange(ready_s.size)
    remote = np.floor((index + 1) * (1.0 - local_share)) > np.floor(index * (1.0 - local_share))
    if not remote.any():
        raise InputError(f"local_share {local_share} leaves none of the {ready_s.size} prefills to prefill replicas")
    if window_s is None:
        measured = np.ones(ready_s.size, dtype=bool)
        read_s = (float(ready_s[0]), float(ready_s[-1]))
    else:
        measured = (table.arrival_s[session] >= window_s[0]) & (table.arrival_s[session] < window_s[1])
        if not measured.any():
            raise InputError(f"no session arrives in the planner's window {window_s[0]:.0f}-{window_s[1]:.0f} s")
        read_s = window_s
    return NominalStream(ready_s, hist, new, session, remote, next_task, after_s, local_share,
                         build_decode_load(table, itl_s, window_s), read_s, measured)

