"""mha.attention: PyTorch's F.scaled_dot_product_attention on mha's kernels (docs/python.md)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import _mha
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
    out: Any = None,
) -> Any:
    """softmax(scale q k^T + attn_mask [+ causal]) v, with F.scaled_dot_product_attention's
    arguments and meaning, on mha's fused kernels (no (L, S) scores on xsimd and tbb).

    query (B, H, L, D) or (H, L, D); key and value (B, H_kv, S, D), H_kv == H, or dividing H with
    enable_gqa=True. PyTorch CPU tensors (float32, or bfloat16: computed as mha's bf16, operands
    rounded to bf16 and sums in fp32) or float32 NumPy arrays, any strides: a tensor whose last
    dimension is contiguous is read where it lies, float32 or bfloat16 (a (B, L, H, D) buffer's
    transpose(1, 2) too). attn_mask: boolean (True attends) or additive
    float, broadcastable to (B, H, L, S) as SDPA's; with is_causal too, both apply (SDPA
    refuses the pair). is_causal: query i sees keys j <= i
    (causal_alignment "top_left", SDPA's meaning, also when L != S) or j <= i + S - L
    ("bottom_right": the queries are the sequence's last L positions, as a decode step or a
    chunk of a prefill over a cache). A row that sees no key is zeros, as SDPA gives. dropout_p
    other than 0 is refused (mha computes inference). backend: a name of mha.backends() that
    runs attention calls (xsimd, tbb, naive; None: the default backend); threads as a plan's.
    out: where to write (the result's shape, float32, or bfloat16 for bfloat16 inputs; any
    strides, written in place where the last dimension is contiguous). The GIL is released while
    it runs. Returns out, or a new tensor or array of the query's kind and dtype."""
    if dropout_p != 0.0:
        raise Unsupported(
            f"mha.attention: dropout_p={dropout_p!r}: dropout is not implemented (inference only)"
        )
    if causal_alignment not in _ALIGNMENTS:
        raise InvalidArgument(
            f"mha.attention: causal_alignment {causal_alignment!r}, expected 'top_left' or 'bottom_right'"
        )
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(query, torch.Tensor):
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
            out,
        )
    arrays = [_numpy_operand(name, t) for name, t in (("query", query), ("key", key), ("value", value))]
    q, k, v = _batched(arrays)
    _check_heads(q.shape, k.shape, v.shape, enable_gqa)
    result_shape = tuple(np.shape(query)[:-1]) + (q.shape[-1],)
    if out is None:
        target = np.empty(q.shape, np.float32)
    else:
        if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != result_shape:
            raise InvalidArgument(
                f"mha.attention: out must be a float32 NumPy array of shape {result_shape}, got "
                f"{_describe(out)}"
            )
        target = out.reshape(q.shape) if out.ndim == 3 else out
    additive, boolean = _numpy_mask(attn_mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    _run(q, k, v, target, additive, boolean, is_causal, causal_alignment, scale, False, backend, threads)
    return out if out is not None else target.reshape(result_shape)


def _describe(t: Any) -> str:
    shape = getattr(t, "shape", None)
    dtype = getattr(t, "dtype", None)
    return f"{type(t).__name__}" + (
        f" of shape {tuple(shape)} and dtype {dtype}" if shape is not None else ""
    )


def _check_heads(q: Any, k: Any, v: Any, enable_gqa: bool) -> None:
    """Shapes (tuples or torch.Size) of 4-D operands."""
    if k != v or k[0] != q[0] or k[3] != q[3]:
        raise InvalidArgument(
            f"mha.attention: query {tuple(q)}, key {tuple(k)} and value {tuple(v)}: expected query "
            "(B, H, L, D) and key, value (B, H_kv, S, D) of the same B and D"
        )
    if q[1] != k[1] and not (enable_gqa and q[1] % k[1] == 0):
        raise InvalidArgument(
            f"mha.attention: query has {q[1]} heads and key {k[1]}: "
            + (
                "the query heads must be a multiple of the key heads"
                if enable_gqa
                else "pass enable_gqa=True for grouped-query attention (as SDPA)"
            )
        )


def _batched(ts: list) -> list:
    """(H, L, D) operands as (1, H, L, D); 4-D ones as they are; others refused naming the rank."""
    ranks = {t.ndim for t in ts}
    if len(ranks) != 1 or ranks.pop() not in (3, 4):
        raise InvalidArgument(
            "mha.attention: query, key and value are of shapes "
            + ", ".join(str(tuple(t.shape)) for t in ts)
            + ": expected (B, H, L, D) or (H, L, D), all of one rank"
        )
    return [t[None] if t.ndim == 3 else t for t in ts]


def _numpy_operand(name: str, t: Any) -> np.ndarray:
    if not isinstance(t, np.ndarray):
        raise InvalidArgument(
            f"mha.attention: {name} is a {_describe(t)}, expected a PyTorch tensor or a NumPy array"
        )
    if t.dtype != np.float32:
        raise InvalidArgument(f"mha.attention: {name} has dtype {t.dtype}, expected float32")
    return t if t.ndim == 0 or t.strides[-1] == 4 else np.ascontiguousarray(t)


def _numpy_mask(mask: Any, b: int, h: int, rows: int, keys: int) -> tuple[Any, Any]:
    if mask is None:
        return None, None
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        mask = mask.astype(np.float32, copy=False)
    try:
        full = np.broadcast_to(mask, (b, h, rows, keys))
    except ValueError:
        raise InvalidArgument(
            f"mha.attention: attn_mask of shape {mask.shape} does not broadcast to (B, H, L, S) = "
            f"{(b, h, rows, keys)}"
        ) from None
    if keys > 1 and full.strides[-1] != full.itemsize:
        full = np.ascontiguousarray(full)
    return (None, full) if full.dtype == np.bool_ else (full, None)


def _run(q, k, v, out, additive, boolean, is_causal, alignment, scale, bf16, backend, threads) -> None:
    """q, k and v: float32 arrays (computed in bf16 when bf16) and out float32, or all int16
    arrays holding bfloat16."""
    if scale is not None and not isinstance(scale, (int, float)):
        raise InvalidArgument(f"mha.attention: scale {scale!r} must be a number")
    if not isinstance(threads, int) or isinstance(threads, bool):
        raise InvalidArgument(f"mha.attention: threads ({threads!r}) must be an integer")
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
        None if scale is None else float(scale),
        bf16,
        backend,
        threads,
    )


def _torch_attention(
    torch, query, key, value, mask, is_causal, scale, enable_gqa, alignment, backend, threads, out
):
    # Lean on purpose: a decode step of a small model calls this once per layer (docs/python.md
    # states the overhead). Tensors reach the library as NumPy views of their memory (.numpy()
    # shares it, strides and all), which nanobind reads faster than through DLPack; the result
    # is a NumPy array's memory (np.empty is 10x cheaper than torch.empty).
    ts = (query, key, value)
    grad = torch.is_grad_enabled()
    for name, t in zip(("query", "key", "value"), ts):
        if not isinstance(t, torch.Tensor):
            raise InvalidArgument(f"mha.attention: {name} is a {_describe(t)}, expected a tensor as query is")
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
    # Read where they lie (bfloat16 as its 16-bit words), unless their last dimension is strided.
    qa, ka, va = _memory(torch, q, bf16), _memory(torch, k, bf16), _memory(torch, v, bf16)
    result_shape = (*query.shape[:-1], q.shape[-1])
    if out is not None:
        want = torch.bfloat16 if bf16 else torch.float32
        if (
            not isinstance(out, torch.Tensor)
            or out.dtype != want
            or tuple(out.shape) != result_shape
            or not out.is_cpu
        ):
            raise InvalidArgument(
                f"mha.attention: out must be a CPU tensor of dtype {want} and shape {result_shape}, "
                f"got {_describe(out)}"
            )
    direct = out is not None and (out.stride(-1) == 1 or out.shape[-1] == 1)
    if direct:
        target = _memory(torch, out if out.dim() == 4 else out.unsqueeze(0), bf16)
    else:
        target = np.empty(qa.shape, np.int16 if bf16 else np.float32)
    additive = boolean = None
    if mask is not None:
        additive, boolean = _torch_mask(torch, mask, (qa.shape[0], qa.shape[1], qa.shape[2], ka.shape[2]))
    _run(qa, ka, va, target, additive, boolean, is_causal, alignment, scale, bf16, backend, threads)
    if direct:
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


def _torch_mask(torch: Any, mask: Any, full_shape: tuple) -> tuple[Any, Any]:
    """attn_mask broadcast to (B, H, L, S) without copying (strides 0), as NumPy views:
    (additive, None) or (None, boolean)."""
    if not isinstance(mask, torch.Tensor):
        raise InvalidArgument(
            f"mha.attention: attn_mask is a {_describe(mask)}, expected a tensor as query is"
        )
    mask = mask.detach()
    if mask.dtype != torch.bool:
        mask = mask.float()
    try:
        full = mask.expand(full_shape)
    except RuntimeError:
        raise InvalidArgument(
            f"mha.attention: attn_mask of shape {tuple(mask.shape)} does not broadcast to (B, H, L, S) = {full_shape}"
        ) from None
    if full.shape[-1] > 1 and full.stride(-1) != 1:
        full = full.contiguous()
    return (None, full.numpy()) if full.dtype == torch.bool else (full.numpy(), None)


def _memory(torch: Any, t: Any, bf16: bool) -> Any:
    """A tensor's memory as a NumPy array (an input copied only when its last dimension is
    strided): float32 as it is, bfloat16 as int16 words (NumPy has no bfloat16)."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        t = t.contiguous()
    if t.requires_grad:  # under no_grad (the caller refuses it otherwise)
        t = t.detach()
    return t.view(torch.int16).numpy() if bf16 else t.numpy()
