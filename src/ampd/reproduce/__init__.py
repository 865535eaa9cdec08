"""``ampd reproduce``: the paper's evaluation (AMPD.md section 4) in the simulator:
the models x workloads grid, every baseline on its best deployment, the latency
breakdown, the ablation, the local share, and the sensitivity to w, alpha and beta."""
