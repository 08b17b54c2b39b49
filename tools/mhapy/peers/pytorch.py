"""PyTorch 2.x as a peer: the seeds' modules as written (mhapy.torch_modules), the split-weight
module on F.scaled_dot_product_attention (mhapy.sdpa_module: PyTorch's flash kernel on CPU,
grouped K/V heads, RoPE, a preallocated KV cache, sliding windows as SDPA's masked call), torch.nn.MultiheadAttention, and
torch.compile of the SDPA module. Modules run in eval mode under torch.inference_mode();
torch.set_num_threads(threads) before each call's first run.
"""

from __future__ import annotations

import time

import numpy as np

from .. import meminfo
from ..inputs import Weights
from ..problem import Shape
from .adapter import CACHE_SLACK_CALLS, Call, Peer, Unavailable, Variant

SEEDS = "the seeds' modules"
VARIANTS = [
    Variant(
        "torch",
        "wrapper",
        "the seeds' MultiHeadAttentionWrapper: H CausalAttention heads, each its own Q/K/V nn.Linear, "
        "softmax of masked scores, concatenated, out_proj; decode: each head's torch.cat cache",
    ),
    Variant(
        "torch",
        "split_weight",
        "the seeds' MultiHeadAttention: one nn.Linear per Q/K/V, masked_fill_ and softmax of the "
        "(B, H, T, T) scores; decode: a torch.cat cache, as the seeds write it",
    ),
    Variant(
        "torch_prealloc",
        "wrapper",
        "decode: the seeds' MultiHeadAttentionWrapper, each head a preallocated cache written in place",
    ),
    Variant(
        "torch_prealloc",
        "split_weight",
        "decode: the seeds' MultiHeadAttention with a preallocated cache written in place",
    ),
    Variant(
        "torch_sdpa",
        "split_weight",
        "one nn.Linear per Q/K/V, F.scaled_dot_product_attention (is_causal; enable_gqa for grouped "
        "K/V heads), RoPE rotate-half; decode: a preallocated (B, H_kv, capacity, hd) cache, SDPA "
        "over the filled slice; a sliding window: SDPA's masked call over the window's keys",
    ),
    Variant(
        "torch_nn_mha",
        "fused_qkv",
        "torch.nn.MultiheadAttention(batch_first=True), need_weights=False, boolean causal "
        "attn_mask, in_proj = [Wq; Wk; Wv]",
    ),
    Variant(
        "torch_compile",
        "split_weight",
        "torch.compile (inductor, default mode) of the torch_sdpa module; its compile time is the "
        "entry's compile_s counter",
    ),
]

# torch.compile is declined for the rest of a run once one compile took longer than this.
COMPILE_LIMIT_S = 300.0


def seeds_scores_too_big(variant: Variant, s: Shape) -> str | None:
    """Why the seeds' module would not fit in this machine's available memory, or None: it holds
    its (B, H, T, keys) fp32 scores three times at once (scores, masked, softmax; the wrapper one
    head's at a time), and past half of MemAvailable the run would be killed, not measured."""
    heads = 1 if variant.formulation == "wrapper" else s.n_heads
    need = 3 * 4 * s.batch * heads * s.seq_len * (s.past + s.seq_len)
    return meminfo.too_big(need, f"{SEEDS} hold (B, H, T, keys) scores (torch_sdpa does not)")


class TorchCall(Call):
    def __init__(self, torch, module, x, threads: int, step=None, rewind=None):
        self.torch, self.module, self.x, self.threads = torch, module, x, threads
        self.step = step or (lambda: module(x))
        self.rewind_to = rewind
        self.y = None
        torch.set_num_threads(threads)

    def run(self) -> None:
        with self.torch.inference_mode():
            self.y = self.step()

    def output(self) -> np.ndarray:
        return self.y.float().numpy()

    def rewind(self) -> None:
        if self.rewind_to is not None:
            self.rewind_to()

    def close(self) -> None:
        self.module = self.x = self.y = self.step = self.rewind_to = None


class PyTorch(Peer):
    library = "pytorch"

    def __init__(self, torch):
        self.torch = torch
        from .. import sdpa_module, torch_modules

        self.tm, self.sdpa = torch_modules, sdpa_module
        self.compile_over: str | None = None

    # -- what each variant computes --

    def declines(self, variant: Variant, s: Shape) -> str | None:
        if s.kv_precision:
            return (
                f"a {s.kv_precision} KV cache: PyTorch's decode keeps its cache as tensors in the "
                "compute precision"
            )
        if s.window and variant.backend != "torch_sdpa":
            return f"a sliding window ({s.window}): torch_sdpa computes it, as SDPA's masked call"
        if variant.backend in ("torch", "torch_prealloc"):
            if too_big := seeds_scores_too_big(variant, s):
                return too_big
            if s.precision != "fp32":
                return f"{SEEDS} run in fp32 only: in bf16 they round the scores before the softmax (torch_sdpa is PyTorch's bf16 path)"
            if s.n_kv_heads:
                return f"{SEEDS} have no grouped K/V heads (torch_sdpa has)"
            if s.rope_base:
                return f"{SEEDS} have no rotary embedding (torch_sdpa has)"
            if not s.out_proj_bias:
                return f"{SEEDS}' out_proj always has a bias"
            if variant.backend == "torch_prealloc" and not s.is_decode:
                return "torch_prealloc is the seeds' decode with a preallocated cache: no forward pass"
            return None
        if variant.backend == "torch_nn_mha":
            if s.is_decode:
                return "nn.MultiheadAttention has no KV cache"
            if s.d_in != s.d_out:
                return f"nn.MultiheadAttention needs d_in == d_out (got {s.d_in}, {s.d_out})"
            if not s.out_proj:
                return "nn.MultiheadAttention always applies out_proj"
            if s.n_kv_heads:
                return "nn.MultiheadAttention has no grouped K/V heads"
            if s.rope_base:
                return "nn.MultiheadAttention has no rotary embedding"
            return None
        if variant.backend == "torch_compile":
            if s.is_decode:
                return "decode steps are not compiled here (each cached length would recompile)"
            return self.compile_over
        return None  # torch_sdpa computes every axis

    # -- modules with mha's weights --

    def tensor(self, a: np.ndarray, dtype):
        return self.torch.from_numpy(np.ascontiguousarray(a)).to(dtype)

    def load_linear(self, layer, linear) -> None:
        with self.torch.no_grad():
            layer.weight.copy_(self.torch.from_numpy(linear.weight))
            if linear.bias is not None:
                layer.bias.copy_(self.torch.from_numpy(linear.bias))
            elif getattr(layer, "bias", None) is not None:
                layer.bias.zero_()

    def load_block(self, module, w: Weights) -> None:
        """w into a split-weight module's W_query, W_key, W_value and out_proj."""
        for name, linear in (("W_query", w.query), ("W_key", w.key), ("W_value", w.value)):
            self.load_linear(getattr(module, name), linear)
        if w.out_proj is not None:
            self.load_linear(module.out_proj, w.out_proj)

    def seeds_split(self, s: Shape, w: Weights, module_class, context_length: int = 0, **kw):
        """The seeds' split module (or its KV-cache twin) with mha's weights; context_length:
        its cache's capacity (default past + T)."""
        torch = self.torch
        module = module_class(
            s.d_in,
            s.d_out,
            context_length or s.past + s.seq_len,
            s.n_heads,
            qkv_bias=s.qkv_bias,
            causal=s.causal,
            out_proj=s.out_proj,
            **kw,
        )
        self.load_block(module, w)
        return module.eval().to(torch.float32)

    def sdpa_module(self, s: Shape, w: Weights, dtype, capacity: int = 0):
        sdpa = self.sdpa
        positions = s.past + s.seq_len * (1 + CACHE_SLACK_CALLS)
        rope = sdpa.rope_half_tables(s.head_dim, s.rope_base, positions, dtype) if s.rope_base else None
        module = sdpa.SDPAMultiHeadAttention(
            s.d_in,
            s.d_out,
            s.n_heads,
            s.kv_heads,
            qkv_bias=s.qkv_bias,
            causal=s.causal,
            out_proj=s.out_proj,
            out_proj_bias=s.out_proj_bias,
            rope=rope,
            capacity=capacity,
            window=s.window,
        )
        self.load_block(module, w)
        return module.eval().to(dtype)

    # -- calls --

    def prepare(self, variant: Variant, s: Shape, w: Weights, x: np.ndarray, threads: int) -> Call:
        torch, tm = self.torch, self.tm
        dtype = torch.bfloat16 if s.precision == "bf16" else torch.float32
        xt = self.tensor(x, dtype)
        torch.set_num_threads(threads)
        if variant.backend == "torch_sdpa" and s.is_decode:
            return self.sdpa_decode(s, w, xt, dtype, threads)
        if variant.backend in ("torch", "torch_prealloc") and s.is_decode:
            return self.seeds_decode(variant, s, w, xt, threads)
        if variant.backend == "torch":
            split = self.seeds_split(s, w, tm.MultiHeadAttention)
            if variant.formulation == "split_weight":
                return TorchCall(torch, split, xt, threads)
            wrapper = tm.MultiHeadAttentionWrapper(
                s.d_in,
                s.d_out,
                s.seq_len,
                s.n_heads,
                qkv_bias=s.qkv_bias,
                causal=s.causal,
                out_proj=s.out_proj,
            )
            tm.copy_split_to_wrapper(split, wrapper)
            return TorchCall(torch, wrapper.eval(), xt, threads)
        if variant.backend == "torch_nn_mha":
            module = tm.TorchNNMultiheadAttention(s.d_out, s.n_heads, s.seq_len, s.causal, bias=True)
            split = self.seeds_split(s, w, tm.MultiHeadAttention)
            tm.copy_split_to_nn_mha(split, module)  # a zero bias where mha's module has none
            return TorchCall(torch, module.eval().to(dtype), xt, threads)
        if variant.backend == "torch_compile":
            return self.compiled_call(s, w, xt, dtype, threads)
        return TorchCall(torch, self.sdpa_module(s, w, dtype), xt, threads)

    def compiled_call(self, s: Shape, w: Weights, xt, dtype, threads: int) -> Call:
        """The module of s compiled afresh for this thread count: dynamo guards on the thread
        count (a change recompiles) and stops compiling a function after a few recompiles
        (config.recompile_limit), after which it runs eagerly, so every call starts from a reset.
        compile_s is the first call's time."""
        torch = self.torch
        torch._dynamo.reset()
        torch.set_num_threads(threads)
        module = torch.compile(self.sdpa_module(s, w, dtype), fullgraph=True)
        start = time.perf_counter()
        with torch.inference_mode():
            module(xt)
        seconds = time.perf_counter() - start
        if seconds > COMPILE_LIMIT_S:
            self.compile_over = (
                f"torch.compile took {seconds:.0f} s on {s.problem_suffix()}, over the "
                f"{COMPILE_LIMIT_S:.0f} s limit: not compiled for the rest of this run"
            )
        call = TorchCall(torch, module, xt, threads)
        call.counters = {"compile_s": seconds}
        return call

    def sdpa_decode(self, s: Shape, w: Weights, xt, dtype, threads: int) -> Call:
        """A step after s.past tokens of x = 0: their keys and values (the biases, rotated by
        position with RoPE) written into the cache once; each rewind sets its length back."""
        torch = self.torch
        module = self.sdpa_module(s, w, dtype, capacity=s.past + s.seq_len * (1 + CACHE_SLACK_CALLS))
        module.allocate(s.batch, dtype)
        with torch.inference_mode():
            zeros = torch.zeros(s.batch, s.past, s.d_in, dtype=dtype)
            module(zeros, use_cache=True)
        past = s.past

        def rewind():
            module.length = past

        return TorchCall(torch, module, xt, threads, step=lambda: module(xt, use_cache=True), rewind=rewind)

    def seeds_decode(self, variant: Variant, s: Shape, w: Weights, xt, threads: int) -> Call:
        """The seeds' KV-cache module (torch: a torch.cat cache; torch_prealloc: preallocated)
        after s.past tokens of x = 0, loaded as their keys and values; each rewind puts the
        cache back to them."""
        torch, tm = self.torch, self.tm
        cache = "cat" if variant.backend == "torch" else "preallocated"
        capacity = s.past + s.seq_len * (1 + CACHE_SLACK_CALLS)
        split = self.seeds_split(s, w, tm.KVCacheMultiHeadAttention, capacity, kv_cache=cache)
        module = split
        if variant.formulation == "wrapper":
            module = tm.KVCacheMultiHeadAttentionWrapper(
                s.d_in,
                s.d_out,
                capacity,
                s.n_heads,
                qkv_bias=s.qkv_bias,
                causal=s.causal,
                out_proj=s.out_proj,
                kv_cache=cache,
            )
            tm.copy_split_to_wrapper(split, module)
            module.eval()
        with torch.inference_mode():
            zeros = torch.zeros(s.batch, 1, s.d_in)
            layout = (s.batch, s.past, s.n_heads, s.head_dim)
            keys = split.W_key(zeros).view(s.batch, 1, s.n_heads, s.head_dim).expand(layout).contiguous()
            values = split.W_value(zeros).view(s.batch, 1, s.n_heads, s.head_dim).expand(layout).contiguous()
        module.load_cache(keys, values)
        del keys, values
        states = [(c, c.state()) for c in module.kv_caches()]

        def rewind():
            for c, state in states:
                c.restore(state)

        return TorchCall(torch, module, xt, threads, step=lambda: module(xt, use_cache=True), rewind=rewind)

    def context(self) -> dict[str, str]:
        torch = self.torch
        config = torch.__config__.show()

        def line(prefix: str) -> str:
            return next((l.split(":", 1)[1].strip() for l in config.splitlines() if prefix in l), "?")

        parallel = next(
            (
                l.split(":", 1)[1].strip()
                for l in torch.__config__.parallel_info().splitlines()
                if l.startswith("ATen parallel backend")
            ),
            "?",
        )
        return {
            "torch_version": torch.__version__,
            "torch_parallel_backend": parallel,
            "torch_cpu_capability": line("CPU capability usage"),
            "torch_blas": line("BLAS_INFO").split(",")[0],
            "torch_threads": "torch.set_num_threads(threads) per call; interop threads "
            f"{torch.get_num_interop_threads()}",
            "torch_compile_limit_s": f"{COMPILE_LIMIT_S:g}",
        }


def make_peer() -> Peer:
    try:
        import torch
    except ImportError as e:
        raise Unavailable(
            f"PyTorch is not installed in this Python ({e}); scripts/peers-env.sh says why"
        ) from None
    return PyTorch(torch)
