"""The split-weight module as PyTorch 2 writes it, on F.scaled_dot_product_attention: the
PyTorch peer's torch_sdpa (mhapy.peers.pytorch) with grouped K/V heads, rotary embedding
(rotate-half, rope_half_tables), a preallocated KV cache and sliding windows. Imports torch; the
seeds' modules are mhapy.torch_modules.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SDPAMultiHeadAttention(nn.Module):
    """The split-weight module as PyTorch 2 writes it: one nn.Linear per Q/K/V (K and V of
    n_kv_heads · head_dim rows), heads by view/transpose, rotary embedding (rotate-half, the
    angles of positions past + i from `rope` = (cos, sin) tables of head_dim / 2 columns, or
    None), F.scaled_dot_product_attention (enable_gqa for grouped K/V heads: query head h reads
    K/V head h // (H / n_kv_heads)), merged, out_proj (nn.Identity without; bias as asked).
    Decode: with `capacity` > 0, a preallocated cache of (b, n_kv_heads, capacity, head_dim)
    keys and values, written in place by index; forward(x, use_cache=True) appends the new
    tokens' and attends over the filled slice, the causal mask bottom-right (none for one new
    token: it sees every cached key; PyTorch's is_causal is top-left aligned). `length` is the
    number of tokens cached (rewind by setting it).
    A sliding window of `window` keys (0: none; docs/design.md §1.9) is SDPA's masked call, as
    transformers makes it: a boolean mask of each row's window (made once per call shape and
    kept), over the keys from the first row's window on (a decode step's w keys alone)."""

    def __init__(
        self,
        d_in,
        d_out,
        num_heads,
        num_kv_heads,
        qkv_bias=False,
        causal=True,
        out_proj=True,
        out_proj_bias=True,
        rope=None,
        capacity=0,
        window=0,
    ):
        super().__init__()
        if window and not causal:
            raise ValueError(f"a sliding window ({window}) needs causal attention")
        self.window = window
        self.masks = {}
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = d_out // num_heads
        d_kv = num_kv_heads * self.head_dim
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_kv, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_kv, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out, bias=out_proj_bias) if out_proj else nn.Identity()
        self.causal = causal
        self.rope = rope
        self.capacity = capacity
        self.length = 0
        self.keys = self.values = None

    def heads(self, z, count, first=None):
        """(b, T, count · hd) -> (b, count, T, hd); with `first` (queries and keys) rotated by
        positions first + i when RoPE."""
        b, t, _ = z.shape
        z = z.view(b, t, count, self.head_dim).transpose(1, 2)
        if self.rope is not None and first is not None:
            cos, sin = (table[first : first + t] for table in self.rope)
            half = self.head_dim // 2
            lo, hi = z[..., :half], z[..., half:]
            z = torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], dim=-1)
        return z

    def append(self, keys, values, t):
        end = self.length + t
        if end > self.capacity:
            raise ValueError(f"KV cache of {self.capacity} tokens holds {self.length}: no room for {t} more")
        self.keys[:, :, self.length : end] = keys
        self.values[:, :, self.length : end] = values
        self.length = end

    def allocate(self, batch, dtype):
        layout = (batch, self.num_kv_heads, self.capacity, self.head_dim)
        self.keys, self.values = torch.zeros(layout, dtype=dtype), torch.zeros(layout, dtype=dtype)
        self.length = 0

    def window_mask(self, rows, position, first_key, keys):
        """(rows, keys) booleans, True where row i (at `position` + i) sees key first_key + j:
        the last `window` keys up to its own."""
        made = self.masks.get((rows, position, first_key, keys))
        if made is None:
            row = torch.arange(position, position + rows).unsqueeze(1)
            key = torch.arange(first_key, first_key + keys).unsqueeze(0)
            made = (key <= row) & (key > row - self.window)
            self.masks[(rows, position, first_key, keys)] = made
        return made

    def forward(self, x, use_cache=False):
        b, t, _ = x.shape
        first = self.length if use_cache else 0
        queries = self.heads(self.W_query(x), self.num_heads, first)
        keys = self.heads(self.W_key(x), self.num_kv_heads, first)
        values = self.heads(self.W_value(x), self.num_kv_heads)
        mask, causal = None, self.causal
        if self.window:
            if use_cache:
                self.append(keys, values, t)
                keys, values = self.keys[:, :, : self.length], self.values[:, :, : self.length]
            window_start = max(0, first - self.window + 1)
            keys, values = keys[:, :, window_start:], values[:, :, window_start:]
            if t > 1 or keys.shape[2] > self.window:
                mask = self.window_mask(t, first, window_start, keys.shape[2])
            causal = False
        elif use_cache:
            end = self.length + t
            self.append(keys, values, t)
            keys, values = self.keys[:, :, :end], self.values[:, :, :end]
            if causal and t > 1:
                mask = ~torch.triu(torch.ones(t, end, dtype=torch.bool), diagonal=end - t + 1)
            causal = False
        context = F.scaled_dot_product_attention(
            queries,
            keys,
            values,
            attn_mask=mask,
            is_causal=causal,
            enable_gqa=self.num_kv_heads != self.num_heads,
        )
        return self.out_proj(context.transpose(1, 2).reshape(b, t, -1))


def rope_half_tables(head_dim, base, positions, dtype=torch.float32):
    """cos and sin (positions, head_dim / 2) of p · base^(-2e/head_dim), computed in float64 and
    rounded once, as mha's rope table (docs/design.md §1.6)."""
    frequency = base ** (-2.0 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)
    angle = torch.arange(positions, dtype=torch.float64)[:, None] * frequency[None, :]
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
