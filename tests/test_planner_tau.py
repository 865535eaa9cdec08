"""The planner's tau estimates worked out by hand on tiny cases, with the round-number
performance model of ``stub_perf`` (prefill 1 ms per new token, decode step 20 ms,
KV transfer 10 us per token between two workers)."""

import numpy as np
import pytest

from ampd.core import Round, Session
from ampd.core.errors import InputError
from ampd.policy.batching import Batching, local_prefill
from ampd.perf import build_perf_model
from ampd.planner.decode_tau import _chunked_local_prefills, decode_cells, decode_replica
from ampd.planner.prefill_tau import _p95_s, prefill_cells
from ampd.planner.queueing import PrefillChains, fcfs_ttft_s
from ampd.planner.rounds import RoundTable
from ampd.planner.stream import build_stream
from ampd.planner.timeline import Steps, interval_events, others_seen, weighted_quantile
from queue_runs import listed
from stub_perf import StubPerf


def _one_round_sessions(arrivals_s, input_tokens, output_tokens):
    return [Session(f"s{i}", t, (Round(input_tokens, output_tokens),)) for i, t in enumerate(arrivals_s)]


def _independent(ready, compute, read=0.0, send=0.0):
    n = len(ready)
    return PrefillChains(ready, [read] * n, compute, [send] * n, [True] * n, [0.0] * n, [-1] * n)


def test_lindley_one_and_two_servers_by_hand():
    ready, compute = [0.0, 1.0, 1.5], [2.0, 2.0, 2.0]
    # one server: 0-2, 2-4, 4-6 -> TTFT 2, 3, 4.5
    assert listed(fcfs_ttft_s(_independent(ready, compute), 1))[:2] == ([2.0, 3.0, 4.5], True)
    # two servers: 0-2, 1-3, 2-4 -> TTFT 2, 2, 2.5
    assert listed(fcfs_ttft_s(_independent(ready, compute), 2))[:2] == ([2.0, 2.0, 2.5], True)
    # a 0.5 s history read before an idle server's compute, overlapped with a busy one's; 0.1 s back
    ttft, waited, _ = fcfs_ttft_s(_independent(ready, compute, read=0.5, send=0.1), 1)
    assert ttft == pytest.approx([2.6, 3.6, 5.1]) and waited  # computes 0.5-2.5, 2.5-4.5, 4.5-6.5
    assert listed(fcfs_ttft_s(_independent([0.0, 5.0], [1.0, 1.0]), 1))[:2] == ([1.0, 1.0], False)


def test_lindley_closed_over_a_session_and_local_tasks_by_hand():
    # task 0: 3 s from t = 0. Task 1 (session A, round 0) ready at 1, waits until 3, computes
    # 1 s: first token at 4; its round 1 (task 2) is ready 0.5 s later, at 4.5 (not at
    # 1 + 1 + 0.5), and runs at once: TTFT 1. Task 3 is local: its own 2 s, no queue.
    chains = PrefillChains([0.0, 1.0, 99.0, 2.0], [0.0] * 4, [3.0, 1.0, 1.0, 2.0], [0.0] * 4,
                           [True, True, True, False], [0.0, 0.5, 0.0, 0.0], [-1, 2, -1, -1])
    assert listed(fcfs_ttft_s(chains, 1)) == ([3.0, 3.0, 1.0, 2.0], True, [False, False, False, True])


def test_lindley_counts_the_serving_path_of_each_engine_request_by_hand():
    # The case above behind a 0.25 s serving path per engine request. Task 0 reaches the
    # replica at 0.25, computes to 3.25, first token 3.5 (TTFT 3.5). Task 1 reaches it at 1.25,
    # waits, computes 3.25-4.25, first token 4.5 (TTFT 3.5); its round 1 is ready at 5.0,
    # reaches the idle replica at 5.25, computes to 6.25: TTFT 1.5. Task 3, local: one
    # request and its 2 s: TTFT 2.25.
    chains = PrefillChains([0.0, 1.0, 99.0, 2.0], [0.0] * 4, [3.0, 1.0, 1.0, 2.0], [0.0] * 4,
                           [True, True, True, False], [0.0, 0.5, 0.0, 0.0], [-1, 2, -1, -1],
                           remote_paths_s=(0.25, 0.25), local_path_s=0.25)
    assert listed(fcfs_ttft_s(chains, 1)) == ([3.5, 3.5, 1.5, 2.25], True, [False, False, False, True])
    # The router model predicts two requests on top of the queue and the work, against 3.6 s:
    # task 0 predicts 3 + 0.5 = 3.5 and runs remotely as above. Task 1 predicts 2.25 queued +
    # 1 + 0.5 = 3.75 (3.25 without the requests: remote) and runs locally, one request and 1 s;
    # its round 1, ready at 1 + 1.25 + 0.5 = 2.75, predicts 0.5 + 1 + 0.5 = 2.0 and queues
    # remotely: reaches the replica at 3.0, computes 3.25-4.25, first token 4.5 (TTFT 1.75).
    routed = fcfs_ttft_s(chains, 1, local_above_s=3.6)
    assert listed(routed) == ([3.5, 1.25, 1.75, 2.25], True, [False, True, False, True])


def test_prefill_tau_by_hand():
    # 2000-token prompts: 2 s of prefill, no history to read, 2000 x 10 us = 20 ms back.
    stream = build_stream(_one_round_sessions([0.0, 1.0, 10.0], 2000, 2), 0.05, 0.0)
    cells = prefill_cells(stream, StubPerf(), 1, 3, 1.0, cross_server=False, scope="strict")
    # one-round sessions: a session's mean TTFT is its round's, so both scopes agree
    assert cells == prefill_cells(stream, StubPerf(), 1, 3, 1.0, cross_server=False, scope="mean")
    # one replica: 0-2, 2-4 (waited 1 s), 10-12 -> TTFT 2.02, 3.02, 2.02; P95 by linear
    # interpolation between the 2nd and 3rd smallest: 2.02 + 0.9 x 1.0 = 2.92
    assert cells[0].p95_s == pytest.approx(2.92) and cells[0].tau == pytest.approx(2.92)
    # two replicas: nobody waits; a third changes nothing
    assert [c.p95_s for c in cells[1:]] == pytest.approx([2.02, 2.02])
    assert [c.dp for c in cells] == [1, 2, 3] and all(c.kv_tokens == 0 for c in cells)


def test_prefill_cells_overloaded_when_work_reaches_capacity():
    # 6 s of prefill over a 2 s span: utilisation 3, 1.5, 1.0 (still overloaded), then 0.75
    stream = build_stream(_one_round_sessions([0.0, 1.0, 2.0], 2000, 2), 0.05, 0.0)
    cells = prefill_cells(stream, StubPerf(), 1, 4, 1.0, cross_server=False, scope="strict")
    assert [c.overloaded for c in cells] == [True, True, True, False]
    assert "3.00 x what 1 replica(s)" in cells[0].reason
    assert cells[3].p95_s == pytest.approx(2.02)


def test_prefill_p95_over_rounds_or_over_sessions_by_hand():
    ttft_s, session = np.array([1.0, 3.0, 2.0, 6.0]), np.array([0, 0, 1, 1])
    # rounds sorted 1, 2, 3, 6: position 0.95 x 3 = 2.85 -> 3 + 0.85 x 3
    assert _p95_s(ttft_s, session, "strict") == pytest.approx(5.55)
    # session means 2 and 4: 2 + 0.95 x 2
    assert _p95_s(ttft_s, session, "mean") == pytest.approx(3.9)


@pytest.mark.parametrize("scope", ["mean", "strict"])
def test_decode_tau_and_kv_by_hand_without_local_prefills(scope):
    # one session every 10 s, 100 + 51 tokens each: never two at once, so the batch is 1
    # and every gap is one 20 ms step; a session holds 151 tokens for 51 x 20 ms out of
    # every 10 s (> 5 % of the time), so the P95 resident KV is 151 tokens.
    stream = build_stream(_one_round_sessions([10.0 * i for i in range(11)], 100, 51), 0.05, 0.0)
    cells = decode_cells(decode_replica(stream, StubPerf(), 2), 2, 0.05, scope)
    assert [c.p95_s for c in cells] == pytest.approx([0.02, 0.02])
    assert [c.tau for c in cells] == pytest.approx([0.4, 0.4])
    assert [c.kv_tokens for c in cells] == [151, 76]


def test_decode_tau_by_hand_with_local_prefills():
    # 21 sessions in 1 s, half their 100-token prefills local (0.1 s each at 1 ms/token):
    # 21 prefills/s x 0.5 / k local prefills per second per replica.
    stream = build_stream(_one_round_sessions([0.05 * i for i in range(21)], 100, 51), 0.05, 0.5)
    one, two, three = decode_cells(decode_replica(stream, StubPerf(), 1), 20, 0.05, "strict")[:3]
    # k = 1: 10.5 prefills/s x 0.1 s = 1.05 of the replica: overloaded
    assert one.overloaded and "1.05 x the replica" in one.reason
    # k = 2: busy u = 0.525, mean gap 0.02 / 0.475; a gap holds a prefill with probability
    # 5.25 x 0.0421 = 0.22 > 5 %, so P95 = step + prefill = 0.12 s
    assert two.p95_s == pytest.approx(0.12) and three.p95_s == pytest.approx(0.12)
    # k = 20: 0.525 prefills/s, probability 0.525 x 0.02 / 0.9475 = 1.1 %: P95 = one step
    assert decode_cells(decode_replica(stream, StubPerf(), 1), 20, 0.05, "strict")[-1].p95_s == pytest.approx(0.02)
    # mean scope: the pauses spread over a session's tokens, mean gap 0.02 / (1 - u)
    means = decode_cells(decode_replica(stream, StubPerf(), 1), 3, 0.05, "mean")
    assert [c.p95_s for c in means[1:]] == pytest.approx([0.02 / 0.475, 0.02 / 0.65])


def test_decode_overloaded_when_no_batch_fits_the_kv_capacity():
    stream = build_stream(_one_round_sessions([0.05 * i for i in range(21)], 100, 51), 0.05, 0.0)
    cell = decode_cells(decode_replica(stream, StubPerf(capacity_tokens=100), 1), 1, 0.05, "mean")[0]
    assert cell.overloaded and "KV capacity" in cell.reason


def test_stream_by_hand():
    sessions = [Session("a", 0.0, (Round(10, 4, 1.0), Round(5, 2))),
                Session("b", 0.5, (Round(20, 3, 0.2), Round(7, 1)))]
    stream = build_stream(sessions, 0.1, 0.25)
    # a1 ready at 0 + 4 x 0.1 + 1.0 = 1.4; b1 at 0.5 + 3 x 0.1 + 0.2 = 1.0
    assert stream.ready_s.tolist() == pytest.approx([0.0, 0.5, 1.0, 1.4])
    assert stream.hist_tokens.tolist() == [0, 0, 23, 14] and stream.new_tokens.tolist() == [10, 20, 7, 5]
    assert stream.session.tolist() == [0, 1, 1, 0] and stream.next_task.tolist() == [3, 2, -1, -1]
    # after the first token: 3 more tokens and the 1 s tool (a0), 2 tokens and 0.2 s (b0)
    assert stream.after_s.tolist() == pytest.approx([1.3, 0.4, 0.0, 0.1])
    # local share 1/4: task i local when floor((i + 1) 3/4) == floor(i 3/4): task 0
    assert stream.remote.tolist() == [False, True, True, True]
    # decoded tokens see contexts 11, 12, 13 (a0), 21, 22 (b0), 20 (a1); b1 decodes nothing
    assert stream.decode.mean_context_tokens == pytest.approx(99 / 6)
    # at 0.1 s per token (the grid's top: 10 x the 0.01 s threshold) no two decodes
    # overlap, and the KV is 14 (0.8 s), 21 (0.2 s), 37 (0.5 s), 45 (0.1 s): P95 = 45
    at_top = build_stream(sessions, 0.01, 0.0).decode
    assert at_top.others_at(0.1) == 0.0 and at_top.session_others_p95_at(0.1) == 0.0
    assert at_top.kv_p95_tokens_at(0.1) == 45


def test_timeline_helpers_by_hand():
    # [0, 2] and [1, 3]: covered 1, 2, 1 over 1 s each; an instant of an interval sees
    # 0 others (weight 1 x 1 s), 1 (weight 2 x 1 s), 0 (1 x 1 s): mean 2 / 4
    others, weights = others_seen(Steps.of(*interval_events(np.array([0.0, 1.0]), np.array([2.0, 3.0]))))
    assert others.tolist() == [0.0, 1.0, 0.0] and weights.tolist() == [1.0, 2.0, 1.0]
    steps = Steps.of(np.array([2.0, 0.0, 3.0, 1.0]), np.array([-1.0, 1.0, -1.0, 1.0]))
    assert steps.times_s.tolist() == [0.0, 1.0, 2.0, 3.0] and steps.integral().tolist() == [0.0, 1.0, 3.0, 4.0]
    assert steps.integral_at_events().tolist() == [3.0, 0.0, 4.0, 1.0]
    # events at one time, in either order: the same positive-length intervals and integral
    for deltas in ([1.0, 1.0, -1.0, -1.0], [1.0, -1.0, 1.0, -1.0]):
        tied = Steps.of(np.array([0.0, 1.0, 1.0, 2.0]), np.array(deltas))
        assert [a.tolist() for a in tied.profile()] == [[1.0, 1.0], [1.0, 1.0]]
        assert tied.integral_at_events().tolist() == [0.0, 1.0, 1.0, 2.0]
    values, weights = np.array([3.0, 1.0, 2.0]), np.array([0.05, 0.9, 0.05])
    assert weighted_quantile(values, weights, 0.9) == 1.0
    assert weighted_quantile(values, weights, 0.95) == 2.0
    assert weighted_quantile(values, weights, 0.96) == 3.0


@pytest.mark.parametrize("sessions,share,message", [
    (_one_round_sessions([1.0, 1.0], 10, 2), 0.0, "different arrival times"),
    (_one_round_sessions([0.0, 1.0], 10, 2), 1.0, "local_share must be in [0, 1)"),
    (_one_round_sessions([0.0, 1.0], 10, 2), 0.6, "leaves none of the 2 prefills"),
])
def test_stream_refuses_what_it_cannot_plan_for(sessions, share, message):
    with pytest.raises(InputError) as err:
        build_stream(sessions, 0.05, share)
    assert message in str(err.value)


def _fcfs_by_hand(arrival_s, compute_s, after_s, next_task, opening, servers):
    """The FCFS queue by its definition, with no heap: the ready task of smallest (ready
    time, index) goes to the replica that frees first."""
    ready, free_s, ttft_s = {int(t): arrival_s[t] for t in opening}, [-np.inf] * servers, {}
    while ready:
        t = min(ready, key=lambda task: (ready[task], task))
        at_s = ready.pop(t)
        replica = min(range(servers), key=lambda i: free_s[i])
        free_s[replica] = max(at_s, free_s[replica]) + compute_s[t]
        ttft_s[t] = free_s[replica] - at_s
        if next_task[t] >= 0:
            ready[int(next_task[t])] = free_s[replica] + after_s[t]
    return [ttft_s[t] for t in range(len(arrival_s))]


@pytest.mark.parametrize("servers", [1, 3])
def test_the_compiled_queue_is_the_queue_by_definition(servers):
    # 40 sessions of 1-4 rounds on whole seconds, so ready times tie and the order between
    # equal ones (by task index) is exercised; the compiled recursion must give the same floats.
    rng = np.random.default_rng(7)
    rounds = rng.integers(1, 5, 40)
    first = np.concatenate([[0], np.cumsum(rounds)[:-1]])
    m = int(rounds.sum())
    next_task = np.arange(1, m + 1)
    next_task[first + rounds - 1] = -1
    arrival_s = np.repeat(rng.integers(0, 20, 40).astype(float), rounds)
    compute_s, after_s = rng.choice([0.5, 1.0, 2.0], m), rng.choice([0.0, 1.0, 3.0], m)
    chains = PrefillChains(arrival_s, np.zeros(m), compute_s, np.zeros(m), np.ones(m, dtype=bool), after_s, next_task)
    assert fcfs_ttft_s(chains, servers).ttft_s.tolist() == _fcfs_by_hand(arrival_s, compute_s, after_s, next_task,
                                                                           first, servers)


def test_the_round_table_reads_every_round_as_the_sessions_say():
    sessions = [Session("a", 1.0, (Round(10, 2, 0.25), Round(5, 3, 0.5), Round(7, 1))),
                Session("b", 0.5, (Round(4, 4),)), Session("c", 2.0, (Round(1, 1, 0.1), Round(2, 2)))]
    table = RoundTable.of(sessions)
    assert table.session.tolist() == [0, 0, 0, 1, 2, 2] and table.round_index.tolist() == [0, 1, 2, 0, 0, 1]
    assert table.history_tokens.tolist() == [s.history_tokens(i) for s in sessions for i in range(len(s.rounds))]
    assert table.is_last.tolist() == [False, False, True, True, False, True]
    # ready at pace 0: arrival plus the tools before, added one round at a time
    assert table.accumulate(table.arrival_s, table.tool_s).tolist() == [1.0, 1.0 + 0.25, 1.0 + 0.25 + 0.5, 0.5,
                                                                        2.0, 2.0 + 0.1]


@pytest.mark.parametrize("batch_size", [0, 1, 37, 2047, 2048])
def test_chunked_local_prefills_stepped_together_are_each_the_scalar_estimate(batch_size):
    # The planner steps its 50 representative prefills together; each must be exactly
    # what the router's scalar estimate gives for it alone.
    perf, batching = build_perf_model("Llama-3.1-70B", "H20"), Batching("chunked")
    hist, new = np.array([0, 1000, 50_000, 7]), np.array([1, 4000, 2047, 9000])
    together = _chunked_local_prefills(perf, 4, batching, hist, new, batch_size, 30_000)
    alone = [local_prefill(perf, 4, batching, h, x, batch_size, 30_000) for h, x in zip(hist.tolist(), new.tolist())]
    assert together == alone


def test_the_stream_orders_rounds_as_a_sort_of_their_rows():
    # Ready order, ties by session id, round, history, input, then input order: the same
    # rows sorted as tuples (a second method), ids given twice and equal times included.
    sessions = [Session("b", 0.0, (Round(10, 2, 1.0), Round(5, 1))), Session("a", 0.0, (Round(30, 1),)),
                Session("b", 0.0, (Round(10, 2, 0.0), Round(7, 1))), Session("c", 1.0, (Round(4, 1),)),
                Session("a", 3.01, (Round(1, 1),))]
    stream = build_stream(sessions, 0.005, 0.0)
    rows = []
    for i, s in enumerate(sessions):
        ready = s.arrival_s
        for r, rnd in enumerate(s.rounds):  # the first token's slot, the rest of the round, the tool
            rows.append((ready, s.session_id, r, s.history_tokens(r), rnd.input_tokens, i))
            ready += 0.005 + ((rnd.output_tokens - 1) * 0.005 + rnd.tool_s)
    rows.sort()
    assert list(zip(stream.ready_s.tolist(), stream.session.tolist(), stream.hist_tokens.tolist(),
                    stream.new_tokens.tolist())) == [(float(t), i, h, x) for t, _, _, h, x, i in rows]
