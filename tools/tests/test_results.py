"""Reading Google Benchmark JSON: names, units, repetitions, aggregates, failures, bad input."""

import gzip
import json

import pytest
from conftest import bench_name, entries, skipped, write

from mhapy.problem import Shape, flops
from mhapy.report.loading import load, parse_name
from mhapy.report.results import Key, ReportError
from mhapy.schema import is_peer

S = Shape(4, 256, 768, 768, 12)


def test_parse_name_reads_every_field_and_ignores_google_benchmark_suffixes():
    key = parse_name(
        "mha/xsimd/wrapper/b2/t17/din24/dout32/h4/noncausal/qkv_bias/no_out_proj/threads:2/real_time"
    )
    assert key == Key("xsimd", "wrapper", Shape(2, 17, 24, 32, 4, False, True, False), 2)
    assert key.shape.head_dim == 8
    assert key.name() == "mha/xsimd/wrapper/b2/t17/din24/dout32/h4/noncausal/qkv_bias/no_out_proj/threads:2"
    assert parse_name(key.name()) == key


def test_parse_name_reads_the_whole_problem_grammar_in_any_order():
    # mha::to_string's order, and the same parts shuffled (mha::parse_problem reads both).
    canonical = (
        "mha/naive/split_weight/b2/t1/past4095/din64/dout64/h8/kvh2/noncausal/bf16/threads:1/real_time"
    )
    shuffled = "mha/naive/split_weight/threads:1/bf16/kvh2/h8/noncausal/past4095/dout64/din64/t1/b2"
    shape = Shape(2, 1, 64, 64, 8, causal=False, past=4095, n_kv_heads=2, precision="bf16")
    assert parse_name(canonical) == parse_name(shuffled) == Key("naive", "split_weight", shape, 1)
    assert parse_name(shuffled).name() + "/real_time" == canonical
    assert shape.is_decode and shape.kv_heads == 2
    # The defaults spelled out (fp32, kvh = H, past0) are the plain problem.
    plain = parse_name("mha/xsimd/wrapper/b1/t8/din8/dout8/h2/kvh2/fp32/past0/threads:2")
    assert plain == Key("xsimd", "wrapper", Shape(1, 8, 8, 8, 2), 2)
    assert plain.name() == "mha/xsimd/wrapper/b1/t8/din8/dout8/h2/threads:2"


def test_parse_name_reads_every_formulation_and_axis():
    name = "mha/naive/fused_qkv/b1/t1/din8/dout8/h2/kvh1/rope10000/no_out_bias/threads:1"
    shape = Shape(1, 1, 8, 8, 2, n_kv_heads=1, rope_base=10000.0, out_proj_bias=False)
    assert parse_name(name) == Key("naive", "fused_qkv", shape, 1)
    assert parse_name(name).name() == name


def test_parse_name_leaves_other_benchmarks_alone_and_rejects_broken_mha_names():
    assert parse_name("peak/fma/threads:1") is None
    with pytest.raises(
        ReportError, match="unknown formulation 'fused'; expected wrapper, split_weight, fused_qkv"
    ):
        parse_name("mha/naive/fused/b1/t1/din1/dout1/h1/threads:1")
    with pytest.raises(ReportError, match="unknown name component 'x7'"):
        parse_name("mha/naive/wrapper/b1/t1/din1/dout1/h1/x7/threads:1")
    with pytest.raises(ReportError, match=r"missing name component\(s\) t, threads:<n>"):
        parse_name("mha/naive/wrapper/b1/din1/dout1/h1")
    with pytest.raises(ReportError, match=r"d_out \(10\) is not a multiple of H \(3\)"):
        parse_name("mha/naive/wrapper/b1/t1/din1/dout10/h3/threads:1")
    with pytest.raises(ReportError, match=r"H \(8\) is not a multiple of kvh \(3\)"):
        parse_name("mha/naive/wrapper/b1/t1/din1/dout8/h8/kvh3/threads:1")
    with pytest.raises(ReportError, match="name component past given twice"):
        parse_name("mha/naive/wrapper/b1/t1/past2/din1/dout8/h8/past3/threads:1")
    with pytest.raises(ReportError, match=r"missing name component\(s\) threads:<n>"):
        parse_name("mha/naive/wrapper/b1/t1/din1/dout8/h8")


def test_median_of_repetitions_in_any_time_unit_and_gflops_from_the_counter(tmp_path):
    for unit in ("ns", "us", "ms", "s"):
        path = write(
            tmp_path / f"{unit}.json",
            entries("naive", "split_weight", S, 1, 0.02, spread=(1.3, 0.9, 1.0), unit=unit),
        )
        m = load([path]).get("naive", "split_weight", S, 1)
        assert m.repetitions == 3
        assert m.median_s == pytest.approx(0.02)
        assert sorted(m.times_s) == pytest.approx([0.018, 0.02, 0.026])
        assert m.flops == pytest.approx(flops(S))
        assert m.gflops == pytest.approx(flops(S) / 0.02 * 1e-9)


def test_aggregates_only_file_uses_the_median_aggregate(tmp_path):
    data = [
        e
        for e in entries("naive", "wrapper", S, 1, 0.05, spread=(0.9, 1.0, 1.4))
        if e["run_type"] == "aggregate"
    ]
    m = load([write(tmp_path / "agg.json", data)]).get("naive", "wrapper", S, 1)
    assert m.repetitions == 0
    assert m.median_s == pytest.approx(0.05)
    assert m.flops is None  # aggregates carry no GFLOPS here: no rate is invented


def test_failures_are_recorded_not_measured_and_peers_are_recognised(tmp_path):
    data = entries("torch", "wrapper", S, 1, 0.01) + [skipped("naive", "wrapper", S, 1)]
    data.append({"name": "peak/fma/threads:1", "run_type": "iteration", "real_time": 1, "time_unit": "ns"})
    results = load([write(tmp_path / "r.json", data)])
    assert list(results.measurements) == [Key("torch", "wrapper", S, 1)]
    assert results.failures[0].key == Key("naive", "wrapper", S, 1)
    assert "time budget" in results.failures[0].message
    assert results.unrecognised == [("peak/fma/threads:1", str(tmp_path / "r.json"))]
    assert is_peer("torch") and is_peer("torch_nn_mha") and not is_peer("onednn")


def test_files_merge_by_name_and_the_same_benchmark_twice_is_an_error(tmp_path):
    a = write(tmp_path / "a.json", entries("naive", "wrapper", S, 1, 0.01))
    b = write(tmp_path / "b.json", entries("torch", "wrapper", S, 1, 0.01))
    merged = load([a, b])
    assert merged.backends() == ["naive", "torch"]
    assert len(merged.contexts) == 2
    with pytest.raises(
        ReportError, match="is in both .*a.json and .*a2.json; to compare two runs use --ab.*--best-run"
    ):
        load([a, write(tmp_path / "a2.json", entries("naive", "wrapper", S, 1, 0.02))])


def test_best_run_keeps_each_benchmarks_fastest_run_whichever_file_it_is_in(tmp_path):
    first = write(
        tmp_path / "first.json",
        entries("tbb", "wrapper", S, 2, 0.060) + entries("tbb", "split_weight", S, 2, 0.027),
    )
    second = write(
        tmp_path / "second.json",
        entries("tbb", "wrapper", S, 2, 0.031) + entries("tbb", "split_weight", S, 2, 0.028),
    )
    merged = load([first, second], best_run=True)
    assert merged.repeated == 2
    wrapper = merged.get("tbb", "wrapper", S, 2)
    assert wrapper.median_s == pytest.approx(0.031) and wrapper.source == str(second)
    split = merged.get("tbb", "split_weight", S, 2)
    assert split.median_s == pytest.approx(0.027) and split.source == str(first)
    assert len(merged.contexts) == 2


@pytest.mark.parametrize(
    "content, message",
    [
        ("{", "not valid JSON"),
        ('{"benchmarks": 3}', "expected a Google Benchmark JSON object"),
        (
            '{"benchmarks": [{"name": "mha/naive/wrapper/b4/t256/din768/dout768/h12/threads:1", "real_time": 1, "time_unit": "min"}]}',
            "time_unit 'min'",
        ),
        (
            '{"benchmarks": [{"name": "mha/naive/wrapper/b4/t256/din768/dout768/h12/threads:1", "real_time": -1}]}',
            "must be positive",
        ),
        (
            '{"benchmarks": [{"name": "mha/naive/wrapper/b4/t256/din768/dout768/h12/threads:1", "real_time": 1, "H": 8}]}',
            "counter H = 8 but the name says 12",
        ),
        (
            '{"benchmarks": [{"name": "mha/naive/wrapper/b4/t256/din768/dout768/h12/threads:2", "real_time": 1, '
            '"threads": 1, "n_threads": 1}]}',
            "counter n_threads = 1 but the name says 2",
        ),
        (
            '{"benchmarks": [{"name": "mha/naive/wrapper/b4/t1/past9/din768/dout768/h12/threads:2", "real_time": 1, '
            '"past": 8}]}',
            "counter past = 8 but the name says 9",
        ),
    ],
)
def test_malformed_input_is_an_error_naming_the_problem(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ReportError, match=message):
        load([path])


def test_gzip_compressed_file_reads_like_the_plain_one(tmp_path):
    plain = write(tmp_path / "r.json", entries("xsimd", "split_weight", S, 1, 0.012))
    packed = tmp_path / "r.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    key = Key("xsimd", "split_weight", S, 1)
    assert load([packed]).measurements[key].median_s == load([plain]).measurements[key].median_s
    fake = tmp_path / "fake.json.gz"
    fake.write_bytes(plain.read_bytes())
    with pytest.raises(ReportError, match="fake.json.gz: named .gz but not gzip-compressed"):
        load([fake])


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ReportError, match="cannot read"):
        load([tmp_path / "absent.json"])


@pytest.mark.parametrize("shape", [S, Shape(8, 1, 768, 768, 12, past=2048, n_kv_heads=4, qkv_bias=True)])
def test_fixture_names_round_trip_through_json(shape):
    # The fixture writer and the reader agree on the format mha_bench writes.
    name = bench_name("onednn", "split_weight", shape, 2)
    assert json.loads(json.dumps(entries("onednn", "split_weight", shape, 2, 1.0)))[0]["name"] == name
    assert parse_name(name) == Key("onednn", "split_weight", shape, 2)
