"""OpenVINO as a peer: mha's block built node by node with OpenVINO's opset and compiled for its
CPU plugin, the way a model converted for OpenVINO runs. A forward pass: one MatMul with
[Wq; Wk; Wv] (three MatMuls measured no faster: 101.7 vs 101.6 ms on the GPT-2 block, fp32, one
Zen3 core), RoPE from cos/sin tables, ScaledDotProductAttention (grouped K/V heads broadcast to
every query head), the heads merged, out_proj. A decode step: the stateful graph optimum-intel
exports (a ReadValue/Assign variable per K and V, read through Gather(beam_idx) and extended by
Concat), which the CPU plugin's StatefulSDPAFusion turns into one SDPA node that keeps the cache
itself (in u8 by default) and splits a step over the keys. prepare() refuses a decode graph that
did not fuse: unfused, every step concatenates the whole cache and runs attention as separate
MatMul and Softmax nodes, an order of magnitude slower: OpenVINO measured the way nobody runs it.

Compiled with one stream, the latency hint, `threads` inference threads and the inference
precision pinned (bf16 is OpenVINO's default on CPUs that have it: unpinned, an fp32 shape would
run in bf16). The KV cache precision is pinned to the compute precision (openvino; u8 for a
shape with an int8 cache) or left at the plugin's default (openvino_u8kv); what the plugin used is read back from the compiled graph
and recorded. A call is one synchronous infer() of a request whose input shares x's memory and
whose output is not copied: the plugin runs on the calling thread (and its own, with more).
"""

from __future__ import annotations

import time

import numpy as np

from ..inputs import Weights
from ..problem import Shape
from .adapter import CACHE_SLACK_CALLS, Call, Peer, Unavailable, Variant

VARIANTS = [
    Variant(
        "openvino",
        "fused_qkv",
        "the block in OpenVINO's opset on its CPU plugin: one MatMul with [Wq; Wk; Wv], RoPE from cos/sin "
        "tables, ScaledDotProductAttention (grouped K/V heads broadcast), out_proj; decode: optimum-intel's "
        "stateful graph, the KV cache fused into the SDPA, kept in the compute precision",
    ),
    Variant(
        "openvino_u8kv",
        "fused_qkv",
        "decode: the openvino graph with the CPU plugin's default KV cache (u8 with a scale and zero point "
        "per token)",
    ),
]

# The cache's variables (ReadValue/Assign ids), K then V.
CACHE = ("past_key", "past_value")
# The plugin's precision names for mha's.
PRECISION = {"fp32": "f32", "bf16": "bf16"}


class NotFused(Exception):
    """A compiled decode graph whose KV cache the CPU plugin did not fuse into its SDPA."""


def kv_cache_fusion(runtime_model) -> str:
    """The KV cache precision of the fused SDPA of a compiled decode graph's runtime model
    (compiled.get_runtime_model()), or NotFused saying what is there instead.

    What fused looks like (found by experiment, OpenVINO 2026.4): the plugin's StatefulSDPAFusion
    replaces ReadValue -> Gather -> Concat -> SDPA and the Assigns by one node whose layerType is
    still "ScaledDotProductAttention" but whose inputs are q, k, v, beam_idx and the two
    variables' "MemoryInput" nodes, whose outputs feed the "MemoryOutput" nodes (the Assigns),
    and whose rt_info carries "kv_cache_precision". Unfused, the MemoryInputs feed a
    "Concatenation" (or attention runs as "MatMul" and "Softmax" nodes)."""

    def layer(node) -> str:
        info = node.get_rt_info()
        return info["layerType"].astype(str) if "layerType" in info else node.get_type_name()

    ops = runtime_model.get_ordered_ops()
    readers = {
        layer(target.get_node())
        for node in ops
        if layer(node) == "MemoryInput"
        for output in node.outputs()
        for target in output.get_target_inputs()
    }
    separate = sorted({layer(n) for n in ops} & {"MatMul", "Softmax", "SoftMax"})
    for node in ops:
        info = node.get_rt_info()
        sources = [layer(i.get_source_output().get_node()) for i in node.inputs()]
        if (
            layer(node) == "ScaledDotProductAttention"
            and sources.count("MemoryInput") == 2
            and "kv_cache_precision" in info
            and readers <= {"ScaledDotProductAttention", "ShapeOf"}  # ShapeOf: the step's position
            and not separate
        ):
            return info["kv_cache_precision"].astype(str)
    why = [
        f"the cache's MemoryInputs feed {', '.join(sorted(readers))}" if readers else "no cache MemoryInput"
    ]
    why += [f"attention runs as separate {', '.join(separate)} nodes"] if separate else []
    raise NotFused(f"OpenVINO did not fuse the KV cache into its ScaledDotProductAttention: {'; '.join(why)}")


def rope_tables(s: Shape, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (positions, head_dim) float32 of docs/design.md §1.6 for positions 0 ..
    positions - 1, each half of a row the same (the pairs (e, e + head_dim/2) turn by one angle):
    the angles in float64, rounded once, as mha's per-plan table and the oracle."""
    half = s.head_dim // 2
    frequency = s.rope_base ** (-2.0 * np.arange(half) / s.head_dim)
    angle = np.arange(positions, dtype=np.float64)[:, None] * frequency[None, :]
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    return np.concatenate([cos, cos], axis=1), np.concatenate([sin, sin], axis=1)


class Graph:
    """mha's block of one shape in OpenVINO's opset (opset13 has every op it needs)."""

    def __init__(self, ov, op, s: Shape, w: Weights, fused: bool = True):
        self.ov, self.op, self.s, self.w, self.fused = ov, op, s, w, fused

    def const(self, a) -> object:
        return self.op.constant(np.ascontiguousarray(a))

    def i64(self, *values) -> object:
        return self.op.constant(np.array(values, np.int64))

    def linear(self, x, weight: np.ndarray, bias: np.ndarray | None):
        y = self.op.matmul(x, self.const(weight), False, True)
        return self.op.add(y, self.const(bias)) if bias is not None else y

    def heads(self, t, n: int):
        """(B, T, n·hd) -> (B, n, T, hd)."""
        s = self.s
        return self.op.transpose(
            self.op.reshape(t, self.i64(s.batch, s.seq_len, n, s.head_dim), False), self.i64(0, 2, 1, 3)
        )

    def rotate(self, t, cos, sin):
        """RoPE, rotate-half (§1.6): t·cos + [-t_hi, t_lo]·sin on (B, n, T, hd), cos and sin
        (1, 1, T, hd) with equal halves. Written as OpenVINO's RoPEFusionGPTNEOX pattern expects it
        (VariadicSplit on axis 3, Multiply by -1, Concat on axis -1), which the CPU plugin runs as
        one RoPE node."""
        op, half = self.op, self.s.head_dim // 2
        lo, hi = op.variadic_split(t, np.int64(3), self.i64(half, half)).outputs()
        turned = op.concat([op.multiply(hi, np.float32(-1)), lo], -1)
        return op.add(op.multiply(t, cos), op.multiply(turned, sin))

    def expand(self, t):
        """Grouped K/V heads for the SDPA: (B, H_kv, L, hd) -> (B, H, L, hd), K/V head j read by
        query heads j·g .. j·g + g - 1 (§1.3), as Unsqueeze -> Broadcast(BIDIRECTIONAL, constant
        [1, 1, g, 1, 1]) -> Reshape: the one form the plugin folds into its fused decode SDPA
        (a numpy-mode Broadcast to a shape from ShapeOf does not fuse)."""
        s, op = self.s, self.op
        group = s.n_heads // s.kv_heads
        if group == 1:
            return t
        t = op.unsqueeze(t, self.i64(2))
        t = op.broadcast(t, self.i64(1, 1, group, 1, 1), broadcast_spec="BIDIRECTIONAL")
        return op.reshape(t, self.i64(s.batch, s.n_heads, -1, s.head_dim), False)

    def projections(self, x):
        """Q, K and V (B, T, d) of x: one MatMul with [Wq; Wk; Wv] split three ways (fused_qkv),
        or one MatMul each (split)."""
        op, s, w = self.op, self.s, self.w
        layers = (w.query, w.key, w.value)
        if not self.fused:
            return [self.linear(x, layer.weight, layer.bias) for layer in layers]
        d_kv = s.kv_heads * s.head_dim
        weight = np.concatenate([layer.weight for layer in layers])
        bias = np.concatenate([layer.bias for layer in layers]) if s.qkv_bias else None
        return op.variadic_split(
            self.linear(x, weight, bias), np.int64(-1), self.i64(s.d_out, d_kv, d_kv)
        ).outputs()

    def variable(self, name: str):
        """A cache variable: (B, H_kv, any length, hd) float32 (the plugin keeps it in the KV cache
        precision; its VariableState takes and gives float32)."""
        ov, s = self.ov, self.s
        info = ov.op.util.VariableInfo()
        info.variable_id, info.data_type = name, ov.Type.f32
        info.data_shape = ov.PartialShape([s.batch, s.kv_heads, -1, s.head_dim])
        return ov.op.util.Variable(info)

    def model(self, decode: bool, positions: int = 0, beam_gather: bool = True):
        """The block of a forward pass (decode False), or of a decode step, the stateful graph whose
        RoPE tables cover positions 0 .. positions - 1. beam_gather=False leaves out the
        Gather(beam_idx): a stateful graph the plugin does not fuse (for kv_cache_fusion's tests)."""
        ov, op, s, w = self.ov, self.op, self.s, self.w
        x = op.parameter([s.batch, s.seq_len, s.d_in], np.float32, name="x")
        parameters, sinks, mask = [x], [], None
        q, k, v = self.projections(x)
        q, k, v = self.heads(q, s.n_heads), self.heads(k, s.kv_heads), self.heads(v, s.kv_heads)
        if not decode:
            if s.rope_base:
                cos, sin = (self.const(t[None, None]) for t in rope_tables(s, s.seq_len))
                q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
            causal = s.causal  # no past: top-left and bottom-right alignment agree
        else:
            # optimum-intel's form, the one StatefulSDPAFusion matches: per K and V a ReadValue
            # with an empty-cache initializer (without one the fused graph fails to compile),
            # Gather(beam_idx) on the batch axis, Concat with the step's rows, the Concat feeding
            # the SDPA and the Assign.
            beam = op.parameter([s.batch], np.int32, name="beam_idx")
            parameters.append(beam)
            empty = self.i64(s.batch, s.kv_heads, 0, s.head_dim)
            variables = [self.variable(name) for name in CACHE]
            pasts = [op.read_value(op.broadcast(np.float32(0), empty), variable) for variable in variables]
            if beam_gather:
                pasts = [op.gather(past, beam, np.int64(0)) for past in pasts]
            # The step's positions: from the cache's length before it on (rewinds and steps move
            # them with no input to update).
            start = op.gather(op.shape_of(pasts[0], "i64"), np.int64(2), np.int64(0))
            stop = op.add(start, np.int64(s.seq_len))
            if s.rope_base:
                steps = op.range(start, stop, np.int64(1), "i64")
                cos, sin = (
                    op.unsqueeze(op.gather(self.const(t), steps, np.int64(0)), self.i64(0, 1))
                    for t in rope_tables(s, positions)
                )
                q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
            k, v = (op.concat([past, new], 2) for past, new in zip(pasts, (k, v)))
            sinks = [ov.op.assign(t, variable) for t, variable in zip((k, v), variables)]
            # OpenVINO's causal flag is top-left aligned (a single row would see key 0 only):
            # a one-token step attends to every key without it; several new rows get the
            # bottom-right mask, row i seeing keys 0 .. past + i (True: attend).
            causal = False
            if s.causal and s.seq_len > 1:
                keys = op.range(np.int64(0), stop, np.int64(1), "i64")
                rows = op.range(start, stop, np.int64(1), "i64")
                mask = op.less_equal(op.unsqueeze(keys, self.i64(0)), op.unsqueeze(rows, self.i64(1)))
        k, v = self.expand(k), self.expand(v)
        inputs = (q, k, v) if mask is None else (q, k, v, mask)
        a = op.scaled_dot_product_attention(*inputs, causal=causal)
        y = op.reshape(op.transpose(a, self.i64(0, 2, 1, 3)), self.i64(s.batch, s.seq_len, s.d_out), False)
        if w.out_proj is not None:
            y = self.linear(y, w.out_proj.weight, w.out_proj.bias)
        return ov.Model([op.result(y)], sinks, parameters, "mha_block")


def initial_cache(s: Shape, w: Weights) -> tuple[np.ndarray, np.ndarray]:
    """The cache after s.past tokens of x = 0, (B, H_kv, past, hd) float32 each: every key the K
    bias (zero without qkv_bias) turned by its position with RoPE, every value the V bias."""
    layout = (s.batch, s.kv_heads, s.past, s.head_dim)
    key, value = (np.zeros(layout[1::2], np.float64) for _ in range(2))
    if s.qkv_bias:
        key = w.key.bias.astype(np.float64).reshape(s.kv_heads, s.head_dim)
        value = w.value.bias.astype(np.float64).reshape(s.kv_heads, s.head_dim)
    keys = np.broadcast_to(key[:, None, :], layout[1:])
    if s.rope_base:
        cos, sin = rope_tables(s, s.past)
        half = s.head_dim // 2
        turned = np.concatenate([-keys[..., half:], keys[..., :half]], axis=-1)
        keys = keys * cos + turned * sin
    keys = np.ascontiguousarray(np.broadcast_to(keys, layout), np.float32)
    values = np.ascontiguousarray(np.broadcast_to(value[:, None, :], layout), np.float32)
    return keys, values


class OpenVINOCall(Call):
    """One compiled graph and its infer request, x bound once as a tensor sharing its memory; a
    decode call holds the cache's VariableStates and the past tokens it puts back into them."""

    def __init__(self, ov, compiled, x: np.ndarray, beam: np.ndarray | None = None, cache=None):
        self.compiled, self.x, self.beam, self.cache = compiled, x, None, None
        self.request = compiled.create_infer_request()
        self.request.set_input_tensor(0, ov.Tensor(x, shared_memory=True))
        self.states = []
        if beam is not None:
            self.beam = beam  # beam_idx = 0 .. B - 1 (no reordering), its tensor over this memory
            self.request.set_input_tensor(1, ov.Tensor(beam, shared_memory=True))
            by_name = {state.name: state for state in self.request.query_state()}
            # The past tokens as OpenVINO tensors over NumPy's memory; set_state copies them into
            # the plugin's cache (converting to its precision), so they stay the same for the
            # next rewind.
            self.cache = cache
            self.states = [(by_name[name], ov.Tensor(a, shared_memory=True)) for name, a in zip(CACHE, cache)]

    def run(self) -> None:
        # Synchronous: the plugin runs the graph on this thread and its own; the output stays in
        # the request's tensor (share_outputs: no copy into NumPy).
        self.request.infer(share_outputs=True)

    def output(self) -> np.ndarray:
        return self.request.get_output_tensor(0).data.copy()

    def rewind(self) -> None:
        for state, past in self.states:
            state.state = past

    def close(self) -> None:
        self.states = []
        self.request = self.compiled = self.x = self.beam = self.cache = None


class OpenVINO(Peer):
    library = "openvino"

    def __init__(self, ov, op):
        self.ov, self.op = ov, op
        self.core = ov.Core()
        self.capabilities = list(self.core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))

    def declines(self, variant: Variant, s: Shape) -> str | None:
        if s.window:
            return (
                f"a sliding window ({s.window}): OpenVINO's ScaledDotProductAttention op takes no window "
                "(its PagedAttention does, behind a serving pipeline this bench does not drive)"
            )
        if variant.backend == "openvino_u8kv" and s.kv_precision:
            return (
                f"a {s.kv_precision} KV cache: openvino runs it with its cache pinned to u8 (per token and "
                "head, a scale and zero point: mha's int8 format's kin)"
            )
        if variant.backend == "openvino_u8kv" and not s.is_decode:
            return (
                "openvino_u8kv is OpenVINO's decode with its default u8 KV cache: a forward pass has no "
                "cache (openvino computes it)"
            )
        if s.precision == "bf16" and "BF16" not in self.capabilities:
            return (
                "this CPU has no bf16 in OpenVINO's CPU plugin (OPTIMIZATION_CAPABILITIES: "
                f"{', '.join(self.capabilities)}): it would compute f32"
            )
        if s.rope_base and s.head_dim % 2:
            return f"rotary embedding needs an even head_dim (got {s.head_dim})"
        return None

    def config(self, variant: Variant, s: Shape, threads: int) -> dict:
        precision = PRECISION[s.precision]
        config = {
            "INFERENCE_NUM_THREADS": threads,
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": precision,
        }
        if s.is_decode and variant.backend == "openvino":
            # An int8 cache's counterpart: the plugin's u8 cache (asymmetric, per token and head).
            config["KV_CACHE_PRECISION"] = "u8" if s.kv_precision == "int8" else precision
        return config

    def prepare(self, variant: Variant, s: Shape, w: Weights, x: np.ndarray, threads: int) -> Call:
        ov = self.ov
        x = np.ascontiguousarray(x, np.float32)
        graph = Graph(ov, self.op, s, w)
        # set_state copies the cache in: rewind every 1% of past tokens appended. The RoPE tables
        # cover every step until then and CACHE_SLACK_CALLS more (a position beyond them would
        # read zeros from Gather: silently wrong).
        rewind_every = max(1, s.past // (100 * s.seq_len))
        positions = s.past + s.seq_len * (rewind_every + CACHE_SLACK_CALLS)
        start = time.perf_counter()
        compiled = self.core.compile_model(
            graph.model(s.is_decode, positions), "CPU", self.config(variant, s, threads)
        )
        seconds = time.perf_counter() - start
        if not s.is_decode:
            call = OpenVINOCall(ov, compiled, x)
            call.counters = {"compile_s": seconds}
            return call
        precision = kv_cache_fusion(compiled.get_runtime_model())  # NotFused: not timed
        call = OpenVINOCall(ov, compiled, x, np.arange(s.batch, dtype=np.int32), initial_cache(s, w))
        call.kv_cache_precision = precision
        call.rewind_every = rewind_every
        call.counters = {"compile_s": seconds, "ov_fused_kv_cache": 1.0}
        return call

    def context(self) -> dict[str, str]:
        return {
            "openvino_version": self.ov.get_version(),
            "openvino_settings": "CPU plugin, NUM_STREAMS=1, PERFORMANCE_HINT=LATENCY, "
            "INFERENCE_PRECISION_HINT pinned to the shape's precision (f32 or bf16), "
            "INFERENCE_NUM_THREADS=threads; decode: the stateful graph (ReadValue -> Gather(beam_idx) -> "
            "Concat -> SDPA, Assign) fused into one SDPA node with the cache, KV_CACHE_PRECISION pinned to "
            "the compute precision (openvino) or the plugin's default, "
            f"{self.core.get_property('CPU', 'KV_CACHE_PRECISION').to_string()} here (openvino_u8kv); "
            "the cache set back to its past tokens with VariableState.state every rewind",
            "openvino_cpu_capabilities": ", ".join(self.capabilities),
        }


def make_peer() -> Peer:
    try:
        import openvino
        import openvino.opset13
    except ImportError as e:
        raise Unavailable(
            f"OpenVINO is not installed in this Python ({e}); scripts/peers-env.sh says why"
        ) from None
    return OpenVINO(openvino, openvino.opset13)
