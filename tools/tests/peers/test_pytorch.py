"""The PyTorch adapter: every variant against the float64 oracle on tiny shapes (each axis:
grouped K/V heads, RoPE, biases, no out_proj, d_in != d_out, bf16, decode, sliding windows), decode steps that
advance and rewind, and every decline with its reason. Runs in the peers' environment
(scripts/peers-env.sh); skipped where PyTorch is not installed."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import adapter_checks  # noqa: E402
from adapter_checks import assert_first_run_computes_the_function  # noqa: E402
from mhapy import inputs, oracle  # noqa: E402
from mhapy.peers import pytorch  # noqa: E402
from mhapy.problem import parse_shape  # noqa: E402

PEER = pytorch.make_peer()
VARIANTS = {(v.backend, v.formulation): v for v in pytorch.VARIANTS}

SHAPES = [
    "b2/t7/din12/dout8/h2",
    "b1/t5/din8/dout8/h4/noncausal",
    "b2/t6/din8/dout12/h3/qkv_bias/no_out_proj",
    "b1/t9/din16/dout16/h4/kvh2/rope10000/no_out_bias",
    "b1/t9/din16/dout16/h4/kvh1/rope500000/qkv_bias/bf16",
    "b2/t1/past6/din8/dout12/h3",
    "b2/t3/past6/din16/dout16/h4/qkv_bias",
    "b2/t1/past5/din16/dout16/h4/kvh1/rope10000/qkv_bias",
    "b2/t2/past5/din16/dout16/h4/kvh2/rope10000/noncausal",
    "b1/t1/past4/din8/dout8/h2/bf16",
    # Sliding windows shorter than the keys: a forward pass, a chunk and a step after a past.
    "b1/t9/din16/dout16/h4/kvh2/rope10000/w3",
    "b2/t3/past6/din16/dout16/h4/qkv_bias/w4",
    "b2/t1/past6/din8/dout12/h3/w2",
]


def computed(shapes):
    """(variant, shape) pairs the variant does not decline (torch_compile on the first shape
    only: each compile takes seconds)."""
    return adapter_checks.computed(PEER, VARIANTS, shapes, only_first={"torch_compile"})


def first_run(variant, s, threads=1):
    """The variant's call on the shape, after its first run (checked against the oracle)."""
    call, w, x = adapter_checks.prepared(PEER, variant, s, threads)
    assert_first_run_computes_the_function(call, s, w, x)
    return call, w, x


@pytest.mark.parametrize("variant, s", list(computed(SHAPES)))
def test_every_variant_computes_the_function_on_every_axis_it_claims(variant, s):
    call, _, _ = first_run(variant, s)
    if s.is_decode:
        assert call.kv_cache_precision is None or call.kv_cache_precision in ("f32", "bf16")
    call.close()


def test_torch_compile_records_its_compile_time():
    s = parse_shape(SHAPES[0].split("/"))
    call, _, _ = first_run(VARIANTS["torch_compile", "split_weight"], s)
    assert call.counters["compile_s"] > 0


@pytest.mark.parametrize(
    "backend, formulation",
    [("torch_sdpa", "split_weight"), ("torch", "split_weight"), ("torch_prealloc", "wrapper")],
)
def test_decode_steps_append_and_rewind_puts_the_cache_back(backend, formulation):
    # Three steps without a rewind are the rows of a forward over past + 3 tokens at positions
    # past, past + 1, past + 2; a rewind makes the next step the first again.
    variant = VARIANTS[backend, formulation]
    rope = "/rope10000" if backend == "torch_sdpa" else ""
    s = parse_shape(f"b2/t1/past4/din8/dout8/h2{rope}/qkv_bias".split("/"))
    w = inputs.weights(s)
    tokens = np.random.default_rng(3).uniform(-1, 1, (3, s.batch, 1, s.d_in)).astype(np.float32)
    x3 = np.concatenate(list(tokens), axis=1)
    call = PEER.prepare(variant, s, w, tokens[0].copy(), 1)  # the call may share its x's memory
    call.rewind()
    outputs = []
    for i in range(3):
        call.x.copy_(torch.from_numpy(tokens[i]))
        call.run()
        outputs.append(call.output().copy())
    # The same: a call of three new tokens after the same past (mha_bench's oracle).
    whole = parse_shape(f"b2/t3/past4/din8/dout8/h2{rope}/qkv_bias".split("/"))
    rows = [(b, t) for b in range(2) for t in range(3)]
    expected = oracle.forward_rows(whole, w, x3, rows)
    got = np.stack([outputs[t][b, 0] for b, t in rows])
    assert np.abs(got - expected.values).max() <= 1e-5 * np.abs(expected.values).max()
    call.rewind()
    call.x.copy_(torch.from_numpy(tokens[0]))
    call.run()
    np.testing.assert_array_equal(call.output(), outputs[0])


@pytest.mark.parametrize(
    "backend, formulation, text, reason",
    [
        ("torch", "split_weight", "b1/t4/din8/dout8/h2/bf16", "fp32 only"),
        ("torch", "wrapper", "b1/t4/din8/dout8/h2/kvh1", "no grouped K/V heads"),
        ("torch", "split_weight", "b1/t4/din8/dout8/h2/rope10000", "no rotary embedding"),
        ("torch", "split_weight", "b1/t4/din8/dout8/h2/no_out_bias", "always has a bias"),
        ("torch_prealloc", "split_weight", "b1/t4/din8/dout8/h2", "no forward pass"),
        ("torch_nn_mha", "fused_qkv", "b1/t1/past3/din8/dout8/h2", "no KV cache"),
        ("torch_nn_mha", "fused_qkv", "b1/t4/din8/dout12/h2", "d_in == d_out"),
        ("torch_nn_mha", "fused_qkv", "b1/t4/din8/dout8/h2/no_out_proj", "always applies out_proj"),
        ("torch_nn_mha", "fused_qkv", "b1/t4/din8/dout8/h2/kvh1", "no grouped K/V heads"),
        ("torch_compile", "split_weight", "b1/t1/past3/din8/dout8/h2", "not compiled"),
        ("torch", "split_weight", "b1/t4/din8/dout8/h2/w2", "torch_sdpa computes it"),
        ("torch_compile", "split_weight", "b1/t4/din8/dout8/h2/w2", "masked call"),
    ],
)
def test_declines_say_why(backend, formulation, text, reason):
    assert reason in PEER.declines(VARIANTS[backend, formulation], parse_shape(text.split("/")))


def test_sdpa_declines_nothing():
    variant = VARIANTS["torch_sdpa", "split_weight"]
    assert all(PEER.declines(variant, parse_shape(t.split("/"))) is None for t in SHAPES)


def test_context_names_the_version_and_threads():
    context = PEER.context()
    assert context["torch_version"] == torch.__version__
    assert "set_num_threads" in context["torch_threads"]


def test_seeds_modules_too_big_for_memory_are_declined_naming_the_bytes(monkeypatch):
    # The seeds' split module at B1 T16k H12 holds 3 x 12 GiB of scores; a forward of 16k tokens
    # was killed at that, not measured. The wrapper holds one head's (3 GiB); SDPA none.
    monkeypatch.setattr(pytorch.meminfo, "available_bytes", lambda: 16 * 2**30)
    s = parse_shape("b1/t16384/din768/dout768/h12".split("/"))
    reason = PEER.declines(VARIANTS["torch", "split_weight"], s)
    assert (
        "hold (B, H, T, keys) scores (torch_sdpa does not): ~36.0 GiB at this shape, over half of the 16.0 GiB"
        in reason
    )
    assert PEER.declines(VARIANTS["torch", "wrapper"], s) is None
    assert PEER.declines(VARIANTS["torch_sdpa", "split_weight"], s) is None
    monkeypatch.setattr(pytorch.meminfo, "available_bytes", lambda: None)  # unknown: not declined
    assert PEER.declines(VARIANTS["torch", "split_weight"], s) is None
