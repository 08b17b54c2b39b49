"""mhapy.peers' runner: the JSON it writes (entries, counters, check, context) and that the
report reads it; declined, skipped, wrong and unavailable entries; one file per library. Runs in
the peers' environment; the report runs with Debian's interpreter, as scripts/sweep.sh runs it."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import TOOLS, run_module, run_python

from mhapy import inputs, oracle, schema
from mhapy.peers import run
from mhapy.peers.adapter import Call, Peer, Variant
from mhapy.problem import decode_bytes, flops, parse_shape
from mhapy.report.loading import parse_name

REPORT_PYTHON = "/usr/bin/python3"
# The runner's tests run one library: the first of these importable here (PyTorch may be left
# out of the environment: scripts/peers-env.sh).
IMPORTS = {"pytorch": "torch", "onnxruntime": "onnxruntime", "openvino": "openvino"}
LIBRARY = next((lib for lib, module in IMPORTS.items() if importlib.util.find_spec(module)), None)
pytestmark = pytest.mark.skipif(LIBRARY is None, reason="no peer library is installed in this Python")


def peers(*args) -> subprocess.CompletedProcess:
    return run_module("mhapy.peers", *args)


def test_a_tiny_run_writes_checked_entries_the_report_reads(tmp_path):
    out = tmp_path / "peers.json"
    result = peers(
        "--libraries", LIBRARY, "--shape", "b1/t8/din16/dout16/h2", "--shape", "b2/t1/past5/din16/dout16/h2",
        "--shape", "b1/t8/din8/dout16/h2", "--threads", "1", "--min-time", "0.002", "--repetitions", "2",
        "--out", out, "--quiet",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    context = doc["context"]
    assert context["mha_peers"] == LIBRARY and context[f"{IMPORTS[LIBRARY]}_version"]
    assert context["mha_schema_version"] == str(schema.SCHEMA_VERSION)
    for key in ("peers_check", "peers_inputs", "peers_variants", "cpu_model", "num_cpus"):
        assert context[key], key
    timed = [b for b in doc["benchmarks"] if b.get("run_type") == "iteration" and not b.get("error_occurred")]
    assert timed
    for b in timed:
        key = parse_name(b["name"])
        assert b["n_threads"] == key.threads == 1 and b["past"] == key.shape.past
        assert b["GFLOPS"] * 1e9 * b["real_time"] * 1e-3 == pytest.approx(flops(key.shape))
        assert 0 <= b["check_rel_err"] <= b["check_tolerance"] == run.FP32_TOLERANCE
        assert b["check_rows"] == len(inputs.sample_rows(key.shape.batch, key.shape.seq_len))
        assert b["label"].startswith("checked: max |y - oracle| / max |oracle| = ")
        if key.shape.past:
            assert b["bytes_min"] == decode_bytes(key.shape, key.formulation)
    untimed = [b for b in doc["benchmarks"] if b.get("error_occurred")]
    assert all(b["error_message"].startswith("declined: ") for b in untimed)
    # Every (variant, shape, threads) has an entry: timed or declined.
    names = {b["run_name"] for b in doc["benchmarks"]}
    assert len(names) == 3 * len(run.load(LIBRARY)[0])

    report = tmp_path / "report"
    done = subprocess.run(
        [REPORT_PYTHON, "-m", "mhapy.report", str(out), "--out", str(report)],
        capture_output=True, text=True, env={"PYTHONPATH": str(TOOLS), "MPLBACKEND": "Agg"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    md = (report / "report.md").read_text()
    assert f"| `{IMPORTS[LIBRARY]}_version` |" in md
    assert all(parse_name(b["name"]).backend in md for b in timed)


def test_budget_bad_input_and_a_missing_library(tmp_path):
    out = tmp_path / "peers.json"
    result = peers(
        "--libraries", LIBRARY, "--shape", "b1/t4/din8/dout8/h2", "--time-budget", "0", "--out", out
    )
    assert result.returncode == 0, result.stderr
    messages = {b["error_message"] for b in json.loads(out.read_text())["benchmarks"]}
    assert {m.split(":")[0] for m in messages} <= {"skipped", "declined"} and any(
        m.startswith("skipped") for m in messages
    )

    bad = tmp_path / "bad.json"
    result = peers("--libraries", LIBRARY, "--shape", "b1/t4/din8/dout9/h2", "--out", bad)
    assert result.returncode == 2 and "d_out (9) is not a multiple of H (2)" in result.stderr
    result = peers("--libraries", "tensorflow", "--shape", "b1/t4/din8/dout8/h2", "--out", bad)
    assert (
        result.returncode == 2
        and "expected some of pytorch, openvino, onnxruntime, mha_python" in result.stderr
    )
    assert not bad.exists() and not list(tmp_path.glob(".*partial"))

    # A library that cannot be imported: every entry declined with the reason, no time.
    hidden = tmp_path / "hidden.json"
    code = (
        f"import runpy, sys; sys.modules[{IMPORTS[LIBRARY]!r}] = None; "
        f"sys.argv = ['mhapy.peers', '--libraries', {LIBRARY!r}, '--shape', 'b1/t4/din8/dout8/h2', '--out', {str(hidden)!r}]; "
        "runpy.run_module('mhapy.peers', run_name='__main__', alter_sys=True)"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    doc = json.loads(hidden.read_text())
    reason = doc["context"]["peers_unavailable"]
    assert "is not installed in this Python" in reason
    assert all(b["error_message"] == f"declined: {reason}" for b in doc["benchmarks"])


class Wrong(Call):
    """A call that computes something else: the non-causal function."""

    def __init__(self, s, w, x):
        noncausal = parse_shape((s.problem_suffix() + "/noncausal").split("/"))
        rows = inputs.sample_rows(s.batch, s.seq_len)
        self.y = np.zeros((s.batch, s.seq_len, s.d_out), np.float32)
        for (b, t), v in zip(rows, oracle.forward_rows(noncausal, w, x, rows).values):
            self.y[b, t] = v
        self.runs = 0

    def run(self):
        self.runs += 1

    def output(self):
        return self.y


class WrongPeer(Peer):
    library = "wrong"

    def declines(self, variant, s):
        return None

    def prepare(self, variant, s, w, x, threads):
        self.call = Wrong(s, w, x)
        return self.call

    def context(self):
        return {}


def test_a_peer_that_computes_something_else_is_an_error_never_a_time():
    s = parse_shape("b1/t9/din8/dout8/h2".split("/"))
    w, x = inputs.weights(s), inputs.x(s)
    rows = oracle.forward_rows(s, w, x, inputs.sample_rows(s.batch, s.seq_len))
    sweep = run.Sweep(SimpleNamespace(time_budget=None, quiet=True, min_time=0.001, repetitions=2), 1)
    peer = WrongPeer()
    sweep.measure(
        peer, Variant("wrong", "split_weight", "the non-causal function"), run.Job(s, [1]), 0, w, x, rows
    )
    (entry,) = sweep.benchmarks
    assert entry["error_message"].startswith("wrong result: max |y - oracle| / max |oracle| = ")
    assert peer.call.runs == 1  # the check's run only: never timed


def test_several_libraries_one_file_each(tmp_path):
    # Each library in a process of its own, a file each (an uninstalled one: declined entries).
    out = tmp_path / "peers.json"
    result = peers(
        "--libraries", "pytorch,onnxruntime", "--shape", "b1/t4/din8/dout8/h2", "--threads", "1",
        "--min-time", "0.002", "--repetitions", "1", "--out", out, "--quiet",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert not out.exists()
    for library in ("pytorch", "onnxruntime"):
        doc = json.loads((tmp_path / f"peers-{library}.json").read_text())
        assert doc["context"]["mha_peers"] == library


def test_a_decode_step_counts_the_bytes_of_the_cache_the_peer_kept():
    s = parse_shape("b1/t1/past8192/din768/dout768/h12".split("/"))
    kept = {None: "", "f32": "", "bf16": "bf16", "u8": "int8", "i8": "int8"}
    for library_name, mha_name in kept.items():
        shape = run.cache_shape(s, SimpleNamespace(kv_cache_precision=library_name))
        assert shape == dataclasses.replace(s, kv_precision=mha_name)
    u8 = run.cache_shape(s, SimpleNamespace(kv_cache_precision="u8"))
    assert decode_bytes(u8, "fused_qkv") < decode_bytes(s, "fused_qkv") / 2
    # OpenVINO's u8 rows keep an fp32 scale and zero point; mha's from Python one 4-byte word.
    assert run.int8_scale_bytes("openvino_u8kv") == 8 and run.int8_scale_bytes("py_tbb") == 4
    name = "mha/openvino_u8kv/fused_qkv/shape/threads:1/real_time"
    step = run.entries(name, 0, u8, 1, 1, [(1e-3, 1e-3)], "", {}, run.int8_scale_bytes("openvino_u8kv"))
    assert step[0]["bytes_min"] == decode_bytes(u8, "fused_qkv", scale_bytes=8)
    # A forward pass reads no cache: its shape stays as it is.
    forward = parse_shape("b1/t9/din8/dout8/h2".split("/"))
    assert run.cache_shape(forward, SimpleNamespace(kv_cache_precision="u8")) == forward


def test_tolerance_is_mha_bench_s_in_fp32_and_the_bf16_bound_otherwise():
    s = parse_shape("b1/t9/din8/dout8/h2".split("/"))
    rows = oracle.Rows([(0, 0)], np.zeros((1, 8)), np.array([3.0]))
    call = SimpleNamespace(kv_cache_precision=None)
    assert run.tolerance(s, call, rows) == run.FP32_TOLERANCE
    call.kv_cache_precision = "u8"
    assert run.tolerance(s, call, rows) == pytest.approx(2**-9 * (5 + 4 * 3.0))
    bf16 = parse_shape("b1/t9/din8/dout8/h2/bf16".split("/"))
    call.kv_cache_precision = None
    assert run.tolerance(bf16, call, rows) == pytest.approx(2**-9 * 17)


def test_variants_runs_those_backends_only(tmp_path):
    backends = sorted({v.backend for v in run.load(LIBRARY)[0]})
    out = tmp_path / "one.json"
    result = peers(
        "--libraries", LIBRARY, "--variants", backends[0], "--shape", "b1/t4/din8/dout8/h2",
        "--repetitions", "1", "--out", out,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert {parse_name(b["name"]).backend for b in doc["benchmarks"]} == {backends[0]}
    result = peers(
        "--libraries", LIBRARY, "--variants", "no_such", "--shape", "b1/t4/din8/dout8/h2", "--out", tmp_path / "x.json"
    )  # fmt: skip
    assert (
        result.returncode == 2 and f"--variants no_such: {LIBRARY} has {', '.join(backends)}" in result.stderr
    )
