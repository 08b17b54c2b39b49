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
them. What it cannot compute is an error naming it, never a silent fallback: training mode
(dropout, and no gradient flows through mha's attention), attention weights
(output_attentions), logit soft-capping, attention sinks, T5's position bias. In eval mode
under autograd the attention's output carries no gradient.

register(name="mha", backend=None, threads=None) registers the function under a name of its own
(or "mha" again) with its own settings: backend is a name of mha.backends() that runs attention
calls (None: the default backend), threads the worker threads (None: torch.get_num_threads() at
each call, so torch.set_num_threads governs both). Importing this module without transformers installed raises ImportError saying so.
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

from ._attention import attention
from ._mha import Unsupported

__all__ = ["attention_forward", "register"]

# What the function cannot compute, by the keyword transformers passes it under.
_REFUSED = {
    "softcap": "logit soft-capping (softcap)",
    "s_aux": "attention sinks (s_aux)",
    "sinks": "attention sinks",
    "position_bias": "a position bias added to the scores (T5's position_bias)",
}


def _attention_function(backend: str | None, threads: int | None) -> Any:
    """transformers' attention function on `backend` with `threads` (see register)."""

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
        if module.training:
            raise Unsupported(
                f"mha.transformers: {type(module).__name__} is in training mode (dropout {dropout:g}, gradients): "
                "mha computes inference only; call model.eval()"
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
            threads=torch.get_num_threads() if threads is None else threads,
        )
        q, k, v = query.detach(), key.detach(), value.detach()
        # Written straight into the (B, L, H, D) result.
        b, h, rows, d = q.shape
        if q.dtype == torch.bfloat16:
            out = torch.from_numpy(np.empty((b, rows, h, d), np.int16)).view(torch.bfloat16)
        else:
            out = torch.from_numpy(np.empty((b, rows, h, d), np.float32))
        attention(q, k, v, attention_mask, out=out.transpose(1, 2), **options)
        return out, None

    return attention_forward


# The function `import mha.transformers` registers as "mha": the default backend, torch's threads.
attention_forward = _attention_function(None, None)


def register(name: str = "mha", *, backend: str | None = None, threads: int | None = None) -> None:
    """Registers an attention function on `backend` with `threads` as transformers' attention
    implementation `name` (each name keeps its own settings), with the masks of "sdpa" (boolean,
    None where a causal flag suffices)."""
    default = backend is None and threads is None
    AttentionInterface.register(name, attention_forward if default else _attention_function(backend, threads))
    AttentionMaskInterface.register(name, sdpa_mask)


register()
