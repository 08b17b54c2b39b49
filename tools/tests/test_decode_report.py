"""Decode in the report: incremental calls (past > 0) get their own sections (time per step
against past with the bandwidth bound, % of the bound, split vs wrapper, the backend to link for
decode) and stay out of the forward-pass ones. Synthetic files from a bandwidth model, and a
real decode run of mha_bench when MHA_BENCH gives it."""

import json
import os
import subprocess

import pytest
from conftest import (
    BANDWIDTH,
    CONTEXT,
    STREAM_CONTEXT,
    decode_shapes,
    entries,
    heads_run,
    write,
)
from test_report import table_after

from mhapy import schema
from mhapy.problem import Shape, decode_bytes
from mhapy.report import cli, decode, linking
from mhapy.report.loading import load, load_machines
from mhapy.report.series import heads_series, past_series, seq_series
from mhapy.report.wording import fmt_time

# The decode model: a step takes bytes_min / (bandwidth of its thread count x efficiency), the
# wrapper WRAPPER_SLOWER times longer. naive runs 1 thread only.
EFFICIENCY = {
    ("naive", 1): 0.05,
    ("xsimd", 1): 0.8,
    ("tbb", 1): 0.7,
    ("tbb", 2): 0.9,
    ("torch", 1): 0.2,
    ("torch", 2): 0.3,
    ("torch_prealloc", 1): 0.4,
    ("torch_prealloc", 2): 0.5,
}
WRAPPER_SLOWER = {"naive": 1.0, "xsimd": 1.25, "tbb": 1.0, "torch": 2.0, "torch_prealloc": 2.0}


def decode_seconds(backend: str, form: str, s: Shape, threads: int) -> float:
    t = decode_bytes(s, form) / (BANDWIDTH[threads] * EFFICIENCY[(backend, threads)])
    return t * (WRAPPER_SLOWER[backend] if form == "wrapper" else 1.0)


def decode_run(backends=("naive", "xsimd", "tbb"), shapes=None) -> list:
    out = []
    for b in backends:
        for form in ("split_weight", "wrapper"):
            for s in shapes or decode_shapes():
                for n in (1, 2):
                    if (b, n) in EFFICIENCY:
                        out += entries(b, form, s, n, decode_seconds(b, form, s, n))
    return out


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """One mha_bench file holding the heads model of conftest and the decode model, one peers
    file of both (without a bandwidth: read against the mha file's), and the same forward
    passes alone, each reported through the command line."""
    folder = tmp_path_factory.mktemp("decode")
    context = dict(CONTEXT, **STREAM_CONTEXT)
    mha = write(folder / "mha.json", heads_run(("naive", "xsimd")) + decode_run(), context)
    peers = write(
        folder / "peers.json",
        heads_run(("torch",)) + decode_run(("torch", "torch_prealloc")),
        {"num_cpus": 2, "cpu_model": "Synthetic CPU"},
    )
    forward_only = write(folder / "forward.json", heads_run(("naive", "xsimd")), context)
    out, plain = folder / "report", folder / "plain"
    assert cli.main([str(mha), str(peers), "--out", str(out)]) == 0
    assert cli.main([str(forward_only), "--out", str(plain)]) == 0
    return out, plain, mha, peers


def test_decode_entries_leave_the_forward_sections_as_they_were(mixed):
    out, plain, _, _ = mixed
    md, md_plain = (out / "report.md").read_text(), (plain / "report.md").read_text()
    for heading, table in (
        (
            "## GFLOP/s and % of peak against H",
            "### fixed head_dim = 64, d_model = 64·H (B=1, T=128), 2 threads",
        ),
        ("## Thread scaling", "## Thread scaling"),
        ("## Which backend to link", "### 1 thread"),
    ):
        section = heading + md.split(heading)[1].split("\n## ")[0]
        plain_section = heading + md_plain.split(heading)[1].split("\n## ")[0]
        # The same tables, the peers' columns aside: no decode shape in a forward-pass table.
        assert "past" not in section
        rows, plain_rows = table_after(section, table), table_after(plain_section, table)
        mha_rows = [r[:4] for r in rows if not r[0].startswith("torch")]  # no peer rows
        assert mha_rows == [r[:4] for r in plain_rows]
    assert "1 thread: fastest on the most shapes: xsimd split_weight: 26 of 26" in md
    # The forward answer reads forward passes only; decode gets bullets of its own.
    answer = md.split("## Answer: which backend to link")[1].split("\n## ")[0]
    assert "**1 thread: link xsimd** (its faster formulation: split_weight on 26 of 26 shapes)" in answer
    assert (
        "**decode, 1 thread: link xsimd** (its faster formulation: split_weight on 6 of 6 decode shapes)"
        in answer
    )
    # 312 forward passes (heads model: 26 shapes x 2 threads x 2 formulations x naive, xsimd,
    # torch) and 96 decode steps (6 shapes x 2 formulations: naive, xsimd at 1 thread; tbb,
    # torch, torch_prealloc at 1 and 2).
    assert "408 benchmarks (96 of them decode steps, past > 0)" in md


def test_decode_time_bound_and_percent_of_bound_per_cell(mixed):
    out = mixed[0]
    md = (out / "report.md").read_text()
    for stem in ("decode_time_vs_past", "decode_speedup_vs_past"):
        assert (out / f"{stem}.png").stat().st_size > 1000
    assert (
        "Measured streaming-read bandwidth: 40.0 GB/s on 1 thread, 70.0 GB/s on 2 threads (`mha.json`)" in md
    )
    section = md.split("## Decode: time per step against cached tokens")[1]
    rows = table_after(section, "### B=8, T=1, d_model = 768, H = 12, 1 thread")
    header = section.split("### B=8, T=1, d_model = 768, H = 12, 1 thread")[1].splitlines()[2]
    assert header.startswith(
        "| past (cached tokens) | bandwidth bound | naive split_weight | naive wrapper |"
    )
    assert header.endswith("| torch_prealloc wrapper | fastest |")
    assert [r[0] for r in rows] == ["128", "512", "2048"]
    for row in rows:
        s = Shape(8, 1, 768, 768, 12, past=int(row[0]))
        bound = decode_bytes(s, "split_weight") / 40e9
        assert row[1] == fmt_time(bound)
        # Cells: time and % of bound = efficiency / the wrapper's factor.
        assert row[2].endswith("(5%)") and row[3].endswith("(5%)")  # naive
        assert row[4].endswith("(70%)") and row[5].endswith("(70%)")  # tbb
        assert row[6].endswith("(80%)") and row[7].endswith("(64%)")  # xsimd
        assert row[-3].endswith("(40%)") and row[-2].endswith("(20%)")  # torch_prealloc, peers file
        assert row[-1] == "xsimd split_weight (tbb +14%)"
    # Two threads: the all-cores bandwidth; naive and xsimd have no 2-thread entries.
    rows = table_after(section, "### B=1, T=1, d_model = 768, H = 12, 2 threads")
    assert rows[0][1] == fmt_time(decode_bytes(Shape(1, 1, 768, 768, 12, past=128), "wrapper") / 70e9)
    assert rows[0][2] == rows[0][3] or rows[0][2].endswith("(90%)")
    assert "beat the bandwidth bound" not in md


def test_split_vs_wrapper_in_decode(mixed):
    md = (mixed[0] / "report.md").read_text()
    section = md.split("## Decode: split-weight vs wrapper")[1]
    rows = table_after(section, "### B=1, T=1, d_model = 768, H = 12, 1 thread")
    assert rows == [[p, "1.00×", "1.00×", "1.25×", "2.00×", "2.00×"] for p in ("128", "512", "2048")]
    header = section.split("1 thread")[1].splitlines()[2]
    assert header == "| past (cached tokens) | naive | tbb | xsimd | torch | torch_prealloc |"


def test_backend_to_link_for_decode_per_thread_count(tmp_path):
    data = decode_run()
    path = write(tmp_path / "d.json", data, dict(CONTEXT, **STREAM_CONTEXT))
    results = load([path]).decode()
    one = linking.link_summary(results, 1)
    assert (one.backend, one.runner_up) == ("xsimd", "tbb")
    assert one.margin == pytest.approx(0.8 / 0.7 - 1)
    two = linking.link_summary(results, 2)
    assert (two.backend, two.runner_up, two.shapes) == ("tbb", None, 6)
    out = tmp_path / "r"
    assert cli.main([str(path), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert (
        "**decode, 1 thread: link xsimd** (its faster formulation: split_weight on 6 of 6 decode shapes); "
        "fastest mha backend on 6 of 6 decode shapes; runner-up tbb, 14.3% slower (geometric mean "
        "over the 6 decode shapes both measured): not within noise" in md
    )
    assert "**decode, 2 threads: link tbb**" in md and "no other mha backend measured." in md
    # A decode-only run: no forward-pass section, said once.
    assert "forward passes (past = 0): none in the inputs" in md
    for absent in ("## Split-weight vs wrapper against H", "## Which backend to link", "## Thread scaling"):
        assert absent not in md
    assert sorted(p.name for p in out.glob("*.png")) == [
        "decode_speedup_vs_past.png",
        "decode_time_vs_past.png",
    ]


def test_without_a_bandwidth_the_bound_is_said_to_be_absent(tmp_path):
    shapes = [Shape(1, 1, 64, 64, 2, past=p) for p in (16, 64)]
    data = [
        e for e in decode_run(("xsimd",), shapes) if e.get("n_threads", 1) == 1 or "aggregate" in e.values()
    ]
    path = write(tmp_path / "d.json", data, CONTEXT)
    out = tmp_path / "r"
    assert cli.main([str(path), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "No measured streaming-read bandwidth in the inputs" in md
    assert "decode bandwidth bound and % of bound: no measured streaming-read bandwidth" in md
    rows = table_after(md, "### B=1, T=1, d_model = 64, H = 2, 1 thread")
    assert rows[0][1] == "–" and "(" not in rows[0][2]


def test_a_step_above_the_bound_is_said_and_the_bound_follows_the_thread_rule(tmp_path):
    s = Shape(1, 1, 64, 64, 2, past=32)
    fast = decode_bytes(s, "split_weight") / 80e9  # twice the one-thread bandwidth
    data = entries("xsimd", "split_weight", s, 1, fast) + entries("tbb", "split_weight", s, 3, fast)
    path = write(tmp_path / "d.json", data, dict(CONTEXT, **STREAM_CONTEXT))
    results = load([path])
    bandwidths = decode.find_bandwidths(results)
    xsimd, tbb = (results.get(b, "split_weight", s, n) for b, n in (("xsimd", 1), ("tbb", 3)))
    assert bandwidths.percent(xsimd) == pytest.approx(200.0)
    assert bandwidths.bound_s(tbb) is None  # measured on 2 threads, not 3
    out = tmp_path / "r"
    assert cli.main([str(path), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert (
        "**1 step(s) beat the bandwidth bound** (up to 200%: xsimd split_weight at past=32, 1 thread)" in md
    )


def test_bytes_min_comes_from_the_counter_else_from_the_shape(tmp_path):
    s = Shape(2, 1, 32, 32, 4, past=10)
    data = entries("naive", "wrapper", s, 1, 1e-3)
    assert data[0][schema.BYTES_MIN] == decode_bytes(s, "wrapper")
    data[0][schema.BYTES_MIN] = data[1][schema.BYTES_MIN] = data[2][schema.BYTES_MIN] = 1e6
    m = load([write(tmp_path / "a.json", data)]).get("naive", "wrapper", s, 1)
    assert decode.bytes_min(m) == 1e6
    for e in data:
        e.pop(schema.BYTES_MIN, None)
    m = load([write(tmp_path / "b.json", data)]).get("naive", "wrapper", s, 1)
    assert m.bytes_min is None and decode.bytes_min(m) == decode_bytes(s, "wrapper")


def test_past_series_group_everything_but_past():
    shapes = decode_shapes() + [Shape(1, 1, 768, 768, 12), Shape(1, 1, 768, 768, 12, past=7, causal=False)]
    series = past_series(shapes)
    assert [(s.title, [s.x(x) for x in s.shapes]) for s in series] == [
        ("B=1, T=1, d_model = 768, H = 12, noncausal", [7]),
        ("B=1, T=1, d_model = 768, H = 12", [128, 512, 2048]),
        ("B=8, T=1, d_model = 768, H = 12", [128, 512, 2048]),
    ]
    assert not heads_series(shapes) and not seq_series(decode_shapes())


MHA_BENCH = os.environ.get("MHA_BENCH")


@pytest.mark.skipif(not MHA_BENCH, reason="MHA_BENCH (the mha_bench binary) not given; ctest gives it")
def test_a_real_decode_run_reads_and_reports(tmp_path):
    path = tmp_path / "decode.json"
    command = [MHA_BENCH, "--preset", "decode", "--batch", "1,2", "--past", "8,40", "--d-model", "32"]
    # Two formulations, no grouped K/V heads (--kv-heads 0 folds decode_kv into decode) and one
    # new token (--seq 1 folds decode_verify into decode_cache); each step in decode_cache's
    # eight (plan, cache) precision pairs.
    command += ["--heads", "2", "--kv-heads", "0", "--seq", "1", "--formulations", "wrapper,split_weight"]
    command += ["--backends", "naive", "--benchmark_min_time=0.01", "--quiet"]
    command += [f"--benchmark_out={path}", "--benchmark_out_format=json"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    doc = json.loads(path.read_text())
    for key in (schema.STREAM_ONE_CORE, schema.STREAM_ALL_CORES, schema.STREAM_THREADS, schema.STREAM_TRIALS):
        assert key in doc["context"], key
    (results,) = load_machines([path])
    decode = results.decode().measurements
    assert len(decode) == 2 * 2 * 8 * 2 and not results.forward().measurements
    pairs = {(k.shape.precision, k.shape.kv_precision) for k in decode}
    assert pairs == {(plan, cache) for plan in ("fp32", "bf16") for cache in ("", "int8", "k8v4", "int4")}
    for key, m in decode.items():
        assert key.shape.past in (8, 40) and key.shape.seq_len == 1
        assert key.name() + "/real_time" in {e["name"] for e in doc["benchmarks"]}
        # bytes_min as mha_bench counts it is problem.decode_bytes, in every precision pair
        assert m.bytes_min == decode_bytes(key.shape, key.formulation)
    out = tmp_path / "r"
    assert cli.main([str(path), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert (
        "### B=2, T=1, d_model = 32, H = 2, 1 thread" in md and "**fp32 decode, 1 thread: link naive**" in md
    )
    assert len(table_after(md, "## Decode: the KV cache's precision")) == 2 * 2


@pytest.mark.skipif(not MHA_BENCH, reason="MHA_BENCH (the mha_bench binary) not given; ctest gives it")
def test_a_real_verification_run_reports_each_t_against_one(tmp_path):
    path = tmp_path / "verify.json"
    command = [MHA_BENCH, "--preset", "decode", "--batch", "1", "--past", "40", "--d-model", "32"]
    command += ["--heads", "2", "--kv-heads", "0", "--precision", "fp32", "--kv-precision", "fp32,int8"]
    command += ["--threads", "1", "--formulations", "split_weight", "--backends", "naive"]
    command += [
        "--benchmark_min_time=0.01",
        "--quiet",
        f"--benchmark_out={path}",
        "--benchmark_out_format=json",
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (results,) = load_machines([path])
    assert {k.shape.seq_len for k in results.decode().measurements} == {1, 2, 4, 8, 16}
    out = tmp_path / "r"
    assert cli.main([str(path), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    section = md.split("## Verifying drafted tokens")[1].split("\n## ")[0]
    assert "### B=1, past=40, 1 thread" in section and "| T=1 | T=2 | T=4 | T=8 | T=16 |" in section
    assert "| mha (fp32 plan, fp32 cache) |" in section and "| mha (fp32 plan, int8 cache) |" in section
    # The decode sections keep the one-token steps only.
    decode = md.split("## Decode: time per step")[1].split("## Verifying drafted tokens")[0]
    assert "T=1" in decode and "T=8" not in decode


def test_the_cache_precisions_side_by_side_with_the_peers_cache(tmp_path):
    # One step (B1 over 8k, 1 thread) in each (plan, cache) pair, each at 80% of its bound;
    # openvino_u8kv at the fp32 step with the u8 cache it recorded, at 50% of an int8 bound.
    step = Shape(1, 1, 768, 768, 12, past=8192)
    pairs = [(p, c) for p in ("fp32", "bf16") for c in ("", "int8", "k8v4", "int4")]
    run = []
    for precision, cache in pairs:
        s = Shape(1, 1, 768, 768, 12, past=8192, precision=precision, kv_precision=cache)
        run += entries("xsimd", "split_weight", s, 1, decode_bytes(s, "split_weight") / (0.8 * BANDWIDTH[1]))
    u8_bytes = decode_bytes(Shape(1, 1, 768, 768, 12, past=8192, kv_precision="int8"), "fused_qkv")
    peer = entries(
        "openvino_u8kv", "fused_qkv", step, 1, u8_bytes / (0.5 * BANDWIDTH[1]), label="checked; KV cache u8"
    )
    mha = write(tmp_path / "mha.json", run, dict(CONTEXT, **STREAM_CONTEXT))
    peers = write(tmp_path / "peers.json", peer, {"num_cpus": 2, "cpu_model": "Synthetic CPU"})
    assert cli.main([str(mha), str(peers), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    rows = table_after(md, "## Decode: the KV cache's precision")
    assert len(rows) == 1
    row = rows[0]
    assert row[:2] == ["B=1, past=8192", "1 thread"]
    for cell, (precision, cache) in zip(row[2:10], pairs):
        s = Shape(1, 1, 768, 768, 12, past=8192, precision=precision, kv_precision=cache)
        assert cell == f"{fmt_time(decode_bytes(s, 'split_weight') / 32e9)} (80%) xsimd"
    assert row[10] == f"{fmt_time(u8_bytes / 20e9)} openvino_u8kv (fp32 plan, u8 cache)"
    assert row[11] == "mha xsimd (bf16 plan, int4 cache)"
    fp32 = decode_bytes(step, "split_weight")
    fastest = {
        cache: decode_bytes(
            Shape(1, 1, 768, 768, 12, past=8192, precision="bf16", kv_precision=cache), "split_weight"
        )
        for cache in ("int8", "k8v4", "int4")
    }
    assert row[12] == f"{fp32 / fastest['int8']:.2f}×"
    assert row[13] == f"{fastest['int8'] / fastest['k8v4']:.2f}×"
    assert row[14] == f"{fastest['int8'] / fastest['int4']:.2f}×"
    # The decode answer names the fastest path of the step, then the next two and the peer.
    answer = next(line for line in md.splitlines() if line.startswith("- **Decode B=1, past=8192"))
    assert answer.startswith(
        f"- **Decode B=1, past=8192, 1 thread: mha xsimd (bf16 plan, int4 cache)**, "
        f"{fmt_time(fastest['int4'] / 32e9)} per step (then mha xsimd (bf16 plan, k8v4 cache)"
    )
    assert answer.endswith(f"; openvino_u8kv (fp32 plan, u8 cache) {fmt_time(u8_bytes / 20e9)}).")


def test_the_fastest_path_may_be_a_peer_with_a_wider_cache(tmp_path):
    # OpenVINO's bf16 step with its cache pinned to bf16 beats mha's int8 steps here: the table
    # and the answer say so, whatever cache each kept.
    pairs = (("fp32", ""), ("fp32", "int8"), ("bf16", ""), ("bf16", "int8"))
    run = []
    for precision, cache in pairs:
        s = Shape(1, 1, 768, 768, 12, past=8192, precision=precision, kv_precision=cache)
        run += entries("xsimd", "split_weight", s, 1, 1e-3)
    bf16 = Shape(1, 1, 768, 768, 12, past=8192, precision="bf16")
    peer = entries("openvino", "fused_qkv", bf16, 1, 0.5e-3, label="checked; KV cache bf16")
    mha = write(tmp_path / "mha.json", run, dict(CONTEXT, **STREAM_CONTEXT))
    peers = write(tmp_path / "peers.json", peer, {"num_cpus": 2, "cpu_model": "Synthetic CPU"})
    assert cli.main([str(mha), str(peers), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    (row,) = table_after(md, "## Decode: the KV cache's precision")
    assert row[4] == row[5] == row[8] == row[9] == "–"  # no k8v4 or int4 step measured
    assert row[10] == f"{fmt_time(0.5e-3)} openvino (bf16 plan, bf16 cache)"
    assert row[11] == "openvino (bf16 plan, bf16 cache)"
    assert row[13] == row[14] == "–"
    assert "**Decode B=1, past=8192, 1 thread: openvino (bf16 plan, bf16 cache)**" in md
