"""The OpenVINO adapter: both variants against the float64 oracle on tiny shapes (each axis:
grouped K/V heads, RoPE, biases, no out_proj, no out_proj bias, d_in != d_out, decode of one and
of several tokens), the fused KV cache (and a graph the check finds unfused), decode steps that
advance the positions and a rewind that puts the cache back, the cache precision recorded, and
the declines with their reasons. Runs in the peers' environment (scripts/peers-env.sh); skipped
where OpenVINO is not installed."""

from __future__ import annotations

import platform
import sys

import numpy as np
import pytest

ov = pytest.importorskip("openvino")

import adapter_checks  # noqa: E402
from mhapy import inputs, oracle  # noqa: E402
from mhapy.peers import openvino, run  # noqa: E402
from adapter_checks import assert_first_run_computes_the_function, shape  # noqa: E402

PEER = openvino.make_peer()
VARIANTS = {v.backend: v for v in openvino.VARIANTS}
HAS_BF16 = "BF16" in PEER.capabilities

SHAPES = [
    "b2/t7/din12/dout8/h2",
    "b1/t5/din8/dout8/h4/noncausal",
    "b2/t6/din8/dout12/h3/qkv_bias/no_out_proj",
    "b1/t9/din16/dout16/h4/kvh2/rope10000/no_out_bias",
    "b2/t8/din16/dout16/h4/kvh1/rope500000/qkv_bias/noncausal",
    "b2/t1/past6/din8/dout12/h3",
    "b2/t3/past6/din16/dout16/h4/qkv_bias",
    "b2/t1/past5/din16/dout16/h4/kvh1/rope10000/qkv_bias",
    "b2/t2/past5/din16/dout16/h4/kvh2/rope10000/noncausal",
    "b1/t3/past7/din12/dout16/h4/kvh2/rope10000/qkv_bias/no_out_bias",
    "b1/t1/past4/din8/dout8/h2/no_out_proj",
]


def computed():
    return adapter_checks.computed(PEER, VARIANTS, SHAPES)


def first_run(variant, s, threads=1):
    """The variant's call on the shape, after its first run (checked against the oracle)."""
    call, w, x = adapter_checks.prepared(PEER, variant, s, threads)
    assert_first_run_computes_the_function(call, s, w, x)
    return call, w, x


@pytest.mark.parametrize("variant, s", list(computed()))
def test_every_variant_computes_the_function_on_every_axis(variant, s):
    call, _, _ = first_run(variant, s)
    assert call.counters["compile_s"] > 0
    if s.is_decode:
        assert call.counters["ov_fused_kv_cache"] == 1.0
    call.close()


def test_every_decode_shape_is_computed_by_both_variants_and_prefill_by_openvino():
    params = list(computed())
    assert len(params) == len(SHAPES) + sum(shape(t).is_decode for t in SHAPES)


def test_three_projections_compute_the_same_block():
    # The split form (one MatMul per Q/K/V) measured no faster than [Wq; Wk; Wv]; it computes
    # the same thing.
    s = shape("b2/t6/din8/dout12/h3/kvh1/rope10000/qkv_bias")
    w, x = inputs.weights(s), inputs.x(s)
    outputs = []
    for fused in (True, False):
        graph = openvino.Graph(ov, PEER.op, s, w, fused=fused)
        compiled = PEER.core.compile_model(graph.model(False), "CPU", PEER.config(VARIANTS["openvino"], s, 1))
        outputs.append(compiled.create_infer_request().infer({0: x})[0])
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["openvino", "openvino_u8kv"])
@pytest.mark.parametrize("new", [1, 2])
def test_decode_steps_advance_the_positions_and_rewind_puts_the_cache_back(backend, new):
    # Three steps without a rewind are the rows of one call of 3·new tokens after the same past
    # (RoPE positions past, past + new, ...; each step's causal mask bottom-right); a rewind makes
    # the next step the first again. The call shares x's memory: each step's tokens go there.
    variant = VARIANTS[backend]
    s = shape(f"b2/t{new}/past5/din16/dout16/h4/kvh2/rope10000/qkv_bias")
    w = inputs.weights(s)
    tokens = np.random.default_rng(3).uniform(-1, 1, (3, s.batch, new, s.d_in)).astype(np.float32)
    x = tokens[0].copy()
    call = PEER.prepare(variant, s, w, x, 1)
    call.rewind()
    outputs = []
    for step in tokens:
        x[...] = step
        call.run()
        outputs.append(call.output())
    whole = shape(f"b2/t{3 * new}/past5/din16/dout16/h4/kvh2/rope10000/qkv_bias")
    rows = [(b, t) for b in range(2) for t in range(3 * new)]
    expected = oracle.forward_rows(whole, w, np.concatenate(list(tokens), axis=1), rows)
    got = np.stack([outputs[t // new][b, t % new] for b, t in rows])
    bound = 1e-5 if backend == "openvino" else oracle.bf16_tolerance(float(expected.max_score.max()))
    assert np.abs(got - expected.values).max() <= bound * np.abs(expected.values).max()
    # set_state copied the past tokens in: the arrays a rewind sets are untouched.
    for kept, initial in zip(call.cache, openvino.initial_cache(s, w)):
        np.testing.assert_array_equal(kept, initial)
    call.rewind()
    x[...] = tokens[0]
    call.run()
    np.testing.assert_array_equal(call.output(), outputs[0])
    call.close()


def test_the_kv_cache_precision_is_the_one_the_plugin_used():
    s = shape("b1/t1/past4/din8/dout8/h2")
    pinned, _, _ = first_run(VARIANTS["openvino"], s)
    default, _, _ = first_run(VARIANTS["openvino_u8kv"], s)
    assert pinned.kv_cache_precision == "f32"
    # The CPU plugin's default, as it reports it: u8 (a scale and zero point per token) on x86.
    assert default.kv_cache_precision == PEER.core.get_property("CPU", "KV_CACHE_PRECISION").to_string()
    if platform.machine() in ("x86_64", "AMD64"):
        assert default.kv_cache_precision == "u8"
    rows = oracle.forward_rows(s, inputs.weights(s), inputs.x(s), inputs.sample_rows(1, 1))
    assert run.tolerance(s, default, rows) > run.FP32_TOLERANCE == run.tolerance(s, pinned, rows)
    # A shape with an int8 cache: openvino pins the plugin's u8 cache, openvino_u8kv declines.
    int8 = shape("b1/t1/past4/din8/dout8/h2/kv_int8")
    quantised, _, _ = first_run(VARIANTS["openvino"], int8)
    assert quantised.kv_cache_precision == "u8"
    assert "u8" in PEER.declines(VARIANTS["openvino_u8kv"], int8)


def test_a_rewind_every_one_percent_of_past_tokens_appended():
    # A rewind copies the cache in (set_state): it comes once the steps since the last one have
    # appended 1% of past.
    for text, every in [("b1/t1/past250/din8/dout8/h2", 2), ("b1/t2/past250/din8/dout8/h2", 1)]:
        call, _, _ = first_run(VARIANTS["openvino"], shape(text))
        assert call.rewind_every == every
        call.close()


def test_the_fusion_check_finds_the_fused_cache_and_refuses_an_unfused_graph():
    s = shape("b2/t1/past3/din16/dout16/h4/kvh2/rope10000")
    w = inputs.weights(s)
    config = PEER.config(VARIANTS["openvino"], s, 1)
    fused = PEER.core.compile_model(openvino.Graph(ov, PEER.op, s, w).model(True, 16), "CPU", config)
    assert openvino.kv_cache_fusion(fused.get_runtime_model()) == "f32"
    # Without Gather(beam_idx) the plugin keeps the Concat and decomposes the SDPA.
    graph = openvino.Graph(ov, PEER.op, s, w).model(True, 16, beam_gather=False)
    unfused = PEER.core.compile_model(graph, "CPU", config)
    with pytest.raises(openvino.NotFused, match="MemoryInputs feed Concatenation"):
        openvino.kv_cache_fusion(unfused.get_runtime_model())
    # A forward pass has no cache at all.
    forward = PEER.core.compile_model(openvino.Graph(ov, PEER.op, s, w).model(False), "CPU", config)
    with pytest.raises(openvino.NotFused, match="no cache MemoryInput"):
        openvino.kv_cache_fusion(forward.get_runtime_model())


def test_u8kv_declines_a_forward_pass():
    reason = PEER.declines(VARIANTS["openvino_u8kv"], shape("b1/t4/din8/dout8/h2"))
    assert "a forward pass has no cache" in reason


@pytest.mark.skipif(HAS_BF16, reason="this CPU has bf16 in OpenVINO's CPU plugin")
@pytest.mark.parametrize("text", ["b1/t4/din8/dout8/h2/bf16", "b1/t1/past3/din8/dout8/h2/bf16"])
def test_bf16_is_declined_where_the_plugin_lacks_it(text):
    for variant in VARIANTS.values():
        reason = PEER.declines(variant, shape(text))
        assert reason is not None
        if shape(text).is_decode or variant.backend == "openvino":
            assert reason.startswith(
                "this CPU has no bf16 in OpenVINO's CPU plugin (OPTIMIZATION_CAPABILITIES: "
            )
            assert reason.endswith("): it would compute f32")


@pytest.mark.skipif(not HAS_BF16, reason="this CPU has no bf16 in OpenVINO's CPU plugin")
@pytest.mark.parametrize("backend", ["openvino", "openvino_u8kv"])
@pytest.mark.parametrize(
    "text", ["b1/t9/din16/dout16/h4/kvh2/rope10000/bf16", "b2/t1/past5/din16/dout16/h4/bf16"]
)
def test_bf16_computes_within_the_bound_of_a_bf16_module(backend, text):
    s = shape(text)
    if PEER.declines(VARIANTS[backend], s) is not None:
        pytest.skip("openvino_u8kv: decode only")
    call, _, _ = first_run(VARIANTS[backend], s)
    if s.is_decode and backend == "openvino":
        assert call.kv_cache_precision == "bf16"


def test_context_names_the_version_settings_and_capabilities():
    context = PEER.context()
    assert context["openvino_version"] == ov.get_version()
    assert "INFERENCE_NUM_THREADS=threads" in context["openvino_settings"]
    assert "FP32" in context["openvino_cpu_capabilities"]


def test_without_openvino_every_variant_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(openvino.Unavailable, match="OpenVINO is not installed in this Python"):
        openvino.make_peer()


@pytest.mark.parametrize("text", ["b1/t8/din8/dout8/h2/w2", "b1/t1/past6/din8/dout8/h2/w3"])
def test_windows_are_declined_naming_the_operator(text):
    for variant in VARIANTS.values():
        assert "OpenVINO's ScaledDotProductAttention op takes no window" in PEER.declines(
            variant, shape(text)
        )
