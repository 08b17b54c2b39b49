"""A tiny randomly initialised Gemma 3 for the real-model harnesses' tests (mhapy.models.accuracy,
mhapy.models.speculative): 4 layers, sliding (window `window`) and full ones mixed, 4 query heads of 16
over one K/V head; seconds to make, no download. Needs torch and transformers."""

from __future__ import annotations

import torch
import transformers


def tiny_gemma3(vocab: int, window: int = 8) -> transformers.PreTrainedModel:
    torch.set_num_threads(1)
    config = transformers.Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=window,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=256,
        # Wider random weights than the default 0.02: peaked next-token distributions, so that a
        # wrong cache moves them measurably.
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="sdpa", dtype=torch.float32
    ).eval()
