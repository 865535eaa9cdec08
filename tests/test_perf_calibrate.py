"""Calibration: reading the measured profile, refitting reproduces the shipped constants."""

import math
from dataclasses import astuple

import pytest

from ampd.perf.calibrate import CALIBRATED, efficiency_for, refit
from ampd.perf.splitwise import load_profile

HEADER = "model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,prompt_time,token_time,e2e_time,tensor_parallel\n"


def test_medians_and_filters_on_a_small_csv(tmp_path):
    path = tmp_path / "perf.csv"
    path.write_text(HEADER + "".join([
        "llama2-70b,h100-80gb,512,1,128,0,0,80,30,0,4\n",
        "llama2-70b,h100-80gb,512,1,128,0,0,90,31,0,4\n",
        "llama2-70b,h100-80gb,512,1,256,0,0,70,40,0,4\n",   # same prefill config, other generation
        "llama2-70b,h100-80gb-pcap,512,1,128,0,0,1,1,0,4\n",  # power-capped: left out
        "bloom-176b,h100-80gb,512,1,128,0,0,1,1,0,8\n",       # other model: left out
        # 64 x 512 tokens in 10 ms at TP2 beats 2 x 989.5 TFLOPS: impossible, both points dropped
        "llama2-70b,h100-80gb,512,64,128,0,0,10,50,0,2\n",
    ]))
    profile = load_profile(path)
    prefill = [p for p in profile.points if p.phase == "prefill"]
    decode = sorted((p for p in profile.points if p.phase == "decode"), key=lambda p: p.context_tokens)
    assert [(p.gpu, p.tp, p.batch_size, p.prompt_tokens, p.time_s) for p in prefill] == [("H100-SXM", 4, 1, 512, 0.080)]
    # decode context: 1 x (512 + 128/2) = 576 and 1 x (512 + 256/2) = 640; medians 30.5 ms and 40 ms
    assert [(p.context_tokens, p.time_s) for p in decode] == [(576, pytest.approx(0.0305)), (640, 0.040)]
    assert profile.dropped == ("H100-SXM TP=2 prompt=512 batch=64",)


def test_shipped_profile_drops_only_the_impossible_batch_64_runs():
    profile = load_profile()
    assert profile.dropped == ("A100-80GB TP=2 prompt=512 batch=64", "H100-SXM TP=2 prompt=512 batch=64")
    assert {p.gpu for p in profile.points} == {"A100-80GB", "H100-SXM"}
    assert {p.tp for p in profile.points} == {2, 4, 8}


def test_refit_reproduces_the_shipped_constants():
    fitted = refit()
    assert set(fitted) == set(CALIBRATED)
    for name, eff in fitted.items():
        for got, shipped in zip(astuple(eff), astuple(CALIBRATED[name])):
            # constants are rounded to 4 significant digits; times to the nanosecond
            assert math.isclose(got, shipped, rel_tol=1e-3, abs_tol=1e-9), (name, got, shipped)


def test_unmeasured_gpus_borrow_a_measured_efficiency():
    assert efficiency_for("h20") is CALIBRATED["H100-SXM"]
    assert efficiency_for("H200") is CALIBRATED["H100-SXM"]
    assert efficiency_for("L40S") is CALIBRATED["A100-80GB"]
    assert efficiency_for("A100-80GB") is CALIBRATED["A100-80GB"]
