"""mhapy.peers: the modules against a float64 oracle of docs/design.md §1, the agreement
check, shape input, and a real (tiny) run whose JSON the report reads. What needs torch is
skipped without it."""

import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import run_module

from mhapy import peers
from mhapy.problem import Shape, decode_bytes, flops
from mhapy.report import cli
from mhapy.report.results import load, parse_name

torch = peers.torch
tm = peers.tm if torch is not None else None
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
        ("b1/t8", r"missing name component\(s\) din, dout, h; expected b<B>/t<T>\[/past<P>\]/din"),
        ("b1/t8/din16/dout10/h3", r"d_out \(10\) is not a multiple of H \(3\)"),
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
    # Past tokens are timed (decode); grouped K/V heads and bf16: no module computes them yet,
    # listed, not timed.
    decode = dict(
        item, past=7, name="b4/t256/past7/din768/dout768/h12", flops=flops(replace(job.shape, past=7))
    )
    grouped = dict(item, n_kv_heads=4, name="b4/t256/din768/dout768/h12/kvh4")
    grouped["flops"] = flops(replace(job.shape, n_kv_heads=4))
    path.write_text(
        json.dumps([item, decode, dict(item, precision="bf16", name=item["name"] + "/bf16"), grouped])
    )
    jobs, not_timed = peers.shapes_from_file(str(path))
    assert [j.shape for j in jobs] == [job.shape, replace(job.shape, past=7)]
    assert not_timed == [
        f"{item['name']}/bf16 (precision bf16)",
        "b4/t256/din768/dout768/h12/kvh4 (n_kv_heads 4)",
    ]
    path.write_text(json.dumps([dict(decode, name=item["name"])]))
    with pytest.raises(peers.UsageError, match="but the fields spell 'b4/t256/past7/din768/dout768/h12'"):
        peers.shapes_from_file(str(path))
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
    assert "d_out (9) is not a multiple of H (2)" in result.stderr
    assert not bad.exists() and not list(tmp_path.glob(".*partial"))


def split_weights(split):
    """The split module's weights as oracle() takes them (numpy)."""
    projections = (split.W_query, split.W_key, split.W_value)
    wq, wk, wv = (p.weight.detach().numpy() for p in projections)
    biases = [p.bias.detach().numpy() for p in projections] if split.W_query.bias is not None else [None] * 3
    wo = bo = None
    if isinstance(split.out_proj, torch.nn.Linear):
        wo, bo = split.out_proj.weight.detach().numpy(), split.out_proj.bias.detach().numpy()
    return wq, wk, wv, wo, bo, biases


@needs_torch
@pytest.mark.parametrize("kv_cache", ["cat", "preallocated"])
@pytest.mark.parametrize(
    "text", ["b2/t9/din12/dout8/h2/qkv_bias", "b1/t9/din8/dout12/h3/noncausal/no_out_proj"]
)
def test_kv_cache_modules_compute_design_section_1_4(kv_cache, text):
    """Calls of 4, 1, 3 and 1 tokens: each call's y is rows [at, at + t) of the oracle over the
    tokens fed so far (causal: the full forward's rows), for both formulations and both caches;
    reset_cache() starts over; a call past the capacity is refused."""
    s = peers.shape_from_text(text)
    kw = dict(qkv_bias=s.qkv_bias, causal=s.causal, out_proj=s.out_proj)
    torch.manual_seed(5)
    split = tm.KVCacheMultiHeadAttention(s.d_in, s.d_out, s.seq_len, s.n_heads, kv_cache=kv_cache, **kw)
    wrapper = tm.KVCacheMultiHeadAttentionWrapper(
        s.d_in, s.d_out, s.seq_len, s.n_heads, kv_cache=kv_cache, **kw
    )
    tm.copy_split_to_wrapper(split, wrapper)
    assert "mask" not in split.state_dict() and "heads.0.mask" not in wrapper.state_dict()
    x = torch.randn(s.batch, s.seq_len, s.d_in, generator=torch.Generator().manual_seed(3))
    weights = split_weights(split)
    with torch.no_grad():
        for module in (split, wrapper):
            for _ in range(2):  # the second time after reset_cache()
                at = 0
                for t in (4, 1, 3, 1):
                    got = module(x[:, at : at + t], use_cache=True).numpy()
                    expected = oracle(x[:, : at + t].numpy(), *weights[:5], weights[5], s.n_heads, s.causal)
                    np.testing.assert_allclose(got, expected[:, at:], rtol=1e-4, atol=1e-5)
                    at += t
                assert [len(c) for c in module.kv_caches()] == [s.seq_len] * len(module.kv_caches())
                with pytest.raises(ValueError, match="KV cache of 9 tokens holds 9: no room for 1 more"):
                    module(x[:, :1], use_cache=True)
                module.reset_cache()
        # Without use_cache, the plain module: the full forward.
        full = oracle(x.numpy(), *weights[:5], weights[5], s.n_heads, s.causal)
        np.testing.assert_allclose(split(x).numpy(), full, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="MultiHeadAttention has no KV cache"):
        tm.MultiHeadAttention(4, 4, 2, 2)(torch.zeros(1, 1, 4), use_cache=True)


@needs_torch
def test_a_decode_step_starts_from_the_same_past_tokens_every_time():
    s = peers.shape_from_text("b2/t1/past6/din8/dout12/h3")
    modules = peers.build_decode_modules(s, seed=4)
    assert list(modules) == [
        "torch/split_weight",
        "torch/wrapper",
        "torch_prealloc/split_weight",
        "torch_prealloc/wrapper",
    ]
    x = torch.rand(s.batch, s.seq_len, s.d_in)
    outputs = {}
    with torch.no_grad():
        for name, module in modules.items():
            step = peers.DecodeStep(module, s, x, seed=9)
            assert [len(c) for c in module.kv_caches()] == [s.past] * len(module.kv_caches())
            outputs[name] = step()
            assert [len(c) for c in module.kv_caches()] == [s.past + 1] * len(module.kv_caches())
            assert torch.equal(step(), outputs[name])  # the cache went back to its 6 tokens first
            step.close()
            assert all(c.keys is None for c in module.kv_caches())
    # The same weights and the same cached tokens: the four agree.
    assert max(peers.agreement(outputs).values()) < peers.RTOL


@needs_torch
def test_tiny_decode_run_is_read_into_the_reports_decode_section(tmp_path):
    out = tmp_path / "peers.json"
    result = run_peers(
        "--shape", "b2/t1/past5/din16/dout16/h2", "--shape", "b2/t1/past20/din16/dout16/h2",
        "--threads", "1", "--min-time", "0.002", "--repetitions", "2", "--out", out, "--quiet",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    iterations = [b for b in doc["benchmarks"] if b.get("run_type") == "iteration"]
    assert len(iterations) == 2 * 4 * 2  # shapes x modules x repetitions; no nn.MultiheadAttention
    for b in iterations:
        key = parse_name(b["name"])
        assert key.backend in ("torch", "torch_prealloc") and b["past"] == key.shape.past
        assert b["bytes_min"] == decode_bytes(key.shape, key.formulation)
        assert b["GFLOPS"] * 1e9 * b["real_time"] * 1e-3 == pytest.approx(flops(key.shape))
        assert "cache loaded with the same random K/V of past tokens" in b["label"]
    assert "peers_decode" in doc["context"]
    report = tmp_path / "report"
    assert cli.main([str(out), "--out", str(report)]) == 0
    md = (report / "report.md").read_text()
    assert "| past (cached tokens) | bandwidth bound | torch split_weight | torch wrapper |" in md
    assert (report / "decode_time_vs_past.png").exists()
