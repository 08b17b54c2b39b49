"""KV cache formats simulated in PyTorch, for choosing a format before its kernels exist: each is
a transformers DynamicCache whose keys and values are rounded to the format's codes and back as
they enter it (the attention then reads what the format would hold), so that the real-model
harness (mhapy.models.accuracy) judges a format's accuracy, not its speed.

Formats (FORMATS), each a key scheme and a value scheme:

- "sim_int8": keys and values 8-bit per token (a scale and an offset per row over head_dim), the
  keys over mha's channel scales (src/base/int8.hpp: each channel divided by its largest prompt
  key over the largest channel's, at least 1/8): mha's int8 cache, the simulation's calibration
  against the real mha_int8;
- "sim_int8_unscaled": the same without the channel scales (what they buy);
- "sim_k8v4": keys as sim_int8, values 4-bit per token (16 levels between the row's min and max);
- "sim_k8v4g64", "sim_k8v4g32", "sim_k8v4g16": values 4-bit in groups of 64, 32 or 16 elements
  of a row, each with its scale and offset;
- "sim_int4_token": keys 4-bit per token as values are: the naive 4-bit key format, which the
  literature finds breaks models whose keys have outlier channels;
- "sim_int4_scaled": keys 4-bit per token over mha's channel scales;
- "sim_int4_channel": keys 4-bit per channel over groups of GROUP tokens (KIVI, KVQuant), the
  newest tokens of an unfilled group kept at full precision until it fills; values 4-bit per
  token ("sim_int4_channel_v4g32", "sim_int4_channel_v4g16": in groups of 32 or 16);
  "sim_int4_channel_hb32": values as mha's int4 holds them (sim_k8v4hb32's), the key groups of 64
  (mha's int4), 32 or 16 tokens ("sim_int4_channel32_hb32", "sim_int4_channel16_hb32");
- "sim_int4_hadamard": keys turned by the normalised Hadamard rotation of head_dim (which spreads
  an outlier channel over every channel) before 4-bit per-token codes, and turned back (the
  kernels would turn the query instead); values 4-bit per token;
- "sim_k8v4h": keys as sim_int8, values turned by the Hadamard rotation before 4-bit per-token
  codes (a kernel would turn each output row back once: O = H sum_j p_j (H v_j));
  "sim_k8v4hg64", "sim_k8v4hg32": turned, then in groups of 64 or 32 elements;
  "sim_k8v4hb32": each group of 32 turned on its own (a block-diagonal rotation), then coded.

Rows are asymmetric: code = round((x - min) / scale), scale = (max - min) / (levels - 1), read back
as min + code * scale (a constant row reads back exactly).
"""

from __future__ import annotations

from typing import Any

# Tokens per group of sim_int4_channel's keys (KIVI uses 32 to 128).
GROUP = 64

# Each format: (key scheme, value scheme); a scheme is (kind, bits, group): "token" rows of
# head_dim elements (or of `group` elements), "scaled" rows over mha's key channel scales,
# "channel" groups of `group` tokens (GROUP in most), "hadamard" rows turned first, "blocks"
# each group of a row turned on its own first.
FORMATS = {
    "sim_int8": (("scaled", 8, 0), ("token", 8, 0)),
    "sim_int8_unscaled": (("token", 8, 0), ("token", 8, 0)),
    "sim_k8v4": (("scaled", 8, 0), ("token", 4, 0)),
    "sim_k8v4g64": (("scaled", 8, 0), ("token", 4, 64)),
    "sim_k8v4g32": (("scaled", 8, 0), ("token", 4, 32)),
    "sim_k8v4g16": (("scaled", 8, 0), ("token", 4, 16)),
    "sim_int4_token": (("token", 4, 0), ("token", 4, 0)),
    "sim_int4_scaled": (("scaled", 4, 0), ("token", 4, 0)),
    "sim_int4_channel": (("channel", 4, GROUP), ("token", 4, 0)),
    "sim_int4_channel_v4g32": (("channel", 4, GROUP), ("token", 4, 32)),
    "sim_int4_channel_v4g16": (("channel", 4, GROUP), ("token", 4, 16)),
    "sim_int4_channel_hb32": (("channel", 4, GROUP), ("blocks", 4, 32)),
    "sim_int4_channel32_hb32": (("channel", 4, 32), ("blocks", 4, 32)),
    "sim_int4_channel16_hb32": (("channel", 4, 16), ("blocks", 4, 32)),
    "sim_int4_hadamard": (("hadamard", 4, 0), ("token", 4, 0)),
    "sim_k8v4h": (("scaled", 8, 0), ("hadamard", 4, 0)),
    "sim_k8v4hg64": (("scaled", 8, 0), ("hadamard", 4, 64)),
    "sim_k8v4hg32": (("scaled", 8, 0), ("hadamard", 4, 32)),
    "sim_k8v4hb32": (("scaled", 8, 0), ("blocks", 4, 32)),
}


def rounded(x: Any, bits: int, dim: int) -> Any:
    """x with each slice along `dim` rounded to 2^bits asymmetric levels between its min and max,
    read back (in x's dtype, computed in float32)."""
    import torch

    levels = (1 << bits) - 1
    f = x.float()
    low, high = f.amin(dim=dim, keepdim=True), f.amax(dim=dim, keepdim=True)
    scale = (high - low) / levels
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round((f - low) / safe).clamp(0, levels)
    return (low + codes * scale).to(x.dtype)


def by_token(x: Any, bits: int, group: int) -> Any:
    """Each row of x (..., tokens, head_dim) rounded (in groups of `group` elements; 0, or a group
    as wide as the row or wider: whole)."""
    shape = x.shape
    if not group or group >= shape[-1]:
        return rounded(x, bits, -1)
    if shape[-1] % group:
        raise ValueError(f"groups of {group} elements do not divide head_dim {shape[-1]}")
    return rounded(x.reshape(*shape[:-1], shape[-1] // group, group), bits, -1).reshape(shape)


def hadamard(n: int) -> Any:
    """The normalised Sylvester Hadamard matrix of order n (a power of 2): orthonormal and
    symmetric, so it is its own inverse."""
    import torch

    if n & (n - 1):
        raise ValueError(f"a Hadamard rotation needs head_dim a power of 2, not {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n**0.5


def simulated_cache(model: Any, name: str) -> Any:
    """A DynamicCache for `model` storing the format `name` of FORMATS."""
    import torch
    import transformers

    if name not in FORMATS:
        raise ValueError(f"simulated cache {name!r}: expected one of {', '.join(FORMATS)}")
    (key_kind, key_bits, key_group), (value_kind, value_bits, value_group) = FORMATS[name]

    class Simulated(transformers.DynamicCache):
        def __init__(self) -> None:
            super().__init__(config=model.config)
            self.pending: dict[int, Any] = {}  # channel keys: each layer's unfilled group
            self.scales: dict[int, Any] = {}  # scaled keys: each layer's channel scales

        def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any):
            keys = self.keys_of(key_states, layer_idx)
            if value_kind in ("hadamard", "blocks"):
                d = value_states.shape[-1]
                n = d if value_kind == "hadamard" else min(value_group, d)  # a group past d: the row
                h = torch.block_diag(*[hadamard(n)] * (value_states.shape[-1] // n))
                h = h.to(value_states.dtype)
                values = by_token(value_states @ h, value_bits, value_group) @ h
            else:
                values = by_token(value_states, value_bits, value_group)
            return super().update(keys, values, layer_idx, *args, **kwargs)

        def keys_of(self, k: Any, layer_idx: int) -> Any:
            if key_kind == "token":
                return by_token(k, key_bits, key_group)
            if key_kind == "scaled":
                if layer_idx not in self.scales:  # from the first call's keys, as mha sets them
                    m = k.abs().amax(dim=-2, keepdim=True)
                    largest = m.amax(dim=-1, keepdim=True)
                    self.scales[layer_idx] = torch.where(
                        largest > 0, (m / largest.clamp_min(1e-30)).clamp_min(0.125), torch.ones_like(m)
                    )
                s = self.scales[layer_idx]
                return by_token(k / s, key_bits, 0) * s
            if key_kind == "hadamard":
                h = hadamard(k.shape[-1]).to(k.dtype)
                return by_token(k @ h, key_bits, 0) @ h
            # Per channel over groups of key_group tokens: rows wait at full precision (in the
            # cache already) until their group fills, and are then rewritten with their codes.
            pending = self.pending.get(layer_idx)
            held = 0 if pending is None else pending.shape[-2]
            rows = k if pending is None else torch.cat([pending, k], dim=-2)
            filled = rows.shape[-2] // key_group * key_group
            self.pending[layer_idx] = rows[..., filled:, :]
            if not filled:
                return k
            b, h, _, d = rows.shape
            groups = rows[..., :filled, :].reshape(b, h, filled // key_group, key_group, d)
            coded = rounded(groups, key_bits, -2).reshape(b, h, filled, d)
            if held:
                self.layers[layer_idx].keys[..., -held:, :] = coded[..., :held, :]
            return torch.cat([coded[..., held:, :], rows[..., filled:, :]], dim=-2)

    return Simulated()
