"""What the models people run add to attention (docs/python.md "Windows, soft-caps and sinks"):
mha.attention's window, softcap and sinks against a float64 reference written from their
definitions (tensors and arrays, the plain call and the general path, bf16, over a cache); and
tiny random Gemma 2 (soft-cap and window), Gemma 3 (sliding and full layers), Mistral (window)
and gpt-oss (sinks and window) on "mha" against their own eager attention, with prompts longer
than the window (a prompt inside it would prove nothing)."""

from __future__ import annotations

import mha
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from sdpa_oracle import close  # noqa: E402


def reference(q, k, v, window=0, softcap=0.0, sinks=None):
    """float64 attention of the last L positions over S keys (bottom-right causal), grouped
    heads repeated, with a window, a soft-cap and sinks as their definitions say."""
    q, k, v = (torch.as_tensor(np.asarray(t)).double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    rows, keys = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(rows)[:, None] + keys - rows
    j = torch.arange(keys)[None, :]
    seen = (j <= i) & (j > i - window) if window else j <= i
    s = s.masked_fill(~seen, float("-inf"))
    if sinks is not None:
        column = torch.as_tensor(np.asarray(sinks)).double()[None, :, None, None].expand(*s.shape[:3], 1)
        return torch.cat([s, column], -1).softmax(-1)[..., :-1] @ v
    return s.softmax(-1) @ v


def operands(rows, keys, d=32, heads=4, kv_heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, heads, rows, d, generator=g),
        torch.randn(2, kv_heads, keys, d, generator=g),
        torch.randn(2, kv_heads, keys, d, generator=g),
    )


CASES = [
    dict(window=64),
    dict(window=1),
    dict(softcap=2.0),
    dict(sinks=torch.tensor([0.5, 30.0, -2.0, 1.0])),
    dict(window=40, softcap=20.0, sinks=torch.tensor([0.5, 3.0, -2.0, 1.0])),
]


@pytest.mark.parametrize("shape", [(300, 300), (1, 3000), (6, 500)])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("path", ["plain", "mask", "numpy"])
def test_the_extensions_match_their_definitions(shape, case, path):
    rows, keys = shape
    q, k, v = operands(rows, keys)
    extra = CASES[case]
    call = dict(is_causal=True, causal_alignment="bottom_right", enable_gqa=True, **extra)
    if path == "numpy":
        got = mha.attention(q.numpy(), k.numpy(), v.numpy(), **{**call, "sinks": _numpy(extra.get("sinks"))})
    else:  # an all-true mask takes the general path; both apply
        mask = torch.ones(rows, keys, dtype=torch.bool) if path == "mask" else None
        got = mha.attention(q, k, v, mask, **call)
    close(got, reference(q, k, v, **extra), atol=2e-5)


def _numpy(t):
    return None if t is None else t.numpy()


def test_bfloat16_operands_within_bf16s_bound():
    q, k, v = (t.bfloat16() for t in operands(1, 700, d=64))
    sinks = torch.tensor([0.5, 3.0, -2.0, 1.0])
    got = mha.attention(
        q, k, v, is_causal=True, causal_alignment="bottom_right", enable_gqa=True, window=100, sinks=sinks
    )
    assert got.dtype == torch.bfloat16
    close(got.float(), reference(q.float(), k.float(), v.float(), window=100, sinks=sinks), atol=1.5e-2)


@pytest.mark.parametrize("kv", ["fp32", "bf16", "int8"])
def test_a_windows_cache_is_a_ring_read_in_key_order(kv):
    """A cache made with a window keeps a ring of ring_slots(8) = 384 tokens (its capacity is
    2048): a prefill of 400 (longer than the ring) and 30 steps round it, each its window."""
    q, k, v = operands(430, 430, d=32)
    cache = mha.AttentionCache(2, 2048, 2, 32, kv=kv, window=8)
    assert (cache.window, cache.slots) == (8, 384) and "window=8, slots=384" in repr(cache)
    assert cache.nbytes < mha.AttentionCache(2, 2048, 2, 32, kv=kv).nbytes / 4
    options = dict(is_causal=True, causal_alignment="bottom_right", enable_gqa=True, cache=cache)
    rows = [mha.attention(q[:, :, :400], k[:, :, :400], v[:, :, :400], **options)]
    for t in range(400, 430):  # one token at a time, round the ring
        rows.append(mha.attention(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], **options))
    close(
        torch.cat(rows, 2), reference(q, k, v, window=8), atol={"fp32": 2e-5, "bf16": 3e-2, "int8": 5e-2}[kv]
    )
    with pytest.raises(mha.InvalidArgument, match="window 5, and the kv_cache was made for a window of 8"):
        mha.attention(q[:, :, :1], k[:, :, :1], v[:, :, :1], window=5, **options)


def test_bad_extensions_are_named():
    q, k, v = operands(4, 4)
    for kwargs, says in (
        (dict(window=-1), "window \\(-1\\) must be an integer >= 0"),
        (dict(window=2.5), "window \\(2.5\\) must be an integer"),
        (dict(softcap="big"), "softcap \\('big'\\) must be a real number"),
        (dict(sinks=torch.zeros(2, 2)), "sinks is a Tensor of shape \\(2, 2\\)"),
        (dict(sinks=torch.zeros(3)), "3 sinks for 4 query heads"),
        (dict(window=3, is_causal=False), "a sliding window \\(3\\) is causal"),
        (dict(softcap=float("inf")), "softcap \\(inf\\) must be finite"),
    ):
        kwargs = {"is_causal": True, "enable_gqa": True, **kwargs}
        with pytest.raises(mha.InvalidArgument, match=says):
            mha.attention(q, k, v, **kwargs)


# -- tiny models, prompts longer than their windows ---------------------------------------------------

transformers = pytest.importorskip("transformers")
import mha.transformers  # noqa: E402

VOCAB = 64
WINDOW = 8


def tiny(kind):
    common = dict(
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=128,
        sliding_window=WINDOW,
    )
    if kind == "gemma2":  # every other layer slides; soft-capped logits
        return transformers.Gemma2Config(
            num_hidden_layers=2,
            head_dim=16,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=None,
            **common,
        )
    if kind == "gemma3":  # sliding layers beside a full one, one K/V head
        return transformers.Gemma3TextConfig(
            num_hidden_layers=3,
            head_dim=16,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            **{**common, "num_key_value_heads": 1},
        )
    if kind == "mistral":  # every layer slides
        return transformers.MistralConfig(num_hidden_layers=2, **common)
    return transformers.GptOssConfig(  # sinks on every layer, sliding and full layers
        num_hidden_layers=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"],
        **{**common, "intermediate_size": 64},
    )


@pytest.fixture(scope="module", params=["gemma2", "gemma3", "mistral", "gpt_oss"])
def model(request):
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(tiny(request.param), attn_implementation="eager").eval()
    if request.param == "gpt_oss":  # sinks that matter (they start at zero)
        for layer in m.model.layers:
            layer.self_attn.sinks.data.normal_(0.0, 2.0)
    return m


@pytest.fixture
def windows(monkeypatch):
    """The windows mha's attention function computed itself (no mask, a sliding_window)."""
    seen = []
    inner = mha.transformers.attention_forward

    def counted(module, query, key, value, mask, *args, **kwargs):
        if mask is None and kwargs.get("sliding_window"):
            seen.append(kwargs["sliding_window"])
        return inner(module, query, key, value, mask, *args, **kwargs)

    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, "mha", counted)
    return seen


def test_tiny_models_match_eager_past_their_window(model, windows):
    ids = torch.randint(0, VOCAB, (2, 5 * WINDOW), generator=torch.Generator().manual_seed(1))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        want = model(input_ids=ids).logits
        want_tokens = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0)
    model.set_attn_implementation("mha")
    try:
        with torch.no_grad():
            got = model(input_ids=ids).logits
            got_tokens = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0)
    finally:
        model.set_attn_implementation("eager")
    close(got, want.double(), atol=1e-4)
    assert torch.equal(got_tokens, want_tokens)
    assert windows and set(windows) == {WINDOW}  # computed as windows, not through a mask


def test_a_padded_batch_past_the_window_matches_eager(model):
    ids = torch.randint(0, VOCAB, (2, 4 * WINDOW), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding: the mask then carries the window
    model.set_attn_implementation("eager")
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
    model.set_attn_implementation("mha")
    try:
        with torch.no_grad():
            got = model(input_ids=ids, attention_mask=mask).logits
    finally:
        model.set_attn_implementation("eager")
    close(got[mask.bool()], want[mask.bool()].double(), atol=1e-4)


def test_a_chunked_attention_mask_is_not_taken_for_a_window():
    from transformers.masking_utils import chunked_causal_mask_function, sliding_window_causal_mask_function

    assert mha.transformers._sliding_causal(sliding_window_causal_mask_function(8), 8)
    assert not mha.transformers._sliding_causal(
        chunked_causal_mask_function(8, torch.zeros(1, dtype=torch.long)), 8
    )
    assert not mha.transformers._sliding_causal(sliding_window_causal_mask_function(9), 8)


# -- MhaCache: sliding layers keep their window's ring ------------------------------------------------


@pytest.mark.parametrize("kv", ["fp32", "bf16", "int8"])
def test_an_mha_cache_serves_sliding_layers_past_their_ring(model, kv):
    """A padded batch whose prompt passes a sliding layer's ring (ring_slots(8) = 384 tokens),
    then 12 greedy tokens: fp32 the same tokens as eager with transformers' cache; bf16 and int8
    the first step's logits within their caches' rounding."""
    ids = torch.randint(0, VOCAB, (2, 400), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        want_tokens = model.generate(ids, **kwargs)
        want = model(input_ids=ids, attention_mask=mask).logits[:, -1]
    model.set_attn_implementation("mha")
    try:
        cache = mha.transformers.MhaCache(model.config, 2048, kv=kv)
        with torch.no_grad():
            got = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits[
                :, -1
            ]
            cache = mha.transformers.MhaCache(model.config, 2048, kv=kv)
            got_tokens = model.generate(ids, past_key_values=cache, **kwargs)
    finally:
        model.set_attn_implementation("eager")
    layer_types = getattr(model.config, "layer_types", None) or ["sliding_attention"] * len(cache.layers)
    slots = [layer.cache.slots for layer in cache.layers]
    assert slots == [384 if t == "sliding_attention" else 2048 for t in layer_types]
    if kv == "fp32":
        close(got, want.double(), atol=1e-4)
        assert torch.equal(got_tokens, want_tokens)
    else:
        scale = want.abs().max().item()
        assert (got - want).abs().max().item() <= (2e-2 if kv == "bf16" else 5e-2) * scale


def test_gemma3s_cache_holds_its_full_layers_and_windows():
    """Gemma 3 270M's layer pattern at 32k positions: 3 full layers of 32,768 tokens and 15 rings
    of its 512-key window (832 tokens), in int8 (head_dim 256, one K/V head)."""
    cfg = transformers.Gemma3TextConfig(
        num_hidden_layers=18,
        sliding_window=512,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
        num_key_value_heads=1,
        head_dim=256,
        vocab_size=VOCAB,
    )
    cache = mha.transformers.MhaCache(cfg, 32768, kv="int8")
    for layer in cache.layers:
        layer.lazy_initialization(torch.zeros(1, 1, 1, 256), torch.zeros(1, 1, 1, 256))
    assert [layer.cache.slots for layer in cache.layers].count(832) == 15
    full = mha.AttentionCache(1, 32768, 1, 256, kv="int8").nbytes
    ring = mha.AttentionCache(1, 32768, 1, 256, kv="int8", window=512).nbytes
    assert cache.nbytes == 3 * full + 15 * ring
    assert cache.nbytes < 0.21 * 18 * full  # about a fifth of every layer at 32k
