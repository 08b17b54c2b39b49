"""mha.attention's arguments checked and read (python/mha/_attention.py calls these): its scale,
threads, extensions (window, softcap, sinks) and shapes, NumPy operands and masks, and the errors
that name an argument of the wrong kind. _cache, _plan and _modules share them."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from . import _mha
from ._mha import InvalidArgument, Unsupported

# The most worker threads a call takes (include/mha/run_options.hpp's max_run_threads).
MAX_THREADS: int = _mha.max_run_threads
# float32's largest value: the kernels scale the scores in float32.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


# A call without a window, a soft-cap or sinks: the bindings' defaults.
_NO_EXTENSIONS: tuple[int, float, Any] = (0, 0.0, None)


def _extensions(window: Any, softcap: Any, sinks: Any) -> tuple[int, float, Any]:
    """(window, softcap, sinks) as the bindings take them: an int >= 0, a float, and None or a
    contiguous float32 array of one logit per query head (the library checks the values: the
    window needs is_causal, the soft-cap is finite, one sink per head, none NaN)."""
    where = "mha.attention"
    if window is None:
        window = 0
    elif not isinstance(window, (int, np.integer)) or isinstance(window, bool) or window < 0:
        raise InvalidArgument(f"{where}: window ({window!r}) must be an integer >= 0, or None (no window)")
    if softcap is None:
        softcap = 0.0
    elif not isinstance(softcap, (int, float, np.integer, np.floating)) or isinstance(softcap, bool):
        raise InvalidArgument(f"{where}: softcap ({softcap!r}) must be a real number > 0, or None")
    if sinks is not None:
        given = sinks
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(sinks, torch.Tensor):
            if sinks.requires_grad and torch.is_grad_enabled():
                raise Unsupported(
                    f"{where}: sinks requires grad: autograd is not implemented (inference only)"
                )
            if not sinks.is_cpu:
                raise InvalidArgument(f"{where}: sinks is on {sinks.device}, expected the CPU")
            sinks = sinks.detach().to(torch.float32).numpy()
        if (
            not isinstance(sinks, np.ndarray)
            or sinks.ndim != 1
            or not np.issubdtype(sinks.dtype, np.floating)
        ):
            raise InvalidArgument(
                f"{where}: sinks is a {_describe(given)}, expected a 1-d floating tensor or array of "
                "one logit per query head"
            )
        sinks = np.ascontiguousarray(sinks, np.float32)
    return int(window), float(softcap), sinks


def _describe(t: Any) -> str:
    shape = getattr(t, "shape", None)
    dtype = getattr(t, "dtype", None)
    return f"{type(t).__name__}" + (
        f" of shape {tuple(shape)} and dtype {dtype}" if shape is not None else ""
    )


def _mixed(kind: str, name: str, t: Any) -> InvalidArgument:
    """The error for an argument that is not of the query's kind (`kind`): of the other framework,
    or neither (a list: named by its type)."""
    if isinstance(t, np.ndarray):
        other = "a NumPy array"
    elif type(t).__module__.startswith("torch"):
        other = "a torch.Tensor"
    else:
        other = f"a {_describe(t)}"
    return InvalidArgument(
        f"mha.attention: query is {kind} and {name} {other}: pass all of one kind "
        "(PyTorch tensors or NumPy arrays)"
    )


def _scale(scale: Any) -> float:
    """scale as a float: a real number, a NumPy scalar, or a 0-d array or tensor holding one,
    within float32's range (the kernels scale in float32; NaN and inf are the library's to
    refuse)."""
    value = None
    if isinstance(scale, (int, float, np.integer, np.floating)):
        value = float(scale)
    elif getattr(scale, "ndim", None) == 0 and hasattr(scale, "item"):
        try:
            item = scale.item()
        except (RuntimeError, TypeError, ValueError):  # a meta-device tensor: no value
            item = None
        if isinstance(item, (int, float)):
            value = float(item)
    if value is None:
        raise InvalidArgument(
            f"mha.attention: scale {scale!r} must be a real number (a float, a NumPy scalar, or a 0-d "
            "array or CPU tensor), or None"
        )
    if math.isfinite(value) and abs(value) > _FLOAT32_MAX:
        raise InvalidArgument(
            f"mha.attention: scale ({value!r}) is beyond float32's range (|scale| <= {_FLOAT32_MAX:.8g}): "
            "mha scales the scores in float32"
        )
    return value


def _count(name: str, value: Any, least: int = 0) -> int:
    """An integer argument that the library takes as int64, checked here so that the message
    names it (nanobind's would list signatures); the library checks its range."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not least <= value < 2**63:
        low = "-2^63" if least == -(2**63) else least
        raise InvalidArgument(f"mha: {name} ({value!r}) must be an integer in [{low}, 2^63)")
    return int(value)


def _threads(where: str, threads: Any) -> int:
    """threads as an int in [0, MAX_THREADS] (0: all cores), else InvalidArgument naming it."""
    if (
        not isinstance(threads, (int, np.integer))
        or isinstance(threads, bool)
        or not 0 <= threads <= MAX_THREADS
    ):
        raise InvalidArgument(
            f"{where}: threads ({threads!r}) must be an integer in [0, {MAX_THREADS}] (0: all cores)"
        )
    return int(threads)


def _check_heads(q: Any, k: Any, v: Any, enable_gqa: bool) -> None:
    """Shapes (tuples or torch.Size) of 4-D operands, by the library's rule (the bindings'
    heads_refusal, which its plain call follows too)."""
    _mha._check_heads(tuple(q), tuple(k), tuple(v), bool(enable_gqa))


def _expanded_keys(shape: Any, strides: Any) -> bool:
    """Whether a 4-d key or value tensor's (or array's) keys share memory: a key dimension
    expanded with stride 0, which the library refuses (its work would not be bounded by the memory
    behind it) and the package therefore copies, as SDPA computes it."""
    return len(shape) == 4 and shape[2] > 1 and strides[2] == 0


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


def _numpy_operand(torch: Any, name: str, t: Any) -> np.ndarray:
    if not isinstance(t, np.ndarray):
        if name != "query" and torch is not None and isinstance(t, torch.Tensor):
            raise _mixed("a NumPy array", name, t)
        raise InvalidArgument(
            f"mha.attention: {name} is a {_describe(t)}, expected a PyTorch tensor or a NumPy array"
        )
    if t.dtype != np.float32:
        raise InvalidArgument(f"mha.attention: {name} has dtype {t.dtype}, expected float32")
    return t


def _in_place(a: np.ndarray) -> bool:
    """Whether the library reads (or writes) a NumPy array where it lies: aligned, every stride
    non-negative (a multiple of the element's size: aligned says so), the last contiguous."""
    strides = a.strides
    return (
        a.flags.aligned and (a.shape[-1] <= 1 or strides[-1] == a.itemsize) and all(s >= 0 for s in strides)
    )


def _numpy_mask(torch: Any, mask: Any, b: int, h: int, rows: int, keys: int) -> tuple[Any, Any]:
    if mask is None:
        return None, None
    if not isinstance(mask, np.ndarray):
        if torch is not None and isinstance(mask, torch.Tensor):
            raise _mixed("a NumPy array", "attn_mask", mask)
        raise InvalidArgument(
            f"mha.attention: attn_mask is a {_describe(mask)}, expected a NumPy array as query is"
        )
    if mask.dtype != np.bool_ and mask.dtype != np.float32:
        raise InvalidArgument(
            f"mha.attention: attn_mask has dtype {mask.dtype}: expected bool (True attends) or "
            "float32 (added to the scores), the masks SDPA takes for a float32 query"
        )
    try:
        full = np.broadcast_to(mask, (b, h, rows, keys))
    except ValueError:
        raise InvalidArgument(
            f"mha.attention: attn_mask of shape {mask.shape} does not broadcast to (B, H, L, S) = "
            f"{(b, h, rows, keys)}"
        ) from None
    if not _in_place(full):
        full = np.ascontiguousarray(full)
    return (None, full) if full.dtype == np.bool_ else (full, None)
