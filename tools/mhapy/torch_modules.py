"""The PyTorch modules of docs/design.md §1, defined once: the PyTorch peers time them
(mhapy.peers) and the goldens are written from them (mhapy.golden). This module imports torch;
nothing else in mhapy imports it at module level, so the report and the memory probe never
need torch.

The seeds' modules, written as the seeds write them with the seeds' bugs left out, plus the
switches the spec has and the seeds lack: `causal` (False: no mask) and `out_proj` (False: the
merged heads are the output). Their state_dict names are the ones mha reads (README, "Weight
files"): W_query / W_key / W_value (+ .bias), out_proj, the `mask` buffer, and heads.{h}. in
front of a wrapper head's.

  CausalAttention              one head of the wrapper: its own (head_dim, d_in) Q/K/V
  MultiHeadAttentionWrapper    wrapper: H CausalAttention heads, concatenated, out_proj
  MultiHeadAttention           split_weight: one (d_out, d_in) Q/K/V projection each, heads by
                               view/transpose, merged, out_proj
  TorchNNMultiheadAttention    torch.nn.MultiheadAttention as causal self-attention

FORMULATIONS maps a formulation to its module; the copy_split_* functions give another module
the split module's weights (docs/design.md §1: head h's W_q is rows [h·head_dim, (h+1)·head_dim)
of W_q), so every module computes the same function on the same input.

New modules go here, each a class of its own next to these: the seeds' module with a KV cache
(forward(x, use_cache=True) appends the new keys and values to a cache with torch.cat, and
reset_cache() empties it; its mask is then aligned bottom-right, as docs/design.md §1.4 says),
grouped-query attention with RoPE, and further nn.MultiheadAttention wrappers.
"""

from __future__ import annotations

import torch
from torch import nn


class _SelfAttention(nn.Module):
    """What a wrapper head and the split module share: Q/K/V projections of `width` outputs,
    dropout on the attention weights, the causal mask buffer (1 above the diagonal) of
    context_length x context_length, and the attention itself."""

    def __init__(self, d_in, width, context_length, dropout=0.0, qkv_bias=False, causal=True):
        super().__init__()
        self.W_query = nn.Linear(d_in, width, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, width, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, width, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.causal = causal
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def attend(self, queries, keys, values):
        """softmax(Q K^T / sqrt(head_dim), causal mask) V over the last two axes (tokens,
        head_dim); any leading axes (batch, heads) are batched over."""
        num_tokens = queries.shape[-2]
        attn_scores = queries @ keys.transpose(-2, -1)  # (..., T, T)
        if self.causal:
            attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)
        return attn_weights @ values  # (..., T, head_dim)


class CausalAttention(_SelfAttention):
    """One head: its own (d_head, d_in) Q/K/V projections, softmax attention (causal unless
    causal=False). x: (b, T, d_in) -> (b, T, d_head)."""

    def __init__(self, d_in, d_head, context_length, dropout=0.0, qkv_bias=False, causal=True):
        super().__init__(d_in, d_head, context_length, dropout, qkv_bias, causal)

    def forward(self, x):
        return self.attend(self.W_query(x), self.W_key(x), self.W_value(x))


class MultiHeadAttentionWrapper(nn.Module):
    """H independent CausalAttention heads (d_head = d_out / H each), concatenated on the last
    axis, then out_proj (nn.Identity without). x: (b, T, d_in) -> (b, T, d_out)."""

    def __init__(
        self, d_in, d_out, context_length, num_heads, dropout=0.0, qkv_bias=False, causal=True, out_proj=True
    ):
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        super().__init__()
        d_head = d_out // num_heads
        self.heads = nn.ModuleList(
            [
                CausalAttention(d_in, d_head, context_length, dropout, qkv_bias, causal)
                for _ in range(num_heads)
            ]
        )
        self.out_proj = nn.Linear(d_out, d_out) if out_proj else nn.Identity()

    def forward(self, x):
        return self.out_proj(torch.cat([head(x) for head in self.heads], dim=-1))


class MultiHeadAttention(_SelfAttention):
    """Split weights: one (d_out, d_in) projection per Q/K/V, viewed as (b, H, T, head_dim),
    attention per head, merged to (b, T, d_out), then out_proj (nn.Identity without)."""

    def __init__(
        self, d_in, d_out, context_length, num_heads, dropout=0.0, qkv_bias=False, causal=True, out_proj=True
    ):
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        super().__init__(d_in, d_out, context_length, dropout, qkv_bias, causal)
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.out_proj = nn.Linear(d_out, d_out) if out_proj else nn.Identity()

    def forward(self, x):
        b, num_tokens, _ = x.shape
        shape = (b, num_tokens, self.num_heads, self.head_dim)
        queries = self.W_query(x).view(shape).transpose(1, 2)  # (b, H, T, hd)
        keys = self.W_key(x).view(shape).transpose(1, 2)
        values = self.W_value(x).view(shape).transpose(1, 2)
        context_vec = self.attend(queries, keys, values).transpose(1, 2)  # (b, T, H, hd)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        return self.out_proj(context_vec)


class TorchNNMultiheadAttention(nn.Module):
    """torch.nn.MultiheadAttention(batch_first=True) as self-attention with a boolean causal
    attn_mask (none when causal=False). It needs d_in == d_out and always applies out_proj; its
    in_proj bias always exists (bias=True keeps out_proj's bias): zero unless copied."""

    def __init__(self, d_model, num_heads, context_length, causal=True):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, num_heads, bias=True, batch_first=True)
        self.causal = causal
        self.register_buffer(
            "mask", torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1)
        )

    def forward(self, x):
        t = x.shape[1]
        mask = self.mask[:t, :t] if self.causal else None
        return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]


# The module of each formulation, as mha names them (mha::formulation).
FORMULATIONS = {"wrapper": MultiHeadAttentionWrapper, "split_weight": MultiHeadAttention}


def copy_split_to_wrapper(split: MultiHeadAttention, wrapper: MultiHeadAttentionWrapper) -> None:
    """Gives the wrapper the split module's weights: head h gets rows [h·hd, (h+1)·hd) of each
    Q/K/V projection (copies: the heads own separate weights), and the same out_proj."""
    hd = split.head_dim
    with torch.no_grad():
        for h, head in enumerate(wrapper.heads):
            rows = slice(h * hd, (h + 1) * hd)
            for name in ("W_query", "W_key", "W_value"):
                getattr(head, name).weight.copy_(getattr(split, name).weight[rows])
                if getattr(split, name).bias is not None:
                    getattr(head, name).bias.copy_(getattr(split, name).bias[rows])
        wrapper.out_proj.load_state_dict(split.out_proj.state_dict())


def copy_split_to_nn_mha(split: MultiHeadAttention, nn_mha: TorchNNMultiheadAttention) -> None:
    """Gives nn.MultiheadAttention the split module's weights: Q/K/V packed as in_proj (a zero
    in_proj_bias when the split module has no Q/K/V bias), the same out_proj."""
    attn = nn_mha.attn
    projections = (split.W_query, split.W_key, split.W_value)
    with torch.no_grad():
        attn.in_proj_weight.copy_(torch.cat([p.weight for p in projections]))
        if split.W_query.bias is not None:
            attn.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))
        else:
            attn.in_proj_bias.zero_()
        attn.out_proj.load_state_dict(split.out_proj.state_dict())
