"""mha.transformers.MhaCache: transformers' Cache kept in mha's KV cache, one mha.AttentionCache
per layer (docs/python.md "A KV cache for attention calls"). Imported by mha.transformers, which
re-exports MhaCache; its update() hands each step's keys and values to mha's attention function
(_taken), which appends and attends in one call through the layer's own cache (attend)."""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DummyLayer, get_layer_types_and_kwargs

from ._arguments import _extensions
from ._cache import _KV, AttentionCache
from ._executor import resolve
from ._mha import InvalidArgument, Unsupported

# The attribute of a key tensor that an MhaCacheLayer's update() returned, naming the layer (until
# the attention function takes it): carried by the tensor itself, so nothing is left behind when
# another implementation reads it or a call is refused.
_LAYER = "_mha_cache_layer"

_NOT_READ = (
    "mha.transformers.MhaCache: the attention function did not take the new tokens the cache "
    "handed it (update() keeps them for mha's function): load the model with "
    'attn_implementation="mha" to use an MhaCache'
)


def _taken(key: torch.Tensor) -> MhaCacheLayer | None:
    """The MhaCache layer whose update() returned `key`, now taken by the attention function."""
    layer = key.__dict__.pop(_LAYER, None) if hasattr(key, "__dict__") else None
    if layer is None or layer._pending is None or layer._pending[0] is not key:
        return None
    layer._pending = None
    return layer


class MhaCacheLayer(CacheLayerMixin):
    """One attention layer of an MhaCache: an mha.AttentionCache, made at the first update from
    the keys' shape (batch, K/V heads, head_dim) and dtype. update() hands the new tokens to mha's
    attention function, which appends them and attends over the cache in one call. A left-padded
    batch (transformers' mask: padding in front of each sequence, then causal) keeps no padding:
    each sequence's prefill is appended without it, and its rows of the result are zeros (as a
    row that sees no key is, in mha.attention and SDPA). A sliding layer's (window > 0) cache is
    a ring of the window's last tokens, whatever the capacity (mha.AttentionCache's window)."""

    is_compileable = False
    is_croppable = True
    supports_early_init = False  # made from the first keys' shape

    def __init__(self, capacity: int, kv: str, backend: str | None, window: int = 0) -> None:
        super().__init__()
        self.capacity, self.kv, self.backend, self.window = capacity, kv, backend, window
        self.is_sliding = window > 0
        self.cache: AttentionCache | None = None
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None
        self.seen = 0  # tokens per sequence as transformers counts them (padding included)
        self.pads: list[int] = []  # each sequence's leading padding, which the cache does not hold

    def __repr__(self) -> str:
        return f"MhaCacheLayer({self.cache!r})"

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, kv_heads, _, head_dim = key_states.shape
        bf16 = self.kv == "bf16" or key_states.dtype == torch.bfloat16
        self.cache = AttentionCache(
            batch,
            self.capacity,
            kv_heads,
            head_dim,
            kv=self.kv,
            precision="bf16" if bf16 else "fp32",
            backend=self.backend,
            window=self.window,
        )
        self.pads = [0] * batch
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pending is not None:
            raise Unsupported(_NOT_READ)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        elif key_states.shape[0] != self.cache.batch:
            raise InvalidArgument(
                f"mha.transformers.MhaCache: a step of {key_states.shape[0]} sequences, and the cache holds "
                f"{self.cache.batch} (as many as its first step had): every step takes all of them"
            )
        self._pending = (key_states, value_states)
        setattr(key_states, _LAYER, self)
        return key_states, value_states

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool,
        scaling: float | None,
        backend: str | None,
        threads: int,
        executor: str | None,
        more: dict[str, Any],
    ) -> tuple[torch.Tensor, None]:
        """The attention function's call: key and value the new tokens update() handed it; more:
        the call's window, softcap and sinks (mha.attention's keywords). Made on the layer's cache
        directly (AttentionCache._attend, as mha.attention(cache=) makes it); the library refuses
        a backend other than the cache's."""
        rows = query.shape[2]
        if not causal and rows > 1:
            raise Unsupported(
                "mha.transformers.MhaCache: a non-causal model (an encoder) has no KV cache to keep"
            )
        pads = self._padding(mask, query.shape[0], rows)
        extensions = _extensions(more["window"], more["softcap"], more["sinks"])
        executor, threads = resolve(executor, threads)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first_sequence: int) -> torch.Tensor:
            return self.cache._attend(
                q,
                k,
                v,
                True,
                scaling,
                True,
                "bottom_right",
                backend,
                threads,
                executor,
                first_sequence,
                extensions,
            )

        # This call's rows of padding, per sequence: its prefill's first ones.
        skip = [min(rows, max(0, pad - self.seen)) for pad in pads]
        if not any(skip):
            result = attend(query, key, value, 0)
        else:  # each sequence on its own, without its padding
            result = torch.zeros(query.shape, dtype=query.dtype)
            for b, n in enumerate(skip):
                if n < rows:
                    part = (slice(b, b + 1), slice(None), slice(n, None))
                    result[part] = attend(query[part], key[part], value[part], b)
        self.seen += rows
        return result.transpose(1, 2).contiguous(), None

    def _padding(self, mask: torch.Tensor | None, batch: int, rows: int) -> list[int]:
        """Each sequence's leading padding, read from transformers' mask for `rows` new tokens (None:
        no padding) and checked to be exactly left padding then causal (and the layer's window), as
        at the prefill; any other mask refused."""
        if mask is None:
            if any(self.pads):
                raise Unsupported(
                    "mha.transformers.MhaCache: a call without a mask after a padded prefill (its padding "
                    "would be attended)"
                )
            return self.pads
        keys = self.seen + rows
        refused = Unsupported(
            "mha.transformers.MhaCache: this attention mask is not left padding followed by the causal "
            + (f"mask of a window of {self.window}" if self.window else "mask")
            + " (a mask over the cached keys of another kind is not implemented; use transformers' "
            "DynamicCache)"
        )
        if (
            mask.dtype != torch.bool
            or mask.dim() != 4
            or tuple(mask.shape[-2:]) != (rows, keys)
            or mask.shape[1] != 1
        ):
            raise refused
        grid = mask.expand(batch, 1, rows, keys)[:, 0]
        if self.seen > 0:  # the prefill's padding, which every later mask must keep
            pads = torch.tensor(self.pads)
        else:  # each sequence's keys in front of the first one any row sees (a window's first row
            # sees from there)
            seen_any = grid.any(dim=1)
            if not bool(seen_any.any(dim=1).all()):
                raise refused  # a sequence of padding only
            pads = seen_any.to(torch.int8).argmax(dim=1)
        position = torch.arange(keys)
        seen = position[None, :] <= position[-rows:, None]
        if self.window:
            seen &= position[None, :] > position[-rows:, None] - self.window
        allowed = seen[None] & (position[None, None, :] >= pads[:, None, None])
        if not torch.equal(grid, allowed):
            raise refused  # another mask, or padding after the prefill
        self.pads = pads.tolist()
        return self.pads

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        if self._pending is not None:
            raise Unsupported(_NOT_READ)
        return self.seen

    def get_max_length(self) -> int:
        return self.capacity

    def reset(self) -> None:
        if self.cache is not None:
            self.cache.reset()
        self._pending = None
        self.seen = 0
        self.pads = [0] * len(self.pads)

    def crop(self, tokens_to_remove: int) -> None:
        """Forgets the last -tokens_to_remove tokens of every sequence (as DynamicLayer's crop)."""
        if tokens_to_remove > 0:
            raise ValueError(
                f"crop({tokens_to_remove}): pass a negative number of tokens to remove (as transformers' "
                "DynamicLayer)"
            )
        if tokens_to_remove == 0 or self.cache is None:
            return
        self.seen = max(0, self.seen + tokens_to_remove)
        for b, pad in enumerate(self.pads):
            self.cache.truncate(b, min(self.cache.lengths[b], max(0, self.seen - pad)))

    def _refuse(self, what: str) -> None:
        raise Unsupported(f"mha.transformers.MhaCache: {what} is not implemented; use DynamicCache")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            self._refuse("reordering the cache (beam search)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            self._refuse("repeating the cache's sequences")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self._refuse("selecting the cache's sequences")

    def offload(self) -> None:
        self._refuse("offloading")

    def prefetch(self) -> None:
        self._refuse("offloading")


class MhaCache(Cache):
    """transformers' Cache kept in mha's KV cache, for generate(past_key_values=MhaCache(...)) on a
    model loaded with attn_implementation="mha": one mha.AttentionCache per layer, up to `capacity`
    tokens per sequence (the prompt and every new token), keys and values in `kv` ("int8", the
    default: codes with a scale and an offset per token and K/V head, read in place by the decode
    kernels; "k8v4": int8's keys, 4-bit values in turned groups of 32; "int4": k8v4's values,
    4-bit keys per channel of each group of 64 tokens; "bf16"; "fp32"), on
    `backend` (None: the default). config: the model's (its
    num_hidden_layers, and each layer's kind as transformers' caches read it: a sliding layer's
    cache keeps its window's last tokens, Gemma 2/3's, Mistral's, Qwen2's and gpt-oss's). A
    left-padded batch (generate()'s) keeps no padding in the cache. Not implemented, and refused by
    name: other masks over the cached keys, beam search's reordering, offloading, encoders,
    cross-attention, KV-shared layers, a hybrid model's other layers."""

    def __init__(self, config: Any, capacity: int, *, kv: str = "int8", backend: str | None = None) -> None:
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        layers = getattr(text, "num_hidden_layers", None)
        if not isinstance(layers, int) or layers < 1:
            raise InvalidArgument(f"mha.transformers.MhaCache: config has no num_hidden_layers ({layers!r})")
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise InvalidArgument(
                f"mha.transformers.MhaCache: capacity ({capacity!r}) must be an integer >= 1"
            )
        if kv not in _KV:
            raise InvalidArgument(f"mha.transformers.MhaCache: kv {kv!r} is not one of {', '.join(_KV)}")
        self.kv = kv
        super().__init__(
            layers=[
                DummyLayer() if window is None else MhaCacheLayer(capacity, kv, backend, window)
                for window in _layer_windows(config, text, layers)
            ]
        )

    @property
    def nbytes(self) -> int:
        """The bytes of the layers' caches made so far."""
        return sum(layer.cache.nbytes for layer in self._kept() if layer.cache is not None)

    def _kept(self) -> list[MhaCacheLayer]:
        """The layers that keep a cache (not those without attention)."""
        return [layer for layer in self.layers if isinstance(layer, MhaCacheLayer)]

    def __repr__(self) -> str:
        first = self._kept()[0]
        tokens = first.cache.lengths if first.cache is not None else []  # padding not held
        return (
            f"mha.transformers.MhaCache(layers={len(self.layers)}, kv={self.kv!r}, capacity={first.capacity}, "
            f"lengths={tokens}, nbytes={self.nbytes})"
        )


def _layer_windows(config: Any, text: Any, layers: int) -> list[int | None]:
    """Each layer's window as transformers' own caches read the config (layer_types,
    sliding_window, Mistral's window, Qwen2's max_window_layers): 0 for full attention, the window
    of a sliding layer, None for a layer without attention; every layer MhaCache cannot serve
    refused by name."""
    where = "mha.transformers.MhaCache"
    if getattr(config, "is_encoder_decoder", False):
        raise Unsupported(
            f"{where}: {type(config).__name__} is an encoder-decoder model, whose decoder also attends over "
            "the encoder's outputs (cross-attention), which MhaCache does not keep; use transformers' "
            "EncoderDecoderCache"
        )
    try:
        kinds, kwargs = get_layer_types_and_kwargs(text)
    except (AttributeError, TypeError, ValueError):  # a config transformers' caches do not read either
        kinds, kwargs = ["full_attention"] * layers, [{}] * layers
    kinds, kwargs = list(kinds)[:layers], list(kwargs)[:layers]
    sharing = getattr(text, "kv_sharing_modes", None) or []
    shared = [i for i, mode in enumerate(sharing) if mode == "reuse"]
    if shared:
        raise Unsupported(
            f"{where}: layers {_spans(shared)} of {type(text).__name__} reuse an earlier layer's keys and "
            "values (KV-shared layers: num_kv_shared_layers, kv_sharing_modes), which MhaCache does not "
            "hand them; use DynamicCache"
        )
    windows: list[int | None] = []
    for i, (kind, extra) in enumerate(zip(kinds, kwargs)):
        if kind == "full_attention":
            windows.append(0)
        elif kind == "dummy":
            windows.append(None)
        elif kind == "sliding_attention" and isinstance(extra.get("sliding_window"), int):
            windows.append(extra["sliding_window"])
        else:
            raise Unsupported(
                f"{where}: layer {i} is of kind {kind!r} (layer_types), not attention over a KV cache "
                "(a hybrid model's recurrent or convolutional state, chunked or sparse attention), "
                "which MhaCache does not implement; use DynamicCache"
            )
    return windows


def _spans(indices: list[int]) -> str:
    """[3, 4, 5, 9] as "3-5, 9"."""
    spans: list[list[int]] = []
    for i in indices:
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
