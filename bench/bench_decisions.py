"""Decision time of the policies, in microseconds: Algorithm 1 (routing) and
Algorithm 2 (reordering, w = 3), on a 32-GPU cluster view with loaded queues.
The paper reports 0.39 ms per routing and 0.45 ms per reorder (AMPD.md 3.1, 3.2).

Run: ``python bench/bench_decisions.py`` -> ``bench/results/decisions.json``.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.core import ClusterView, Deployment, PrefillTask, QueuedTask, Role, WorkerView  # noqa: E402
from ampd.perf import build_perf_model  # noqa: E402
from ampd.policy.reorder import TtftAwareReorder  # noqa: E402
from ampd.policy.routing import AdaptiveRouter, PredictiveRouter, SloThresholds  # noqa: E402

DEPLOYMENT = "P:<TP=4,DP=4> D:<TP=8,DP=2>"
QUEUE_LENGTH = 8
REPEATS = 20_000


def _view(rng: random.Random, busy_ttft_s: float) -> ClusterView:
    """Every prefill worker's window over the alpha threshold, so routing reaches step 3."""
    workers = []
    for spec in Deployment.parse(DEPLOYMENT).workers(32):
        queue = tuple(QueuedTask(PrefillTask(f"q{spec.worker_id}-{i}", 1, 4000, 600, -rng.random(), 0),
                                 0.0, rng.uniform(0.1, 1.0)) for i in range(QUEUE_LENGTH))
        if spec.role is Role.PREFILL:
            workers.append(WorkerView(spec, queue, 0.3, busy_ttft_s, None))
        else:
            workers.append(WorkerView(spec, queue[:2], 0.02, None, 1.0, 10**6, 10**5))
    return ClusterView(tuple(workers))


def _time_us(fn, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    rng = random.Random(0)
    perf = build_perf_model("Llama-3.1-70B", "H20")
    slo = SloThresholds(3.0, 0.06)
    task = PrefillTask("s", 2, 8000, 700, 0.0, 4)  # worker 4: the first decode replica
    view = _view(rng, busy_ttft_s=10.0)
    routers = {"adaptive": AdaptiveRouter(perf, slo, random.Random(1)),
               "predictive": PredictiveRouter(perf, slo, random.Random(1))}
    figures = {f"route_{name}_step3_us": _time_us(lambda r=r: r.route(task, view, 0.0), REPEATS)
               for name, r in routers.items()}
    figures["route_adaptive_step1_us"] = _time_us(
        lambda: routers["adaptive"].route(task, _STEP1_VIEW, 0.0), REPEATS)
    queue = view.workers[0].queue
    reorder = TtftAwareReorder(slo.ttft_s, window=3)
    figures["reorder_w3_us"] = _time_us(lambda: reorder.pick(queue, 0.5), REPEATS)
    reorder5 = TtftAwareReorder(slo.ttft_s, window=5)
    figures["reorder_w5_us"] = _time_us(lambda: reorder5.pick(queue, 0.5), REPEATS // 10)
    for k, v in figures.items():
        print(f"{k}: {v:.1f} us")
    write_result("decisions", {"deployment": DEPLOYMENT, "queue_length": QUEUE_LENGTH,
                               "paper_route_us": 390, "paper_reorder_us": 450, **figures})


_STEP1_VIEW = _view(random.Random(2), busy_ttft_s=0.5)

if __name__ == "__main__":
    main()
