"""``ampd profile`` on mock engines whose cost model is known: the profiler must give it
back. The truth is the mock's own performance model (the simulator's catalog model);
each fitted function is compared with it on sizes the profile never probed."""

import asyncio
import contextlib
import json
import socket

import httpx
import numpy as np
import pytest

from app_server import serving

from ampd.cli.main import main
from ampd.cli.profile import QUICK_GRID
from ampd.core.deployment import Role, WorkerSpec
from ampd.core.errors import InputError
from ampd.perf.catalog import gpu, model
from ampd.perf.model import AlphaBetaPerfModel
from ampd.perf.perf_file import load_perf_model
from ampd.profile.decode_load import DecodeLoad
from ampd.profile.decode_probe import DecodePoint, MixedPoint, chunk_budget_tokens
from ampd.profile.engine import ProbedEngine, connect
from ampd.profile.overhead_probe import PROBE_PROMPT_TOKENS, OverheadPoint, measure_overhead
from ampd.profile.fit import fit_kv_points, fit_prefill_points, mape, medians, repeat_spread, split
from ampd.profile.remote_probe import RemotePoint
from ampd.profile.prefill_probe import PrefillPoint, measure_prefill
from ampd.profile.profile_file import profile_document
from ampd.profile.run import Measurements, ProfileGrid, batching, fit, fit_remote, remote_paths_s, run
from ampd.profile.scrape import ProbeError
from ampd.engines.mock.engine import EngineOptions
from ampd.engines.mock.server import create_app

# [our choice] Half speed: a 48-token decode probe lasts about half a wall second, long
# enough that a client slowed by a loaded machine still reads its window mid-stream.
MOCK = dict(model="Llama-3.1-8B", gpu="H100-SXM", time_scale=0.5)
GRID = ProfileGrid(repeats=1, warmup=1)
# Sizes between and beyond the probe grid's (within its range).
CHECK_PREFILL = [(h, n) for h in (0, 300, 1500) for n in (20, 100, 700, 1800)]
CHECK_DECODE = [(b, b * per_seq) for b in (1, 3, 6, 12) for per_seq in (200, 800)]
CHECK_KV_TOKENS = (100, 700, 1500)


@contextlib.contextmanager
def _mock_pair(batching: str = "alternate", chunk_tokens: int = 2048):
    prefill = create_app(EngineOptions(Role.PREFILL, 0, 1, **MOCK))
    decode = create_app(EngineOptions(Role.DECODE, 1, 1, batching=batching, chunk_tokens=chunk_tokens, **MOCK))
    with serving(prefill) as p, serving(decode) as d:
        yield p, d, decode.state.engine.perf


@pytest.fixture(scope="module")
def alternate_profile():
    with _mock_pair() as (p, d, perf):
        yield run(d, p, GRID, seed=0, show_progress=False), perf


def _truth_mape(fitted, truth, args) -> float:
    return float(np.mean([abs(fitted(*a) / truth(*a) - 1) for a in args]))


def test_the_profile_recovers_the_mocks_cost_model_within_5_percent(alternate_profile):
    (points, prints, fits), perf = alternate_profile
    prefill = _truth_mape(fits["prefill"].cost, lambda h, n: perf.prefill_s(h, n, 1), CHECK_PREFILL)
    decode = _truth_mape(fits["decode"].cost, lambda b, c: perf.decode_step_s(b, c, 1), CHECK_DECODE)
    src, dst = WorkerSpec(0, Role.PREFILL, 1, 0), WorkerSpec(1, Role.DECODE, 1, 0)
    kv = _truth_mape(fits["kv"].cost, lambda b, _: perf.kv_transfer_s(b // perf.kv_bytes_per_token, src, dst),
                     [(t * perf.kv_bytes_per_token, 0) for t in CHECK_KV_TOKENS])
    assert prefill < 0.05 and decode < 0.05 and kv < 0.05, (prefill, decode, kv)
    assert fits["kv_bytes_per_token"] == perf.kv_bytes_per_token
    # The mock's prefix hits are exact: every probe's history came from the cache.
    assert {p.hist_tokens for p in points.prefill} == set(GRID.hist_tokens)
    assert prints["decode_engine"]["engine"] == "ampd-mock"
    assert prints["decode_engine"]["num_gpu_blocks"] == perf.kv_capacity_tokens(1)


def test_the_serving_path_is_timed_under_a_decode_load_each_reading_its_own_request(alternate_profile):
    # GRID's serving load: the mock decode engine streams 4 sequences while the serving-path
    # probes run. The engine pauses its batch for a prefill (alternate) once the step in
    # flight ends, so a probe's TTFT is its own 16-token prefill plus at most one step of the
    # load's batch (its context at most 4 x (512 + 1,000) tokens). Another request's first
    # token in the reading (the load's warm-ups, a 512-token prefill each) would exceed that.
    (points, _, _), perf = alternate_profile
    load = GRID.serving_load_batch
    prefill_s = perf.prefill_s(0, PROBE_PROMPT_TOKENS, 1)
    step_s = perf.decode_step_s(load, load * (GRID.serving_load_prompt_tokens + GRID.serving_load_output_tokens), 1)
    assert load == 4 and len(points.overhead) == GRID.overhead_probes
    for point in points.overhead:
        assert prefill_s - 1e-9 <= point.engine_ttft_s <= prefill_s + step_s
    # The load was there: a probe meets a step in flight (on an idle engine the TTFT is the
    # prefill exactly, test_the_serving_path_of_a_request_is_what_the_client_waits_beyond...).
    assert max(point.engine_ttft_s for point in points.overhead) > prefill_s * 1.01


def test_mock_engines_share_no_compute_so_the_profile_finds_no_neighbour_slowdown(alternate_profile):
    # Two mock engines are two simulated workers that share nothing: a decode batch's steps are
    # the model's whether the prefill engine computes or not, so the factor is 1 (and the
    # neighbour did compute: it finished prefills while the busy batch ran).
    (points, _, fits), perf = alternate_profile
    assert len(points.neighbour) == GRID.repeats
    for point in points.neighbour:
        assert point.neighbour_prefills >= 1
        assert (point.batch_size, point.prompt_tokens, point.prefill_tokens) == (4, 512, 1024)
    assert fits["shared_host"]["decode_step_factor"] == 1.0
    doc = profile_document(points, {"decode_engine": {}, "prefill_engine": {}}, fits, model("Llama-3.1-8B"),
                           gpu("H100-SXM"), 1, GRID, 0)
    assert doc["perf_model"]["shared_host"] == {"decode_step_factor": 1.0}
    assert doc["fit_report"]["shared_host"]["decode_step_factor"] == 1.0


def test_an_engine_that_stops_answering_is_named_with_the_timeout_waited():
    def frozen(request):
        raise httpx.ReadTimeout("", request=request)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(frozen)) as client:
            engine = ProbedEngine("http://frozen", "m", client, np.random.default_rng(0), request_timeout_s=300.0)
            await engine.complete([1, 2, 3], 1, "s")

    with pytest.raises(ProbeError, match=r"http://frozen/v1/completions: no reply within 300 s: the engine stalled"):
        asyncio.run(go())


def test_a_decode_load_that_cannot_run_fails_the_probe_waiting_on_it_instead_of_hanging():
    # An engine that answers /metrics but fails every completion: the load's warm-up
    # requests fail, and the probe waiting for the load to stream is told why, never run.
    def engine(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text="")
        return httpx.Response(500, text="engine down")
    ran = []

    async def probe():
        ran.append(1)

    async def attempt():
        async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
            load = DecodeLoad(ProbedEngine("http://engine", "m", client, np.random.default_rng(0)), 2, 16, 32)
            async with load.running():
                return await load.inside(probe)

    with pytest.raises(ProbeError, match="the decode load failed: .*HTTP 500: engine down"):
        asyncio.run(attempt())
    assert not ran


def test_a_decode_engine_that_pauses_for_a_local_prefill_is_told_apart_from_one_that_chunks(alternate_profile):
    (_, _, fits), _ = alternate_profile
    assert fits["batching"]["mode"] == "alternate"
    assert fits["batching"]["num_probes"] == 1  # one step at the largest size: nothing to search
    grid = ProfileGrid(hist_tokens=(0,), new_tokens=(64, 256, 1024), batch_sizes=(1, 2, 4), decode_prompt_tokens=(128,),
                       kv_tokens=(), repeats=1, warmup=0, decode_output_tokens=64,
                       serving_load_batch=0)  # the batching alone: no serving path under load
    # Slowed to 2 wall s per model s: a chunk's extra ~40 ms of wall time stands well
    # above the jitter of a busy machine.
    decode = create_app(EngineOptions(Role.DECODE, 1, 1, batching="chunked", chunk_tokens=512,
                                      **{**MOCK, "time_scale": 2.0}))
    with serving(decode) as d:
        _, _, chunked = run(d, None, grid, seed=1, show_progress=False)
    # Under a 512-token budget 4 decoding sequences leave 508 tokens a step for the
    # prefill: the search finds 508 as the largest one-step prefill (to within 1.6 %).
    assert chunked["batching"]["mode"] == "chunked"
    assert 500 <= chunked["batching"]["chunk_tokens"] - 4 <= 508
    assert chunked["kv"] is None


def test_the_serving_path_of_a_request_is_what_the_client_waits_beyond_the_engines_ttft():
    # Every request waits 0.4 model s (0.2 wall s at half speed) before the mock engine takes
    # it in: outside the engine's TTFT counter, as a real API server's own work is. The
    # engine's TTFT of the probe is its model's prefill of the probe's 16 tokens on an idle
    # engine, exactly; the serving path is at least the wait, in model seconds (a client
    # clock left in wall seconds would read about half of it).
    decode = create_app(EngineOptions(Role.DECODE, 1, 1, api_delay_s=0.4, **MOCK))

    async def probes():
        async with httpx.AsyncClient() as client:
            engine, _ = await connect(d, client, np.random.default_rng(0))
            return [await measure_overhead(engine) for _ in range(3)]

    with serving(decode) as d:
        points = asyncio.run(probes())
    prefill_s = decode.state.engine.perf.prefill_s(0, PROBE_PROMPT_TOKENS, 1)
    for point in points:
        assert point.engine_ttft_s == pytest.approx(prefill_s)
        assert point.overhead_s >= 0.4 and point.overhead_s == point.client_ttft_s - point.engine_ttft_s


def test_chunk_budget_is_the_largest_one_step_prefill_plus_the_batch():
    def probe(new_tokens, steps):
        return MixedPoint(4, new_tokens, 0.01, 0.025, steps)
    assert chunk_budget_tokens([probe(3072, 7), probe(1536, 4), probe(768, 2), probe(384, 1), probe(576, 2),
                                probe(480, 1), probe(528, 2), probe(504, 1)]) == 504 + 4
    assert chunk_budget_tokens([probe(3072, 1)]) is None  # one step: a pause, or a budget above 3072
    assert chunk_budget_tokens([]) is None


def test_a_budget_the_engine_was_started_with_is_taken_when_the_probe_sees_chunks():
    def probe(new_tokens, steps):
        return MixedPoint(4, new_tokens, 0.01, 0.025, steps)
    # 3,072 tokens beside 4 sequences under a 512-token budget: ceil(3072 / 508) = 7 steps.
    assert batching([probe(3072, 7)], known_chunk_tokens=512) == {
        "mode": "chunked", "chunk_tokens": 512, "chunk_tokens_from": "engine configuration",
        "largest_probe_tokens": 3072, "num_probes": 1, "probes_in_several_steps": 1}
    # Repeated probes vote: 2 chunks under a 2,048-token budget seen twice of three times is
    # chunked; once of three is a pause; a tie goes to the engine's configuration.
    assert batching([probe(3072, 2), probe(3072, 1), probe(3072, 2)], known_chunk_tokens=2048)["mode"] == "chunked"
    assert batching([probe(3072, 1), probe(3072, 2), probe(3072, 1)], known_chunk_tokens=2048)["mode"] == "alternate"
    assert batching([probe(3072, 1), probe(3072, 2)], known_chunk_tokens=2048)["mode"] == "chunked"
    assert batching([probe(512, 1), probe(8192, 5), probe(4096, 3)], known_chunk_tokens=2048)[
        "largest_probe_tokens"] == 8192
    # What the engine did wins over what it was said to run: one step is a pause.
    assert batching([probe(3072, 1)], known_chunk_tokens=512)["mode"] == "alternate"
    assert batching([probe(3072, 7), probe(1536, 4), probe(504, 1)])["chunk_tokens_from"] == "search"
    with pytest.raises(InputError, match="chunk_tokens"):
        ProfileGrid(chunk_tokens=4)
    with pytest.raises(InputError, match="serving_load_batch"):
        ProfileGrid(serving_load_batch=-1)


def test_breakpoints_are_found_where_the_slope_changes():
    # 2 ms + 0.01 ms per token up to 512 tokens, then 0.04 ms per extra token: the kink
    # a chunked prefill makes when a second chunk starts.
    def t_s(n):
        return 0.002 + 1e-5 * min(n, 512) + 4e-5 * max(0, n - 512)
    sizes = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
    samples = [(0, n, t_s(n)) for n in sizes for _ in range(2)]
    fit = fit_prefill_points(samples, np.random.default_rng(0))
    assert 512 in fit.breakpoints
    assert fit.held_out_mape < 1e-3 and fit.num_held_out == len(sizes) // 4


def test_repeats_reduce_to_their_median_and_a_quarter_is_held_out():
    samples = [(0, 8, 1.0), (0, 8, 9.0), (0, 8, 2.0), (1, 8, 3.0)]
    assert medians(samples) == [(0, 8, 2.0), (1, 8, 3.0)]
    train, held = split([(i, 0, 1.0) for i in range(8)], np.random.default_rng(0))
    assert len(held) == 2 and len(train) == 6 and not set(train) & set(held)
    # the smallest and largest sizes stay in the fit, whatever the seed
    for seed in range(20):
        train, _ = split([(i, 0, 1.0) for i in range(8)], np.random.default_rng(seed))
        assert {(0, 0, 1.0), (7, 0, 1.0)} <= set(train)
    # on --quick's 2 x 4 prefill grid a quarter (2) is held out, and what is left spans both
    # axes: both histories, and 32 and 2,048 new tokens
    grid = [(h, n, 1.0) for h in (0, 512) for n in (32, 128, 512, 2048)]
    for seed in range(20):
        train, held = split(grid, np.random.default_rng(seed))
        assert len(held) == 2 and {h for h, _, _ in train} == {0, 512} and {32, 2048} <= {n for _, n, _ in train}
    # four sizes on a line: the two ends stay, one of the two inside is held out
    train, held = split([(16, 0, 1.0), (1024, 0, 1.0), (64, 0, 1.0), (256, 0, 1.0)], np.random.default_rng(0))
    assert len(held) == 1 and held[0][0] in (64, 256)
    assert mape(lambda a, b: 1.1, [(0, 0, 1.0), (1, 0, 1.0)]) == pytest.approx(0.1)


def test_repeat_spread_is_how_far_two_halves_of_a_points_repeats_lie():
    # Point (0, 8) in run order 1, 2, 3 s: even repeats {1, 3} (median 2), odd {2}: 0 apart.
    # Point (1, 8): 1 then 1.5 s: |1.5 / 1 - 1| = 0.5. A point measured once has no halves.
    samples = [(0, 8, 1.0), (0, 8, 2.0), (1, 8, 1.0), (0, 8, 3.0), (1, 8, 1.5), (2, 8, 9.0)]
    assert repeat_spread(samples) == pytest.approx((0.0 + 0.5) / 2)
    assert repeat_spread([(0, 8, 1.0), (1, 8, 2.0)]) is None
    assert repeat_spread([(0, 8, 0.0), (0, 8, 1.0)]) is None  # an even half at 0 s has no ratio
    # reported with the fit: on exact repeats of a line, 0 apart
    fit = fit_kv_points([(b, 0, 1e-3 + b * 1e-9) for b in (1e5, 1e6, 4e6, 1e7) for _ in range(3)],
                        np.random.default_rng(0))
    assert fit.repeat_spread == 0.0 and fit.report()["repeat_spread"] == 0.0


@pytest.mark.parametrize("bad_s", [0.0, -5.0, float("nan"), float("inf")])
def test_a_bad_time_is_refused_even_where_a_median_would_hide_it(bad_s):
    line = [(0, n, 1e-4 * n) for n in (128, 256, 512, 1024, 2048)]
    hidden = [(0, 128, t) for t in (0.0128, bad_s, 0.0128)]  # the median would be 0.0128
    for fit in (fit_prefill_points, fit_kv_points):
        with pytest.raises(InputError, match="finite number of seconds above 0"):
            fit(line + hidden, np.random.default_rng(0))


def test_a_kv_link_fits_latency_plus_bytes_over_bandwidth():
    # 50 us + 1 byte per ns (1 GB/s): exact on every size.
    samples = [(b, 0, 50e-6 + b * 1e-9) for b in (1e5, 1e6, 4e6, 1e7, 5e7)]
    fit = fit_kv_points(samples, np.random.default_rng(0))
    assert fit.link.alpha_s == pytest.approx(50e-6, rel=1e-6)
    assert fit.link.s_per_byte == pytest.approx(1e-9, rel=1e-6)
    with pytest.raises(InputError, match="2 or more sizes"):
        fit_kv_points([(1e6, 0, 1.0)], np.random.default_rng(0))


def test_a_remote_rounds_requests_are_fitted_each_by_its_own_sizes():
    # Points made from known functions: export 20 ms + 1 us per history token, the prefill
    # request 30 ms + 0.2 ms per new token + 10 us per history token read, join 25 ms +
    # 10 us per new token; every grid point, exact. Each fit gives its function back.
    points = [RemotePoint(h, h, n, 0.02 + 1e-6 * h if h else None, 0.03 + 2e-4 * n + 1e-5 * h, 0.025 + 1e-5 * n,
                          0.004 if h else None, 0.009, 0.005)
              for h in (0, 128, 512, 1024, 2048) for n in (16, 64, 256, 1024)]
    fits = fit_remote(points, np.random.default_rng(0))
    assert (fits["export"].linear.fixed_s, fits["export"].linear.s_per_token) == pytest.approx((0.02, 1e-6))
    assert (fits["join"].linear.fixed_s, fits["join"].linear.s_per_token) == pytest.approx((0.025, 1e-5))
    assert fits["prefill"].cost(1000, 100) == pytest.approx(0.03 + 0.02 + 0.01, rel=1e-3)
    assert all(fit.held_out_mape < 1e-3 for fit in fits.values())


def test_a_remote_rounds_serving_paths_are_each_requests_median_over_the_probes():
    # Export paths 4, 5 and 40 ms (a stall), and a first round with none: 5 ms. Prefill
    # request 11, 9, 10, 12 ms: 10.5 ms. Join -1, -1, 2, 3 ms (the client's clock coarser
    # than the path): 0.5 ms.
    times = [(0.004, 0.011, -0.001), (0.005, 0.009, -0.001), (0.040, 0.010, 0.002), (None, 0.012, 0.003)]
    points = [RemotePoint(0 if export is None else 512, 0, 64, None if export is None else 0.01, 0.03, 0.02,
                          export, prefill, join) for export, prefill, join in times]
    assert remote_paths_s(points) == pytest.approx((0.005, 0.0105, 0.0005))
    # The first three's join paths -1, -1, 2 ms: a median below 0 is no path.
    assert remote_paths_s(points[:3]).join == 0.0


def test_a_profile_times_a_remote_round_with_its_requests_own_serving_paths():
    # Measurements made from known functions: T_pre 10 ms + 0.1 ms per new token; a 20 ms
    # decode step; a plain request's serving path 5 ms; the remote round's requests as in
    # test_a_remote_rounds_requests_are_fitted_each_by_its_own_sizes, with serving paths
    # export 4 ms, prefill request 9 ms, join 5 ms.
    points = Measurements(
        prefill=[PrefillPoint(h, n, 0.01 + 1e-4 * n) for h in (0, 256, 1024) for n in (16, 64, 256, 1024)],
        decode=[DecodePoint(b, p, b * (p + 128), 0.02, 128 * b) for b in (1, 2, 4, 8) for p in (128, 512)],
        overhead=[OverheadPoint(0.015, 0.010)] * 4,
        remote=[RemotePoint(h, h, n, 0.02 + 1e-6 * h if h else None, 0.03 + 2e-4 * n + 1e-5 * h, 0.025 + 1e-5 * n,
                            0.004 if h else None, 0.009, 0.005)
                for h in (0, 128, 512, 1024, 2048) for n in (16, 64, 256, 1024)])
    doc = profile_document(points, {"decode_engine": {}}, fit(points, 0), model("Llama-3.1-8B"), gpu("H100-SXM"), 1,
                           ProfileGrid(), 0)
    assert doc["perf_model"]["remote_path"]["1"]["paths_s"] == pytest.approx(
        {"export": 0.004, "prefill": 0.009, "join": 0.005})
    perf = AlphaBetaPerfModel.from_json(json.dumps(doc["perf_model"]))
    p0, d1 = WorkerSpec(0, Role.PREFILL, 1, 0), WorkerSpec(1, Role.DECODE, 1, 0)
    # 1,000 tokens of history, 100 new: the export 4 + 20 + 1 ms, the prefill request
    # 30 + 20 + 10 ms and its 9 ms path; the join 25 + 1 ms and its 5 ms path. The stages
    # hold every request's path, so the round adds none beside them.
    assert perf.remote_stages_s(1000, 100, p0, d1) == pytest.approx((0.0, 0.025 + 0.06 + 0.009, 0.031), rel=1e-3)
    assert perf.round_paths_s(1, 1) == (0.0, 0.0)


def test_ampd_profile_writes_a_profile_and_its_plots(tmp_path, capsys):
    with _mock_pair() as (p, d, perf):
        code = main(["profile", "--decode-url", d, "--prefill-url", p, "--model", "Llama-3.1-8B", "--gpu", "H100-SXM",
                     "--quick", "--serving-load-batch", "2", "--quiet", "--out", str(tmp_path)])
    assert code == 0

    def no_nan(name):
        raise AssertionError(f"profile.json holds {name}: not standard JSON")
    doc = json.loads((tmp_path / "profile.json").read_text(), parse_constant=no_nan)
    # The quick grid's 3 transfer sizes leave none to hold out: no held-out error, written as null.
    assert doc["fit_report"]["kv"]["held_out_mape"] is None and doc["fit_report"]["kv"]["num_held_out"] == 0
    assert doc["perf_model"]["fit_report"]["held_out_mape"]["kv"] is None
    # The serving path was timed under a decode load of 2 streams, and the profile says so.
    assert doc["fingerprint"]["grid"]["serving_load_batch"] == 2 and QUICK_GRID.serving_load_batch == 0
    assert "streamed 2 other sequences" in doc["fit_report"]["measured_by"]["request_overhead"]
    assert doc["format"] == "ampd.profile/1"
    assert doc["perf_model"]["format"] == "ampd.perf.alphabeta/2"
    assert doc["perf_model"]["kv_capacity_tokens"] == {"1": perf.kv_capacity_tokens(1)}
    assert doc["perf_model"]["batching"]["mode"] == "alternate"
    assert len(doc["points"]["prefill"]) == len(QUICK_GRID.hist_tokens) * len(QUICK_GRID.new_tokens)
    assert {"prefill", "decode", "kv"} <= set(doc["fit_report"])
    assert all((tmp_path / f"{name}.png").stat().st_size > 0 for name in ("prefill", "decode", "kv"))
    # A mock decode engine hands out no history: no remote round measured, nor assumed.
    assert doc["fingerprint"]["decode_engine"]["exports_history"] is False and not doc["points"]["remote"]
    assert "remote_path" not in doc["perf_model"] and not (tmp_path / "remote.png").exists()
    # Every other command reads the profile as a performance model (--perf-model).
    loaded = load_perf_model(tmp_path / "profile.json")
    assert loaded.tps == (1,) and loaded.kv_capacity_tokens(1) == perf.kv_capacity_tokens(1)
    assert loaded.kv_bytes_per_token == perf.kv_bytes_per_token
    assert loaded.batching.mode == "alternate"
    assert "held-out MAPE" in capsys.readouterr().out


def test_an_engine_that_is_not_there_is_named(tmp_path, capsys):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    code = main(["profile", "--decode-url", url, "--model", "Llama-3.1-8B", "--gpu", "H100-SXM", "--quiet",
                 "--out", str(tmp_path)])
    assert code == 2
    assert url in capsys.readouterr().err


def test_an_engine_that_served_the_same_seeds_prompts_is_refused_not_misread():
    # Two profiles with one seed send the same "fresh" prompts; the second finds its 64-token
    # first round already cached and would record it as (64 cached, 1 new): refused instead.
    async def first_round(url):
        async with httpx.AsyncClient() as client:
            engine, _ = await connect(url, client, np.random.default_rng(0))
            return await measure_prefill(engine, 0, 64)

    with _mock_pair() as (_, d, _perf):
        assert asyncio.run(first_round(d)).new_tokens == 64
        with pytest.raises(ProbeError, match="served this seed's prompts before"):
            asyncio.run(first_round(d))
