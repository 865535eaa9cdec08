"""The colocated baselines' defining behaviour on tiny cases worked out by hand
(times from tests/stub_perf.py: prefill 1 ms/token, decode step 20 ms)."""

import pytest

from ampd.core import Deployment, Round, Session
from ampd.policy.reorder import Fcfs, ReturningFirst
from ampd.policy.routing import AlwaysLocalRouter
from ampd.sim.cluster import SimCluster, WorkerOptions
from ampd.sim.decode_worker import Batching
from stub_perf import StubPerf


def _run(sessions, batching="prefill-first", retention="lru", chunk=2048, capacity=1_000_000, queue=Fcfs(),
         pin_ttl_s=10.0):
    options = WorkerOptions(10.0, Batching(batching, chunk), retention, pin_ttl_s)
    cluster = SimCluster(Deployment.parse("D:<TP=1,DP=1>").workers(8), StubPerf(capacity), AlwaysLocalRouter(),
                         queue, options)
    return {s.session_id: s for s in cluster.run(sessions).sessions}


def test_prefill_first_runs_every_waiting_prefill_before_the_next_step():
    # A decodes from 1.0 (steps end 1.02, 1.04, ...). B and C arrive mid-step (1.03) with
    # 100-token prompts: both prefill 1.04-1.14-1.24 before the next step, so A's gap is
    # 0.02 + 0.1 + 0.1 = 0.22 (the alternate batching of AMPD's decode workers gives 0.12).
    a = Session("a", 0.0, (Round(1000, 5),))
    b, c = Session("b", 1.03, (Round(100, 2),)), Session("c", 1.03, (Round(100, 2),))
    runs = _run([a, b, c])
    assert list(runs["a"].rounds[0].itls_s) == pytest.approx([0.02, 0.02, 0.22, 0.02])
    assert runs["b"].rounds[0].first_token_s == pytest.approx(1.14)
    assert runs["c"].rounds[0].first_token_s == pytest.approx(1.24)
    alternate = _run([a, b, c], batching="alternate", retention="resident")
    assert list(alternate["a"].rounds[0].itls_s) == pytest.approx([0.02, 0.02, 0.12, 0.12])


def test_chunked_prefill_bounds_the_decode_gap_by_the_chunk():
    # Budget 64 tokens per step. A's 100-token prompt: chunks 64 + 36 -> first token 0.1.
    # B (200 tokens) arrives at 0.13; from the step ending 0.14 each step carries A's token and
    # 63 of B's (64 - batch of 1): 0.063 s each, until A's 5th token at 0.329; B's last 11
    # tokens run alone (0.011 s) -> B's first token at 0.340.
    a = Session("a", 0.0, (Round(100, 6),))
    b = Session("b", 0.13, (Round(200, 2),))
    runs = _run([a, b], batching="chunked", chunk=64)
    assert runs["a"].rounds[0].first_token_s == pytest.approx(0.1)
    assert list(runs["a"].rounds[0].itls_s) == pytest.approx([0.02, 0.02, 0.063, 0.063, 0.063])
    assert runs["b"].rounds[0].first_token_s == pytest.approx(0.340)
    assert max(runs["a"].rounds[0].itls_s) <= 0.064  # never the 0.2 s of B's whole prefill


def test_continuum_pinned_kv_avoids_the_recompute_plain_colocated_pays():
    # One replica of 1500 KV tokens. A: round 0 (1000 + 2 tokens) ends 1.02, tool 1 s, round 1 at 2.02.
    # B (1002 tokens) arrives 1.5, during A's tool call.
    a = Session("a", 0.0, (Round(1000, 2, 1.0), Round(100, 2)))
    b = Session("b", 1.5, (Round(1000, 2),))
    # vLLM (LRU prefix cache): B evicts A's idle KV; A's round 1 recomputes its 1002 history tokens.
    plain = _run([a, b], capacity=1500)
    a1 = plain["a"].rounds[1]
    assert (a1.recomputed_tokens, a1.hist_tokens, a1.new_tokens) == (1002, 0, 1102)
    assert plain["b"].rounds[0].first_token_s == pytest.approx(2.5)  # admitted at once: 1.5 + 1.0
    # Continuum (pinned 10 s): A's KV survives its tool call; B waits until A ends.
    pinned = _run([a, b], capacity=1500, retention="pinned", queue=ReturningFirst())
    a1 = pinned["a"].rounds[1]
    assert (a1.recomputed_tokens, a1.hist_tokens, a1.new_tokens) == (0, 1002, 100)
    # A round 1: prefill 0.1 s from 2.02, one step -> ends 2.14; then B: 1.0 s prefill -> 3.14.
    assert pinned["b"].rounds[0].first_token_s == pytest.approx(3.14)


def test_returning_sessions_go_first():
    from views import task
    from ampd.core import QueuedTask
    new = QueuedTask(task("new", round_index=0), 0.0, 0.1)
    returning = QueuedTask(task("back", round_index=2), 0.0, 0.1)
    d = ReturningFirst().pick([new, new, returning], 0.0)
    assert d.order == (2, 0, 1)
    assert ReturningFirst().pick([new, new], 0.0).order == (0,)
