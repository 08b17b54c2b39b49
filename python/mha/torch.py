"""mha.torch.Attention: a PyTorch attention module run through mha, for inference.

    import mha.torch
    block.attn = mha.torch.Attention(block.attn)      # same calls, same outputs, mha's kernels

It takes the forward signature of the module it wraps (torch.nn.MultiheadAttention, the seeds'
modules, Hugging Face's GPT2Attention, LlamaAttention, BertSelfAttention) and returns what that
returns. What mha does not compute is an error naming it, never a silent fallback to PyTorch:
autograd (a tensor that requires grad, with grad enabled), training mode with dropout, attention
weights (need_weights / output_attentions), masks other than the causal one (or none for BERT),
a Hugging Face cache, positions other than 0 .. T-1. The weights are copied when it is made:
later changes to the wrapped module do not reach it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import _modules
from . import _mha
from ._mha import Unsupported
from ._plan import Plan

__all__ = ["Attention"]


class Attention(torch.nn.Module):
    """`module` run by mha (see the module's docstring). backend, formulation, precision,
    threads and executor as for mha.Plan.from_module and mha.Plan; context_length where the module
    records none."""

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        context_length: int | None = None,
        rope_base: float | None = None,
        backend: str | None = None,
        formulation: str = "split_weight",
        precision: str = "fp32",
        threads: int = 0,
        executor: str | None = None,
    ) -> None:
        super().__init__()
        self.description = _modules.describe(module, context_length=context_length, rope_base=rope_base)
        self.plan = Plan._from_description(self.description, None, precision, backend, formulation, threads)
        self.plan.executor = executor
        self.description.state_dict = {}  # the plan holds the weights
        self._rope_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.train(module.training)  # eval stays eval

    def extra_repr(self) -> str:
        return f"{self.description.kind}: {self.plan!r}"

    def _check_mode(self) -> None:
        if self.training and self.plan.config.dropout > 0:
            raise Unsupported(
                f"mha.torch.Attention: training mode with dropout {self.plan.config.dropout:g} "
                "(mha computes inference only): call .eval()"
            )

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        self._check_mode()
        return self.plan(x)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        kind = self.description.kind
        if kind == _modules.TORCH_MHA:
            return self._torch_mha(*args, **kwargs)
        if kind == _modules.SEEDS:
            return self._seeds(*args, **kwargs)
        if kind == _modules.GPT2:
            return self._gpt2(*args, **kwargs)
        if kind == _modules.LLAMA:
            return self._llama(*args, **kwargs)
        return self._bert(*args, **kwargs)

    # -- the modules' signatures -------------------------------------------------------------

    def _seeds(self, x: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        if use_cache:
            raise Unsupported(
                "mha.torch.Attention: use_cache=True (the module's own cache): decode through "
                "plan.make_cache and plan(x, cache=...) instead"
            )
        return self._run(x)

    def _torch_mha(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, None]:
        if not (_same(query, key) and _same(key, value)):
            raise Unsupported(
                "mha.torch.Attention: query, key and value must be one tensor (self-attention: the "
                "same memory, shape and strides)"
            )
        if need_weights:
            raise Unsupported(
                "mha.torch.Attention: need_weights=True (nn.MultiheadAttention's default): mha does not "
                "return attention weights; pass need_weights=False"
            )
        if key_padding_mask is not None:
            raise Unsupported("mha.torch.Attention: key_padding_mask is not computed by mha")
        causal = self.plan.config.causal
        tokens = query.shape[1] if self.description.batch_first else query.shape[0]
        if attn_mask is not None:
            if not _is_causal_mask(attn_mask, tokens):
                raise Unsupported(
                    "mha.torch.Attention: attn_mask other than the causal mask is not computed by mha"
                )
        elif causal and not is_causal:
            raise Unsupported(
                "mha.torch.Attention: this plan is causal and the call has neither is_causal=True nor "
                "the causal attn_mask (non-causal calls need a non-causal plan: causal=False)"
            )
        if not causal and (attn_mask is not None or is_causal):
            raise Unsupported("mha.torch.Attention: a causal call of a non-causal plan")
        x = query if self.description.batch_first else query.transpose(0, 1)
        y = self._run(x)
        return (y if self.description.batch_first else y.transpose(0, 1)), None

    def _gpt2(
        self,
        hidden_states: torch.Tensor,
        past_key_values: Any = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: Any = None,
        encoder_attention_mask: Any = None,
        output_attentions: bool = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        self._check_hf(past_key_values, encoder_hidden_states, output_attentions, kwargs)
        self._check_hf_mask(attention_mask, hidden_states.shape[1], causal=True)
        return self._run(hidden_states), None

    def _llama(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        cache_position: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        self._check_hf(past_key_values, None, kwargs.pop("output_attentions", False), kwargs)
        tokens = hidden_states.shape[1]
        self._check_hf_mask(attention_mask, tokens, causal=True)
        if position_embeddings is not None:
            cos, sin = self._rope(tokens)
            given_cos, given_sin = position_embeddings
            for given, want in ((given_cos, cos), (given_sin, sin)):
                if given.shape[-2:] != want.shape or not torch.allclose(
                    given.float(), want.expand_as(given), atol=1e-4
                ):
                    raise Unsupported(
                        "mha.torch.Attention: position_embeddings are not positions 0 .. T-1 of this "
                        "rotary embedding: mha computes a sequence from position 0 (decode: plan.make_cache)"
                    )
        return self._run(hidden_states), None

    def _bert(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        self._check_hf(
            past_key_values,
            kwargs.pop("encoder_hidden_states", None),
            kwargs.pop("output_attentions", False),
            kwargs,
        )
        self._check_hf_mask(attention_mask, hidden_states.shape[1], causal=self.plan.config.causal)
        return self._run(hidden_states), None

    # -- checks ------------------------------------------------------------------------------

    @staticmethod
    def _check_hf(
        past_key_values: Any, encoder_states: Any, output_attentions: bool, kwargs: dict[str, Any]
    ) -> None:
        if past_key_values is not None:
            raise Unsupported(
                "mha.torch.Attention: a Hugging Face cache (past_key_values): decode through "
                "plan.make_cache and plan(x, cache=...) instead"
            )
        if encoder_states is not None:
            raise Unsupported("mha.torch.Attention: cross-attention (encoder_hidden_states)")
        if output_attentions:
            raise Unsupported(
                "mha.torch.Attention: output_attentions=True: mha does not return attention weights"
            )
        head_mask = kwargs.pop("head_mask", None)
        if head_mask is not None:
            raise Unsupported("mha.torch.Attention: head_mask is not computed by mha")
        # Positions are checked through position_embeddings; without a cache these say nothing.
        for harmless in ("position_ids", "use_cache", "cache_position"):
            kwargs.pop(harmless, None)
        given = sorted(name for name, value in kwargs.items() if value is not None)
        if given:
            raise Unsupported(f"mha.torch.Attention: arguments mha does not compute: {', '.join(given)}")

    @staticmethod
    def _check_hf_mask(mask: torch.Tensor | None, tokens: int, causal: bool) -> None:
        """Hugging Face passes None, or an additive (B, 1, T, T) float mask (0 where allowed),
        or a boolean one (True where allowed): only the module's own pattern is computed."""
        if mask is None:
            return
        allowed = mask if mask.dtype == torch.bool else mask == 0
        want = torch.ones(tokens, tokens, dtype=torch.bool)
        if causal:
            want = want.tril()
        if allowed.shape[-2:] == (tokens, tokens) and bool((allowed == want).all()):
            return
        if not causal and allowed.shape[-2] == 1 and bool(allowed.all()):
            return  # BERT's (B, 1, 1, T) padding mask with no padding
        raise Unsupported(
            "mha.torch.Attention: an attention_mask other than "
            + ("the causal mask" if causal else "none (padding)")
            + " is not computed by mha"
        )

    def _rope(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (T, head_dim) of positions 0 .. T-1 in the rotate-half convention."""
        if tokens not in self._rope_cache:
            freqs = np.asarray(_mha.rope_frequencies(self.plan.config))
            angles = np.outer(np.arange(tokens, dtype=np.float64), freqs)
            angles = np.concatenate([angles, angles], axis=1)
            amplitude = _mha.rope_amplitude(self.plan.config)  # yarn's attention factor, else 1
            self._rope_cache = {
                tokens: (
                    torch.from_numpy(amplitude * np.cos(angles)).float(),
                    torch.from_numpy(amplitude * np.sin(angles)).float(),
                )
            }
        return self._rope_cache[tokens]


def _same(a: Any, b: Any) -> bool:
    """Whether two tensors are one: the same object, or views of the same memory with the same
    dtype, shape, strides and negative and conjugate bits (x[0] taken three times)."""
    if a is b:
        return True
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.layout == b.layout == torch.strided
        and a.device == b.device
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.data_ptr() == b.data_ptr()
        and a.is_neg() == b.is_neg()
        and a.is_conj() == b.is_conj()
    )


def _is_causal_mask(mask: torch.Tensor, tokens: int) -> bool:
    """Whether nn.MultiheadAttention's attn_mask is the causal one: boolean True above the
    diagonal, or float -inf there and 0 elsewhere, (T, T)."""
    if mask.shape != (tokens, tokens):
        return False
    upper = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
    blocked = mask if mask.dtype == torch.bool else torch.isneginf(mask)
    if mask.dtype != torch.bool and bool((mask[~upper] != 0).any()):
        return False
    return bool((blocked == upper).all())
