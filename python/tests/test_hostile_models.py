"""The Python package under hostile use, continued: models under autograd and in training mode,
register()'s arguments, and the library's fixes as Python reaches them (narrow heads of a few
rows, a cache shared by two threads, out overlapping the mask or itself, finite extreme masks,
empty tensors). Every refusal is an mha.Error naming the
argument; every accepted input is computed as SDPA computes it (float64 SDPA the oracle)."""

from __future__ import annotations

import mha
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import mha.torch
from sdpa_oracle import F, close, operands, randn, sdpa


# -- mha.transformers under autograd, in training mode, and register() -----------------------------


def llama_config(hidden, layers):
    """A random Llama of `hidden` over 4 heads (2 K/V heads), a vocabulary of 64; and mha.transformers
    imported (registering "mha")."""
    transformers = pytest.importorskip("transformers")
    import mha.transformers

    return transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=layers,
        vocab_size=64,
        max_position_embeddings=64,
    )


@pytest.fixture(scope="module")
def llama():
    import transformers

    cfg = llama_config(64, 1)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="mha").eval()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        want = model(input_ids=ids).logits
    model.set_attn_implementation("mha")
    return model, ids, want


def test_a_model_in_eval_mode_under_autograd_is_refused(llama):
    model, ids, want = llama
    with pytest.raises(mha.Unsupported, match="requires grad, with autograd enabled"):
        model(input_ids=ids)
    with torch.no_grad():
        close(model(input_ids=ids).logits, want.double(), atol=1e-4)


def test_training_mode_without_dropout_under_no_grad_is_computed(llama):
    model, ids, want = llama
    model.train()
    try:
        with torch.no_grad():
            close(model(input_ids=ids).logits, want.double(), atol=1e-4)
        with pytest.raises(mha.Unsupported, match="requires grad"):
            model(input_ids=ids)
        model.model.layers[0].self_attn.attention_dropout = 0.25
        with pytest.raises(mha.Unsupported, match="attention dropout 0.25"), torch.no_grad():
            model(input_ids=ids)
    finally:
        model.model.layers[0].self_attn.attention_dropout = 0.0
        model.eval()


def test_torchs_thread_count_beyond_mhas_is_capped(llama):
    model = llama[0]
    threads = torch.get_num_threads()
    q, k, v = operands(b=1, h=4, rows=3, keys=3)
    module = model.model.layers[0].self_attn
    forward = mha.transformers.attention_forward
    try:
        torch.set_num_threads(1500)  # no torch operation runs until it is set back
        got, _ = forward(module, q, k[:, :2], v[:, :2], None, scaling=0.25, is_causal=True)
    finally:
        torch.set_num_threads(threads)
    want = sdpa(q, k[:, :2], v[:, :2], scale=0.25, is_causal=True, enable_gqa=True).transpose(1, 2)
    close(got, want)


def test_register_checks_its_arguments(llama):
    from transformers import AttentionInterface

    register = mha.transformers.register
    with pytest.raises(mha.InvalidArgument, match="name 123 must be a non-empty str"):
        register(123)
    for builtin in ["eager", "sdpa", "flash_attention_2", "flex_attention", *AttentionInterface()]:
        if builtin not in ("mha",):
            with pytest.raises(mha.InvalidArgument, match=f"name '{builtin}' is transformers' own"):
                register(builtin)
    with pytest.raises(mha.InvalidArgument, match="backend 'nonexistent' is not one of mha.backends()"):
        register("mha_hostile", backend="nonexistent")
    with pytest.raises(mha.InvalidArgument, match="backend 3"):
        register("mha_hostile", backend=3)
    for threads in (-1, 2**40, 1.5):
        with pytest.raises(mha.InvalidArgument, match=r"threads \(.*\) must be an integer"):
            register("mha_hostile", threads=threads)
    declining = [b.name for b in mha.backends() if b.supports_attention() is not None]
    for name in declining:
        with pytest.raises(mha.Unsupported, match=f"backend '{name}' does not run attention calls"):
            register("mha_hostile", backend=name)
    assert "mha_hostile" not in AttentionInterface()
    register("mha", threads=1)  # "mha" is mha's own: registered again with other settings
    try:
        assert AttentionInterface()["mha"] is not mha.transformers.attention_forward
    finally:
        register("mha")
    assert AttentionInterface()["mha"] is mha.transformers.attention_forward


# -- the library's own fixes, reached from Python --------------------------------------------------


def causal_sdpa(q, k, v, alignment):
    """float64 SDPA with grouped heads repeated and the causal limit of `alignment`; rows that see
    no key are zeros (SDPA's NaN there is mha's rule's zeros)."""
    rows, keys = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    limit = np.tril(np.ones((rows, keys), bool), keys - rows if alignment == "bottom_right" else 0)
    want = F.scaled_dot_product_attention(
        q.double(),
        k.double().repeat_interleave(group, 1),
        v.double().repeat_interleave(group, 1),
        attn_mask=torch.from_numpy(limit),
    )
    want[..., ~limit.any(-1), :] = 0
    return want


@pytest.mark.parametrize("backend", ["xsimd", "tbb", "naive"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_narrow_heads_of_a_few_rows_are_computed(backend, dtype):
    """head_dim <= 8 with at most 8 query rows per K/V head crashed (the narrow path read a
    packed K^T the in-place block never made): every row count where the blocking changes, with
    and without grouped heads, bottom-right causal (a decode step, a chunk) and L > S (a leftover
    chunk)."""
    if backend not in {b.name for b in mha.backends()}:
        pytest.skip(f"{backend} is not built")
    bound = 2e-6 if dtype == torch.float32 else 2e-2
    for d in (1, 4, 8):
        for rows in (1, 2, 7, 8, 9, 15, 16, 17):
            for h, h_kv in ((2, 2), (4, 1)):
                for keys, alignment in ((rows + 5, "bottom_right"), (5, "top_left")):
                    q = randn(1, h, rows, d, seed=rows).to(dtype)
                    k = randn(1, h_kv, keys, d, seed=rows + 1).to(dtype)
                    v = randn(1, h_kv, keys, d, seed=rows + 2).to(dtype)
                    got = mha.attention(
                        q, k, v, is_causal=True, causal_alignment=alignment, enable_gqa=True, backend=backend
                    )
                    error = (got.double() - causal_sdpa(q, k, v, alignment)).abs().max()
                    assert error <= bound, (d, rows, h, h_kv, keys)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_model_of_head_dim_8_generates_as_sdpa(kind, tmp_path):
    """A Hugging Face model with head_dim <= 8 (the tiny configs people test with: hidden
    32 over 4 heads) crashed at its first generated token: now the same tokens as "sdpa"."""
    cfg = llama_config(32, 2)
    import transformers

    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=64, n_positions=64)
    torch.manual_seed(3)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(4))
    tokens = {}
    for attn in ("sdpa", "mha"):
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=attn).eval()
        with torch.no_grad():
            tokens[attn] = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(tokens["mha"], tokens["sdpa"])


@pytest.mark.parametrize("backend", ["xsimd", "tbb"])
def test_two_threads_decoding_into_one_cache_never_pass_its_capacity(backend):
    """Two Python threads decoding into one cache with one free slot both passed the
    capacity check (the GIL is released between it and the append) and wrote past the storage.
    Now one call holds the cache: one token is appended, the other call is refused naming the
    concurrent use (or the capacity, when it came second)."""
    import threading

    if backend not in {b.name for b in mha.backends()}:
        pytest.skip(f"{backend} is not built")
    module = torch.nn.MultiheadAttention(32, 2, batch_first=True).eval()
    plan = mha.Plan.from_module(module, context_length=8, backend=backend)
    x = np.ones((1, 1, 32), np.float32)
    for _ in range(50):
        cache = plan.make_cache(1, 8)
        plan(np.zeros((1, 7, 32), np.float32), cache=cache)
        barrier = threading.Barrier(2)
        results, messages = [], []

        def decode():
            barrier.wait()
            try:
                plan(x, cache=cache)
                results.append("appended")
            except mha.InvalidArgument as e:
                results.append("refused")
                messages.append(str(e))

        threads = [threading.Thread(target=decode) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == ["appended", "refused"]
        assert "in use by another call" in messages[0] or "past the cache's capacity (8)" in messages[0]
        assert cache.lengths == [8]


def test_out_sharing_memory_with_the_mask_or_itself_is_refused():
    """Out overlapping the mask (a broadcast mask sliced from out) was accepted
    and silently wrong; an expanded out (stride 0) wrote every (b, h) into one slab, and expanded
    to a batch of 2^30 over a few bytes ran for hours; out interleaved with q was said to
    "overlap"."""
    q, k, v = operands()
    buffer = torch.zeros(2 * 2 * 5 * 16)
    with pytest.raises(mha.InvalidArgument, match="out may overlap the mask"):
        mha.attention(q, k, v, buffer[-35:].view(1, 1, 5, 7), out=buffer.view(2, 2, 5, 16))
    expanded = torch.zeros(1, 1, 5, 16).expand(2, 2, 5, 16)
    with pytest.raises(
        mha.InvalidArgument, match=r"out of shape \(2, 2, 5, 16\) has strides \(0, 0, 16, 1\)"
    ):
        mha.attention(q, k, v, out=expanded)
    huge = torch.zeros(1, 1, 3, 16).expand(2**30, 1, 3, 16)
    with pytest.raises(mha.InvalidArgument, match="elements overlap"):
        mha.attention(huge, huge, huge, out=huge)
    interleaved = torch.zeros(2, 2, 5, 32)
    with pytest.raises(mha.InvalidArgument, match="out may overlap q"):
        mha.attention(interleaved[..., :16], k, v, out=interleaved[..., 16:])


def test_finite_extreme_masks_give_sdpas_result():
    """Mask values past about 2.36e38 (float32's lowest is transformers' "masked" value)
    overflowed in the log2(e) scaling: a row all at that value gave zeros where SDPA averages
    its keys, and a +3e38 bias gave NaN where SDPA takes that key's value."""
    lowest = torch.finfo(torch.float32).min
    backends = [b.name for b in mha.backends() if b.supports_attention() is None]
    for keys in (7, 3000):  # one key tile, and split over key chunks
        q, k, v = operands(rows=3, keys=keys)
        for mask in (
            torch.full((1, 1, 3, keys), lowest),
            torch.zeros(1, 1, 3, keys).index_fill_(3, torch.tensor([2]), 3e38),
            torch.full((1, 1, 3, keys), -3e38).index_fill_(3, torch.tensor([1]), -2.5e38),
        ):
            want = F.scaled_dot_product_attention(q, k, v, mask)
            for backend in backends:
                got = mha.attention(q, k, v, mask, backend=backend)
                assert (got - want).abs().max() <= 1e-5, (keys, backend)


@pytest.mark.parametrize(
    "q_shape, k_shape",
    [
        ((0, 2, 4, 8), (0, 2, 6, 8)),
        ((1, 0, 4, 8), (1, 0, 6, 8)),
        ((1, 2, 0, 8), (1, 2, 6, 8)),
        ((1, 2, 4, 8), (1, 2, 0, 8)),
        ((1, 2, 4, 0), (1, 2, 6, 0)),
    ],
)
def test_empty_tensors_give_sdpas_answer(q_shape, k_shape):
    """Zero-size B, H, L, S or D were refused with messages about contiguity or null
    data; SDPA returns an empty result (zeros where there is no key: mha's rule for a row that
    sees no key, where SDPA's math gives NaN)."""
    q, k = torch.randn(*q_shape), torch.randn(*k_shape)
    want = F.scaled_dot_product_attention(q, k, k)
    if k_shape[2] == 0:
        want = torch.zeros(q_shape)
    got = mha.attention(q, k, k)
    assert got.shape == want.shape and torch.equal(got, want)
    got = mha.attention(q.numpy(), k.numpy(), k.numpy())
    assert got.shape == want.shape and np.array_equal(got, want.numpy())


def test_a_plan_on_no_tokens_names_the_empty_dimension():
    """Plans: a run on 0 tokens or a batch of 0 said "input x has no data (nullptr)"."""
    module = torch.nn.MultiheadAttention(32, 2, batch_first=True).eval()
    plan = mha.Plan.from_module(module, context_length=8)
    with pytest.raises(mha.InvalidArgument, match=r"seq_len \(0\) must be >= 1"):
        plan(np.zeros((1, 0, 32), np.float32))
    with pytest.raises(mha.InvalidArgument, match=r"batch \(0\) must be >= 1"):
        plan(np.zeros((0, 3, 32), np.float32))
