"""mha.AttentionCache and mha.attention(..., cache=): a decode stream through each cache precision
against PyTorch's SDPA over all the keys each sequence has seen (bottom-right causal), NumPy and
torch operands, what the cache says of itself, and what it refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest

import mha

torch = pytest.importorskip("torch")
F = torch.nn.functional

BACKENDS = [b.name for b in mha.backends() if b.supports_attention() is None]


def sdpa_over(q, keys, values):
    """SDPA of q's T rows over S keys, query i at position S - T + i (bottom-right causal), in
    float64 with the key heads repeated for the query heads."""
    t, s = q.shape[2], keys.shape[2]
    group = q.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)
    v = values.double().repeat_interleave(group, dim=1)
    allowed = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)
    return F.scaled_dot_product_attention(q.double(), k, v, attn_mask=allowed)


# An int8 code's largest error over its row's largest magnitude: half a step of 2/254 rounded up
# to bf16 (docs/design.md §1.7; int8_element_error in src/base/int8.hpp).
CODE_ERROR = (1 + 1 / 128) / 254


def int8_bound(head_dim):
    """The int8 codes' bound for inputs in [-1, 1] (docs/design.md §1.7): a code is within
    CODE_ERROR of its element, a score moves by sqrt(D) CODE_ERROR, the result by CODE_ERROR +
    2 (exp(2 sqrt(D) CODE_ERROR) - 1)."""
    return CODE_ERROR + 2 * (math.exp(2 * math.sqrt(head_dim) * CODE_ERROR) - 1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "kv,precision,dtype,tolerance",
    [
        ("fp32", "fp32", torch.float32, 1e-5),
        ("bf16", "bf16", torch.bfloat16, 3e-2),
        ("int8", "fp32", torch.float32, None),
        ("int8", "bf16", torch.bfloat16, None),
    ],
)
def test_a_decode_stream_matches_sdpa_over_every_key_seen(backend, kv, precision, dtype, tolerance):
    batch, heads, kv_heads, head_dim = 2, 4, 2, 16
    cache = mha.AttentionCache(batch, 32, kv_heads, head_dim, kv=kv, precision=precision, backend=backend)
    g = torch.Generator().manual_seed(5)
    keys = [torch.empty(1, kv_heads, 0, head_dim) for _ in range(batch)]
    values = [torch.empty(1, kv_heads, 0, head_dim) for _ in range(batch)]
    bound = (
        tolerance
        if tolerance is not None
        else int8_bound(head_dim) + (3e-2 if dtype == torch.bfloat16 else 0)
    )
    for step, tokens in enumerate([7, 1, 1, 3, 1]):
        q = (torch.rand(batch, heads, tokens, head_dim, generator=g) * 2 - 1).to(dtype)
        k = (torch.rand(batch, kv_heads, tokens, head_dim, generator=g) * 2 - 1).to(dtype)
        v = (torch.rand(batch, kv_heads, tokens, head_dim, generator=g) * 2 - 1).to(dtype)
        out = mha.attention(
            q, k, v, is_causal=True, causal_alignment="bottom_right", enable_gqa=True, cache=cache
        )
        assert out.dtype == dtype and out.shape == q.shape
        for b in range(batch):
            keys[b] = torch.cat([keys[b], k[b : b + 1].float()], dim=2)
            values[b] = torch.cat([values[b], v[b : b + 1].float()], dim=2)
            expected = sdpa_over(q[b : b + 1].float(), keys[b], values[b])
            error = (out[b : b + 1].double() - expected).abs().max().item()
            assert error <= bound, (step, b, error, bound)
        assert cache.lengths == [keys[0].shape[2]] * batch


# The SIMD kernels' 16-bit weights of a k8v4 cache's 4-bit values, for values in [-1, 1]: at most
# value4_weight_error (src/base/value4.hpp) times the largest turned element, itself at most
# sqrt(32); plus the int8 keys' 16-bit queries (a far smaller share) and fp32 rounding.
VALUE4_WEIGHT_ERROR = math.sqrt(32) * 15 * 32 / (2 * 32767) * 2 * (1 + 1 / 128) / 15.4375
K8V4_KERNELS_TOLERANCE = math.sqrt(32) * VALUE4_WEIGHT_ERROR + 1e-3


def decode_steps(caches, steps, heads):
    """Per call of `steps` tokens: random q, k, v in [-1, 1] (the same for every cache: seed 7)
    and each cache's causal bottom-right mha.attention over them, by name."""
    cache = next(iter(caches.values()))
    batch, kv_heads, head_dim = cache.batch, cache.kv_heads, cache.head_dim
    g = torch.Generator().manual_seed(7)
    for tokens in steps:
        q = torch.rand(batch, heads, tokens, head_dim, generator=g) * 2 - 1
        k = torch.rand(batch, kv_heads, tokens, head_dim, generator=g) * 2 - 1
        v = torch.rand(batch, kv_heads, tokens, head_dim, generator=g) * 2 - 1
        yield (
            q,
            k,
            v,
            {
                name: mha.attention(
                    q, k, v, is_causal=True, causal_alignment="bottom_right", enable_gqa=True, cache=c
                )
                for name, c in caches.items()
            },
        )


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "naive"])
def test_a_k8v4_decode_stream_matches_the_naive_reference(backend):
    """k8v4 (int8 keys, 4-bit values in turned groups of 32) fed the same stream on a SIMD backend
    and on naive, its reference: the same codes, the kernels' 16-bit weights apart; further from
    sdpa over the exact keys than an int8 cache, and 0.79x its bytes at head_dim 64."""
    batch, heads, kv_heads, head_dim = 2, 4, 2, 64
    caches = {
        name: mha.AttentionCache(batch, 32, kv_heads, head_dim, kv=kv, backend=on)
        for name, kv, on in (("k8v4", "k8v4", backend), ("naive", "k8v4", "naive"), ("int8", "int8", backend))
    }
    assert caches["k8v4"].kv == "k8v4" and "kv='k8v4'" in repr(caches["k8v4"])
    assert 0.75 < caches["k8v4"].nbytes / caches["int8"].nbytes < 0.82
    keys, values, far = [], [], {"k8v4": 0.0, "int8": 0.0}
    for q, k, v, out in decode_steps(caches, [9, 1, 1, 4, 1], heads):
        assert (out["k8v4"] - out["naive"]).abs().max().item() <= K8V4_KERNELS_TOLERANCE
        keys.append(k)
        values.append(v)
        exact = sdpa_over(q, torch.cat(keys, dim=2), torch.cat(values, dim=2))
        for name in far:
            far[name] = max(far[name], (out[name].double() - exact).abs().max().item())
    # Each value element read back within sqrt(32) half-steps of its turned group (|H e|_inf <=
    # sqrt(32) |e|_inf), the step the group's range / 15.4375 rounded up to bf16; a row that sees
    # one key reads that key's value so. The keys' share: as int8's (its far, which holds it).
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < 32:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    turned = torch.cat(values, dim=2).double().reshape(-1, 2, 32) @ (h / math.sqrt(32))
    step = (turned.amax(-1) - turned.amin(-1)).max().item() * 16 / 247 * (1 + 1 / 128)
    assert far["int8"] < far["k8v4"] <= math.sqrt(32) * step / 2 + far["int8"], (far, step)
    assert caches["k8v4"].lengths == [16, 16]


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "naive"])
def test_an_int4_decode_stream_matches_the_naive_reference(backend):
    """int4 (k8v4's values, keys as 4-bit codes per channel of each group of 64 tokens, the newest
    exact) fed the same stream on a SIMD backend and on naive, its reference: the same codes, the
    kernels' 16-bit weights and queries apart, across group ends (63, 64, 127, 128) and a chunk
    that fills a group; 0.56x int8's bytes a token at head_dim 64 (plus each head's 128 recent
    exact keys); a rollback past those exact keys is refused by name, one into them is not."""
    batch, heads, kv_heads, head_dim = 2, 4, 2, 64
    caches = {
        name: mha.AttentionCache(batch, 4096, kv_heads, head_dim, kv=kv, backend=on)
        for name, kv, on in (("int4", "int4", backend), ("naive", "int4", "naive"), ("int8", "int8", backend))
    }
    assert caches["int4"].kv == "int4" and "kv='int4'" in repr(caches["int4"])
    recent = batch * kv_heads * 128 * (head_dim * 4 + 8)
    assert 0.55 < (caches["int4"].nbytes - recent) / caches["int8"].nbytes < 0.57
    for _, _, _, out in decode_steps(caches, [62, 1, 1, 1, 60, 1, 1, 70], heads):
        assert (out["int4"] - out["naive"]).abs().max().item() <= K8V4_KERNELS_TOLERANCE
    assert caches["int4"].lengths == [197, 197]
    with pytest.raises(mha.InvalidArgument, match="an int4 cache codes its keys in groups of 64"):
        caches["int4"].truncate(0, 10)
    caches["int4"].truncate(0, 150)  # into the last coded group (128..191): its keys are exact
    assert caches["int4"].lengths == [150, 197]


def test_numpy_operands_and_what_the_cache_says():
    cache = mha.AttentionCache(1, 256, 1, 64, kv="int8")
    assert cache.kv == "int8" and cache.precision == "fp32" and cache.lengths == [0]
    rng = np.random.default_rng(1)
    q = rng.uniform(-1, 1, (1, 2, 3, 64)).astype(np.float32)
    k = rng.uniform(-1, 1, (1, 1, 3, 64)).astype(np.float32)
    out = mha.attention(q, k, k, is_causal=True, enable_gqa=True, cache=cache)
    assert isinstance(out, np.ndarray) and out.shape == q.shape and np.isfinite(out).all()
    assert cache.lengths == [3]
    text = repr(cache)
    assert "kv='int8'" in text and "lengths=[3]" in text and f"nbytes={cache.nbytes}" in text
    # The int8 cache's bytes against a bf16 one's of the same shape: codes of 64 plus a scale
    # and an offset per row (and 64 key channel scales a head) against 128 bytes a row.
    bf16 = mha.AttentionCache(1, 256, 1, 64, kv="bf16")
    assert cache.nbytes < 0.6 * bf16.nbytes
    cache.truncate(0, 1)
    assert cache.lengths == [1]
    cache.reset()
    assert cache.lengths == [0]


def test_what_a_call_over_a_cache_refuses(monkeypatch):
    cache = mha.AttentionCache(1, 4, 1, 8, kv="fp32", backend="naive")
    q = torch.zeros(1, 1, 3, 8)

    def call(**kw):
        kw.setdefault("causal_alignment", "bottom_right")
        return mha.attention(q, q, q, is_causal=True, cache=cache, **kw)

    call()
    with pytest.raises(mha.InvalidArgument, match="sequence 0 holds 3 tokens; 3 more make 6"):
        call()
    assert cache.lengths == [3]
    cache.reset()
    with pytest.raises(mha.Unsupported, match="attn_mask with a cache"):
        call(attn_mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(mha.Unsupported, match="out= with a cache"):
        call(out=torch.empty(1, 1, 3, 8))
    with pytest.raises(mha.InvalidArgument, match="not causal"):
        mha.attention(q, q, q, cache=cache)
    with pytest.raises(mha.InvalidArgument, match="made for the attention calls of naive, not for xsimd's"):
        call(backend="xsimd")
    with pytest.raises(mha.InvalidArgument, match="expected an mha.AttentionCache"):
        mha.attention(q, q, q, is_causal=True, cache="cache")
    call()
    # Top-left, 3 new rows would stand before the 3 held (the library's rule, in either path).
    for general in (False, True):
        with monkeypatch.context() as m:
            if general:
                m.setattr(mha._cache._mha, "_attention_tensors_over_cache", lambda *a: None)
            with pytest.raises(
                mha.InvalidArgument, match="sequence 0 holds 3 tokens: .* pass causal_alignment bottom_right"
            ):
                call(causal_alignment="top_left")
    assert cache.lengths == [3]
    mha.attention(q[:, :, :1], q[:, :, :1], q[:, :, :1], cache=cache)  # one token: no flag needed
    assert cache.lengths == [4]
    with pytest.raises(mha.InvalidArgument, match="kv 'int2' is not one of"):
        mha.AttentionCache(1, 4, 1, 8, kv="int2")
    with pytest.raises(mha.InvalidArgument, match="a bf16 cache is computed in bf16"):
        mha.AttentionCache(1, 4, 1, 8, kv="bf16", precision="fp32")
    with pytest.raises(mha.InvalidArgument, match="capacity"):
        mha.AttentionCache(1, 2**70, 1, 8)
    with pytest.raises(mha.Unsupported, match="onednn"):
        mha.AttentionCache(1, 4, 1, 8, backend="onednn")


@pytest.mark.parametrize("kv", ["fp32", "bf16", "int8", "k8v4", "int4"])
def test_plain_cache_calls_are_read_in_cpp_with_the_general_paths_bits(kv, monkeypatch):
    """A prefill and decode steps through two caches alike, one by the C++ reader (float32 tensors,
    K and V in (B, T, H, D) buffers seen as (B, H, T, D)), one by the general path: the same
    bits, the same lengths (a top-left prefill into empty sequences among them); bfloat16 tokens
    take the general path."""
    caches = [mha.AttentionCache(2, 16, 2, 16, kv=kv) for _ in range(2)]
    g = torch.Generator().manual_seed(9)
    steps = [(4, "top_left"), (1, "top_left"), (1, "bottom_right"), (3, "bottom_right")]
    tokens = [[torch.randn(2, h, t, 16, generator=g) for h in (4, 2, 2)] for t, _ in steps]
    tokens = [(q, k.transpose(1, 2).contiguous().transpose(1, 2), v) for q, k, v in tokens]
    results = []
    for cache, plain in zip(caches, (True, False)):
        with monkeypatch.context() as m:
            if plain:
                m.setattr(mha._cache, "_operand", lambda *a: pytest.fail("took the general path"))
            else:
                m.setattr(mha._cache._mha, "_attention_tensors_over_cache", lambda *a: None)
            results.append(
                [
                    mha.attention(
                        q, k, v, is_causal=True, causal_alignment=align, enable_gqa=True, cache=cache
                    )
                    for (q, k, v), (_, align) in zip(tokens, steps)
                ]
            )
    for plain, general in zip(*results):
        assert plain.dtype == torch.float32 and plain.is_contiguous()
        assert torch.equal(plain, general)
    assert caches[0].lengths == caches[1].lengths == [9, 9]
    general = []
    operand = mha._cache._operand
    monkeypatch.setattr(mha._cache, "_operand", lambda *a: general.append(1) or operand(*a))
    q, k, v = (t[:, :, :1] for t in tokens[0])
    assert mha.attention(
        q.bfloat16(), k.bfloat16(), v.bfloat16(), enable_gqa=True, cache=caches[0]
    ).dtype == (torch.bfloat16)
    assert general, "bfloat16 tokens did not take the general path"
    caches[0].reset()
    general.clear()
    q, k, v = tokens[0]
    mha.attention(q, k, v, is_causal=True, enable_gqa=True, cache=caches[0])  # top-left, nothing held
    assert not general and caches[0].lengths == [4, 4]
