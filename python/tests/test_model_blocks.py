"""The attention blocks of the models people run now as mha computes them (docs/design.md §1.9,
§1.10): a model folder's layer (Plan.from_pretrained, which `mha run --model` shares) and a live
module (Plan.from_module) against transformers' own attention module over a prompt longer than
the window. Gemma 3: sliding and full layers each with their own rotary embedding, q/k norms
(1 + weight), an inner width apart from the hidden size; Gemma 2: soft-capping; gpt-oss: sinks
and every bias."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import mha  # noqa: E402

WINDOW, TOKENS = 5, 23


def tiny_gemma3(tmp_path):
    """A tiny Gemma 3 with every weight random (its norms' weights too, which start at 0), saved."""
    config = transformers.Gemma3TextConfig(
        vocab_size=64,
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=WINDOW,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        max_position_embeddings=64,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
        attn_implementation="eager",
    )
    return saved(transformers.Gemma3ForCausalLM(config), tmp_path, seed=0)


def saved(model, folder, seed, **normal):
    """`model` with every weight drawn from N(0, 0.3) (the norms' too, which start at 0; each
    parameter named in `normal` from N(0, its value)), saved to `folder`."""
    torch.manual_seed(seed)
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, next((s for n, s in normal.items() if name.endswith(n)), 0.3))
    model.save_pretrained(folder)
    return model


def want(model, layer, x):
    """transformers' own attention module of layer `layer` on x, with the model's rotary
    embedding (Gemma 3's per layer type) and a causal mask (sliding: the last WINDOW keys)."""
    kind = model.config.layer_types[layer]
    attention = model.model.layers[layer].self_attn
    i, j = torch.arange(TOKENS)[:, None], torch.arange(TOKENS)[None, :]
    hidden = (j > i) | ((j <= i - WINDOW) if kind == "sliding_attention" else torch.zeros_like(j > i))
    mask = torch.zeros(TOKENS, TOKENS).masked_fill(hidden, -torch.inf).view(1, 1, TOKENS, TOKENS)
    typed = "sliding_attention" in (model.config.rope_parameters or {})
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(x, torch.arange(TOKENS).unsqueeze(0), *([kind] if typed else []))
        return attention(x, position_embeddings=(cos, sin), attention_mask=mask)[0]


def close(got, want):
    got, want = np.asarray(got, np.float64), want.double().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("layer", [0, 3])
def test_a_gemma3_folders_layer_is_transformers_attention(tmp_path, layer):
    model = tiny_gemma3(tmp_path)
    x = torch.randn(2, TOKENS, 48)
    plan = mha.Plan.from_pretrained(tmp_path, layer=layer)
    c = plan.config
    assert (c.d_in, c.d_out, c.out_width, c.head_dim, c.qk_norm) == (48, 64, 48, 16, True)
    assert c.qk_norm_eps == pytest.approx(model.config.rms_norm_eps)
    assert (c.window, c.rope_base) == ((WINDOW, 1e4) if layer == 0 else (0, 1e6))
    reference = want(model, layer, x)
    close(plan(x), reference)
    close(mha.Plan.from_module(model.model.layers[layer].self_attn)(x), reference)
    assert mha.Plan.from_module(model.model.layers[layer].self_attn).config == plan.config


def test_a_decode_through_a_cache_gives_the_forward_rows(tmp_path):
    """Keys normalised and rotated once, as they enter the cache (fp32 and int8)."""
    tiny_gemma3(tmp_path)
    plan = mha.Plan.from_pretrained(tmp_path, layer=0)
    x = torch.randn(1, TOKENS, 48)
    full = plan(x)
    for kv in ("fp32", "int8"):
        cache = plan.make_cache(1, TOKENS, kv)
        rows = [plan(x[:, :9], cache=cache)] + [plan(x[:, t : t + 1], cache=cache) for t in range(9, TOKENS)]
        got = torch.cat(rows, dim=1)
        tolerance = 5e-2 if kv == "int8" else 1e-5
        assert (got - full).abs().max() <= tolerance * full.abs().max(), kv


def test_a_gemma2_folders_layers_soft_cap_their_scores(tmp_path):
    """Gemma 2: no q/k norms, every other layer sliding, scores soft-capped (a cap the scores
    reach, so that it changes them)."""
    config = transformers.Gemma2Config(
        vocab_size=64,
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=WINDOW,
        attn_logit_softcapping=2.0,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    model = saved(transformers.Gemma2ForCausalLM(config), tmp_path, seed=1)
    x = torch.randn(2, TOKENS, 48)
    for layer, window in ((0, WINDOW), (1, 0)):
        attention = model.model.layers[layer].self_attn
        reference = want(model, layer, x)
        plan = mha.Plan.from_pretrained(tmp_path, layer=layer)
        assert (plan.config.softcap, plan.config.window, plan.config.qk_norm) == (2.0, window, False)
        close(plan(x), reference)
        close(mha.Plan.from_module(attention)(x), reference)
        # The cap changes these scores: transformers' own module without it is far off.
        attention.attn_logit_softcapping = None
        uncapped = want(model, layer, x)
        attention.attn_logit_softcapping = 2.0
        assert (uncapped - reference).abs().max() > 1e-2 * reference.abs().max()


def test_a_gpt_oss_folders_layers_have_their_sinks(tmp_path):
    """gpt-oss: a sink logit per head, biases on every projection, every other layer sliding, an
    inner width apart from the hidden size, and its YaRN rotary embedding (frequencies and
    attention factor as transformers computes them, the ramp's ends inside the head)."""
    config = transformers.GptOssConfig(
        vocab_size=64,
        hidden_size=40,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=WINDOW,
        max_position_embeddings=64,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 8.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        attn_implementation="eager",
    )
    # Sinks from N(0, 2): they take a share of every row.
    model = saved(transformers.GptOssForCausalLM(config), tmp_path, seed=2, sinks=2.0)
    x = torch.randn(2, TOKENS, 40)
    for layer, window in ((0, WINDOW), (1, 0)):
        attention = model.model.layers[layer].self_attn
        reference = want(model, layer, x)
        plan = mha.Plan.from_pretrained(tmp_path, layer=layer)
        c = plan.config
        assert c.rope_scaling.kind == "yarn"
        np.testing.assert_allclose(
            mha._mha.rope_frequencies(c), model.model.rotary_emb.inv_freq.numpy(), rtol=1e-6
        )
        assert mha._mha.rope_amplitude(c) == pytest.approx(model.model.rotary_emb.attention_scaling)
        assert (c.sinks, c.window, c.qkv_bias, c.out_proj_bias, c.out_width) == (True, window, True, True, 40)
        close(plan(x), reference)
        close(mha.Plan.from_module(attention)(x), reference)
        # The sinks change these rows: transformers' own module without them is far off.
        sinks = attention.sinks.data.clone()
        attention.sinks.data.fill_(-1e4)
        sinkless = want(model, layer, x)
        attention.sinks.data.copy_(sinks)
        assert (sinkless - reference).abs().max() > 1e-2 * reference.abs().max()
