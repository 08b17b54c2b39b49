"""mhapy.peers: the modules against a float64 oracle of docs/design.md §1, the agreement
check, shape input, and a real (tiny) run whose JSON the report reads. What needs torch is
skipped without it."""

import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import run_module

from mhapy import peers
from mhapy.problem import Shape, flops
from mhapy.report import cli
from mhapy.report.results import load, parse_name

torch = peers.torch
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def oracle(x, wq, wk, wv, wo, bo, bqkv, n_heads, causal):
    """docs/design.md §1 in float64 numpy: split weights, per-head softmax attention, merge, out_proj."""
    x = x.astype(np.float64)
    b, t, _ = x.shape
    q, k, v = (
        x @ w.T.astype(np.float64) + (0 if bias is None else bias) for w, bias in zip((wq, wk, wv), bqkv)
    )
    hd = wq.shape[0] // n_heads
    out = np.zeros((b, t, wq.shape[0]))
    for h in range(n_heads):
        cols = slice(h * hd, (h + 1) * hd)
        s = q[:, :, cols] @ k[:, :, cols].transpose(0, 2, 1) / np.sqrt(hd)
        if causal:
            s = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, s)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        out[:, :, cols] = a @ v[:, :, cols]
    return out if wo is None else out @ wo.T.astype(np.float64) + bo


@needs_torch
@pytest.mark.parametrize(
    "text",
    [
        "b2/t7/din12/dout8/h2",
        "b1/t5/din8/dout8/h4/noncausal",
        "b2/t6/din8/dout12/h3/qkv_bias/no_out_proj",
        "b1/t9/din16/dout16/h1/qkv_bias",
    ],
)
def test_every_module_computes_design_section_1(text):
    s = peers.shape_from_text(text)
    modules = peers.build_modules(s, seed=7)
    split = modules["torch/split_weight"]
    weights = [split.W_query.weight, split.W_key.weight, split.W_value.weight]
    wq, wk, wv = (w.detach().numpy() for w in weights)
    biases = [None] * 3
    if s.qkv_bias:
        biases = [m.bias.detach().numpy() for m in (split.W_query, split.W_key, split.W_value)]
    wo = bo = None
    if s.out_proj:
        wo, bo = split.out_proj.weight.detach().numpy(), split.out_proj.bias.detach().numpy()
    x = torch.randn(s.batch, s.seq_len, s.d_in, generator=torch.Generator().manual_seed(3))
    expected = oracle(x.numpy(), wq, wk, wv, wo, bo, biases, s.n_heads, s.causal)
    assert ("torch_nn_mha/split_weight" in modules) == (peers.nn_mha_unsupported(s) is None)
    with torch.no_grad():
        for name, module in modules.items():
            got = module(x).numpy()
            assert got.shape == expected.shape, name
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=name)
    # The wrapper's heads own separate weights: rows of the split weights, not views of them.
    head = modules["torch/wrapper"].heads[-1]
    assert head.W_query.weight.data_ptr() != split.W_query.weight.data_ptr()


@needs_torch
def test_check_catches_a_module_that_disagrees():
    s = peers.shape_from_text("b1/t8/din16/dout16/h2")
    modules = peers.build_modules(s, seed=1)
    x = torch.rand(1, 8, 16)
    assert max(peers.check(modules, x).values()) < peers.RTOL
    with torch.no_grad():
        modules["torch/wrapper"].heads[1].W_value.weight.mul_(1.5)
    errors = peers.check(modules, x)
    assert errors["torch/wrapper"] > peers.RTOL and errors["torch_nn_mha/split_weight"] < peers.RTOL


@pytest.mark.parametrize(
    "text, message",
    [
        ("b1/t8", "expected b<B>/t<T>/din<d_in>/dout<d_out>/h<H>"),
        ("b1/t8/din16/dout10/h3", r"d_out \(10\) must be divisible by n_heads \(3\)"),
        ("b0/t8/din16/dout16/h2", "batch = 0, expected an integer >= 1"),
        ("b1/t8/din16/dout16/h2/causal", "optionally followed by"),
    ],
)
def test_bad_shape_text_is_refused(text, message):
    with pytest.raises(peers.UsageError, match=message):
        peers.shape_from_text(text)


def test_shapes_file_fields_and_threads(tmp_path):
    path = tmp_path / "shapes.json"
    item = {
        "batch": 4,
        "seq_len": 256,
        "d_in": 768,
        "d_out": 768,
        "n_heads": 12,
        "causal": True,
        "qkv_bias": False,
        "out_proj": True,
        "threads": [1, 2],
        "series": "d_model",
        "name": "b4/t256/din768/dout768/h12",
        "flops": 5236064256,  # as mha_bench --dump-shapes writes them
    }
    path.write_text(json.dumps({"shapes": [item]}))
    (job,), not_timed = peers.shapes_from_file(str(path))
    assert (job.shape, job.threads, not_timed) == (Shape(4, 256, 768, 768, 12), [1, 2], [])
    # Grouped K/V heads, past tokens, bf16: no module computes them yet; listed, not timed.
    decode = dict(
        item, past=7, name="b4/t256/past7/din768/dout768/h12", flops=flops(replace(job.shape, past=7))
    )
    path.write_text(json.dumps([item, decode, dict(item, precision="bf16")]))
    jobs, not_timed = peers.shapes_from_file(str(path))
    assert len(jobs) == 1
    assert not_timed == ["b4/t256/past7/din768/dout768/h12 (past 7)", f"{item['name']} (precision bf16)"]
    path.write_text(json.dumps([dict(item, flops=item["flops"] + 1)]))
    with pytest.raises(peers.UsageError, match=r"mha_bench counts 5236064257 FLOPs.* disagree"):
        peers.shapes_from_file(str(path))
    path.write_text(json.dumps([dict(item, name="b4/t256/din768/dout768/h12/noncausal")]))
    with pytest.raises(peers.UsageError, match="but the fields spell 'b4/t256/din768/dout768/h12'"):
        peers.shapes_from_file(str(path))
    path.write_text(json.dumps([dict(item, heads=3)]))
    with pytest.raises(peers.UsageError, match=r"unknown fields \['heads'\]"):
        peers.shapes_from_file(str(path))
    path.write_text(json.dumps([dict(item, batch="4")]))
    with pytest.raises(peers.UsageError, match="batch = '4', expected an integer >= 1"):
        peers.shapes_from_file(str(path))
    path.write_text(json.dumps([dict(item, threads=[])]))
    with pytest.raises(peers.UsageError, match="threads = \\[\\], expected a non-empty list"):
        peers.shapes_from_file(str(path))
    assert peers.parse_threads("2,1,2") == [1, 2]
    with pytest.raises(peers.UsageError, match="--threads 'x'"):
        peers.parse_threads("x")


def run_peers(*args):
    return run_module("mhapy.peers", *args)


@needs_torch
def test_tiny_run_writes_google_benchmark_json_the_report_reads(tmp_path):
    out = tmp_path / "peers.json"
    result = run_peers(
        "--shape", "b1/t8/din16/dout16/h1", "--shape", "b1/t8/din16/dout16/h2", "--shape", "b1/t8/din8/dout16/h2",
        "--threads", "1", "--min-time", "0.002", "--repetitions", "2", "--out", out, "--quiet",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    context = doc["context"]
    for key in (
        "torch_version",
        "torch_parallel_backend",
        "blas",
        "blas_library",
        "torch_threads",
        "peers_check",
        "num_cpus",
    ):
        assert key in context, key
    assert context["torch_version"] == torch.__version__
    assert "largest max |diff| / max |y|" in context["peers_check"]

    iterations = [
        b for b in doc["benchmarks"] if b.get("run_type") == "iteration" and not b.get("error_occurred")
    ]
    # 2 shapes x 3 modules + 1 shape (d_in != d_out) x 2 modules, 2 repetitions each.
    assert len(iterations) == (2 * 3 + 2) * 2
    for b in iterations:
        key = parse_name(b["name"])
        assert key.backend in ("torch", "torch_nn_mha") and key.threads == b["n_threads"] == 1
        assert (b["B"], b["T"], b["d_in"], b["d_out"], b["H"], b["head_dim"]) == (
            1,
            8,
            key.shape.d_in,
            16,
            key.shape.n_heads,
            16 // key.shape.n_heads,
        )
        assert b["GFLOPS"] * 1e9 * b["real_time"] * 1e-3 == pytest.approx(flops(key.shape))
        assert b["label"].startswith("checked: max |y - y_split| / max |y_split| = ")
    aggregates = {b["aggregate_name"] for b in doc["benchmarks"] if b.get("run_type") == "aggregate"}
    assert aggregates == {"mean", "median", "stddev", "cv"}
    (skip,) = [
        b for b in doc["benchmarks"] if b.get("error_occurred") and b["name"].endswith("threads:1/real_time")
    ]
    assert "nn.MultiheadAttention needs d_in == d_out" in skip["error_message"]

    results = load([out])
    assert results.backends() == ["torch", "torch_nn_mha"]
    report = tmp_path / "report"
    assert cli.main([str(out), "--out", str(report)]) == 0
    md = (report / "report.md").read_text()
    assert "| `torch_version` |" in md and (report / "speedup_vs_heads.png").exists()


@needs_torch
def test_time_budget_and_bad_input_leave_no_complete_looking_file(tmp_path):
    shapes = tmp_path / "shapes.json"
    shapes.write_text(
        json.dumps([{"batch": 1, "seq_len": 4, "d_in": 8, "d_out": 8, "n_heads": 2, "threads": [1]}])
    )
    out = tmp_path / "peers.json"
    result = run_peers("--shapes", shapes, "--time-budget", "0", "--out", out, "--quiet")
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert len(doc["benchmarks"]) == 3
    assert all(b["error_message"] == "skipped: time budget of 0 s used up" for b in doc["benchmarks"])

    bad = tmp_path / "bad.json"
    result = run_peers("--shape", "b1/t4/din8/dout9/h2", "--out", bad)
    assert result.returncode == 2
    assert "d_out (9) must be divisible by n_heads (2)" in result.stderr
    assert not bad.exists() and not list(tmp_path.glob(".*partial"))
