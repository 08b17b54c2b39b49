"""mha.attention: PyTorch's F.scaled_dot_product_attention on mha's kernels (docs/python.md)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import _cache, _executor, _mha
from ._arguments import (
    _FLOAT32_MAX,
    _NO_EXTENSIONS,
    MAX_THREADS,
    _batched,
    _check_heads,
    _describe,
    _expanded_keys,
    _extensions,
    _in_place,
    _mixed,
    _numpy_mask,
    _numpy_operand,
    _scale,
    _threads,
)
from ._mha import InvalidArgument, Unsupported

_ALIGNMENTS = ("top_left", "bottom_right")


def attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    causal_alignment: str = "top_left",
    backend: str | None = None,
    threads: int = 0,
    executor: str | None = None,
    out: Any = None,
    cache: Any = None,
    first_sequence: int = 0,
    window: int | None = None,
    softcap: float | None = None,
    sinks: Any = None,
) -> Any:
    """softmax(scale q k^T + attn_mask [+ causal]) v, with F.scaled_dot_product_attention's
    arguments and meaning, on mha's fused kernels (no (L, S) scores on xsimd and tbb).

    query (B, H, L, D) or (H, L, D); key and value (B, H_kv, S, D), H_kv == H, or dividing H with
    enable_gqa=True. Dense PyTorch CPU tensors (float32, or bfloat16: computed as mha's bf16,
    operands rounded to bf16 and sums in fp32) or float32 NumPy arrays, all of one kind, any
    strides: a tensor whose last dimension is contiguous is read where it lies, float32 or
    bfloat16 (a (B, L, H, D) buffer's transpose(1, 2) too); other views (a strided last
    dimension, NumPy's negative or unaligned strides, torch's negative bit, keys or values
    expanded along the key dimension with stride 0) are copied first.
    attn_mask: of the query's kind, boolean (True attends) or additive float (float32, or the
    query's dtype: what SDPA takes; integer masks are refused as SDPA refuses them),
    broadcastable to (B, H, L, S) as SDPA's; with is_causal too, both apply (SDPA refuses the
    pair). is_causal: query i sees keys j <= i (causal_alignment "top_left", SDPA's meaning, also
    when L != S) or j <= i + S - L ("bottom_right": the queries are the sequence's last L
    positions, as a decode step or a chunk of a prefill over a cache). A row that sees no key is
    zeros, as SDPA gives. scale: a real number within float32's range (NumPy scalars and 0-d
    arrays or tensors too; None: 1/sqrt(D)). dropout_p other than 0 and autograd (inputs that
    require grad) are refused (mha computes inference). backend: a name of mha.backends() that
    runs attention calls (xsimd, tbb, naive; None: the default backend); threads as a plan's (0:
    all cores, at most MAX_THREADS); executor, who runs tbb's parallel work: "tbb", "openmp",
    "serial", or None (PyTorch's OpenMP pool with torch.get_num_threads() threads where PyTorch
    is loaded, else oneTBB: mha.default_executor() says which and why). out: where to write
    (the result's shape, float32, or bfloat16 for bfloat16 inputs; writable, not requiring grad,
    not an inference tensor outside inference mode; any strides: written in place where the last
    dimension is contiguous, else through a copy; its version counter bumped, as torch's in-place
    operations do, so that autograd sees the write).
    The GIL is released while it runs. Returns out, or a new tensor or array of the query's kind
    and dtype. With cache (an mha.AttentionCache): key and value (B, H_kv, T, D) are each
    sequence's next T tokens', appended to it, and query (B, H, T, D) attends over all the
    sequence then holds, causal (query i after the cache's tokens); no attn_mask or out; the
    call's B sequences are the cache's first_sequence .. first_sequence + B - 1 (docs/python.md
    "A KV cache for attention calls"). What models add to the function (SDPA has none of them;
    docs/python.md "Windows, soft-caps and sinks"): window, a sliding window with is_causal (the
    query at position p sees keys p - window < j <= p, transformers' sliding_window; keys outside
    are never read; None or 0: none); softcap, each scaled score s becomes softcap tanh(s /
    softcap) before the mask (Gemma 2; None or 0: none); sinks, one logit per query head (a 1-d
    tensor or array of H) that joins each row's softmax denominator and adds no value (gpt-oss's;
    None: none)."""
    if dropout_p != 0.0:
        raise Unsupported(
            f"mha.attention: dropout_p={dropout_p!r}: dropout is not implemented (inference only)"
        )
    if causal_alignment not in _ALIGNMENTS:
        raise InvalidArgument(
            f"mha.attention: causal_alignment {causal_alignment!r}, expected 'top_left' or 'bottom_right'"
        )
    if scale is not None and not (type(scale) is float and abs(scale) <= _FLOAT32_MAX):
        scale = _scale(scale)
    if type(threads) is not int or not 0 <= threads <= MAX_THREADS:
        threads = _threads("mha.attention", threads)
    if backend is not None and type(backend) is not str:
        raise InvalidArgument(
            f"mha.attention: backend {backend!r} must be a name of mha.backends() (a str), or None"
        )
    executor, threads = _executor.resolve(executor, threads)
    more = _NO_EXTENSIONS if window is None and softcap is None and sinks is None else None
    if more is None:
        more = _extensions(window, softcap, sinks)
    if cache is not None:
        if not isinstance(cache, _cache.AttentionCache):
            raise InvalidArgument(
                f"mha.attention: cache is a {_describe(cache)}, expected an mha.AttentionCache"
            )
        if attn_mask is not None:
            raise Unsupported(
                "mha.attention: attn_mask with a cache is not implemented (the call is causal over what "
                "each sequence holds)"
            )
        if out is not None:
            raise Unsupported("mha.attention: out= with a cache is not implemented (the result is returned)")
        return cache._attend(
            query,
            key,
            value,
            is_causal,
            scale,
            enable_gqa,
            causal_alignment,
            backend,
            threads,
            executor,
            first_sequence,
            more,
        )
    if first_sequence != 0:
        raise InvalidArgument(
            f"mha.attention: first_sequence ({first_sequence!r}) is a cache's sequence: pass cache="
        )
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(query, torch.Tensor):
        if attn_mask is None:  # the plain call, read in C++; None: not plain, the general path's
            result = _mha._attention_tensors(
                query,
                key,
                value,
                out,
                bool(is_causal),
                causal_alignment == "bottom_right",
                scale,
                bool(enable_gqa),
                backend,
                threads,
                executor,
                *more,
            )
            if result is not None:
                return result
        return _torch_attention(
            torch,
            query,
            key,
            value,
            attn_mask,
            is_causal,
            scale,
            enable_gqa,
            causal_alignment,
            backend,
            threads,
            executor,
            out,
            more,
        )
    arrays = [
        _numpy_operand(torch, name, t) for name, t in (("query", query), ("key", key), ("value", value))
    ]
    q, k, v = (
        t if _in_place(t) and not (i and _expanded_keys(t.shape, t.strides)) else np.ascontiguousarray(t)
        for i, t in enumerate(_batched(arrays))
    )
    _check_heads(q.shape, k.shape, v.shape, enable_gqa)
    result_shape = tuple(query.shape[:-1]) + (q.shape[-1],)
    target = None
    if out is not None:
        if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != result_shape:
            if torch is not None and isinstance(out, torch.Tensor):
                raise _mixed("a NumPy array", "out", out)
            raise InvalidArgument(
                f"mha.attention: out must be a float32 NumPy array of shape {result_shape}, got "
                f"{_describe(out)}"
            )
        if not out.flags.writeable:
            raise InvalidArgument(
                "mha.attention: out is read-only (writeable=False, or a broadcast view such as "
                "np.broadcast_to's): expected an array mha can write the result into"
            )
        target = out.reshape(q.shape) if out.ndim == 3 else out  # a view: a unit axis added
        if not _in_place(target):  # computed aside, then copied into out's strides
            target = None
    additive, boolean = _numpy_mask(torch, attn_mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    result = np.empty(q.shape, np.float32) if target is None else target
    _run(
        q,
        k,
        v,
        result,
        additive,
        boolean,
        is_causal,
        causal_alignment,
        scale,
        False,
        backend,
        threads,
        executor,
        more,
    )
    if out is None:
        return result.reshape(result_shape)
    if target is None:
        np.copyto(out, result.reshape(result_shape))
    return out


def _run(
    q, k, v, out, additive, boolean, is_causal, alignment, scale, bf16, backend, threads, executor, more
) -> None:
    """q, k and v: float32 arrays (computed in bf16 when bf16) and out float32, or all int16
    arrays holding bfloat16; scale, backend and threads checked; more: _extensions'."""
    call = _mha._attention_bf16 if q.dtype == np.int16 else _mha._attention
    call(
        q,
        k,
        v,
        out,
        additive,
        boolean,
        bool(is_causal),
        alignment == "bottom_right",
        scale,
        bf16,
        backend,
        threads,
        executor,
        *more,
    )


def _torch_attention(
    torch,
    query,
    key,
    value,
    mask,
    is_causal,
    scale,
    enable_gqa,
    alignment,
    backend,
    threads,
    executor,
    out,
    more,
):
    # The general path: every call the C++ reader (_mha._attention_tensors) leaves, a mask's, 3-d
    # operands', a strided last dimension's, a subclass's, and those it refuses. Tensors reach
    # the library as NumPy views of their memory (.numpy() shares it, strides and all, ~2 us a
    # tensor), which nanobind reads faster than through DLPack; the result is a NumPy array's
    # memory (np.empty is 10x cheaper than torch.empty). What .numpy() cannot read (sparse, meta,
    # torch.func's wrappers) is named where it fails.
    ts = (query, key, value)
    grad = torch.is_grad_enabled()
    for name, t in zip(("query", "key", "value"), ts):
        if not isinstance(t, torch.Tensor):
            raise _mixed("a torch.Tensor", name, t)
        if not t.is_cpu:
            raise InvalidArgument(f"mha.attention: {name} is on {t.device}, expected the CPU")
        if grad and t.requires_grad:
            raise Unsupported(
                f"mha.attention: {name} requires grad: autograd is not implemented (inference only)"
            )
    dtype = query.dtype
    if key.dtype != dtype or value.dtype != dtype or dtype not in (torch.float32, torch.bfloat16):
        raise InvalidArgument(
            f"mha.attention: query, key and value have dtypes {query.dtype}, {key.dtype}, {value.dtype}: "
            "expected all float32 or all bfloat16"
        )
    bf16 = dtype == torch.bfloat16
    q, k, v = ts if query.dim() == 4 and key.dim() == 4 and value.dim() == 4 else _batched(ts)
    _check_heads(q.shape, k.shape, v.shape, enable_gqa)
    # Read where they lie (bfloat16 as its 16-bit words), unless their last dimension is strided
    # (or a key dimension expanded: copied, as the library refuses keys that share memory).
    qa = _memory(torch, q, bf16, "query")
    ka = _memory(torch, k, bf16, "key")
    va = _memory(torch, v, bf16, "value")
    result_shape = (*query.shape[:-1], q.shape[-1])
    target = None if out is None else _torch_out(torch, out, bf16, result_shape, grad)
    # Every tensor's memory held for the call: another thread's set_() on one of them frees its
    # old storage only once the call is done (the NumPy views hold the tensors, not their memory).
    held = [t.untyped_storage() for t in (query, key, value) + (() if out is None else (out,))]
    direct = target is not None
    if not direct:
        target = np.empty(qa.shape, np.int16 if bf16 else np.float32)
    additive = boolean = None
    if mask is not None:
        additive, boolean = _torch_mask(
            torch, mask, dtype, (qa.shape[0], qa.shape[1], qa.shape[2], ka.shape[2])
        )
    if mask is not None:
        held.append(mask.untyped_storage())
    _run(
        qa,
        ka,
        va,
        target,
        additive,
        boolean,
        is_causal,
        alignment,
        scale,
        bf16,
        backend,
        threads,
        executor,
        more,
    )
    del held
    if direct:
        # Written in place, as torch's own in-place operations: its version counter bumped, so that
        # autograd refuses a backward() through a tensor it saved and mha then overwrote.
        torch.autograd.graph.increment_version(out)
        return out
    result = torch.from_numpy(target)
    if bf16:
        result = result.view(torch.bfloat16)
    if query.dim() == 3:
        result = result[0]
    if out is not None:
        out.copy_(result)
        return out
    return result


def _torch_out(torch: Any, out: Any, bf16: bool, shape: tuple, grad: bool) -> Any:
    """out checked, as the NumPy view mha writes the result into; None where it is written
    through a copy (a strided last dimension, torch's negative bit)."""
    want = torch.bfloat16 if bf16 else torch.float32
    if not isinstance(out, torch.Tensor):
        if isinstance(out, np.ndarray):
            raise _mixed("a torch.Tensor", "out", out)
    elif out.dtype == want and tuple(out.shape) == shape:
        if not out.is_cpu:
            raise InvalidArgument(f"mha.attention: out is on {out.device}, expected the CPU")
        if out.is_inference() and not torch.is_inference_mode_enabled():
            raise InvalidArgument(
                "mha.attention: out is an inference tensor (made under torch.inference_mode()) and the "
                "call is outside inference mode, where torch refuses in-place writes to one: pass "
                "out.clone(), or call under torch.inference_mode()"
            )
        if grad and out.requires_grad:
            raise InvalidArgument(
                "mha.attention: out requires grad: mha writes it in place, outside autograd (torch "
                "refuses in-place writes to a leaf that requires grad): pass one that does not"
            )
        try:
            if out.shape[-1] > 1 and out.stride(-1) != 1:
                if out.layout != torch.strided:
                    raise _unreadable(torch, "out", out, None)
                return None
            t = out if out.dim() == 4 else out.unsqueeze(0)
            if t.requires_grad:  # under no_grad
                t = t.detach()
            return t.view(torch.int16).numpy() if bf16 else t.numpy()
        except (RuntimeError, TypeError) as e:
            if out.layout == torch.strided and out.is_neg():
                return None  # copy_ writes its values negated, as they read
            raise _unreadable(torch, "out", out, e) from None
    raise InvalidArgument(
        f"mha.attention: out must be a CPU tensor of dtype {want} and shape {shape}, got {_describe(out)}"
    )


def _torch_mask(torch: Any, mask: Any, dtype: Any, full_shape: tuple) -> tuple[Any, Any]:
    """attn_mask broadcast to (B, H, L, S) without copying (strides 0), as NumPy views:
    (additive, None) or (None, boolean). Its dtype is one SDPA takes for a query of `dtype`."""
    if not isinstance(mask, torch.Tensor):
        if isinstance(mask, np.ndarray):
            raise _mixed("a torch.Tensor", "attn_mask", mask)
        raise InvalidArgument(
            f"mha.attention: attn_mask is a {_describe(mask)}, expected a tensor as query is"
        )
    if mask.dtype != torch.bool and mask.dtype != torch.float32 and mask.dtype != dtype:
        also = "" if dtype == torch.float32 else f" or {dtype} (the query's)"
        raise InvalidArgument(
            f"mha.attention: attn_mask has dtype {mask.dtype}: expected torch.bool (True attends), or "
            f"torch.float32{also} added to the scores: the masks SDPA takes for a {dtype} query"
        )
    if not mask.is_cpu or mask.layout != torch.strided:
        raise _unreadable(torch, "attn_mask", mask, None)
    mask = mask.detach()
    if mask.dtype != torch.bool:
        mask = mask.float()
    try:
        full = mask.expand(full_shape)
    except RuntimeError:
        raise InvalidArgument(
            f"mha.attention: attn_mask of shape {tuple(mask.shape)} does not broadcast to (B, H, L, S) = {full_shape}"
        ) from None
    try:
        if full.shape[-1] > 1 and full.stride(-1) != 1:
            full = full.contiguous()
        array = full.numpy()
    except (RuntimeError, TypeError) as e:
        if mask.is_neg():  # torch._neg_view: its values, negated
            return _torch_mask(torch, mask.resolve_neg(), dtype, full_shape)
        raise _unreadable(torch, "attn_mask", mask, e) from None
    return (None, array) if full.dtype == torch.bool else (array, None)


def _memory(torch: Any, t: Any, bf16: bool, name: str = "the tensor") -> Any:
    """A tensor's memory as a NumPy array (an input copied only when its last dimension is
    strided, its negative bit set, or it is the key or value and its key dimension expanded):
    float32 as it is, bfloat16 as int16 words (NumPy has no bfloat16)."""
    try:
        if (t.stride(-1) != 1 and t.shape[-1] > 1) or (
            name in ("key", "value") and _expanded_keys(t.shape, t.stride())
        ):
            t = t.contiguous()
        if t.requires_grad:  # under no_grad (the caller refuses it otherwise)
            t = t.detach()
        return t.view(torch.int16).numpy() if bf16 else t.numpy()
    except (RuntimeError, TypeError) as e:
        if t.layout == torch.strided and t.is_neg():  # torch._neg_view: its values, negated
            return _memory(torch, t.resolve_neg(), bf16, name)
        raise _unreadable(torch, name, t, e) from None


def _unreadable(torch: Any, name: str, t: Any, error: Exception | None) -> InvalidArgument:
    """The error for a tensor whose memory mha cannot read: named by its layout, device or
    wrapper rather than by torch's message."""
    functorch = getattr(torch._C, "_functorch", None)
    if t.layout != torch.strided:
        what = f"has layout {t.layout} (expected torch.strided: a dense tensor; call .to_dense())"
    elif not t.is_cpu:
        what = f"is on {t.device}, expected the CPU"
    elif functorch is not None and functorch.is_functorch_wrapped_tensor(t):
        what = (
            "is a tensor inside a torch.func transform (vmap, grad, ...): mha reads tensors' memory, "
            "which these wrappers have not; call mha.attention outside the transform"
        )
    else:
        what = f"has no memory mha can read ({error})"
    return InvalidArgument(f"mha.attention: {name} {what}")
