"""mha.AttentionCache: mha's KV cache for attention calls, and mha.attention's call over it
(docs/python.md "A KV cache for attention calls"; include/mha/attention.hpp's
make_attention_cache). A model that projects and rotates its own queries, keys and values
decodes through it: each call appends the new tokens' keys and values, in fp32, bf16, int8
(codes with a scale and an offset per token and K/V head), k8v4 (int8's keys, values as 4-bit
codes of turned groups of 32) or int4 (k8v4's values, keys as 4-bit codes per channel of each
group of 64 tokens, the newest exact), and attends over all the sequence holds, reading the codes
where they lie."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import _mha
from ._arguments import _check_heads, _expanded_keys, _in_place, _mixed, _numpy_operand
from ._mha import InvalidArgument, Unsupported

_KV = ("fp32", "bf16", "int8", "k8v4", "int4")
_PRECISIONS = ("fp32", "bf16")


class AttentionCache:
    """An empty KV cache for `batch` sequences of up to `capacity` tokens, `kv_heads` K/V heads
    of `head_dim`, its bytes allocated now: keys and values kept in `kv` ("int8", the default:
    codes with a scale and an offset per token and head; "k8v4": int8's keys, 4-bit values in
    turned groups of 32 with a scale and an offset each, 0.8x int8's bytes; "int4": k8v4's values,
    4-bit keys with a scale and an offset per channel of each group of 64 tokens, the newest
    group's kept exact, 0.56x int8's bytes, rolled back only within its last 128 tokens' exact
    keys; "bf16"; "fp32"), the attention computed
    in `precision` ("fp32" or "bf16"; None: bf16 for a bf16 cache, else fp32), on `backend` (a
    name of mha.backends() whose attention calls take a cache: xsimd, tbb, naive; None: the
    default). mha.attention(q, k, v, cache=this) appends and attends. One caller at a time (a
    second, on another thread, is refused). window: a sliding window (0: none) that every call
    over the cache takes; the cache then keeps only each sequence's last tokens, a ring of
    `slots` (docs/python.md "Windows, soft-caps and sinks")."""

    __slots__ = ("_cache", "backend", "kv_heads", "head_dim", "precision")

    def __init__(
        self,
        batch: int,
        capacity: int,
        kv_heads: int,
        head_dim: int,
        *,
        kv: str = "int8",
        precision: str | None = None,
        backend: str | None = None,
        window: int = 0,
    ) -> None:
        if kv not in _KV:
            raise InvalidArgument(f"mha.AttentionCache: kv {kv!r} is not one of {', '.join(_KV)}")
        if precision is None:
            precision = "bf16" if kv == "bf16" else "fp32"
        if precision not in _PRECISIONS:
            raise InvalidArgument(
                f"mha.AttentionCache: precision {precision!r} is not one of {', '.join(_PRECISIONS)}, or None"
            )
        if backend is not None and type(backend) is not str:
            raise InvalidArgument(
                f"mha.AttentionCache: backend {backend!r} must be a name of mha.backends() (a str), or None"
            )
        self._cache = _mha._make_attention_cache(
            backend, batch, capacity, kv_heads, head_dim, kv, precision, window
        )
        self.backend: str = backend if backend is not None else _mha.default_backend().name
        self.kv_heads = int(kv_heads)
        self.head_dim = int(head_dim)
        self.precision = precision

    @property
    def batch(self) -> int:
        return self._cache.batch

    @property
    def capacity(self) -> int:
        return self._cache.capacity

    @property
    def window(self) -> int:
        """The sliding window every call over the cache takes (0: none)."""
        return self._cache.window

    @property
    def slots(self) -> int:
        """Tokens the storage holds per sequence: the capacity, or a window's ring (fewer)."""
        return self._cache.slots

    @property
    def lengths(self) -> list[int]:
        """Tokens each sequence holds."""
        return list(self._cache.lengths)

    @property
    def kv(self) -> str:
        """What the keys and values are kept in: fp32, bf16, int8, k8v4 or int4."""
        return self._cache.precision

    @property
    def nbytes(self) -> int:
        """The storage's bytes, allocated when the cache was made."""
        return self._cache.nbytes

    def reset(self, b: int | None = None) -> None:
        """Forgets every sequence, or sequence b."""
        self._cache.reset(b)

    def truncate(self, b: int, length: int) -> None:
        """Keeps the first `length` tokens of sequence b."""
        self._cache.truncate(b, length)

    def _attend(
        self,
        query: Any,
        key: Any,
        value: Any,
        is_causal: bool,
        scale: float | None,
        enable_gqa: bool,
        alignment: str,
        backend: str | None,
        threads: int,
        executor: str | None,
        first_sequence: int,
        more: tuple,
    ) -> Any:
        """mha.attention's call over this cache, its arguments checked and resolved (executor: the
        binding's name; more: the window, soft-cap and sinks as _arguments._extensions makes them):
        the new tokens appended and attended over what each sequence holds. The route of both
        mha.attention(cache=) and the transformers MhaCache's layers; the library checks the
        backend against the cache's (None: the cache's)."""
        where = "mha.attention"
        backend = self.backend if backend is None else backend
        torch = sys.modules.get("torch")
        is_tensor = torch is not None and isinstance(query, torch.Tensor)
        # The plain call, read in C++ (float32 only: bfloat16 tokens are the general path's, which
        # copies them to float32); None: not plain, the general path's.
        if is_tensor and query.dtype == torch.float32:
            result = _mha._attention_tensors_over_cache(
                query,
                key,
                value,
                self._cache,
                bool(is_causal),
                alignment == "bottom_right",
                scale,
                self.precision == "bf16",
                bool(enable_gqa),
                backend,
                threads,
                executor,
                first_sequence,
                *more,
            )
            if result is not None:
                return result
        if is_tensor:
            dtypes = [getattr(t, "dtype", None) for t in (query, key, value)]
            if dtypes[1:] != dtypes[:1] * 2 and all(isinstance(t, torch.Tensor) for t in (key, value)):
                raise InvalidArgument(
                    f"{where}: query, key and value have dtypes {dtypes[0]}, {dtypes[1]}, {dtypes[2]}: "
                    "expected all float32 or all bfloat16"
                )
        arrays = [
            _operand(torch, is_tensor, name, t)
            for name, t in (("query", query), ("key", key), ("value", value))
        ]
        q, k, v = arrays
        if any(a.ndim != 4 for a in arrays):
            raise InvalidArgument(
                f"{where}: query, key and value are of shapes {q.shape}, {k.shape}, {v.shape}: expected "
                "(B, H, T, D) and (B, H_kv, T, D) with a cache"
            )
        _check_heads(q.shape, k.shape, v.shape, enable_gqa)
        result = np.empty(q.shape, np.float32)
        # The tensors' memory held for the call (another thread's set_() frees it only afterwards).
        held = [t.untyped_storage() for t in (query, key, value)] if is_tensor else []
        _mha._attention_over_cache(
            q,
            k,
            v,
            self._cache,
            result,
            bool(is_causal),
            alignment == "bottom_right",
            scale,
            self.precision == "bf16",
            backend,
            threads,
            executor,
            first_sequence,
            *more,
        )
        del held
        if not is_tensor:
            return result
        return torch.from_numpy(result).to(query.dtype)

    def __deepcopy__(self, memo: dict) -> AttentionCache:
        """A new cache holding the same tokens (its storage copied): a prompt's cache reused by
        several continuations, as transformers' copy.deepcopy(prompt_cache) pattern does."""
        made = object.__new__(AttentionCache)
        made._cache = self._cache.__deepcopy__(memo)
        made.backend, made.kv_heads, made.head_dim, made.precision = (
            self.backend,
            self.kv_heads,
            self.head_dim,
            self.precision,
        )
        return made

    def __copy__(self) -> AttentionCache:
        """As deepcopy: a copy sharing the storage would let each append into the other's tokens."""
        return self.__deepcopy__({})

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(
            "mha.AttentionCache cannot be pickled: it holds its tokens in the layout of this "
            "process's kernels (backend and ISA); copy.deepcopy(cache) copies it"
        )

    def __repr__(self) -> str:
        return (
            f"mha.AttentionCache(batch={self.batch}, capacity={self.capacity}, kv_heads={self.kv_heads}, "
            f"head_dim={self.head_dim}, kv={self.kv!r}, precision={self.precision!r}, "
            + (f"window={self.window}, slots={self.slots}, " if self.window else "")
            + f"backend={self.backend!r}, lengths={self.lengths}, nbytes={self.nbytes})"
        )


def _operand(torch: Any, is_tensor: bool, name: str, t: Any) -> np.ndarray:
    """A float32 array of t, read where it lies when it can be (a float32 tensor or array whose
    last dimension is contiguous), else a float32 copy (a bfloat16 tensor's: the new tokens only)."""
    where = "mha.attention"
    if is_tensor:
        if not isinstance(t, torch.Tensor):
            raise _mixed("a torch.Tensor", name, t)
        if t.device.type != "cpu":
            raise InvalidArgument(f"{where}: {name} is on {t.device}, expected the CPU")
        if t.requires_grad and torch.is_grad_enabled():
            raise Unsupported(f"{where}: {name} requires grad: mha computes inference only")
        if t.dtype not in (torch.float32, torch.bfloat16):
            raise InvalidArgument(f"{where}: {name} has dtype {t.dtype}, expected float32 or bfloat16")
        t = t.detach()
        if (
            t.dtype != torch.float32
            or (t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1)
            or (name != "query" and _expanded_keys(t.shape, t.stride()))
        ):
            t = t.to(torch.float32).contiguous()
        return t.numpy()
    t = _numpy_operand(torch, name, t)
    keep = _in_place(t) and not (name != "query" and _expanded_keys(t.shape, t.strides))
    return t if keep else np.ascontiguousarray(t)
