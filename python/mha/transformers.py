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
Importing this module without transformers installed raises ImportError saying so.
"""

from __future__ import annotations

from typing import Any

try:
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "mha.transformers needs PyTorch and Hugging Face transformers 5 (pip install torch "
        f"transformers): {e}"
    ) from e

import numpy as np

from . import _mha
from ._attention import MAX_THREADS, _threads, attention
from ._executor import EXECUTORS
from ._mha import InvalidArgument, Unsupported

__all__ = ["attention_forward", "register"]

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
        causal = query.shape[2] > 1 and attention_mask is None and causal
        options = dict(
            is_causal=causal,
            scale=scaling,
            enable_gqa=True,
            backend=backend,
            threads=min(torch.get_num_threads(), MAX_THREADS) if threads is None else threads,
            executor=executor,
        )
        # Written straight into the (B, L, H, D) result.
        b, h, rows, d = query.shape
        if query.dtype == torch.bfloat16:
            out = torch.from_numpy(np.empty((b, rows, h, d), np.int16)).view(torch.bfloat16)
        else:
            out = torch.from_numpy(np.empty((b, rows, h, d), np.float32))
        attention(query, key, value, attention_mask, out=out.transpose(1, 2), **options)
        return out, None

    return attention_forward


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
