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
torch.inference_mode(), as generate() does), attention weights (output_attentions), T5's
position bias, sparse attention's indices, and any keyword it does not know to leave the function
as the mask says. Sliding windows, logit soft-capping and attention sinks (sliding_window,
softcap, s_aux) are computed (mha.attention's window, softcap, sinks); a sliding window's causal
mask without padding is left to the window (_mask). A model in training mode without dropout,
under no_grad, is computed. A model whose attention does not go through transformers' attention
interface (its own code would never call mha) is refused when it is loaded on mha's name.

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
left-padded batches keep no padding in it; other masks, beam search, offloading, another batch
size, and what the config says it cannot keep (cross-attention, KV-shared layers, a hybrid
model's other layers) are refused by name; a sliding layer keeps its window's ring; copy.deepcopy
copies it.
Importing this module without transformers installed raises ImportError saying so.
"""

from __future__ import annotations

from typing import Any

try:
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import (
        AttentionMaskInterface,
        _ignore_causal_mask_sdpa,
        prepare_padding_mask,
        sdpa_mask,
    )
    from transformers.modeling_utils import PreTrainedModel
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "mha.transformers needs PyTorch and Hugging Face transformers 5 (pip install torch "
        f"transformers): {e}"
    ) from e

import numpy as np

from . import _mha
from ._arguments import MAX_THREADS, _threads
from ._attention import attention
from ._executor import EXECUTORS
from ._mha import InvalidArgument, Unsupported
from ._transformers_cache import MhaCache, _taken

__all__ = ["MhaCache", "attention_forward", "register"]

# What the function cannot compute, by the keyword transformers passes it under.
_REFUSED = {
    "position_bias": "a position bias added to the scores (T5's position_bias)",
    "indices": "sparse attention over selected keys (indices)",
    "block_indices": "sparse attention over selected key blocks (block_indices)",
    "cache": "a paged cache (continuous batching)",
}
# The keywords transformers' attention modules pass that mha computes: the function's extensions
# (sliding_window, softcap, s_aux or sinks: mha.attention's window, softcap and sinks), and those
# that leave the function as the mask and the causal flag define it (the mask carries packed
# sequences; the rest are positions, flash-attention bookkeeping and what the model is asked to
# return). Any other keyword with a value is refused by name: a keyword mha does not know may
# change the function (as sparse models' indices did, silently, before they were named here).
_FUNCTION_KEPT = frozenset(
    {
        "sliding_window",
        "softcap",
        "s_aux",
        "sinks",
        "position_ids",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "seq_idx",
        "output_attentions",
        "output_hidden_states",
        "output_router_logits",
        "num_items_in_batch",
        "use_cache",
        "cache_position",
        "deterministic",
        "layer_idx",
    }
)


def _refuse_keywords(kwargs: dict[str, Any]) -> None:
    """Refuses, by name, a keyword that changes the function (or one mha does not know)."""
    for name, value in kwargs.items():
        if value is None or value is False:
            continue
        what = _REFUSED.get(name)
        if what is not None:
            raise Unsupported(
                f"mha.transformers: {what} is not implemented; use attn_implementation='sdpa' or 'eager'"
            )
        if name not in _FUNCTION_KEPT:
            raise Unsupported(
                f"mha.transformers: the model passes the attention function the keyword {name!r}, which mha "
                "does not know (it may change what the attention computes): not implemented; use "
                "attn_implementation='sdpa' or 'eager'"
            )


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
        # Taken first, so that a refused call leaves the cache as it was (its tokens not appended)
        # and ready for the next call.
        layer = _taken(key)
        if not kwargs.keys() <= _FUNCTION_KEPT:
            _refuse_keywords(kwargs)
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
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        threads_now = min(torch.get_num_threads(), MAX_THREADS) if threads is None else threads
        # The window is the attention's own where there is no mask (_mask leaves a sliding
        # window's causal mask to it); a mask carries the window itself.
        window = kwargs.get("sliding_window") if attention_mask is None else None
        more = dict(
            window=window,
            softcap=kwargs.get("softcap"),
            sinks=kwargs.get("s_aux", kwargs.get("sinks")),
        )
        if layer is not None:  # the new tokens of an MhaCache: appended and attended there
            return layer.attend(
                query, key, value, attention_mask, causal, scaling, backend, threads_now, executor, more
            )
        rows = query.shape[2]
        if window:  # a causal window without a mask; a decode row's sees every key but those past it
            options = dict(
                is_causal=True,
                causal_alignment="bottom_right" if rows == 1 else _alignment(module, rows, key.shape[2]),
                scale=scaling,
                enable_gqa=True,
                backend=backend,
                threads=threads_now,
                executor=executor,
                **more,
            )
            return _into_result(query, key, value, None, options)
        if rows == 1 and more["softcap"] is None and more["sinks"] is None:
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
            is_causal=attention_mask is None and causal and rows > 1,
            causal_alignment=_alignment(module, rows, key.shape[2]),
            scale=scaling,
            enable_gqa=True,
            backend=backend,
            threads=threads_now,
            executor=executor,
            softcap=more["softcap"],
            sinks=more["sinks"],
        )
        return _into_result(query, key, value, attention_mask, options)

    return attention_forward


def _into_result(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, options: dict[str, Any]
) -> tuple[torch.Tensor, None]:
    """mha.attention with `options`, written straight into the (B, L, H, D) result transformers
    reshapes."""
    b, h, rows, d = query.shape
    if query.dtype == torch.bfloat16:
        out = torch.from_numpy(np.empty((b, rows, h, d), np.int16)).view(torch.bfloat16)
    else:
        out = torch.from_numpy(np.empty((b, rows, h, d), np.float32))
    attention(query, key, value, mask, out=out.transpose(1, 2), **options)
    return out, None


def _mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    allow_is_causal_skip: bool = True,
    **kwargs: Any,
) -> torch.Tensor | None:
    """The masks registered for mha's names: sdpa_mask's, but a sliding window's causal mask over
    keys without padding is None, as a plain causal one is: the attention function then computes
    the window itself from the sliding_window keyword transformers passes every windowed layer's
    attention (as flash attention needs it), reading O(L w) keys rather than an L x S mask over all
    of them. Any other pattern with a local size (chunked attention, a bidirectional window) is
    sdpa_mask's, materialised."""
    if (
        local_size is not None
        and allow_is_causal_skip
        and _sliding_causal(mask_function, local_size)
        and _ignore_causal_mask_sdpa(
            prepare_padding_mask(attention_mask, kv_length, kv_offset),
            q_length,
            kv_length,
            q_offset,
            kv_offset,
            None,
        )
    ):
        return None
    extra = {} if mask_function is None else {"mask_function": mask_function}
    return sdpa_mask(
        batch_size,
        q_length,
        kv_length,
        q_offset,
        kv_offset,
        attention_mask=attention_mask,
        local_size=local_size,
        allow_is_causal_skip=allow_is_causal_skip,
        **extra,
        **kwargs,
    )


def _sliding_causal(mask_function: Any, window: int) -> bool:
    """Whether mask_function is transformers' sliding window causal mask of `window` keys: its
    answers for the queries where a window, a chunk of that size and a bidirectional window part
    ways (positions 0, w - 1, w, w + 1, 2w, 2w + 1 over keys 0 to 2w + 1)."""
    if mask_function is None or not isinstance(window, int) or window < 1:
        return False
    q = torch.tensor([0, window - 1, window, window + 1, 2 * window, 2 * window + 1])[:, None]
    kv = torch.arange(2 * window + 2)[None, :]
    zero = torch.zeros((), dtype=torch.long)
    try:
        got = torch.as_tensor(mask_function(zero, zero, q, kv)).expand(q.shape[0], kv.shape[1])
    except (TypeError, ValueError, RuntimeError, IndexError):  # not the window's, whatever it is
        return False
    return bool(torch.equal(got, (kv <= q) & (kv > q - window)))


def _alignment(module: torch.nn.Module, rows: int, keys: int) -> str:
    """Where a causal call without a mask puts its queries. transformers passes is_causal, as to
    SDPA (top-left), where the queries are the first positions: L == S, or a prefill into an empty
    static cache (S its capacity). A layer that reuses an earlier layer's keys and values (Gemma 3n
    and 4's KV-shared layers) may instead be handed only the last L positions' queries over all S
    keys (transformers slices them for logits_to_keep under any implementation but "sdpa"): those
    queries stand at the end, bottom-right."""
    if rows < keys and getattr(module, "is_kv_shared_layer", False):
        return "bottom_right"
    return "top_left"


def _check_routed(model: Any, requested: Any) -> None:
    """Refuses one of mha's names on a model whose attention does not go through transformers'
    attention interface: its own code would never call mha, and would read mha's mask (sdpa's
    boolean one) as whatever it expects. transformers' own signs of a model that does: the class
    says so (_supports_attention_backend), or its module's attention classes look their function
    up in the interface (_can_set_attn_implementation, the test set_attn_implementation uses)."""
    if not isinstance(requested, str) or requested not in _registered:
        return
    cls = type(model)
    if getattr(cls, "_supports_attention_backend", False) or cls._can_set_attn_implementation():
        return
    raise Unsupported(
        f"mha.transformers: {cls.__name__} computes its attention in its own code, not through "
        f"transformers' attention interface, so attn_implementation={requested!r} would never call mha "
        "(and the model would read mha's mask as its own): load it with attn_implementation='sdpa' or "
        "'eager'"
    )


def _refusing_unrouted(original: Any) -> Any:
    def get_correct_attn_implementation(
        self: Any, requested_attention: Any, *args: Any, **kwargs: Any
    ) -> Any:
        _check_routed(self, requested_attention)
        return original(self, requested_attention, *args, **kwargs)

    get_correct_attn_implementation._mha_checked = True
    return get_correct_attn_implementation


# Every model checks the implementation it is loaded with (and set_attn_implementation the new one)
# through this method: mha's names are refused there on models that would not call mha.
if not getattr(PreTrainedModel.get_correct_attn_implementation, "_mha_checked", False):
    PreTrainedModel.get_correct_attn_implementation = _refusing_unrouted(
        PreTrainedModel.get_correct_attn_implementation
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
    AttentionMaskInterface.register(name, _mask)
    _registered.add(name)


_register("mha", None, None, None)
