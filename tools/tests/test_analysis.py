"""The numbers the report prints: peak rule, series, speedups, GFLOP/s, scaling, choices."""

from dataclasses import replace

import pytest
from conftest import (
    HEADS,
    d_model_series,
    entries,
    head_dim_series,
    heads_run,
    model_seconds,
    speedup_model,
    write,
)

from mhapy.problem import Shape, flops
from mhapy.report import formulations, linking, peaks, peer_ranking, throughput
from mhapy.report.peaks import Peak, classify_peak_key, find_peak
from mhapy.report.loading import load
from mhapy.report.scaling import thread_scaling
from mhapy.report.series import heads_series, seq_series


@pytest.fixture
def heads(tmp_path):
    return load([write(tmp_path / "h.json", heads_run(("naive", "xsimd", "torch", "torch_nn_mha")))])


def test_peak_keys_are_classified_explicitly():
    assert classify_peak_key("mha_fma_peak_gflops_one_core") == "one"
    assert classify_peak_key("mha_fma_peak_gflops_one_core_avx2") == "one"
    assert classify_peak_key("peak_gflops_1core") == "one"
    assert classify_peak_key("fp32_fma_peak_gflops_single_thread") == "one"
    assert classify_peak_key("mha_fma_peak_gflops_all_cores") == "all"
    assert classify_peak_key("peak_gflops_allcores") == "all"
    assert classify_peak_key("fma_peak_gflops_12cores") is None  # ambiguous: not guessed
    assert classify_peak_key("mha_fma_peak_threads") is None
    assert classify_peak_key("mha_probe_gflops_naive_wrapper") is None


def test_peak_rule_one_core_for_one_thread_all_cores_scaled_otherwise(heads):
    peak = find_peak(heads)  # fixture context: 100 (1 core; 99 for avx2), 200 on 2 threads
    assert (peak.one_core, peak.all_cores, peak.all_core_threads) == (100.0, 200.0, 2)
    assert "'mha_fma_peak_gflops_one_core' in" in peak.source
    assert peak.for_threads(1) == 100.0
    assert peak.for_threads(2) == 200.0
    assert Peak(None, 400.0, 4).for_threads(1) == 100.0
    assert Peak(None, 400.0, 4).for_threads(3) == 300.0
    assert Peak(None, 400.0, 4).for_threads(8) == 400.0  # more threads than measured: capped
    assert Peak(50.0, None, None).for_threads(2) is None  # not assumed to scale
    overridden = find_peak(heads, one_core=80.0)
    assert overridden.for_threads(1) == 80.0 and "--peak-1core" in overridden.source
    assert peaks.percent_of_peak(50.0, peak, 1) == pytest.approx(50.0)
    assert peaks.percent_of_peak(50.0, Peak(), 1) is None


def test_peak_threads_fall_back_to_num_cpus(tmp_path):
    s = Shape(1, 8, 8, 8, 1)
    context = {"num_cpus": 4, "fma_peak_gflops_all_cores": "400"}
    results = load([write(tmp_path / "p.json", entries("naive", "wrapper", s, 1, 1.0), context)])
    peak = find_peak(results)
    assert (peak.one_core, peak.all_cores, peak.all_core_threads) == (None, 400.0, 4)
    assert peak.for_threads(1) == 100.0
    assert find_peak(results, all_cores=800.0).for_threads(2) == 400.0


def test_both_heads_series_are_inferred_from_the_shapes(heads):
    series = heads_series(heads.shapes())
    kinds = [(s.kind, [s.x(x) for x in s.shapes]) for s in series]
    assert kinds == [("d_model", [h for h in HEADS if 768 % h == 0]), ("head_dim", list(HEADS))]
    d_model, head_dim = series
    assert all(s.head_dim == 64 and s.d_out == 64 * s.n_heads for s in head_dim.shapes)
    assert {(s.batch, s.seq_len, s.d_out) for s in d_model.shapes} == {(4, 256, 768)}
    assert seq_series(heads.shapes()) == []


def test_seq_series_groups_shapes_that_differ_only_in_t():
    shapes = [Shape(1, t, 768, 768, 12) for t in (64, 256, 1024)] + [Shape(1, 64, 768, 768, 6)]
    (series,) = seq_series(shapes)
    assert [series.x(s) for s in series.shapes] == [64, 256, 1024]
    assert series.x_name == "T (tokens)"


@pytest.mark.parametrize(
    "change",
    [
        dict(softcap=30.0),
        dict(sinks=True),
        dict(qk_norm_eps=1e-6),
        dict(rope_scaling="llama3"),
        dict(out_features=512),
    ],
)
def test_every_field_a_series_does_not_vary_parts_its_series(change):
    """A series keeps every field of the shape fixed but its axis: shapes that differ in any other
    (each field added to Shape since the series were first keyed among them) are on two lines."""
    plain = [Shape(1, t, 768, 768, h) for t in (64, 256) for h in (6, 12)]
    other = [replace(s, **change) for s in plain]
    d_model = lambda shapes: [s for s in heads_series(shapes) if s.kind == "d_model"]  # noqa: E731
    for series in (seq_series, d_model):
        found = series(plain + other)
        assert len(found) == 2 * len(series(plain)) >= 4
        assert all(len({replace(s, seq_len=1, n_heads=1) for s in line.shapes}) == 1 for line in found)


def test_speedup_is_wrapper_time_over_split_time_per_backend(heads):
    for series in heads_series(heads.shapes()):
        for threads in (1, 2):
            table = formulations.speedup_table(heads, series, threads)
            # (backend, formulation) columns; torch_nn_mha has no wrapper, none has fused_qkv
            assert table.columns == [(b, "split_weight") for b in ("naive", "xsimd", "torch")]
            for backend, form in table.columns:
                points = table.column((backend, form))
                assert [x for x, _ in points] == [s.n_heads for s in series.shapes]
                assert [v for _, v in points] == pytest.approx([speedup_model(backend, x) for x, _ in points])


def test_speedup_needs_both_formulations(tmp_path):
    s = Shape(1, 8, 16, 16, 2)
    results = load([write(tmp_path / "w.json", entries("naive", "wrapper", s, 1, 1.0))])
    assert formulations.speedup(results, "naive", s, 1) is None


def test_gflops_table_is_model_flops_over_median_time(heads):
    series = heads_series(heads.shapes())[1]  # fixed head_dim
    table = throughput.gflops_table(heads, series, 2)
    assert ("xsimd", "wrapper") in table.columns and ("torch_nn_mha", "split_weight") in table.columns
    for s, (x, values) in zip(series.shapes, table.rows):
        got = dict(zip(table.columns, values))
        for (backend, form), gflops in got.items():
            assert gflops == pytest.approx(flops(s) / model_seconds(backend, form, s, 2) * 1e-9)


def test_thread_scaling_geomean_min_max(tmp_path):
    a, b = Shape(1, 8, 16, 16, 2), Shape(1, 16, 16, 16, 2)
    data = (
        entries("tbb", "split_weight", a, 1, 1.0)
        + entries("tbb", "split_weight", a, 2, 0.5)
        + entries("tbb", "split_weight", b, 1, 1.0)
        + entries("tbb", "split_weight", b, 2, 1.0 / 1.5)
        + entries("tbb", "wrapper", a, 1, 1.0)  # no 2-thread partner: not in the scaling
    )
    (scaling,) = thread_scaling(load([write(tmp_path / "t.json", data)]))
    assert (scaling.backend, scaling.formulation, scaling.threads, scaling.shapes) == (
        "tbb",
        "split_weight",
        2,
        2,
    )
    assert scaling.geomean == pytest.approx((2.0 * 1.5) ** 0.5)
    assert (scaling.low, scaling.high) == pytest.approx((1.5, 2.0))
    assert scaling.efficiency == pytest.approx(scaling.geomean / 2)


def _choice(tmp_path, times: dict, spreads: dict | None = None):
    s = Shape(2, 64, 128, 128, 4)
    data = []
    for (backend, form), seconds in times.items():
        data += entries(
            backend,
            form,
            s,
            1,
            seconds,
            **({"spread": spreads[backend]} if spreads and backend in spreads else {}),
        )
    return linking.choose(load([write(tmp_path / "c.json", data)]), s, 1)


def test_choice_picks_the_fastest_linkable_and_the_best_other_backend(tmp_path):
    c = _choice(
        tmp_path,
        {
            ("xsimd", "split_weight"): 1.0,
            ("xsimd", "wrapper"): 1.1,  # same backend: not the runner-up
            ("onednn", "split_weight"): 1.5,
            ("onednn", "wrapper"): 2.0,
            ("torch", "wrapper"): 0.5,  # faster, but a reference point, never recommended
        },
    )
    assert (c.best.key.backend, c.best.key.formulation) == ("xsimd", "split_weight")
    assert (c.runner_up.key.backend, c.runner_up.key.formulation) == ("onednn", "split_weight")
    assert c.margin == pytest.approx(0.5)
    assert not c.tie
    assert c.peer.key.backend == "torch"
    assert (
        linking.recommendation(c)
        == "link xsimd, run split_weight (wrapper: 1.10× slower); 1.50× faster than onednn"
    )


def test_mha_from_python_is_never_linked_nor_the_peer_compared_with(tmp_path):
    c = _choice(
        tmp_path,
        {("tbb", "split_weight"): 1.0, ("py_tbb", "split_weight"): 0.99, ("torch_sdpa", "split_weight"): 1.3},
    )
    assert c.best.key.backend == "tbb" and c.runner_up is None
    assert c.peer.key.backend == "torch_sdpa"


def test_mha_from_python_faster_than_mha_bench_is_not_a_peer_win(tmp_path):
    s = Shape(2, 64, 128, 128, 4)
    data = []
    for backend, seconds in (("tbb", 1.0), ("py_tbb", 0.9), ("torch_sdpa", 0.95)):
        data += entries(backend, "split_weight", s, 1, seconds)
    (ranking,) = peer_ranking.rankings(load([write(tmp_path / "r.json", data)]))
    assert [w.peer.key.backend for w in ranking.peer_wins] == ["torch_sdpa"]
    assert ranking.versus_mha["mha from Python"][0] == pytest.approx(1 / 0.9)


def test_choice_calls_a_small_margin_a_tie(tmp_path):
    c = _choice(tmp_path, {("xsimd", "split_weight"): 1.0, ("tbb", "split_weight"): 1.03})
    assert c.tie and c.margin == pytest.approx(0.03)
    assert linking.recommendation(c).startswith("xsimd or tbb: within noise (3.0% apart)")


def test_choice_calls_overlapping_repetitions_a_tie_even_beyond_the_margin(tmp_path):
    times = {("xsimd", "split_weight"): 1.0, ("tbb", "split_weight"): 1.10}
    wide = {"xsimd": (0.8, 1.0, 1.2), "tbb": (0.95, 1.0, 1.05)}
    assert _choice(tmp_path, times, wide).tie
    assert not _choice(tmp_path, times).tie  # the default spread of 1% does not overlap


def test_choice_with_one_backend_or_peers_only(tmp_path):
    c = _choice(tmp_path, {("naive", "split_weight"): 2.0, ("naive", "wrapper"): 3.0})
    assert c.runner_up is None and c.margin is None
    assert linking.recommendation(c) == "only naive measured: run split_weight (wrapper: 1.50× slower)"
    c = _choice(tmp_path, {("torch", "split_weight"): 2.0})
    assert c.best is None and c.peer.key.backend == "torch"


def test_win_counts_and_relative_time(heads):
    chosen = linking.choices(heads)
    assert len(chosen) == 2 * len(heads.shapes())
    # Model: xsimd split is fastest everywhere (50 GFLOP/s vs naive's 2).
    n_shapes = len(heads.shapes())
    assert linking.win_counts(chosen, 1) == [("xsimd split_weight", n_shapes, n_shapes)]
    series = heads_series(heads.shapes())[1]
    table = linking.relative_time_table(heads, series, 1)
    assert table.columns == ["naive", "xsimd", "torch", "torch_nn_mha"]
    for x, values in table.rows:
        rel = dict(zip(table.columns, values))
        assert rel["xsimd"] == pytest.approx(1.0)
        assert rel["naive"] == pytest.approx(25.0)
        # torch: its faster formulation is the wrapper (speedup 0.8): 50/40 * 0.8 = 1.0
        assert rel["torch"] == pytest.approx(50 / 40 * 0.8)
        assert rel["torch_nn_mha"] == pytest.approx(50 / 45)


def test_series_of_other_presets_do_not_mix(heads):
    # d_model series are keyed on B and T too: the head_dim series' H=12 (d768, B1 T128) is not
    # in the d_model series (B4 T256).
    d_model = heads_series(heads.shapes())[0]
    assert d_model.kind == "d_model"
    assert Shape(1, 128, 768, 768, 12) not in d_model.shapes
    assert d_model_series()[0] in d_model.shapes and head_dim_series()[0] not in d_model.shapes
