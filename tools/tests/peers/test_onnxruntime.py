"""The ONNX Runtime adapter: every variant against the float64 oracle on tiny shapes (each axis:
grouped K/V heads, RoPE, biases, no out_proj, d_in != d_out, non-causal, prefill and decode with
B > 1), the decode buffers shared between past and present (a step writes its keys into the
preallocated buffer itself), decode steps that append and rewind, and every decline with its
reason. Runs in the peers' environment (scripts/peers-env.sh); skipped where ONNX Runtime is not
installed."""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import adapter_checks  # noqa: E402
from mhapy import inputs, oracle  # noqa: E402
from mhapy.peers import onnxruntime, run  # noqa: E402
from mhapy.peers.adapter import CACHE_SLACK_CALLS  # noqa: E402
from adapter_checks import assert_first_run_computes_the_function, shape  # noqa: E402

PEER = onnxruntime.make_peer()
VARIANTS = {v.backend: v for v in onnxruntime.VARIANTS}

SHAPES = [
    "b2/t7/din24/dout32/h2",
    "b1/t6/din16/dout16/h2/noncausal",
    "b2/t6/din16/dout32/h2/qkv_bias/no_out_proj",
    "b2/t9/din32/dout64/h4/kvh2/rope10000/no_out_bias",
    "b1/t9/din32/dout64/h4/kvh1/rope500000/qkv_bias",
    "b2/t5/din32/dout32/h2/rope10000/noncausal/qkv_bias",
    "b2/t1/past6/din16/dout32/h2",
    "b2/t3/past6/din32/dout32/h2/qkv_bias",
    "b2/t1/past5/din32/dout64/h4/kvh1/rope10000/qkv_bias",
    "b1/t2/past5/din32/dout64/h4/kvh2/rope10000/noncausal",
    "b2/t1/past5/din32/dout32/h2/noncausal/qkv_bias/no_out_bias",
    "b2/t2/past4/din16/dout32/h2/rope10000/qkv_bias/no_out_proj",
    "b2/t3/past4/din16/dout32/h2/noncausal/qkv_bias",
    "b1/t4/din16/dout32/h2/bf16",
    # Sliding windows shorter than the keys (onnxruntime_gqa's local_window_size).
    "b2/t9/din32/dout64/h4/kvh2/rope10000/w3",
    "b2/t1/past6/din16/dout32/h2/w2",
]


def computed():
    return adapter_checks.computed(PEER, VARIANTS, SHAPES)


def prepared(variant, s, threads=1):
    return adapter_checks.prepared(PEER, variant, s, threads)


@pytest.mark.parametrize("variant, s", list(computed()))
def test_every_variant_computes_the_function_on_every_axis_it_claims(variant, s):
    call, w, x = prepared(variant, s)
    assert_first_run_computes_the_function(call, s, w, x)
    assert call.kv_cache_precision == ("f32" if s.is_decode else None)
    call.run()  # a second step (a decode step appends); the check rewinds: the first step again
    assert_first_run_computes_the_function(call, s, w, x)
    call.close()


@pytest.mark.parametrize("backend", list(VARIANTS))
def test_two_threads_compute_it_too(backend):
    s = shape("b2/t3/past6/din32/dout32/h2/qkv_bias")
    call, w, x = prepared(VARIANTS[backend], s, threads=2)
    assert_first_run_computes_the_function(call, s, w, x)


def test_each_variant_declines_only_what_its_operator_lacks():
    # Of SHAPES, GroupQueryAttention declines bf16 and non-causal T > 1 after a past with B > 1
    # only; MultiHeadAttention bf16, grouped K/V heads and windows; Attention those and RoPE
    # (test_declines_say_why).
    declined = {b: {t for t in SHAPES if PEER.declines(VARIANTS[b], shape(t))} for b in VARIANTS}
    bf16 = {t for t in SHAPES if t.endswith("bf16")}
    windows = {t for t in SHAPES if "/w" in t}
    assert declined["onnxruntime_gqa"] == bf16 | {"b2/t3/past4/din16/dout32/h2/noncausal/qkv_bias"}
    assert declined["onnxruntime_mha"] == bf16 | windows | {t for t in SHAPES if "kvh" in t}
    assert declined["onnxruntime"] == bf16 | windows | {t for t in SHAPES if "kvh" in t or "rope" in t}


@pytest.mark.parametrize(
    "backend, text, reason",
    [
        ("onnxruntime", "b1/t4/din16/dout32/h2/bf16", "no bf16 attention kernels"),
        ("onnxruntime_gqa", "b1/t1/past3/din16/dout32/h2/bf16", "no bf16 attention kernels"),
        ("onnxruntime_mha", "b1/t4/din16/dout32/h2/bf16", "no bf16 attention kernels"),
        ("onnxruntime", "b1/t4/din16/dout32/h2/kvh1", "onnxruntime_gqa computes grouped K/V heads"),
        ("onnxruntime_mha", "b1/t4/din16/dout32/h2/kvh1", "onnxruntime_gqa computes grouped K/V heads"),
        ("onnxruntime", "b1/t4/din16/dout32/h2/rope10000", "Rotary embedding is not supported"),
        ("onnxruntime_gqa", "b1/t4/din16/dout24/h2", "head_dim a multiple of 8 (got 12)"),
        ("onnxruntime_gqa", "b1/t4/din16/dout16/h2/rope10000", "head_dim a multiple of 16 (got 8)"),
        ("onnxruntime_gqa", "b2/t3/past4/din16/dout32/h2/noncausal", "query_seqlens"),
        ("onnxruntime_mha", "b1/t4/din16/dout32/h2/w2", "onnxruntime_gqa computes it"),
    ],
)
def test_declines_say_why(backend, text, reason):
    assert reason in PEER.declines(VARIANTS[backend], shape(text))


def test_what_gqa_declines_the_kernel_rejects():
    # The declines are ONNX Runtime's limits, not the adapter's: forced, these shapes fail in
    # the kernel (or, for RoPE at head_dim 8, its rotary kernel).
    for text in (
        "b1/t4/din16/dout24/h2",
        "b1/t4/din16/dout16/h2/rope10000",
        "b2/t3/past4/din16/dout32/h2/noncausal",
    ):
        s = shape(text)
        with pytest.raises(Exception, match="head_size|query_seqlens|batch_size must be 1"):
            call, _, _ = prepared(VARIANTS["onnxruntime_gqa"], s)
            call.rewind()
            call.run()


def expected_keys(s, w, x, positions):
    """The new tokens' keys (B, T, H_kv, hd) in float64: K projection, bias, RoPE at positions."""
    keys = x.astype(np.float64) @ w.key.weight.astype(np.float64).T
    if w.key.bias is not None:
        keys = keys + w.key.bias
    if s.rope_base:
        keys = np.stack([oracle.rotate(k, positions, s.head_dim, s.rope_base) for k in keys])
    return keys.reshape(s.batch, s.seq_len, s.kv_heads, s.head_dim)


@pytest.mark.parametrize(
    "backend, text",
    [
        ("onnxruntime_gqa", "b2/t1/past5/din32/dout64/h4/kvh2/rope10000/qkv_bias"),
        ("onnxruntime_gqa", "b2/t3/past5/din32/dout32/h2"),
        ("onnxruntime_mha", "b2/t2/past5/din32/dout32/h2/rope10000/qkv_bias"),
    ],
)
def test_decode_writes_into_the_preallocated_buffers(backend, text):
    # Past and present are one buffer: after a step the OrtValue bound as past_key (and the
    # one ONNX Runtime returns as present_key) still points at the numpy buffer the call
    # allocated, and the step's keys sit in it at rows past .. past + T - 1; the past rows are
    # as they were and nothing is written beyond. Nothing was copied.
    s = shape(text)
    call, w, x = prepared(VARIANTS[backend], s)
    keys, values = call.key_cache, call.value_cache
    before = keys.copy(), values.copy()
    addresses = {name: call.values[f"past_{name}"].data_ptr() for name in ("key", "value")}
    assert addresses == {"key": keys.ctypes.data, "value": values.ctypes.data}
    call.rewind()
    call.run()
    outputs = dict(zip(["y", "present_key", "present_value"], call.binding.get_outputs()))
    assert outputs["present_key"].data_ptr() == keys.ctypes.data
    assert outputs["present_value"].data_ptr() == values.ctypes.data
    assert outputs["y"].data_ptr() == call.y.ctypes.data
    assert {name: call.values[f"past_{name}"].data_ptr() for name in ("key", "value")} == addresses
    new = slice(s.past, s.past + s.seq_len)
    want = expected_keys(s, w, x, np.arange(s.past, s.past + s.seq_len)).transpose(0, 2, 1, 3)
    assert np.abs(keys[:, :, new] - want).max() <= 1e-5 * np.abs(want).max()
    np.testing.assert_array_equal(keys[:, :, : s.past], before[0][:, :, : s.past])
    np.testing.assert_array_equal(values[:, :, : s.past], before[1][:, :, : s.past])
    assert not keys[:, :, s.past + s.seq_len :].any() and not values[:, :, s.past + s.seq_len :].any()
    assert np.abs(values[:, :, new]).max() > 0


def test_attention_decode_copies_its_past_into_a_new_present():
    # The contrast: com.microsoft.Attention's CPU kernel reads the past and writes all of it
    # and the new keys into another buffer.
    s = shape("b2/t1/past5/din32/dout32/h2/qkv_bias")
    call, w, x = prepared(VARIANTS["onnxruntime"], s)
    call.rewind()
    call.run()
    present = call.binding.get_outputs()[1]
    assert present.data_ptr() != call.values["past"].data_ptr()
    assert present.shape() == [2, s.batch, s.n_heads, s.past + 1, s.head_dim]
    cache = present.numpy()
    np.testing.assert_array_equal(cache[:, :, :, : s.past], call.values["past"].numpy())
    want = expected_keys(s, w, x, np.array([s.past])).transpose(0, 2, 1, 3)
    assert np.abs(cache[0, :, :, s.past :] - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize(
    "backend, rope",
    [
        ("onnxruntime_gqa", "/rope10000"),
        ("onnxruntime_gqa", ""),
        ("onnxruntime_mha", "/rope10000"),
        ("onnxruntime", ""),
    ],
)
def test_decode_steps_append_and_rewind_puts_the_cache_back(backend, rope):
    # Three steps without a rewind are the rows past, past + 1, past + 2 of a forward over the
    # past and the three tokens; a rewind makes the next step the first again.
    variant = VARIANTS[backend]
    s = shape(f"b2/t1/past4/din16/dout32/h2{rope}/qkv_bias")
    w = inputs.weights(s)
    tokens = np.random.default_rng(3).uniform(-1, 1, (3, s.batch, 1, s.d_in)).astype(np.float32)
    call = PEER.prepare(variant, s, w, tokens[0], 1)
    call.rewind()
    outputs = []
    for token in tokens:
        call.x[...] = token
        call.run()
        outputs.append(call.output())
    whole = shape(f"b2/t3/past4/din16/dout32/h2{rope}/qkv_bias")
    rows = [(b, t) for b in range(2) for t in range(3)]
    expected = oracle.forward_rows(whole, w, np.concatenate(list(tokens), axis=1), rows)
    got = np.stack([outputs[t][b, 0] for b, t in rows])
    assert np.abs(got - expected.values).max() <= run.FP32_TOLERANCE * np.abs(expected.values).max()
    call.rewind()
    call.x[...] = tokens[0]
    call.run()
    np.testing.assert_array_equal(call.output(), outputs[0])
    call.close()


def test_steps_beyond_the_buffers_say_so():
    s = shape("b1/t1/past3/din16/dout32/h2")
    call, _, _ = prepared(VARIANTS["onnxruntime_gqa"], s)
    assert call.capacity == s.past + (1 + CACHE_SLACK_CALLS) * s.seq_len
    call.rewind()
    for _ in range(1 + CACHE_SLACK_CALLS):
        call.run()
    with pytest.raises(RuntimeError, match="without a rewind"):
        call.run()


def test_rope_tables_are_mhas():
    cos, sin = onnxruntime.rope_tables(16, 10000.0, 40)
    angle = np.arange(40)[:, None] * 10000.0 ** (-np.arange(8) / 8.0)
    np.testing.assert_array_equal(cos, np.cos(angle).astype(np.float32))
    np.testing.assert_array_equal(sin, np.sin(angle).astype(np.float32))


def test_context_names_the_version_and_settings():
    context = PEER.context()
    assert context["onnxruntime_version"] == ort.__version__
    settings = context["onnxruntime_settings"]
    assert "intra_op_num_threads = threads" in settings and "inter_op_num_threads = 1" in settings
    assert "ORT_SEQUENTIAL" in settings and "ORT_ENABLE_ALL" in settings


def test_a_missing_library_is_unavailable(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(onnxruntime.Unavailable, match="not installed"):
        onnxruntime.make_peer()


def test_shapes_whose_probabilities_pass_the_memory_are_declined_naming_the_bytes(monkeypatch):
    # GroupQueryAttention keeps a (B, H, T, keys) fp32 buffer: 12.0 GiB at B1 T16k H12, 48 GiB at
    # 32k; such a run was killed, not measured. A decode step over 32k keys holds 1.5 MiB.
    monkeypatch.setattr(onnxruntime.meminfo, "available_bytes", lambda: 16 * 2**30)
    reason = PEER.declines(VARIANTS["onnxruntime_gqa"], shape("b1/t16384/din768/dout768/h12/w512"))
    assert reason == (
        "its CPU kernel keeps (B, H, T, keys) fp32 probabilities: ~12.0 GiB at this shape, over half of "
        "the 16.0 GiB available"
    )
    assert (
        PEER.declines(VARIANTS["onnxruntime_gqa"], shape("b1/t1/past32768/din768/dout768/h12/w512")) is None
    )
