"""Hugging Face models on mha's attention (attn_implementation="mha", mha.transformers) against
their own "sdpa" implementation: random-weight GPT-2, Llama (grouped K/V heads, llama3 RoPE),
Qwen2 (Q/K/V biases) and BERT built with from_config, saved to folders and loaded back; logits,
greedy generation and batches of prompts of different lengths (padding masks)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import mha  # noqa: E402
import mha.transformers  # noqa: E402

VOCAB = 96


def config(kind):
    small = dict(vocab_size=VOCAB, max_position_embeddings=128)
    # Llama and Qwen2: 4 query heads over 2 K/V heads.
    grouped = dict(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        **small,
    )
    if kind == "gpt2":
        return transformers.GPT2Config(n_embd=64, n_head=4, n_layer=2, vocab_size=VOCAB, n_positions=128)
    if kind == "llama":
        llama3 = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
        return transformers.LlamaConfig(rope_scaling=llama3, **grouped)
    if kind == "qwen2":
        return transformers.Qwen2Config(**grouped)
    return transformers.BertConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2, **small
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One seeded random model per kind, saved as a Hugging Face folder."""
    out = {}
    for i, kind in enumerate(("gpt2", "llama", "qwen2", "bert")):
        torch.manual_seed(100 + i)
        auto = transformers.AutoModel if kind == "bert" else transformers.AutoModelForCausalLM
        model = auto.from_config(config(kind), attn_implementation="sdpa")
        folder = tmp_path_factory.mktemp(kind)
        model.save_pretrained(folder)
        out[kind] = folder
    return out


def load(folders, kind, attn, dtype=torch.float32):
    auto = transformers.AutoModel if kind == "bert" else transformers.AutoModelForCausalLM
    return auto.from_pretrained(folders[kind], attn_implementation=attn, dtype=dtype).eval()


def outputs(model, ids, mask=None):
    with torch.no_grad():
        result = model(input_ids=ids, attention_mask=mask)
    return result.last_hidden_state if hasattr(result, "last_hidden_state") else result.logits


def prompts(batch=2, tokens=24, seed=0):
    return torch.randint(0, VOCAB, (batch, tokens), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of mha's attention function, so that a test knows mha ran."""
    count = {"n": 0}
    inner = mha.transformers.attention_forward

    def counted(*args, **kwargs):
        count["n"] += 1
        return inner(*args, **kwargs)

    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, "mha", counted)
    return count


def max_error(got, want, where=None):
    diff = (got.double() - want.double()).abs()
    return (diff[where] if where is not None else diff).max().item(), want.double().abs().max().item()


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2", "bert"])
def test_fp32_outputs_match_sdpa(folders, kind, calls):
    ids = prompts()
    want = outputs(load(folders, kind, "sdpa"), ids)
    got = outputs(load(folders, kind, "mha"), ids)
    assert calls["n"] == 2  # one call per layer
    err, scale = max_error(got, want)
    assert err <= 2e-5 * scale


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2"])
def test_greedy_generation_is_identical(folders, kind, calls):
    ids = prompts(batch=1, tokens=12)
    sdpa, ours = load(folders, kind, "sdpa"), load(folders, kind, "mha")
    want = sdpa.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=0)
    got = ours.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=0)
    assert calls["n"] >= 2 * 32  # the prefill and each decode step, per layer
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2", "bert"])
def test_padded_batches(folders, kind, calls):
    """Prompts of 24, 17 and 9 tokens in one batch: left padding for the decoders (as generation
    pads), right padding for BERT; the real positions match, and so does generation."""
    ids = prompts(batch=3)
    mask = torch.ones_like(ids)
    for row, pad in ((1, 7), (2, 15)):
        if kind == "bert":
            mask[row, ids.shape[1] - pad :] = 0
        else:
            mask[row, :pad] = 0
    want = outputs(load(folders, kind, "sdpa"), ids, mask)
    got = outputs(load(folders, kind, "mha"), ids, mask)
    assert calls["n"] == 2
    err, scale = max_error(got, want, mask.bool())
    assert err <= 2e-5 * scale
    if kind != "bert":
        gen = dict(attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
        assert torch.equal(
            load(folders, kind, "mha").generate(ids, **gen), load(folders, kind, "sdpa").generate(ids, **gen)
        )


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2"])
def test_bf16_within_the_bound(folders, kind, calls):
    """bf16 models against the fp32 model's logits: mha's bf16 attention lands as close as sdpa's
    bf16 does (the model rounds every layer to bf16 around the attention either way). Measured
    here: mha 2^-8.0 / 2^-7.3 / 2^-7.3 of the largest logit (GPT-2, Llama, Qwen2), sdpa
    2^-8.2 / 2^-7.4 / 2^-7.3, eager 2^-8.0 / 2^-7.2 / 2^-7.2; the bound: 2^-6, and at most twice
    sdpa's error."""
    ids = prompts()
    exact = outputs(load(folders, kind, "sdpa"), ids)
    theirs, _ = max_error(outputs(load(folders, kind, "sdpa", torch.bfloat16), ids), exact)
    got = outputs(load(folders, kind, "mha", torch.bfloat16), ids)
    assert got.dtype == torch.bfloat16 and calls["n"] == 2
    err, scale = max_error(got, exact)
    assert err <= 2.0**-6 * scale
    assert err <= 2 * theirs


def test_what_it_cannot_compute_is_named(folders):
    model = load(folders, "llama", "mha")
    with pytest.raises(mha.Unsupported, match="requires grad"):  # autograd, eval mode or not
        model(input_ids=prompts())
    model.train()
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with pytest.raises(mha.Unsupported, match="attention dropout 0.1"):
        outputs(model, prompts())
    model.eval()
    with pytest.raises(mha.Unsupported, match="output_attentions"), torch.no_grad():
        model(input_ids=prompts(), output_attentions=True)
    with pytest.raises(mha.Unsupported, match="position_bias"):
        mha.transformers.attention_forward(
            model.model.layers[0].self_attn,
            *[torch.zeros(1, 4, 3, 16)] * 3,
            None,
            position_bias=torch.zeros(1),
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask", [False, True])
def test_a_decode_step_returns_the_layout_transformers_reshapes(dtype, mask):
    """One query row per sequence: the result is (B, 1, H, D), contiguous (transformers' reshape
    then views it), with SDPA's values; with a boolean mask (a padded batch's step) as well."""
    generator = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 8, n, 32, generator=generator).to(dtype) for n in (1, 9, 9))
    k, v = k[:, :4], v[:, :4]  # grouped: 8 query heads over 4
    attention_mask = None
    if mask:
        attention_mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
        attention_mask[1, ..., :3] = False  # the second sequence's 3 padding tokens
    module = torch.nn.Module()
    got, weights = mha.transformers.attention_forward(module, q, k, v, attention_mask, scaling=0.2)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=attention_mask, scale=0.2, enable_gqa=True
    ).transpose(1, 2)
    assert weights is None and got.dtype == dtype and got.shape == (2, 1, 8, 32)
    assert got.is_contiguous() and got.reshape(2, 1, -1).data_ptr() == got.data_ptr()
    err, scale = max_error(got, want)
    assert err <= (2.0**-7 if dtype == torch.bfloat16 else 1e-6) * scale


def test_register_under_another_name_with_settings(folders):
    """Another name with its own backend; "mha" keeps its settings."""
    mapping = transformers.AttentionInterface._global_mapping
    mha.transformers.register("mha_naive", backend="naive", threads=1)
    try:
        assert mapping["mha"] is mha.transformers.attention_forward
        assert mapping["mha_naive"] is not mha.transformers.attention_forward
        ids = prompts()
        want = outputs(load(folders, "gpt2", "sdpa"), ids)
        naive = load(folders, "gpt2", "mha_naive")
        err, scale = max_error(outputs(naive, ids), want)
        assert err <= 2e-5 * scale
        # An MhaCache of another backend's kernels: the library names both.
        cache = mha.transformers.MhaCache(naive.config, 16, backend="xsimd")
        with pytest.raises(
            mha.InvalidArgument, match="made for the attention calls of xsimd, not for naive's"
        ):
            with torch.no_grad():
                naive(input_ids=ids, past_key_values=cache, use_cache=True)
        with pytest.raises(mha.InvalidArgument, match="no_such_backend"):
            mha.transformers.register("mha_bad", backend="no_such_backend")
            outputs(load(folders, "gpt2", "mha_bad"), ids)
    finally:
        for name in ("mha_naive", "mha_bad"):
            mapping.pop(name, None)
            mha.transformers.AttentionMaskInterface._global_mapping.pop(name, None)


# The error of each MhaCache's keys and values in a model, measured here against the fp32 model
# on "sdpa" (largest logit error over the largest logit): fp32 3e-7, bf16 4e-4 / 1.5e-3, int8
# 1.0e-3 / 4.2e-3 (3.6e-3 since), k8v4 1.5e-2 / 5.3e-2 (GPT-2, Llama; 4-bit values on random
# weights; int4 reads these 20 tokens' keys exact, its values as k8v4's). The bounds leave room
# for another ISA's rounding.
MHA_CACHE_BOUND = {"fp32": 2e-5, "bf16": 1e-2, "int8": 2e-2, "k8v4": 1e-1, "int4": 1e-1}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("kv", ["fp32", "bf16", "int8", "k8v4", "int4"])
def test_an_mha_cache_decodes_as_sdpa(folders, kind, kv, calls):
    """A prefill, a chunk of 3 tokens after it (transformers' causal mask over the cache) and
    one-token steps through an MhaCache, each step's logits against sdpa's over the whole
    sequence."""
    ids = prompts(tokens=20)
    want = outputs(load(folders, kind, "sdpa"), ids)
    model = load(folders, kind, "mha")
    cache = mha.transformers.MhaCache(model.config, 32, kv=kv)
    got = []
    with torch.no_grad():
        for start, end in [(0, 12), (12, 15), *((t, t + 1) for t in range(15, 20))]:
            got.append(model(input_ids=ids[:, start:end], past_key_values=cache, use_cache=True).logits)
    err, scale = max_error(torch.cat(got, dim=1), want)
    assert err <= MHA_CACHE_BOUND[kv] * scale
    assert calls["n"] == 2 * 7 and cache.get_seq_length() == 20
    assert f"kv={kv!r}" in repr(cache) and "lengths=[20, 20]" in repr(cache)
    assert cache.nbytes == sum(layer.cache.nbytes for layer in cache.layers) > 0


def test_greedy_generation_through_an_mha_cache_is_identical(folders):
    ids = prompts(batch=1, tokens=12)
    keep = torch.ones_like(ids)  # no padding (token 0 is the pad token)
    want = load(folders, "llama", "sdpa").generate(
        ids, attention_mask=keep, max_new_tokens=24, do_sample=False, pad_token_id=0
    )
    model = load(folders, "llama", "mha")
    cache = mha.transformers.MhaCache(model.config, 64, kv="fp32")
    got = model.generate(
        ids, attention_mask=keep, max_new_tokens=24, do_sample=False, pad_token_id=0, past_key_values=cache
    )
    assert torch.equal(got, want)
    assert cache.get_seq_length() == 12 + 24 - 1


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_left_padded_batch_through_an_mha_cache(folders, kind):
    """Prompts of 24, 17 and 9 tokens (left padding, as generate() pads): the real positions'
    logits match sdpa's, greedy generation too, and the cache holds no padding."""
    ids = prompts(batch=3)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    mask[2, :15] = 0
    want = outputs(load(folders, kind, "sdpa"), ids, mask)
    model = load(folders, kind, "mha")
    cache = mha.transformers.MhaCache(model.config, 48, kv="fp32")
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits
    err, scale = max_error(got, want, mask.bool())
    assert err <= 2e-5 * scale
    assert cache.layers[0].cache.lengths == [24, 17, 9] and cache.get_seq_length() == 24
    gen = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    want_tokens = load(folders, kind, "sdpa").generate(ids, **gen)
    cache = mha.transformers.MhaCache(model.config, 48, kv="fp32")
    assert torch.equal(model.generate(ids, past_key_values=cache, **gen), want_tokens)
    assert cache.layers[0].cache.lengths == [35, 28, 20]


def test_what_an_mha_cache_refuses(folders):
    model = load(folders, "gpt2", "mha")
    ids = prompts(batch=2, tokens=8)
    padded = torch.ones_like(ids)
    padded[1, -3:] = 0  # right padding: keys masked after real ones
    with pytest.raises(mha.Unsupported, match="not left padding followed by the causal"), torch.no_grad():
        model(
            input_ids=ids, attention_mask=padded, past_key_values=mha.transformers.MhaCache(model.config, 16)
        )
    with pytest.raises(mha.Unsupported, match="beam search"):
        model.generate(
            ids[:1],
            attention_mask=torch.ones_like(ids[:1]),
            num_beams=2,
            max_new_tokens=4,
            pad_token_id=0,
            past_key_values=mha.transformers.MhaCache(model.config, 16),
        )
    # Another attention implementation never takes the new tokens: the next step says so.
    sdpa = load(folders, "gpt2", "sdpa")
    cache = mha.transformers.MhaCache(sdpa.config, 16)
    with torch.no_grad():
        sdpa(input_ids=ids, past_key_values=cache, use_cache=True)
        with pytest.raises(mha.Unsupported, match='attn_implementation="mha"'):
            sdpa(input_ids=ids[:, :1], past_key_values=cache, use_cache=True)
    with pytest.raises(mha.InvalidArgument, match="capacity"):
        mha.transformers.MhaCache(model.config, 0)
    with pytest.raises(mha.InvalidArgument, match="kv 'int2'"):
        mha.transformers.MhaCache(model.config, 16, kv="int2")
    with pytest.raises(mha.InvalidArgument, match="sequence 0 holds 8 tokens; 9 more make 17"):
        cache = mha.transformers.MhaCache(model.config, 16)
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            model(input_ids=torch.cat([ids, ids[:, :1]], dim=1), past_key_values=cache, use_cache=True)
