"""Plans from live PyTorch modules and Hugging Face folders, and mha.torch.Attention as a drop-in:
each against the module's own forward on the same input."""

from __future__ import annotations

import numpy as np
import pytest

import mha

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
torch_modules = pytest.importorskip("mhapy.torch_modules")  # the seeds' modules (tools/mhapy)

import mha.torch  # noqa: E402

torch.manual_seed(0)
D, H, C = 32, 4, 64


def close(got, want, rel=2e-5):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * np.abs(want).max())


def tiny(name):
    """A tiny Hugging Face attention module, eval mode, random weights (biases too)."""
    from transformers.models.bert import modeling_bert
    from transformers.models.gpt2 import modeling_gpt2
    from transformers.models.llama import modeling_llama

    if name == "gpt2":
        cfg = transformers.GPT2Config(n_embd=D, n_head=H, n_layer=1, n_positions=C)
        module = modeling_gpt2.GPT2Attention(cfg, layer_idx=0)
    elif name == "llama":
        cfg = transformers.LlamaConfig(
            hidden_size=D,
            num_attention_heads=H,
            num_key_value_heads=2,
            max_position_embeddings=C,
            intermediate_size=64,
            num_hidden_layers=1,
            rope_theta=500000.0,
        )
        module = modeling_llama.LlamaAttention(cfg, layer_idx=0)
    else:
        cfg = transformers.BertConfig(
            hidden_size=D, num_attention_heads=H, num_hidden_layers=1, intermediate_size=64
        )
        module = modeling_bert.BertSelfAttention(cfg)
    cfg._attn_implementation = "eager"
    for p in module.parameters():
        torch.nn.init.uniform_(p, -0.3, 0.3)
    return module.eval(), cfg


def hf_forward(name, module, cfg, x):
    """The module's own output, called as its model calls it (causal mask, rotary tables)."""
    t = x.shape[1]
    with torch.no_grad():
        if name == "llama":
            from transformers.models.llama import modeling_llama

            rope = modeling_llama.LlamaRotaryEmbedding(cfg)
            positions = torch.arange(t).unsqueeze(0)
            cos, sin = rope(x, positions)
            mask = torch.full((t, t), -torch.inf).triu(1).view(1, 1, t, t)
            return module(x, position_embeddings=(cos, sin), attention_mask=mask)[0], (cos, sin), mask
        if name == "gpt2":
            mask = torch.full((t, t), -torch.inf).triu(1).view(1, 1, t, t)
            return module(x, attention_mask=mask)[0], None, mask
        return module(x)[0], None, None


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_hugging_face_modules_through_a_plan_and_the_drop_in(name):
    module, cfg = tiny(name)
    x = torch.randn(2, 11, D)
    want, rope, mask = hf_forward(name, module, cfg, x)
    plan = mha.Plan.from_module(module)
    assert plan.config.causal == (name != "bert")
    close(plan(x), want)
    attention = mha.torch.Attention(module, formulation="fused_qkv")
    with torch.no_grad():
        if name == "llama":
            got = attention(x, position_embeddings=rope, attention_mask=mask)
        elif name == "gpt2":
            got = attention(x, attention_mask=mask)
        else:
            got = attention(x)
    assert got[1] is None
    close(got[0], want)


def test_llama_positions_other_than_from_zero_are_refused():
    module, cfg = tiny("llama")
    x = torch.randn(1, 5, D)
    from transformers.models.llama import modeling_llama

    cos, sin = modeling_llama.LlamaRotaryEmbedding(cfg)(x, torch.arange(3, 8).unsqueeze(0))
    with pytest.raises(mha.Unsupported, match="positions 0 .. T-1"):
        mha.torch.Attention(module)(x, position_embeddings=(cos, sin))


def test_torch_multihead_attention_in_both_batch_layouts():
    for batch_first in (True, False):
        module = torch.nn.MultiheadAttention(D, H, batch_first=batch_first).eval()
        x = torch.randn(3, 9, D)  # (B, T, D), or (T, B, D) when not batch_first
        t = x.shape[1] if batch_first else x.shape[0]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        with torch.no_grad():
            want, _ = module(x, x, x, attn_mask=mask, need_weights=False)
        attention = mha.torch.Attention(module, context_length=C)
        got, weights = attention(x, x, x, attn_mask=mask, need_weights=False)
        assert weights is None
        close(got, want)
        got, _ = attention(x, x, x, is_causal=True, attn_mask=None, need_weights=False)
        close(got, want)


def test_torch_multihead_attention_refusals_name_the_argument():
    module = torch.nn.MultiheadAttention(D, H, batch_first=True).eval()
    attention = mha.torch.Attention(module, context_length=C)
    x = torch.randn(1, 4, D)
    with pytest.raises(mha.Unsupported, match="need_weights=True"):
        attention(x, x, x, is_causal=True)
    with pytest.raises(mha.Unsupported, match="self-attention"):
        attention(x, x.clone(), x, need_weights=False, is_causal=True)
    with pytest.raises(mha.Unsupported, match="attn_mask other than the causal mask"):
        attention(x, x, x, need_weights=False, attn_mask=torch.zeros(4, 4, dtype=torch.bool))
    with pytest.raises(mha.Unsupported, match="neither is_causal=True"):
        attention(x, x, x, need_weights=False)
    with pytest.raises(mha.InvalidArgument, match="context_length="):
        mha.torch.Attention(module)
    with pytest.raises(mha.Unsupported, match="cross-attention"):
        mha.Plan.from_module(torch.nn.MultiheadAttention(D, H, kdim=16, vdim=16), context_length=C)
    with pytest.raises(mha.InvalidArgument, match="requires grad"):
        attention(x.requires_grad_(), x, x, need_weights=False, is_causal=True)


def test_training_with_dropout_is_refused_and_eval_runs():
    module = torch_modules.MultiHeadAttention(D, D, C, H, dropout=0.1).train()
    attention = mha.torch.Attention(module)
    with pytest.raises(mha.Unsupported, match="training mode with dropout 0.1"):
        attention(torch.randn(1, 3, D))
    attention.eval()
    module.eval()
    x = torch.randn(1, 3, D)
    with torch.no_grad():
        close(attention(x), module(x))


@pytest.mark.parametrize("formulation", ["wrapper", "split_weight", "fused_qkv"])
def test_the_seeds_modules(formulation):
    x = torch.randn(2, 10, D)
    split = torch_modules.MultiHeadAttention(D, D, C, H, qkv_bias=True).eval()
    wrapper = torch_modules.MultiHeadAttentionWrapper(D, D, C, H, qkv_bias=True).eval()
    gqa = torch_modules.GroupedQueryAttention(D, D, C, H, 2, rope_base=10_000.0).eval()
    for module, kwargs in ((split, {}), (wrapper, {}), (gqa, {"rope_base": 10_000.0})):
        with torch.no_grad():
            want = module(x)
        close(mha.Plan.from_module(module, formulation=formulation, **kwargs)(x), want)
    with pytest.raises(mha.InvalidArgument, match="pass rope_base="):
        mha.Plan.from_module(gqa)


def test_from_pretrained_reads_a_saved_folder(tmp_path):
    cfg = transformers.GPT2Config(n_embd=D, n_head=H, n_layer=2, n_positions=C)
    model = transformers.GPT2Model(cfg).eval()
    model.save_pretrained(tmp_path)
    x = torch.randn(1, 7, D)
    for layer in range(2):
        attn = model.h[layer].attn
        with torch.no_grad():
            mask = torch.full((7, 7), -torch.inf).triu(1).view(1, 1, 7, 7)
            want = attn(x, attention_mask=mask)[0]
        plan = mha.Plan.from_pretrained(tmp_path, layer=layer)
        assert plan.config.context_length == C
        close(plan(x), want)
    with pytest.raises(mha.InvalidArgument, match="layer"):
        mha.Plan.from_pretrained(tmp_path, layer=2)


def test_from_safetensors_and_state_dict_layouts(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    module = torch.nn.MultiheadAttention(D, H, batch_first=True).eval()
    x = torch.randn(1, 6, D)
    mask = torch.ones(6, 6, dtype=torch.bool).triu(1)
    with torch.no_grad():
        want, _ = module(x, x, x, attn_mask=mask, need_weights=False)
    state = {k: v.contiguous() for k, v in module.state_dict().items()}
    close(mha.Plan.from_state_dict(state, n_heads=H, context_length=C)(x), want)
    path = tmp_path / "attn.safetensors"
    safetensors.save_file({f"layers.3.attn.{k}": v for k, v in state.items()}, str(path))
    plan = mha.Plan.from_safetensors(path, n_heads=H, context_length=C, prefix="layers.3.attn.")
    close(plan(x), want)
    with pytest.raises(mha.InvalidArgument, match="layers.3.attn."):
        mha.Plan.from_safetensors(path, n_heads=H, context_length=C, prefix="layers.4.attn.")


def test_unknown_modules_are_refused_by_name():
    with pytest.raises(mha.Unsupported, match="Linear is not an attention module"):
        mha.Plan.from_module(torch.nn.Linear(4, 4))


def test_hugging_face_configs_are_read_as_mha_reads_config_json():
    """A live module's config goes through the same list of keys as a model folder's
    config.json: what changes the attention and mha does not compute is refused naming the key;
    a sliding window is computed (the plan's config.window), past its length too."""
    from transformers.models.gpt2 import modeling_gpt2
    from transformers.models.mistral import modeling_mistral
    from transformers.models.qwen3 import modeling_qwen3

    gpt2 = transformers.GPT2Config(n_embd=D, n_head=H, n_layer=2, scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(mha.Unsupported, match="scale_attn_by_inverse_layer_idx is true: a gpt2 model"):
        mha.Plan.from_module(modeling_gpt2.GPT2Attention(gpt2, layer_idx=1))
    # Qwen3 normalises q and k per head: its module has Llama's projections, not its function.
    qwen3 = transformers.Qwen3Config(
        hidden_size=D, num_attention_heads=H, num_key_value_heads=2, head_dim=D // H, num_hidden_layers=1
    )
    with pytest.raises(mha.Unsupported, match="model_type 'qwen3' is not one mha reads"):
        mha.Plan.from_module(modeling_qwen3.Qwen3Attention(qwen3, layer_idx=0))
    mistral = transformers.MistralConfig(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=2,
        num_hidden_layers=1,
        max_position_embeddings=C,
        sliding_window=6,
    )
    mistral._attn_implementation = "eager"
    module = modeling_mistral.MistralAttention(mistral, layer_idx=0).eval()
    plan = mha.Plan.from_module(module)
    assert (plan.config.context_length, plan.config.window) == (C, 6)
    # Past the window, the module's own output with its sliding-window mask.
    x = torch.randn(2, 20, D)
    rope = transformers.models.mistral.modeling_mistral.MistralRotaryEmbedding(mistral)
    i, j = torch.arange(20)[:, None], torch.arange(20)[None, :]
    with torch.no_grad():
        cos, sin = rope(x, torch.arange(20).unsqueeze(0))
        mask = torch.zeros(20, 20).masked_fill((j > i) | (j <= i - 6), -torch.inf).view(1, 1, 20, 20)
        want = module(x, position_embeddings=(cos, sin), attention_mask=mask)[0]
    close(plan(x), want)


def test_an_encoder_from_a_folder_has_no_cache(tmp_path):
    cfg = transformers.BertConfig(
        hidden_size=D, num_attention_heads=H, num_hidden_layers=1, intermediate_size=64
    )
    transformers.BertModel(cfg).save_pretrained(tmp_path)
    plan = mha.Plan.from_pretrained(tmp_path, 0)
    with pytest.raises(mha.Unsupported, match="an encoder's attention"):
        plan.make_cache(1, 8)
