"""mha inside Hugging Face models: importing this module registers "mha" as an attention
implementation of transformers (5.x), so that

    import mha.transformers
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="mha")
    model.generate(...)

prefills and decodes through mha's kernels (mha.attention) with transformers' own cache and
masks. The function keeps the contract of transformers' "sdpa" entry
(transformers.integrations.sdpa_attention.sdpa_attention_forward): the same masks (registered
for "mha" as sdpa_mask builds them), the same causal rule (is_causal only for a query of more
than one token without a mask, top-left as SDPA's), grouped K/V heads read without repeating
them. What it cannot compute is an error naming it, never a silent fallback: attention dropout
(training mode with a dropout above 0), gradients (autograd enabled with query, key or value
requiring grad, in training or in eval mode: run under torch.no_grad() or
torch.inference_mode(), as generate() does), attention weights (output_attentions), logit
soft-capping, attention sinks, T5's position bias. A model in training mode without dropout,
under no_grad, is computed.

register(name="mha", backend=None, threads=None) registers the function under a name of its own
(or "mha" again) with its own settings, checked when it registers: name is a str that is not
one of transformers' own implementations ("eager", "sdpa", "flash_attention_2", ...) nor
another library's; backend is a name of mha.backends() that runs attention calls (None: the
default backend), threads the worker threads (0: all cores, at most mha's MAX_THREADS; None:
torch.get_num_threads() at each call, capped there, so torch.set_num_threads governs both),
executor who runs the tbb backend's parallel work (None: PyTorch's own OpenMP workers where
mha can share them, mha.default_executor() says; "tbb", "openmp", "serial").
MhaCache(model.config, capacity, kv="int8") is transformers' Cache kept in mha's KV cache
(mha.AttentionCache per layer; int8 codes read in place by the decode kernels), for
model.generate(..., past_key_values=MhaCache(...)) on a model loaded with attn_implementation="mha";
left-padded batches keep no padding in it; other masks, beam search and offloading are refused
by name.
Importing this module without transformers installed raises ImportError saying so.
"""

from __future__ import annotations

import weakref
from typing import Any

try:
    import torch
    from transformers import AttentionInterface
    from transformers.cache_utils import Cache, CacheLayerMixin
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "mha.transformers needs PyTorch and Hugging Face transformers 5 (pip install torch "
        f"transformers): {e}"
    ) from e

import numpy as np

from . import _mha
from ._attention import MAX_THREADS, _threads, attention
from ._cache import _KV, AttentionCache
from ._executor import EXECUTORS
from ._mha import InvalidArgument, Unsupported

__all__ = ["MhaCache", "attention_forward", "register"]

# What the function cannot compute, by the keyword transformers passes it under.
_REFUSED = {
    "softcap": "logit soft-capping (softcap)",
    "s_aux": "attention sinks (s_aux)",
    "sinks": "attention sinks",
    "position_bias": "a position bias added to the scores (T5's position_bias)",
}


def _attention_function(backend: str | None, threads: int | None, executor: str | None) -> Any:
    """transformers' attention function on `backend` with `threads` and `executor` (see
    register)."""

    def attention_forward(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """transformers' attention function: query (B, H, L, D), key and value (B, H_kv, S, D) as
        the model's attention module made them, the mask from sdpa_mask (boolean, or None where
        is_causal holds), returns ((B, L, H, D), None) as the "sdpa" entry does."""
        for name, what in _REFUSED.items():
            if kwargs.get(name) is not None:
                raise Unsupported(
                    f"mha.transformers: {what} is not implemented; use attn_implementation='sdpa' or 'eager'"
                )
        if kwargs.get("output_attentions"):
            raise Unsupported(
                "mha.transformers: output_attentions=True: mha's fused attention computes no weights"
            )
        if dropout:
            raise Unsupported(
                f"mha.transformers: {type(module).__name__} asks for attention dropout {dropout:g} "
                "(training mode): mha computes inference only; call model.eval()"
            )
        if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
            raise Unsupported(
                f"mha.transformers: {type(module).__name__}'s query, key or value requires grad, with "
                "autograd enabled: mha computes no gradient (inference only); call the model under "
                "torch.no_grad() or torch.inference_mode() (generate() does)"
            )
        if kwargs.get("cache") is not None:
            raise Unsupported("mha.transformers: a paged cache (continuous batching) is not implemented")
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        threads_now = min(torch.get_num_threads(), MAX_THREADS) if threads is None else threads
        layer = _taken(key)
        if layer is not None:  # the new tokens of an MhaCache: appended and attended there
            return layer.attend(
                query, key, value, attention_mask, causal, scaling, backend, threads_now, executor
            )
        b, h, rows, d = query.shape
        if rows == 1:
            # A decode step: (B, H, 1, D) and its transpose (B, 1, H, D) are one contiguous layout,
            # so mha's own result is transformers', with no buffer made here (a few us a call).
            # The keywords spelled out, not the prefill's options dict: making and unpacking it
            # costs 1.5 us of a ~25 us call (Zen3, one thread), once per layer and token.
            result = attention(
                query,
                key,
                value,
                attention_mask,
                scale=scaling,
                enable_gqa=True,
                backend=backend,
                threads=threads_now,
                executor=executor,
            )
            return result.transpose(1, 2), None
        options = dict(
            is_causal=attention_mask is None and causal,
            scale=scaling,
            enable_gqa=True,
            backend=backend,
            threads=threads_now,
            executor=executor,
        )
        # Written straight into the (B, L, H, D) result.
        if query.dtype == torch.bfloat16:
            out = torch.from_numpy(np.empty((b, rows, h, d), np.int16)).view(torch.bfloat16)
        else:
            out = torch.from_numpy(np.empty((b, rows, h, d), np.float32))
        attention(query, key, value, attention_mask, out=out.transpose(1, 2), **options)
        return out, None

    return attention_forward


# The layers whose update() handed the attention function new tokens it has not taken yet, by
# the id of the key tensor update() returned (alive until the attention function has run); weak,
# so that a layer whose tokens another implementation read is not kept alive here.
_pending: dict[int, weakref.ref[MhaCacheLayer]] = {}

_NOT_READ = (
    "mha.transformers.MhaCache: the attention function did not take the new tokens the cache "
    "handed it (update() keeps them for mha's function): load the model with "
    'attn_implementation="mha" to use an MhaCache'
)


def _taken(key: torch.Tensor) -> MhaCacheLayer | None:
    """The MhaCache layer whose update() returned `key`, now taken by the attention function."""
    ref = _pending.pop(id(key), None)
    layer = ref() if ref is not None else None
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
    row that sees no key is, in mha.attention and SDPA)."""

    is_compileable = False
    is_croppable = True
    is_sliding = False
    supports_early_init = False  # made from the first keys' shape

    def __init__(self, capacity: int, kv: str, backend: str | None) -> None:
        super().__init__()
        self.capacity, self.kv, self.backend = capacity, kv, backend
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
        self._pending = (key_states, value_states)
        _pending[id(key_states)] = weakref.ref(self)
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
    ) -> tuple[torch.Tensor, None]:
        """The attention function's call: key and value the new tokens update() handed it."""
        rows = query.shape[2]
        if not causal and rows > 1:
            raise Unsupported(
                "mha.transformers.MhaCache: a non-causal model (an encoder) has no KV cache to keep"
            )
        if backend is not None and backend != self.cache.backend:
            raise InvalidArgument(
                f"mha.transformers: backend {backend!r}, and the MhaCache was made for {self.cache.backend!r}"
            )
        pads = self._padding(mask, query.shape[0], rows)
        options = dict(
            is_causal=True,
            causal_alignment="bottom_right",
            scale=scaling,
            enable_gqa=True,
            threads=threads,
            executor=executor,
            cache=self.cache,
        )
        # This call's rows of padding, per sequence: its prefill's first ones.
        skip = [min(rows, max(0, pad - self.seen)) for pad in pads]
        if not any(skip):
            result = attention(query, key, value, **options)
        else:  # each sequence on its own, without its padding
            result = torch.zeros(query.shape, dtype=query.dtype)
            for b, n in enumerate(skip):
                if n < rows:
                    part = (slice(b, b + 1), slice(None), slice(n, None))
                    result[part] = attention(query[part], key[part], value[part], first_sequence=b, **options)
        self.seen += rows
        return result.transpose(1, 2).contiguous(), None

    def _padding(self, mask: torch.Tensor | None, batch: int, rows: int) -> list[int]:
        """Each sequence's leading padding, read from transformers' mask for `rows` new tokens (None:
        no padding) and checked to be exactly left padding then causal, as at the prefill; any
        other mask refused."""
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
            "mask (a mask over the cached keys of another kind is not implemented; use transformers' "
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
        last = grid[:, -1]  # the last query row sees every key but the padding
        if not bool(last.any(dim=1).all()):
            raise refused  # a sequence of padding only
        pads = last.to(torch.int8).argmax(dim=1)  # its first key that is not padding
        position = torch.arange(keys)
        allowed = (position[None, :] <= position[-rows:, None])[None] & (
            position[None, None, :] >= pads[:, None, None]
        )
        if not torch.equal(grid, allowed):
            raise refused
        pads = pads.tolist()
        if self.seen > 0 and pads != self.pads:
            raise refused  # padding after the prefill
        self.pads = pads
        return pads

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
    kernels; "bf16"; "fp32"), on `backend` (None: the default). config: the model's (its
    num_hidden_layers). A left-padded batch (generate()'s) keeps no padding in the cache. Not
    implemented, and refused by name: other masks over the cached keys, beam search's reordering,
    offloading, encoders."""

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
        super().__init__(layers=[MhaCacheLayer(capacity, kv, backend) for _ in range(layers)])

    @property
    def nbytes(self) -> int:
        """The bytes of the layers' caches made so far."""
        return sum(layer.cache.nbytes for layer in self.layers if layer.cache is not None)

    def __repr__(self) -> str:
        first = self.layers[0]
        tokens = first.cache.lengths if first.cache is not None else []  # padding not held
        return (
            f"mha.transformers.MhaCache(layers={len(self.layers)}, kv={self.kv!r}, capacity={first.capacity}, "
            f"lengths={tokens}, nbytes={self.nbytes})"
        )


# The function `import mha.transformers` registers as "mha": the default backend, torch's threads.
attention_forward = _attention_function(None, None, None)


# The names this module registered: register() replaces these, and no other implementation.
_registered: set[str] = set()


def register(
    name: str = "mha", *, backend: str | None = None, threads: int | None = None, executor: str | None = None
) -> None:
    """Registers an attention function on `backend` with `threads` as transformers' attention
    implementation `name` (each name keeps its own settings), with the masks of "sdpa" (boolean,
    None where a causal flag suffices). The arguments are checked here (see the module's
    docstring): an InvalidArgument or Unsupported names the one that is wrong."""
    where = "mha.transformers.register"
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{where}: name {name!r} must be a non-empty str (an attn_implementation)")
    if name not in _registered and (
        name == "eager" or name in AttentionInterface() or name in AttentionMaskInterface()
    ):
        raise InvalidArgument(
            f"{where}: name {name!r} is transformers' own attention implementation (or another "
            "library's): register mha's under a name of its own"
        )
    if backend is not None:
        if not isinstance(backend, str):
            raise InvalidArgument(
                f"{where}: backend {backend!r} must be a name of mha.backends() (a str), or None"
            )
        found = {b.name: b for b in _mha.backends()}
        if backend not in found:
            raise InvalidArgument(
                f"{where}: backend {backend!r} is not one of mha.backends(): {', '.join(found)}"
            )
        why = found[backend].supports_attention()
        if why is not None:
            raise Unsupported(f"{where}: backend {backend!r} does not run attention calls: {why}")
    if threads is not None:
        threads = _threads(where, threads)
    if executor is not None and executor not in EXECUTORS:
        raise InvalidArgument(f"{where}: executor {executor!r} is not one of {', '.join(EXECUTORS)}, or None")
    _register(name, backend, threads, executor)


def _register(name: str, backend: str | None, threads: int | None, executor: str | None) -> None:
    default = backend is None and threads is None and executor is None
    AttentionInterface.register(
        name, attention_forward if default else _attention_function(backend, threads, executor)
    )
    AttentionMaskInterface.register(name, sdpa_mask)
    _registered.add(name)


_register("mha", None, None, None)
