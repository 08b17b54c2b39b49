"""What mha reads off a live PyTorch attention module: its state_dict in one of the layouts mha
reads (mha/io.hpp) and what the tensors do not say (heads, rotary embedding, context length,
causality), by the module's kind. Plan.from_module and mha.torch.Attention use it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import _mha
from ._arguments import _count
from ._mha import InvalidArgument, RopeScaling, Unsupported

# The kinds, as mha.torch.Attention adapts their forward signatures.
TORCH_MHA = "torch.nn.MultiheadAttention"
SEEDS = "seeds"  # the seeds' modules: forward(x) -> y
GPT2 = "GPT2Attention"
LLAMA = "LlamaAttention"
BERT = "BertSelfAttention"


@dataclass
class Description:
    kind: str
    state_dict: dict[str, Any]
    n_heads: int
    context_length: int
    causal: bool
    n_kv_heads: int = 0
    rope_base: float | None = None
    rope_scaling: RopeScaling | None = None
    dropout: float = 0.0
    window: int = 0  # a sliding layer's window (config.json's sliding_window), computed
    qk_norm_eps: float | None = None  # the q/k norms' epsilon (config.json's rms_norm_eps)
    softcap: float = 0.0  # logit soft-capping (Gemma 2's attn_logit_softcapping), computed
    batch_first: bool = True  # nn.MultiheadAttention's
    context_source: str = ""  # where context_length comes from, for messages
    extra: dict[str, Any] = field(default_factory=dict)


def describe(
    module: Any, *, context_length: int | None = None, rope_base: float | None = None
) -> Description:
    """The module's description, or mha.Unsupported naming what it has that mha does not
    compute, or mha.InvalidArgument naming the argument it needs."""
    import torch

    if context_length is not None:  # as the library takes it (int64), named here
        context_length = _count("context_length", context_length)
    name = type(module).__name__
    if isinstance(module, torch.nn.MultiheadAttention):
        return _torch_mha(module, context_length)
    if hasattr(module, "c_attn") and hasattr(module, "c_proj"):
        return _gpt2(module, context_length)
    if all(hasattr(module, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return _llama(module, context_length)
    if all(hasattr(module, p) for p in ("query", "key", "value")) and hasattr(module, "num_attention_heads"):
        return _bert(module, context_length)
    if hasattr(module, "W_query") or hasattr(module, "heads"):
        return _seeds(module, context_length, rope_base)
    raise Unsupported(
        f"mha: {name} is not an attention module mha reads: torch.nn.MultiheadAttention, the seeds' "
        "MultiHeadAttention / MultiHeadAttentionWrapper / GroupedQueryAttention, or Hugging Face's "
        "GPT2Attention, LlamaAttention (Mistral, Qwen2) and BertSelfAttention"
    )


def _need_context(kind: str, given: int | None) -> int:
    if given is None:
        raise InvalidArgument(
            f"mha: {kind} records no context length: pass context_length= (the longest sequence)"
        )
    return given


def _torch_mha(m: Any, context_length: int | None) -> Description:
    if not m._qkv_same_embed_dim:
        raise Unsupported(
            f"mha: this nn.MultiheadAttention has kdim={m.kdim}, vdim={m.vdim} != embed_dim={m.embed_dim}: "
            "cross-attention, which mha does not compute"
        )
    if m.bias_k is not None or m.add_zero_attn:
        raise Unsupported(
            "mha: nn.MultiheadAttention with add_bias_kv or add_zero_attn is not computed by mha"
        )
    if (m.in_proj_bias is None) != (m.out_proj.bias is None):
        raise Unsupported("mha: nn.MultiheadAttention with a bias on in_proj but not out_proj (or back)")
    state = {"in_proj_weight": m.in_proj_weight, "out_proj.weight": m.out_proj.weight}
    if m.in_proj_bias is not None:
        state["in_proj_bias"] = m.in_proj_bias
        state["out_proj.bias"] = m.out_proj.bias
    return Description(
        TORCH_MHA,
        state,
        m.num_heads,
        _need_context("nn.MultiheadAttention", context_length),
        True,
        dropout=float(m.dropout),
        batch_first=bool(m.batch_first),
    )


def _hf_block(m: Any, context_length: int | None) -> dict[str, Any]:
    """A Hugging Face module's block as mha reads the config.json of its model (C++'s
    parse_model_config, the one list of the keys mha computes): its config (heads, K/V heads,
    rotary embedding, causality, the context length, capped by a sliding window) and where the
    context length comes from. What its config asks that mha does not compute raises
    mha.Unsupported naming the key."""
    cfg = m.config
    source = f"{type(m).__name__}'s config ({getattr(cfg, 'model_type', '?')})"
    return _mha._model_config(
        cfg.to_json_string(use_diff=False),
        source,
        int(getattr(m, "layer_idx", None) or 0),
        context_length or 0,
    )


def _from_block(kind: str, state: dict[str, Any], block: dict[str, Any], dropout: float) -> Description:
    c = block["config"]
    return Description(
        kind,
        state,
        c.n_heads,
        c.context_length,
        c.causal,
        n_kv_heads=c.n_kv_heads,
        rope_base=c.rope_base or None,
        rope_scaling=c.rope_scaling if c.rope_scaling.kind != "none" else None,
        dropout=dropout,
        window=c.window,
        qk_norm_eps=c.qk_norm_eps if c.qk_norm else None,
        softcap=c.softcap,
        context_source=block["context_source"],
    )


def _gpt2(m: Any, context_length: int | None) -> Description:
    if getattr(m, "is_cross_attention", False):
        raise Unsupported("mha: this GPT2Attention is cross-attention, which mha does not compute")
    state = {k: v for k, v in m.state_dict().items() if k.startswith(("c_attn.", "c_proj."))}
    dropout = getattr(getattr(m, "attn_dropout", None), "p", 0.0)
    if getattr(m, "config", None) is not None:
        return _from_block(GPT2, state, _hf_block(m, context_length), dropout)
    # The seeds' lineage: no config; its mask buffer (1, 1, C, C) gives the context length.
    if not getattr(m, "scale_attn_weights", True) or getattr(m, "scale_attn_by_inverse_layer_idx", False):
        raise Unsupported(
            "mha: GPT2Attention with scale_attn_weights=False or scale_attn_by_inverse_layer_idx=True "
            "scales scores by other than 1/sqrt(head_dim)"
        )
    mask = getattr(m, "bias", None)
    if context_length is None and mask is not None and getattr(mask, "ndim", 0) == 4:
        context_length = int(mask.shape[-1])
    return Description(
        GPT2, state, int(m.num_heads), _need_context("GPT2Attention", context_length), True, dropout=dropout
    )


def _llama(m: Any, context_length: int | None) -> Description:
    block = _hf_block(m, context_length)
    state = {
        k: v
        for k, v in m.state_dict().items()
        if k.split(".")[0] in ("q_proj", "k_proj", "v_proj", "o_proj", "sinks")
    }
    # Gemma 3's and Qwen3's q/k norms; Gemma's scale by 1 + weight (qk_norm_offset).
    for norm in ("q_norm", "k_norm"):
        if hasattr(m, norm):
            state[f"{norm}.weight"] = getattr(m, norm).weight.detach() + block["qk_norm_offset"]
    dropout = float(getattr(m, "attention_dropout", 0.0))
    return _from_block(LLAMA, state, block, dropout)


def _bert(m: Any, context_length: int | None) -> Description:
    if getattr(m, "is_cross_attention", False):
        raise Unsupported(f"mha: a cross-attention {type(m).__name__} is not computed by mha")
    # BertSelfAttention ends at the merged heads: the split layout without out_proj.
    names = {"query": "W_query", "key": "W_key", "value": "W_value"}
    state = {}
    for k, v in m.state_dict().items():
        head, _, rest = k.partition(".")
        if head in names:
            state[f"{names[head]}.{rest}"] = v
    dropout = float(getattr(getattr(m, "dropout", None), "p", 0.0))
    return _from_block(BERT, state, _hf_block(m, context_length), dropout)


def _seeds(m: Any, context_length: int | None, rope_base: float | None) -> Description:
    heads = getattr(m, "heads", None)
    first = heads[0] if heads is not None and len(heads) > 0 else m
    if context_length is None:
        context_length = getattr(first, "context_length", None)
        mask = getattr(first, "mask", None)
        if context_length is None and mask is not None:
            context_length = int(mask.shape[-1])
    if rope_base is None:
        rope_base = getattr(m, "rope_base", None)
    if rope_base is None and hasattr(m, "cos"):
        raise InvalidArgument(
            f"mha: {type(m).__name__} rotates by tables of an unrecorded base: pass rope_base= (10000 in Llama 2)"
        )
    dropout = getattr(first, "dropout", 0.0)
    n_heads = len(heads) if heads is not None else int(m.num_heads)
    n_kv = int(getattr(m, "num_kv_groups", 0) or getattr(m, "num_kv_heads", 0) or 0)
    return Description(
        SEEDS,
        dict(m.state_dict()),
        n_heads,
        _need_context(type(m).__name__, context_length),
        bool(getattr(first, "causal", True)),
        n_kv_heads=n_kv,
        rope_base=rope_base,
        dropout=float(getattr(dropout, "p", dropout)),
    )
