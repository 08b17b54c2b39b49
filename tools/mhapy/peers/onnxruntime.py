"""ONNX Runtime as a peer: mha's block built in memory as an ONNX graph (onnx.helper, opset 17
and com.microsoft 1) around one of ONNX Runtime's contrib attention operators and run by its
CPU execution provider, the way a model exported for ONNX Runtime runs:
- onnxruntime: com.microsoft.Attention, the GPT-2 exports' operator (one weight (d_in, 3 d_out)
  = [Wqᵀ | Wkᵀ | Wvᵀ], the projection inside the operator), then out_proj as MatMul + Add. Its
  decode takes a (2, B, H, past, hd) past and writes a new present of past + T tokens every
  step: the CPU kernel shares no buffer (it rejects past_present_share_buffer's
  past_sequence_length).
- onnxruntime_gqa: one MatMul with [Wq; Wk; Wv] into com.microsoft.GroupQueryAttention's packed
  QKV input (grouped K/V heads, RoPE fused with do_rotary), then out_proj: the operator
  onnxruntime-genai runs LLMs with.
- onnxruntime_mha: one MatMul per Q/K/V into com.microsoft.MultiHeadAttention (RoPE by two
  com.microsoft.RotaryEmbedding nodes), then out_proj.
The decode steps of the last two write into the cache in place, as onnxruntime-genai runs them:
past_key and present_key are bound through IOBinding to one preallocated (B, H_kv, capacity, hd)
buffer (and the values to another), which the CPU kernels recognise (GroupQueryAttention by the
two tensors' address, MultiHeadAttention by its past_sequence_length input) and then write only
the new tokens' rows. Copying the past into a new present instead makes a step over 2048 tokens
about 3x slower here.

Every input and output is bound once through IOBinding (x from a copy the call owns, y into a
preallocated array), so a timed run() is one run_with_iobinding. One session per call, with
intra_op_num_threads = threads, one inter-op thread, sequential execution and every graph
optimisation; ONNX Runtime's defaults otherwise (its intra-op threads spin while they wait).
What each operator computes was found by experiment with onnxruntime 1.32.0 against the float64
oracle (tools/tests/peers/test_onnxruntime.py); what it rejects is declined with its message.
"""

from __future__ import annotations

import numpy as np

from .. import meminfo
from ..inputs import Weights
from ..problem import Shape
from .adapter import CACHE_SLACK_CALLS, Call, Peer, Unavailable, Variant

VARIANTS = [
    Variant(
        "onnxruntime",
        "fused_qkv",
        "com.microsoft.Attention (weights [Wqᵀ | Wkᵀ | Wvᵀ], unidirectional for causal), out_proj MatMul + "
        "Add, on ONNX Runtime's CPU provider; decode: the (2, B, H, past, hd) past copied into a new present "
        "every step (the CPU kernel shares no buffer)",
    ),
    Variant(
        "onnxruntime_gqa",
        "fused_qkv",
        "one MatMul with [Wq; Wk; Wv] into com.microsoft.GroupQueryAttention's packed QKV (kv_num_heads, "
        "do_rotary rotate-half, causal), out_proj MatMul + Add; past and present K/V bound through IOBinding "
        "to one preallocated (B, H_kv, capacity, hd) buffer each, written in place",
    ),
    Variant(
        "onnxruntime_mha",
        "split_weight",
        "one MatMul per Q/K/V into com.microsoft.MultiHeadAttention (unidirectional for causal; RoPE by "
        "com.microsoft.RotaryEmbedding), out_proj MatMul + Add; decode: past and present K/V bound to one "
        "preallocated (B, H, capacity, hd) buffer each, past_sequence_length set, written in place",
    ),
]

NO_BF16 = "ONNX Runtime's CPU execution provider has no bf16 attention kernels"
OPSET = 17
MS = "com.microsoft"
SETTINGS = (
    "CPUExecutionProvider; intra_op_num_threads = threads, inter_op_num_threads = 1, ORT_SEQUENTIAL, "
    f"ORT_ENABLE_ALL, other options at their defaults; the block built in memory (opset {OPSET} and "
    "com.microsoft 1), one session per shape and thread count; x, y and the KV buffers bound once "
    "through IOBinding, a call one run_with_iobinding"
)


def rope_tables(head_dim: int, base: float, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (positions, head_dim / 2) of p · base^(-2e/head_dim), computed in float64 and
    rounded once to float32 as mha's table (docs/design.md §1.6): the operators' cos_cache and
    sin_cache."""
    frequency = base ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    angle = np.arange(positions, dtype=np.float64)[:, None] * frequency[None, :]
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def rotate_half(v: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """v (..., positions, head_dim) float32 turned by the tables' rows (rotate-half), in float32
    as the operators turn it."""
    half = v.shape[-1] // 2
    lo, hi = v[..., :half], v[..., half:]
    return np.concatenate([lo * cos - hi * sin, hi * cos + lo * sin], axis=-1)


def past_cache(s: Shape, w: Weights, capacity: int, tables) -> tuple[np.ndarray, np.ndarray]:
    """Key and value buffers (B, H_kv, capacity, hd) whose first `past` rows hold the tokens of
    x = 0 (mha_bench's decode start): keys the K bias turned by positions 0 .. past - 1, values
    the V bias (zeros without biases); the rest zero."""
    kv, hd = s.kv_heads, s.head_dim
    keys = np.zeros((s.batch, kv, capacity, hd), np.float32)
    values = np.zeros_like(keys)
    if s.qkv_bias and s.past:
        bias = np.broadcast_to(w.key.bias.reshape(kv, 1, hd), (kv, s.past, hd))
        keys[:, :, : s.past] = rotate_half(bias, tables[0][: s.past], tables[1][: s.past]) if tables else bias
        values[:, :, : s.past] = w.value.bias.reshape(kv, 1, hd)
    return keys, values


class Graph:
    """The nodes, initializers and inputs of one model, named as they are added. The block's
    output is "y": out_proj's, or the attention operator's own without an out_proj (no copy)."""

    def __init__(self, onnx, w: Weights):
        self.onnx, self.helper = onnx, onnx.helper
        self.nodes, self.initializers, self.inputs = [], [], []
        self.attention = "attention" if w.out_proj is not None else "y"

    def constant(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def input(self, name: str, dtype, dims) -> str:
        self.inputs.append(self.helper.make_tensor_value_info(name, dtype, dims))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], domain: str = "", **attributes) -> str:
        self.nodes.append(self.helper.make_node(op, inputs, outputs, domain=domain, **attributes))
        return outputs[0]

    def linear(self, x: str, weight: np.ndarray, bias: np.ndarray | None, name: str) -> str:
        """x @ weightᵀ (+ bias) as the tensor `name`: weight (out, in) as nn.Linear keeps it."""
        product = f"{name}_matmul" if bias is not None else name
        self.node("MatMul", [x, self.constant(f"{name}_weight", weight.T)], [product])
        if bias is None:
            return product
        return self.node("Add", [product, self.constant(f"{name}_bias", bias)], [name])

    def model_bytes(self, w: Weights, outputs: list[str]) -> bytes:
        """The model with out_proj (MatMul, + Add with its bias) after the attention, outputs
        "y" and then `outputs`."""
        if w.out_proj is not None:
            self.linear(self.attention, w.out_proj.weight, w.out_proj.bias, "y")
        helper, FLOAT = self.helper, self.onnx.TensorProto.FLOAT
        graph = helper.make_graph(
            self.nodes,
            "mha_block",
            self.inputs,
            [helper.make_tensor_value_info(name, FLOAT, None) for name in ["y"] + outputs],
            self.initializers,
        )
        opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS, 1)]
        return helper.make_model(graph, opset_imports=opsets).SerializeToString()


class OrtCall(Call):
    """A session with x (the call's own copy: a test may write new tokens into self.x between
    runs) bound as an input and y bound first among the outputs; a forward pass."""

    def __init__(self, ort, model: bytes, threads: int, x: np.ndarray, d_out: int):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.ort = ort
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.binding = self.session.io_binding()
        self.values = {}  # the bound OrtValues by input name
        self.x = np.array(x, dtype=np.float32, order="C")
        self.bind_input("x", self.x)
        self.y = np.empty((x.shape[0], x.shape[1], d_out), np.float32)
        self.binding.bind_output(
            "y", "cpu", element_type=np.float32, shape=list(self.y.shape), buffer_ptr=self.y.ctypes.data
        )

    def bind_input(self, name: str, array: np.ndarray) -> None:
        """Binds `array` itself (a CPU OrtValue shares numpy's memory): writing it changes the
        next run's input."""
        self.values[name] = self.ort.OrtValue.ortvalue_from_numpy(array)
        self.binding.bind_ortvalue_input(name, self.values[name])

    def run(self) -> None:
        self.session.run_with_iobinding(self.binding)

    def output(self) -> np.ndarray:
        return self.y.copy()

    def close(self) -> None:
        self.binding = self.session = self.values = self.x = self.y = None


class SharedCacheCall(OrtCall):
    """past_key and present_key bound to one OrtValue over self.key_cache (B, H_kv, capacity,
    hd), past_value and present_value to one over self.value_cache: a step writes its keys and
    values at rows length .. length + T - 1 and attends over the first length + T. The length
    reaches the operator through bound int arrays (`lengths`: name -> (shape, dtype, offset),
    each holding length + offset). A step after a step without a rewind appends (the arrays
    grow by T); rewind() sets them back to length = past, which is all a rewind needs: no step
    writes the past rows. A forward pass (past 0: GroupQueryAttention's prefill) never
    advances."""

    def __init__(self, ort, model, threads, x, d_out, caches, past: int, lengths: dict[str, tuple]):
        super().__init__(ort, model, threads, x, d_out)
        self.key_cache, self.value_cache = caches
        self.capacity, self.past, self.step = self.key_cache.shape[2], past, x.shape[1]
        self.kv_cache_precision = "f32" if past else None
        self.lengths = []  # (bound array, offset)
        for name, (shape, dtype, offset) in lengths.items():
            array = np.full(shape, past + offset, dtype)
            self.bind_input(name, array)
            self.lengths.append((array, offset))
        for name, cache in (("key", self.key_cache), ("value", self.value_cache)):
            self.bind_input(f"past_{name}", cache)
            self.binding.bind_ortvalue_output(f"present_{name}", self.values[f"past_{name}"])
        self.steps = 0

    def run(self) -> None:
        if self.steps and self.past:  # the step after another without a rewind: after it
            self.advance()
        self.session.run_with_iobinding(self.binding)
        self.steps += 1

    def advance(self) -> None:
        length = self.past + self.steps * self.step
        if length + self.step > self.capacity:
            raise RuntimeError(
                f"decode step {self.steps + 1} without a rewind: {length + self.step} tokens exceed the "
                f"buffers' {self.capacity} (past + (1 + CACHE_SLACK_CALLS) · T)"
            )
        for array, _ in self.lengths:
            array += self.step

    def rewind(self) -> None:
        for array, offset in self.lengths:
            array[...] = self.past + offset
        self.steps = 0

    def close(self) -> None:
        super().close()
        self.key_cache = self.value_cache = self.lengths = None


class ConcatCacheCall(OrtCall):
    """com.microsoft.Attention's decode: `past` (2, B, H, length, hd) in, a new `present`
    (2, B, H, length + T, hd) out, preallocated for the first step after the past tokens. A
    step after a step (no rewind) takes the last present as its past and a new present T
    longer (allocated in that run); rewind() binds the first past and present again."""

    kv_cache_precision = "f32"

    def __init__(self, ort, model, threads, x, d_out, past: np.ndarray):
        super().__init__(ort, model, threads, x, d_out)
        self.bind_input("past", past)
        shape = list(past.shape)
        shape[3] += x.shape[1]
        self.first = (self.values["past"], ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32))
        self.present = self.first[1]
        self.binding.bind_ortvalue_output("present", self.present)
        self.step, self.steps, self.grown = x.shape[1], 0, False

    def run(self) -> None:
        if self.steps:  # the step after another without a rewind: its present is the past
            shape = self.present.shape()
            shape[3] += self.step
            self.binding.bind_ortvalue_input("past", self.present)
            self.present = self.ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32)
            self.binding.bind_ortvalue_output("present", self.present)
            self.grown = True
        self.session.run_with_iobinding(self.binding)
        self.steps += 1

    def rewind(self) -> None:
        if self.grown:
            self.binding.bind_ortvalue_input("past", self.first[0])
            self.present = self.first[1]
            self.binding.bind_ortvalue_output("present", self.present)
            self.grown = False
        self.steps = 0

    def close(self) -> None:
        super().close()
        self.first = self.present = None


class OnnxRuntime(Peer):
    library = "onnxruntime"

    def __init__(self, ort, onnx):
        self.ort, self.onnx = ort, onnx

    # -- what each variant computes --

    def declines(self, variant: Variant, s: Shape) -> str | None:
        if s.precision != "fp32":
            return NO_BF16
        # Each operator's CPU kernel keeps the (B, H, T, keys) fp32 probabilities of a call.
        probabilities = 4 * s.batch * s.n_heads * s.seq_len * (s.past + s.seq_len)
        if too_big := meminfo.too_big(
            probabilities, "its CPU kernel keeps (B, H, T, keys) fp32 probabilities"
        ):
            return too_big
        if s.kv_precision:
            return f"a {s.kv_precision} KV cache: these graphs keep their past_key/past_value inputs in f32"
        if variant.backend in ("onnxruntime", "onnxruntime_mha"):
            op = "Attention" if variant.backend == "onnxruntime" else "MultiHeadAttention"
            if s.window:
                return (
                    f"a sliding window ({s.window}): com.microsoft.{op} has none; onnxruntime_gqa "
                    "computes it (local_window_size)"
                )
            if s.n_kv_heads:
                return (
                    f"com.microsoft.{op} has one head count for Q, K and V (no K/V head count): "
                    "onnxruntime_gqa computes grouped K/V heads"
                )
            if s.rope_base and op == "Attention":
                return (
                    "com.microsoft.Attention's CPU kernel has no rotary embedding (do_rotary=1: \"Rotary "
                    'embedding is not supported in Attention CPU kernel"): onnxruntime_gqa and '
                    "onnxruntime_mha compute RoPE"
                )
            return None
        # onnxruntime_gqa
        if s.head_dim % 8:
            return f"GroupQueryAttention's CPU kernel needs head_dim a multiple of 8 (got {s.head_dim})"
        if s.rope_base and s.head_dim % 16:
            return (
                "GroupQueryAttention's CPU rotary kernel (do_rotary) needs head_dim a multiple of 16 "
                f"(got {s.head_dim})"
            )
        if not s.causal and s.is_decode and s.seq_len > 1 and s.batch > 1:
            return (
                "GroupQueryAttention's CPU kernel takes several new tokens after a past with batch > 1 "
                "only with query_seqlens, which it allows with causal=1 only"
            )
        return None

    # -- calls --

    def prepare(self, variant: Variant, s: Shape, w: Weights, x: np.ndarray, threads: int) -> Call:
        if variant.backend == "onnxruntime":
            return self.attention_call(s, w, x, threads)
        # GroupQueryAttention always runs on its buffers (without past inputs its prefill is
        # no faster: it writes the presents either way); MultiHeadAttention only to decode.
        gqa = variant.backend == "onnxruntime_gqa"
        if not gqa and not s.is_decode:
            return OrtCall(self.ort, self.mha_model(s, w, 0, None), threads, x, s.d_out)
        # Capacity beyond past + T costs memory, not time: a step reads the first past + T rows.
        capacity = s.past + s.seq_len * (1 + CACHE_SLACK_CALLS if s.is_decode else 1)
        tables = rope_tables(s.head_dim, s.rope_base, capacity) if s.rope_base else None
        caches = past_cache(s, w, capacity, tables)
        if gqa:
            model = self.gqa_model(s, w, capacity, tables)
            lengths = {"seqlens_k": ((s.batch,), np.int32, s.seq_len - 1)}
            lengths["total_sequence_length"] = ((), np.int32, s.seq_len)
        else:
            model = self.mha_model(s, w, capacity, tables)
            lengths = {"past_sequence_length": ((), np.int32, 0)}
            if tables:
                lengths["positions"] = ((1,), np.int64, 0)
        return SharedCacheCall(self.ort, model, threads, x, s.d_out, caches, s.past, lengths)

    def attention_call(self, s: Shape, w: Weights, x: np.ndarray, threads: int) -> Call:
        """x -> com.microsoft.Attention (the projections inside it) -> out_proj; a decode step
        adds the past input (its length a free dimension: steps without a rewind grow it) and
        the present output, the past holding the tokens of x = 0 (the K and V biases)."""
        g, FLOAT = Graph(self.onnx, w), self.onnx.TensorProto.FLOAT
        ins = [
            g.input("x", FLOAT, [s.batch, s.seq_len, s.d_in]),
            g.constant("qkv_weight", np.concatenate([w.query.weight, w.key.weight, w.value.weight]).T),
            (
                g.constant("qkv_bias", np.concatenate([w.query.bias, w.key.bias, w.value.bias]))
                if s.qkv_bias
                else ""
            ),
        ]
        outs = [g.attention]
        if s.is_decode:
            ins += ["", g.input("past", FLOAT, [2, s.batch, s.n_heads, "length", s.head_dim])]
            outs.append("present")
        g.node("Attention", ins, outs, MS, num_heads=s.n_heads, unidirectional=int(s.causal))
        model = g.model_bytes(w, outs[1:])
        if not s.is_decode:
            return OrtCall(self.ort, model, threads, x, s.d_out)
        keys, values = past_cache(s, w, s.past, None)
        return ConcatCacheCall(self.ort, model, threads, x, s.d_out, np.stack([keys, values]))

    def mha_model(self, s: Shape, w: Weights, capacity: int, tables) -> bytes:
        """x -> one MatMul per Q/K/V -> com.microsoft.MultiHeadAttention -> out_proj. The Q/K/V
        biases go in the operator's bias input, or with RoPE are added before the rotation
        (com.microsoft.RotaryEmbedding of Q and K from the start position `positions`). A decode
        step (capacity > 0) passes past_key/past_value of `capacity` rows and
        past_sequence_length, the rows they hold, which makes the CPU kernel share past and
        present and write the new rows only."""
        g, TP = Graph(self.onnx, w), self.onnx.TensorProto
        x = g.input("x", TP.FLOAT, [s.batch, s.seq_len, s.d_in])
        rope = bool(s.rope_base)
        q, k, v = (
            g.linear(x, layer.weight, layer.bias if rope else None, name)
            for layer, name in ((w.query, "query"), (w.key, "key"), (w.value, "value"))
        )
        bias = ""
        if s.qkv_bias and not rope:
            bias = g.constant("qkv_bias", np.concatenate([w.query.bias, w.key.bias, w.value.bias]))
        if rope:
            cos, sin = tables or rope_tables(s.head_dim, s.rope_base, s.seq_len)
            start = (
                g.input("positions", TP.INT64, [1])
                if capacity
                else g.constant("positions", np.zeros(1, np.int64))
            )
            rotary = [start, g.constant("cos_cache", cos), g.constant("sin_cache", sin)]
            q, k = (
                g.node(
                    "RotaryEmbedding", [t] + rotary, [f"{t}_rotated"], MS, interleaved=0, num_heads=s.n_heads
                )
                for t in (q, k)
            )
        ins, outs = [q, k, v, bias], [g.attention]
        if capacity:
            cache = [
                g.input(n, TP.FLOAT, [s.batch, s.n_heads, capacity, s.head_dim])
                for n in ("past_key", "past_value")
            ]
            ins += ["", ""] + cache + [g.input("past_sequence_length", TP.INT32, [])]
            outs += ["present_key", "present_value"]
        g.node("MultiHeadAttention", ins, outs, MS, num_heads=s.n_heads, unidirectional=int(s.causal))
        return g.model_bytes(w, outs[1:])

    def gqa_model(self, s: Shape, w: Weights, capacity: int, tables) -> bytes:
        """x -> one MatMul with [Wq; Wk; Wv] (+ the biases) -> packed QKV into
        com.microsoft.GroupQueryAttention (key and value inputs omitted) -> out_proj. A step's
        tokens sit after seqlens_k + 1 - T cached ones: that is where their keys are written
        and the position RoPE turns them by."""
        g, TP = Graph(self.onnx, w), self.onnx.TensorProto
        x = g.input("x", TP.FLOAT, [s.batch, s.seq_len, s.d_in])
        bias = np.concatenate([w.query.bias, w.key.bias, w.value.bias]) if s.qkv_bias else None
        qkv = g.linear(x, np.concatenate([w.query.weight, w.key.weight, w.value.weight]), bias, "qkv")
        cache = [
            g.input(n, TP.FLOAT, [s.batch, s.kv_heads, capacity, s.head_dim])
            for n in ("past_key", "past_value")
        ]
        lengths = [g.input("seqlens_k", TP.INT32, [s.batch]), g.input("total_sequence_length", TP.INT32, [])]
        ins = [qkv, "", ""] + cache + lengths
        attributes = dict(num_heads=s.n_heads, kv_num_heads=s.kv_heads, causal=int(s.causal))
        if s.window:
            # The CPU kernel's window counts the row's own key, as §1.9's does (w - 1 fails the
            # oracle's check by 0.0054 at w 256).
            attributes["local_window_size"] = s.window
        if tables:
            ins += [g.constant("cos_cache", tables[0]), g.constant("sin_cache", tables[1])]
            attributes |= dict(do_rotary=1, rotary_interleaved=0)
        if s.is_decode and s.seq_len > 1 and s.batch > 1:
            # Without query_seqlens (input 16) the CPU kernel takes several new tokens after a
            # past for batch 1 only ("batch_size must be 1 when sequence_length > 1 and past
            # context is given"); with it, T new tokens in every sequence, any batch.
            ins += [""] * (16 - len(ins)) + [
                g.constant("query_seqlens", np.full(s.batch, s.seq_len, np.int32))
            ]
        g.node("GroupQueryAttention", ins, [g.attention, "present_key", "present_value"], MS, **attributes)
        return g.model_bytes(w, ["present_key", "present_value"])

    def context(self) -> dict[str, str]:
        return {
            "onnxruntime_version": self.ort.__version__,
            "onnx_version": self.onnx.__version__,
            "onnxruntime_settings": SETTINGS,
        }


def make_peer() -> Peer:
    try:
        import onnx
        import onnxruntime
    except ImportError as e:
        raise Unavailable(
            f"ONNX Runtime or onnx is not installed in this Python ({e}); scripts/peers-env.sh says why"
        ) from None
    if "CPUExecutionProvider" not in onnxruntime.get_available_providers():
        raise Unavailable(f"this onnxruntime ({onnxruntime.__version__}) has no CPUExecutionProvider")
    return OnnxRuntime(onnxruntime, onnx)
