"""A perf model file (format ``ampd.perf.alphabeta/2``) with round numbers, of a model and
a GPU the catalog does not have, profiled at TP 1 only, so that what runs on it can be
worked out by hand:

- prefill: 10 ms + 0.1 ms per new token (history free): 1,000 new tokens take 0.11 s;
- decode step: 20 ms whatever the batch;
- KV: 131,072 bytes per token (Llama-3.1-8B's shape: 2 x 32 layers x 8 KV heads x 128 x 2 bytes);
  measured link 1 ms + 1 ns per byte; 100,000 tokens of KV on a TP-1 replica;
- batching: chunked, 512 tokens a step;
- serving path: 5 ms per engine request;
- ``REMOTE_PATH`` (not in ``hand_model()``; a test adds it): a remote round's measured
  requests.
"""

from __future__ import annotations

import json
from pathlib import Path

MODEL = {"name": "my-8b", "num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128,
         "intermediate_size": 14336, "vocab_size": 128256, "params": 8_030_261_248, "active_params": 8_030_261_248}
GPU = {"name": "my-gpu", "bf16_dense_tflops": 100.0, "hbm_gb_per_s": 1000.0, "memory_gb": 40.0,
       "nvlink_gb_per_s": 100.0}

# A profile's remote round (ampd.profile.remote_probe): export 20 ms + 1 us per history token,
# the prefill engine's request 30 ms + 0.2 ms per new token + 10 us per history token read,
# the join 25 ms + 10 us per new token.
REMOTE_PATH = {"1": {"export": {"fixed_s": 0.02, "s_per_token": 1e-6},
                     "prefill": {"segments": {"breakpoints": [], "alpha_s": [0.03], "beta_s": [0.0002]},
                                 "gamma_s_per_pair": 0.0, "delta_s_per_hist_token": 1e-5},
                     "join": {"fixed_s": 0.025, "s_per_token": 1e-5}}}


def hand_model() -> dict:
    """The JSON object of the module docstring's model."""
    return {
        "format": "ampd.perf.alphabeta/2", "model": dict(MODEL), "gpu": dict(GPU),
        "tps": {"1": {"prefill": {"segments": {"breakpoints": [], "alpha_s": [0.01], "beta_s": [0.0001]},
                                  "gamma_s_per_pair": 0.0, "delta_s_per_hist_token": 0.0},
                      "decode": {"segments": {"breakpoints": [], "alpha_s": [0.02], "beta_s": [0.0]},
                                 "gamma_s_per_context_token": 0.0}}},
        "kv_capacity_tokens": {"1": 100_000},
        "kv_transfer": {"alpha_s": 0.001, "s_per_byte": 1e-9},
        "batching": {"mode": "chunked", "chunk_tokens": 512},
        "request_overhead_s": 0.005,
    }


def write_hand_model(path: Path, data: dict | None = None) -> Path:
    """``data`` (default: ``hand_model()``) written as JSON to ``path``; returns ``path``."""
    path.write_text(json.dumps(data if data is not None else hand_model()))
    return path
