"""The PyTorch modules of docs/design.md §1, defined once: the PyTorch peers time them
(mhapy.peers) and the goldens are written from them (mhapy.golden). This module imports torch;
nothing else in mhapy imports it at module level, so the report and the memory probe never
need torch.

The seeds' modules, written as the seeds write them with the seeds' bugs left out, plus the
switches the spec has and the seeds lack: `causal` (False: no mask) and `out_proj` (False: the
merged heads are the output). Their state_dict names are the ones mha reads (docs/cli.md, "Weight
files"): W_query / W_key / W_value (+ .bias), out_proj, the `mask` buffer, and heads.{h}. in
front of a wrapper head's.

  CausalAttention              one head of the wrapper: its own (head_dim, d_in) Q/K/V
  MultiHeadAttentionWrapper    wrapper: H CausalAttention heads, concatenated, out_proj
  MultiHeadAttention           split_weight: one (d_out, d_in) Q/K/V projection each, heads by
                               view/transpose, merged, out_proj
  TorchNNMultiheadAttention    torch.nn.MultiheadAttention as causal self-attention
  KVCacheCausalAttention, KVCacheMultiHeadAttentionWrapper, KVCacheMultiHeadAttention
                               the same three with a KV cache (docs/design.md §1.4), below

FORMULATIONS maps a formulation to its module (KV_FORMULATIONS to its KV-cache module); the
copy_split_* functions give another module the split module's weights (docs/design.md §1: head
h's W_q is rows [h·head_dim, (h+1)·head_dim) of W_q), so every module computes the same function
on the same input.

The KV-cache modules are the seeds' lineage's: forward(x, use_cache=True) computes Q, K and V of
the new tokens only, appends K and V to the cache, attends over every cached token with the
causal mask aligned bottom-right (query i of T new ones, after `past` cached tokens, sees keys
0 .. past + i), and reset_cache() starts over; forward(x) without use_cache is the plain module.
The split module caches (b, tokens, H, head_dim) before its transpose; each wrapper head caches
its own (b, tokens, head_dim). Two caches (kv_cache=):
  "cat"           the seeds': torch.cat of the cache and the new keys/values, so every call
                  copies the whole cache into a new tensor (KVCache);
  "preallocated"  tensors of context_length tokens allocated at the first call, the new keys and
                  values written in place by index, attention over the filled slice; reset_cache()
                  rewinds without freeing (PreallocatedKVCache).
One difference from the seeds: the mask. They keep a (context_length, context_length) float
buffer and take rows [past, past + T) of `mask.bool()` on every call, which converts the whole
buffer per call and holds context_length² floats per head (4.3 GB at a 32 K context); these
modules build the same rows, the bottom-right (T, past + T) corner, per call instead, and so
register no mask buffer (their state_dict has none).

The modules of the other weight layouts mha reads (mha/io.hpp, docs/cli.md, "Weight files"), for the
goldens:
  GroupedQueryAttention        the seeds' lineage's grouped-query attention with rotary
                               embedding (the Llama chapter's): the split names, W_key and W_value
                               of num_kv_groups · head_dim rows, out_proj without bias; Hugging
                               Face's LlamaAttention computes the same function (the llama layout
                               is its names)
  GPT2Attention                GPT-2's attention as Hugging Face stores it: Conv1D layers c_attn
                               and c_proj, weights (in, out), and the mask buffers

New modules go here, each a class of its own next to these; PyTorch 2's own split-weight module
on F.scaled_dot_product_attention (the torch_sdpa peer's) is mhapy.sdpa_module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _SelfAttention(nn.Module):
    """What a wrapper head and the split module share: Q/K/V projections of `width` outputs,
    dropout on the attention weights, the causal mask buffer (1 above the diagonal) of
    context_length x context_length, and the attention itself."""

    # Whether the module registers the seeds' mask buffer (the KV-cache modules do not).
    mask_buffer = True

    def __init__(self, d_in, width, context_length, dropout=0.0, qkv_bias=False, causal=True):
        super().__init__()
        self.W_query = nn.Linear(d_in, width, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, width, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, width, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.causal = causal
        self.context_length = context_length
        if self.mask_buffer:
            self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def causal_mask(self, num_queries, num_keys):
        """True where a query may not look: the seeds' mask buffer (queries = keys here)."""
        return self.mask.bool()[:num_queries, :num_keys]

    def keys_values(self, keys, values, use_cache):
        """The keys and values to attend over: the new ones (a module without a cache)."""
        if use_cache:
            raise ValueError(f"{type(self).__name__} has no KV cache (the KVCache* modules have)")
        return keys, values

    def attend(self, queries, keys, values):
        """softmax(Q K^T / sqrt(head_dim), causal mask) V over the last two axes (tokens,
        head_dim); any leading axes (batch, heads) are batched over. The queries are the last
        of the keys' tokens (the mask's bottom-right corner)."""
        num_tokens, num_keys = queries.shape[-2], keys.shape[-2]
        attn_scores = queries @ keys.transpose(-2, -1)  # (..., T, keys)
        if self.causal:
            attn_scores.masked_fill_(self.causal_mask(num_tokens, num_keys), -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)
        return attn_weights @ values  # (..., T, head_dim)


class CausalAttention(_SelfAttention):
    """One head: its own (d_head, d_in) Q/K/V projections, softmax attention (causal unless
    causal=False). x: (b, T, d_in) -> (b, T, d_head)."""

    def __init__(self, d_in, d_head, context_length, dropout=0.0, qkv_bias=False, causal=True):
        super().__init__(d_in, d_head, context_length, dropout, qkv_bias, causal)

    def forward(self, x, use_cache=False):
        keys, values = self.keys_values(self.W_key(x), self.W_value(x), use_cache)
        return self.attend(self.W_query(x), keys, values)


class MultiHeadAttentionWrapper(nn.Module):
    """H independent CausalAttention heads (d_head = d_out / H each), concatenated on the last
    axis, then out_proj (nn.Identity without). x: (b, T, d_in) -> (b, T, d_out)."""

    head = CausalAttention  # the class of a head

    def __init__(
        self,
        d_in,
        d_out,
        context_length,
        num_heads,
        dropout=0.0,
        qkv_bias=False,
        causal=True,
        out_proj=True,
        **head_options,
    ):
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        super().__init__()
        d_head = d_out // num_heads
        self.heads = nn.ModuleList(
            [
                self.head(d_in, d_head, context_length, dropout, qkv_bias, causal, **head_options)
                for _ in range(num_heads)
            ]
        )
        self.out_proj = nn.Linear(d_out, d_out) if out_proj else nn.Identity()

    def forward(self, x, use_cache=False):
        return self.out_proj(torch.cat([head(x, use_cache) for head in self.heads], dim=-1))


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

    def forward(self, x, use_cache=False):
        b, num_tokens, _ = x.shape
        shape = (b, num_tokens, self.num_heads, self.head_dim)
        queries = self.W_query(x).view(shape).transpose(1, 2)  # (b, H, T, hd)
        # (b, tokens, H, hd): cached in this layout, as the seeds' lineage caches them.
        keys, values = self.keys_values(self.W_key(x).view(shape), self.W_value(x).view(shape), use_cache)
        context_vec = self.attend(queries, keys.transpose(1, 2), values.transpose(1, 2)).transpose(1, 2)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)  # (b, T, H·hd)
        return self.out_proj(context_vec)


# ---------------------------------------------------------------------------------------------
# KV caches (docs/design.md §1.4) and the modules that use them


class KVCache:
    """The seeds' KV cache: the keys and values of every token fed so far, (b, tokens, ...),
    grown by torch.cat on the tokens axis (each call copies the whole cache). `capacity` tokens
    at most (the module's context_length)."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.keys = self.values = None

    def __len__(self):
        return 0 if self.keys is None else self.keys.shape[1]

    def _check_room(self, tokens):
        if len(self) + tokens > self.capacity:
            raise ValueError(
                f"KV cache of {self.capacity} tokens holds {len(self)}: no room for {tokens} more"
            )

    def append(self, keys, values):
        """Appends the new tokens' keys and values; returns those of every token cached."""
        self._check_room(keys.shape[1])
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = torch.cat([self.keys, keys], dim=1)
            self.values = torch.cat([self.values, values], dim=1)
        return self.keys, self.values

    def reset(self):
        self.keys = self.values = None

    # For timing one step after `past` tokens (mhapy.peers): the state to come back to, O(1).
    def state(self):
        return self.keys, self.values

    def restore(self, state):
        self.keys, self.values = state


class PreallocatedKVCache(KVCache):
    """Keys and values in tensors of `capacity` tokens allocated at the first call (for its
    batch and heads) and kept: each call writes its tokens in place by index and returns the
    filled slice; reset() rewinds to 0 tokens without freeing."""

    def __init__(self, capacity):
        super().__init__(capacity)
        self.length = 0

    def __len__(self):
        return self.length

    def append(self, keys, values):
        self._check_room(keys.shape[1])
        layout = (keys.shape[0], self.capacity) + tuple(keys.shape[2:])
        if self.keys is None or tuple(self.keys.shape) != layout:
            if self.length:
                raise ValueError(
                    f"KV cache of layout {tuple(self.keys.shape)} given keys {tuple(keys.shape)}"
                )
            self.keys = keys.new_empty(layout)
            self.values = values.new_empty(layout)
        end = self.length + keys.shape[1]
        self.keys[:, self.length : end] = keys
        self.values[:, self.length : end] = values
        self.length = end
        return self.keys[:, :end], self.values[:, :end]

    def reset(self):
        self.length = 0

    def state(self):
        return self.length

    def restore(self, state):
        self.length = state


KV_CACHES = {"cat": KVCache, "preallocated": PreallocatedKVCache}


class _KVCacheAttention:
    """What the KV-cache modules add to an attention (a wrapper head or the split module): a
    cache (kv_cache: 'cat' or 'preallocated', KV_CACHES) of context_length tokens, the new keys
    and values appended to it when forward is given use_cache=True, and the causal mask built
    per call, aligned bottom-right (no mask buffer)."""

    mask_buffer = False

    def __init__(self, *args, kv_cache="cat", **kwargs):
        super().__init__(*args, **kwargs)
        self.kv_cache = KV_CACHES[kv_cache](self.context_length)

    def causal_mask(self, num_queries, num_keys):
        """Rows [past, past + T) of the seeds' mask, past = num_keys - num_queries: query i
        sees keys 0 .. past + i."""
        ones = torch.ones(num_queries, num_keys, dtype=torch.bool)
        return torch.triu(ones, diagonal=num_keys - num_queries + 1)

    def keys_values(self, keys, values, use_cache):
        return self.kv_cache.append(keys, values) if use_cache else (keys, values)

    def reset_cache(self):
        self.kv_cache.reset()

    def kv_caches(self):
        return [self.kv_cache]

    def load_cache(self, keys, values):
        """Starts the cache over holding `keys` and `values` (b, tokens, ...) in the layout it
        caches, as if those tokens had been fed: a step after many cached tokens without a
        forward over them (mhapy.peers)."""
        self.kv_cache.reset()
        self.kv_cache.append(keys, values)


class KVCacheCausalAttention(_KVCacheAttention, CausalAttention):
    """A wrapper head with its own KV cache."""


class KVCacheMultiHeadAttention(_KVCacheAttention, MultiHeadAttention):
    """The split-weight module with a KV cache of (b, tokens, H, head_dim) keys and values."""


class KVCacheMultiHeadAttentionWrapper(MultiHeadAttentionWrapper):
    """The wrapper of KVCacheCausalAttention heads, each with its own cache (kv_cache= as
    theirs)."""

    head = KVCacheCausalAttention

    def reset_cache(self):
        for head in self.heads:
            head.reset_cache()

    def kv_caches(self):
        return [head.kv_cache for head in self.heads]

    def load_cache(self, keys, values):
        """As the split module's load_cache, from (b, tokens, H, head_dim) keys and values:
        head h gets its own copy of [:, :, h]."""
        for h, head in enumerate(self.heads):
            head.load_cache(keys[:, :, h].contiguous(), values[:, :, h].contiguous())


class TorchNNMultiheadAttention(nn.Module):
    """torch.nn.MultiheadAttention(batch_first=True) as self-attention with a causal attn_mask
    (none when causal=False): boolean, or with float_mask=True the float mask of -inf above the
    diagonal. It needs d_in == d_out and always applies out_proj; bias=True gives in_proj and
    out_proj their biases (the in_proj bias zero unless copied), bias=False neither."""

    def __init__(self, d_model, num_heads, context_length, causal=True, bias=True, float_mask=False):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True)
        self.causal = causal
        mask = torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1)
        if float_mask:
            mask = torch.zeros(context_length, context_length).masked_fill(mask, -torch.inf)
        self.register_buffer("mask", mask)

    def forward(self, x):
        t = x.shape[1]
        mask = self.mask[:t, :t] if self.causal else None
        return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]


# ---------------------------------------------------------------------------------------------
# The modules of the other weight layouts


def rope_tables(head_dim, theta_base, context_length):
    """cos and sin (context_length, head_dim) as the seeds' compute_rope_params makes them: the
    angle of position p and pair e is p · theta_base^(-2e/head_dim), duplicated to head_dim, in
    float32. mha computes the angles in double (docs/design.md §1.6), which moves them by up to
    p · 2^-24 rad: the goldens keep T <= 64, where that changes y by about 1e-7 of max|y|."""
    inv_freq = 1.0 / (theta_base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.arange(context_length, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=1)
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x, cos, sin):
    """The seeds' apply_rope: x (..., T, head_dim) rotated by position in the rotate-half
    convention, (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) with x1, x2 the two halves."""
    seq_len, head_dim = x.shape[-2], x.shape[-1]
    x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos[:seq_len] + rotated * sin[:seq_len]


class GroupedQueryAttention(nn.Module):
    """The seeds' lineage's GroupedQueryAttention (the Llama chapter): W_query (d_out, d_in),
    W_key and W_value (num_kv_groups · head_dim, d_in), no Q/K/V biases, RoPE on queries and
    keys, each K/V head repeated for its group_size = num_heads / num_kv_groups query heads with
    repeat_interleave (query head h reads K/V head h // group_size, docs/design.md §1.3), the
    causal mask, out_proj without bias. The mask and the RoPE tables are buffers the state_dict
    leaves out (the seeds keep them in the model, not persistent): it holds the four weights."""

    def __init__(self, d_in, d_out, context_length, num_heads, num_kv_groups, rope_base=10_000.0):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        assert num_heads % num_kv_groups == 0, "num_heads must be divisible by num_kv_groups"
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.W_key = nn.Linear(d_in, num_kv_groups * self.head_dim, bias=False)
        self.W_value = nn.Linear(d_in, num_kv_groups * self.head_dim, bias=False)
        self.num_kv_groups = num_kv_groups
        self.group_size = num_heads // num_kv_groups
        self.W_query = nn.Linear(d_in, d_out, bias=False)
        self.out_proj = nn.Linear(d_out, d_out, bias=False)
        mask = torch.triu(torch.ones(context_length, context_length), diagonal=1).bool()
        self.register_buffer("mask", mask, persistent=False)
        cos, sin = rope_tables(self.head_dim, rope_base, context_length)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        b, num_tokens, _ = x.shape
        queries = self.W_query(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        keys = self.W_key(x).view(b, num_tokens, self.num_kv_groups, self.head_dim).transpose(1, 2)
        values = self.W_value(x).view(b, num_tokens, self.num_kv_groups, self.head_dim).transpose(1, 2)
        keys = apply_rope(keys, self.cos, self.sin)
        queries = apply_rope(queries, self.cos, self.sin)
        keys = keys.repeat_interleave(self.group_size, dim=1)  # (b, H, T, hd): [K1, K1, K2, K2]
        values = values.repeat_interleave(self.group_size, dim=1)
        attn_scores = queries @ keys.transpose(2, 3)
        attn_scores = attn_scores.masked_fill(self.mask[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        context_vec = (attn_weights @ values).transpose(1, 2).reshape(b, num_tokens, self.d_out)
        return self.out_proj(context_vec)


class Conv1D(nn.Module):
    """GPT-2's Conv1D (Hugging Face): a linear layer whose weight is stored (in, out), y = x W +
    b. Initialised as nn.Linear is (U(±1/sqrt(in)), bias too) rather than GPT-2's N(0, 0.02)
    and zero bias, so that every weight and bias shows in a golden's output."""

    def __init__(self, n_out, n_in):
        super().__init__()
        bound = n_in**-0.5
        self.weight = nn.Parameter(torch.empty(n_in, n_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(n_out).uniform_(-bound, bound))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class GPT2Attention(nn.Module):
    """GPT-2's attention as Hugging Face's GPT2Attention stores and computes it: c_attn (d -> 3 d,
    Conv1D) split into Q, K, V, per head softmax(Q K^T / sqrt(head_dim)) with the causal mask V,
    heads merged, c_proj (Conv1D). The buffers of its older checkpoints are in the state_dict:
    bias, the (1, 1, C, C) lower-triangular causal mask, and masked_bias (-1e4)."""

    def __init__(self, d_model, num_heads, context_length):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.c_attn = Conv1D(3 * d_model, d_model)
        self.c_proj = Conv1D(d_model, d_model)
        tril = torch.tril(torch.ones(context_length, context_length))
        self.register_buffer("bias", tril.view(1, 1, context_length, context_length))
        self.register_buffer("masked_bias", torch.tensor(-1e4))

    def forward(self, x):
        b, t, d = x.shape
        query, key, value = self.c_attn(x).split(d, dim=2)
        query, key, value = (
            z.view(b, t, self.num_heads, self.head_dim).transpose(1, 2) for z in (query, key, value)
        )
        attn_weights = query @ key.transpose(-1, -2) / self.head_dim**0.5
        causal = self.bias[:, :, :t, :t].bool()
        attn_weights = torch.where(causal, attn_weights, torch.finfo(attn_weights.dtype).min)
        attn_output = torch.softmax(attn_weights, dim=-1) @ value
        return self.c_proj(attn_output.transpose(1, 2).reshape(b, t, d))


# The module of each formulation, as mha names them (mha::formulation), and its KV-cache module.
FORMULATIONS = {"wrapper": MultiHeadAttentionWrapper, "split_weight": MultiHeadAttention}
KV_FORMULATIONS = {"wrapper": KVCacheMultiHeadAttentionWrapper, "split_weight": KVCacheMultiHeadAttention}


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
