"""Default SLO thresholds when a run does not set them.

The paper does not publish its thresholds (AMPD.md section 4). [our choice] Both
are multiples of an unloaded latency of the workload on a reference replica, so
they scale with model, GPU and prompt lengths:

- reference replica: TP = twice the smallest power-of-two degree whose GPUs hold
  the weights with room for KV (capped at 8), the size a deployment would use;
  with a model that lacks that degree (a profile measured at TP 1 alone, say), the
  largest degree below it that it has and that holds the weights;
- TTFT threshold = ``TTFT_FACTOR`` x the mean, over every round of the workload,
  of the unloaded prefill time ``T_pre(l_hist, l_incr)`` on that replica, plus
  a remote round's serving path on that replica (``perf.round_paths_s``: its two
  engine requests' and the serving stack's, where measured; 0 in a catalog
  model): a fixed latency no queue order removes, added once rather than
  scaled, so a slow API server neither makes every remote round miss nor earns
  a looser threshold; likewise, where a profile measured a remote round's engine
  requests (``ampd.perf.measured.RemotePath``), the mean over the workload's
  rounds of what those requests take unloaded beyond ``T_pre`` (the history
  export, the history read, the engines' scheduling, the join, with their
  serving paths: the round's floor on such engines; 0 in a catalog model, whose
  remote rounds add only KV transfers, as the paper's thresholds do not count;
  never below 0);
- ITL threshold = ``ITL_FACTOR`` x the decode-step time of a batch of
  ``REF_BATCH`` sequences of the workload's mean context on that replica.
"""

from __future__ import annotations

from ampd.core.deployment import Role, WorkerSpec
from ampd.core.errors import InputError
from ampd.core.session import Round, Session
from ampd.perf.interface import PerfModel
from ampd.policy.routing import SloThresholds

TTFT_FACTOR = 5.0
ITL_FACTOR = 1.5
REF_BATCH = 32
_DEGREES = (1, 2, 4, 8)


def reference_tp(perf: PerfModel) -> int:
    """TP of the reference replica (see module docstring).

    Raises:
        InputError: the model fits at no degree up to 8.
    """
    fitting = [tp for tp in _DEGREES if tp in perf.tps and perf.kv_capacity_tokens(tp) > 0]
    if not fitting:
        raise InputError(f"the model's weights fit on no replica of up to 8 GPUs among its TPs {list(perf.tps)}")
    return max(tp for tp in fitting if tp <= min(2 * fitting[0], _DEGREES[-1]))


def derive_slo(perf: PerfModel, sessions: list[Session]) -> SloThresholds:
    """Thresholds by the rule of the module docstring.

    Raises:
        InputError: no sessions, or the model fits nowhere.
    """
    if not sessions:
        raise InputError("cannot derive SLO thresholds from an empty workload")
    tp = reference_tp(perf)
    prefills = [perf.prefill_s(s.history_tokens(i), r.input_tokens, tp) for s, i, r in _rounds(sessions)]
    contexts = [s.history_tokens(i) + r.input_tokens + r.output_tokens / 2 for s, i, r in _rounds(sessions)]
    mean_context = sum(contexts) / len(contexts)
    floor_s = 0.0
    if perf.measured_remote_path(tp):
        # The reference replica's pair, on one server as a profile's engines are.
        pair = WorkerSpec(0, Role.PREFILL, tp, 0), WorkerSpec(1, Role.DECODE, tp, 0)
        floor_s = max(0.0, sum(sum(perf.remote_stages_s(s.history_tokens(i), r.input_tokens, *pair)) - prefill_s
                               for (s, i, r), prefill_s in zip(_rounds(sessions), prefills)) / len(prefills))
    ttft_s = TTFT_FACTOR * sum(prefills) / len(prefills) + sum(perf.round_paths_s(tp, tp)) + floor_s
    itl_s = ITL_FACTOR * perf.decode_step_s(REF_BATCH, int(REF_BATCH * mean_context), tp)
    return SloThresholds(ttft_s, itl_s)


def _rounds(sessions: list[Session]) -> list[tuple[Session, int, Round]]:
    return [(s, i, r) for s in sessions for i, r in enumerate(s.rounds)]
