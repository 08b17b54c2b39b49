"""The integration under hostile use (round 5): models whose attention never reaches mha, layers
that reuse another layer's keys and values, keywords that change the function, caches asked for
what they cannot serve, refused calls, copies of a filled cache, out= under autograd and outside
inference mode, operands swapped by another thread mid-call, expanded keys, threads past the
cores. Every refusal is an mha.Error naming what it refuses; every accepted input is computed as
eager (or float64 SDPA) computes it."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import textwrap

import mha
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import mha.transformers  # noqa: E402
from sdpa_oracle import close, operands, sdpa  # noqa: E402

VOCAB = 64


def logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(input_ids=ids, **kwargs).logits


def ids_of(batch=1, tokens=12, seed=0):
    return torch.randint(0, VOCAB, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def gpt2(attn="mha", seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=VOCAB, n_positions=64)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()


# -- 1. models whose attention does not go through transformers' interface ------------------------

# Tiny configs of model families that compute attention in their own code (or look their classes
# up by the implementation's name): loading one of them on "mha" never calls mha.
UNROUTED = {
    "BloomForCausalLM": lambda: transformers.BloomConfig(hidden_size=32, n_layer=1, n_head=4),
    "XGLMForCausalLM": lambda: transformers.XGLMConfig(
        d_model=32, num_layers=1, attention_heads=4, ffn_dim=64
    ),
    "MptForCausalLM": lambda: transformers.MptConfig(d_model=32, n_heads=4, n_layers=1, max_seq_len=64),
    "FalconForCausalLM": lambda: transformers.FalconConfig(
        hidden_size=32, num_attention_heads=4, num_hidden_layers=1
    ),
    "GPTNeoForCausalLM": lambda: transformers.GPTNeoConfig(
        hidden_size=32, num_heads=4, num_layers=2, attention_types=[[["global", "local"], 1]], window_size=8
    ),
    "RoFormerForCausalLM": lambda: transformers.RoFormerConfig(
        hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=64, is_decoder=True
    ),
}


@pytest.mark.parametrize("name", sorted(UNROUTED))
def test_a_model_that_never_calls_mha_is_refused_at_load(name):
    cfg = UNROUTED[name]()
    cfg.vocab_size = VOCAB
    cls = getattr(transformers, name)
    with pytest.raises(mha.Unsupported, match=f"{name} computes its attention in its own code"):
        cls._from_config(cfg, attn_implementation="mha")
    # Switched later, transformers itself keeps such a model on its own attention (and warns).
    model = cls._from_config(cfg, attn_implementation="eager")
    model.set_attn_implementation("mha")
    assert model.config._attn_implementation == "eager"


def test_models_that_route_their_attention_load_on_mha():
    assert gpt2().config._attn_implementation == "mha"
    cfg = transformers.BartConfig(
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    )
    bart = transformers.BartForCausalLM._from_config(cfg, attn_implementation="mha")  # no class flag
    assert bart.config._attn_implementation == "mha"


# -- 2, 12. what MhaCache cannot serve, refused by name when it is made ------------------------------


def test_an_mha_cache_refuses_kv_shared_layers():
    cfg = transformers.Gemma3nTextConfig(
        num_hidden_layers=6,
        num_kv_shared_layers=2,
        layer_types=["sliding_attention", "full_attention"] * 3,
        vocab_size=VOCAB,
    )
    with pytest.raises(mha.Unsupported, match=r"layers 4-5 of Gemma3nTextConfig reuse an earlier layer's"):
        mha.transformers.MhaCache(cfg, 16)


def test_an_mha_cache_names_cross_attention_and_hybrid_layers():
    bart = transformers.BartConfig(vocab_size=VOCAB)
    with pytest.raises(mha.Unsupported, match="encoder-decoder model.*cross-attention"):
        mha.transformers.MhaCache(bart, 16)
    hybrid = transformers.Qwen3NextConfig(
        num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2, vocab_size=VOCAB
    )
    with pytest.raises(mha.Unsupported, match="layer 0 is of kind 'linear_attention'"):
        mha.transformers.MhaCache(hybrid, 16)


# -- 3. keywords that change the function -------------------------------------------------------------


def test_keywords_that_change_the_function_are_refused_by_name():
    q, k, v = operands(b=1, h=2, rows=3, keys=3, d=8)
    module = torch.nn.Module()
    forward = mha.transformers.attention_forward
    with torch.no_grad():
        want = forward(module, q, k, v, None, is_causal=True)[0]
        # What a model passes that leaves the function as the mask says: computed.
        got = forward(
            module, q, k, v, None, is_causal=True, position_ids=torch.arange(3), sliding_window=None
        )[0]
        close(got, want.double())
        for name, value, says in (
            ("indices", torch.zeros(1, 3, 2, dtype=torch.long), "sparse attention over selected keys"),
            ("block_indices", torch.zeros(1, 3, 1, dtype=torch.long), "selected key blocks"),
            ("head_bias", torch.zeros(2), "the keyword 'head_bias', which mha does not know"),
        ):
            with pytest.raises(mha.Unsupported, match=says):
                forward(module, q, k, v, None, is_causal=True, **{name: value})


# -- 4. the queries of a KV-shared layer, sliced for logits_to_keep ----------------------------------


def test_kv_shared_layers_sliced_for_logits_to_keep_match_eager():
    cfg = transformers.Gemma4TextConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_kv_shared_layers=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 2,
    )
    torch.manual_seed(0)
    model = transformers.Gemma4ForCausalLM._from_config(cfg, attn_implementation="eager").eval()
    ids = ids_of(tokens=12)
    want = logits(model, ids, logits_to_keep=3)
    model.set_attn_implementation("mha")
    got = logits(model, ids, logits_to_keep=3)
    assert got.shape == want.shape == (1, 3, VOCAB)
    close(got, want.double(), atol=1e-4)


# -- 7, 11. an MhaCache asked for another batch, and after a refused call ---------------------------


def test_an_mha_cache_refuses_a_step_of_another_batch_and_stays_usable():
    model = gpt2()
    cache = mha.transformers.MhaCache(model.config, 32, kv="fp32")
    ids = ids_of(batch=2, tokens=6)
    logits(model, ids, past_key_values=cache, use_cache=True)
    with pytest.raises(mha.InvalidArgument, match="a step of 1 sequences, and the cache holds 2"):
        logits(model, ids[:1, :1], past_key_values=cache, use_cache=True)
    with pytest.raises(mha.Unsupported, match="requires grad, with autograd enabled"):
        model(input_ids=ids[:, :1], past_key_values=cache, use_cache=True)  # autograd on
    assert cache.layers[0].cache.lengths == [6, 6]  # neither refused step appended anything
    # The cache goes on as if they had never been tried.
    fresh = mha.transformers.MhaCache(model.config, 32, kv="fp32")
    logits(model, ids, past_key_values=fresh, use_cache=True)
    step = ids_of(batch=2, tokens=1, seed=5)
    close(
        logits(model, step, past_key_values=cache, use_cache=True),
        logits(model, step, past_key_values=fresh, use_cache=True).double(),
        atol=0,
    )
    assert not hasattr(step, "_mha_cache_layer")


# -- 13. copies of a filled cache ----------------------------------------------------------------------


@pytest.mark.parametrize("kv", ["fp32", "int8"])
def test_a_filled_cache_deepcopies_and_pickling_names_the_way(kv):
    q, k, v = operands(b=1, h=2, rows=5, keys=5, d=16)
    cache = mha.AttentionCache(1, 16, 2, 16, kv=kv)
    options = dict(is_causal=True, causal_alignment="bottom_right", cache=cache)
    mha.attention(q, k, v, **options)
    twin = copy.deepcopy(cache)
    assert twin.lengths == [5] and twin.nbytes == cache.nbytes and twin._cache is not cache._cache
    step = operands(b=1, h=2, rows=1, keys=1, d=16, seed=9)
    a = mha.attention(*step, **options)
    b = mha.attention(*step, is_causal=True, causal_alignment="bottom_right", cache=twin)
    assert torch.equal(a, b)
    assert cache.lengths == twin.lengths == [6]
    for filled in (cache, cache._cache):
        with pytest.raises(TypeError, match=r"cannot be pickled.*copy.deepcopy\(cache\) copies it"):
            pickle.dumps(filled)


def test_a_prompt_cache_copied_for_two_continuations():
    model = gpt2()
    prompt = ids_of(tokens=8)
    cache = mha.transformers.MhaCache(model.config, 32, kv="int8")
    logits(model, prompt, past_key_values=cache, use_cache=True)
    first, second = ids_of(tokens=1, seed=3), ids_of(tokens=1, seed=4)
    copied = copy.deepcopy(cache)
    one = logits(model, first, past_key_values=cache, use_cache=True)
    two = logits(model, second, past_key_values=copied, use_cache=True)
    fresh = mha.transformers.MhaCache(model.config, 32, kv="int8")
    logits(model, prompt, past_key_values=fresh, use_cache=True)
    close(two, logits(model, second, past_key_values=fresh, use_cache=True).double(), atol=0)
    assert not torch.equal(one, two)


# -- 5, 14. out= under autograd and outside inference mode --------------------------------------------


@pytest.mark.parametrize("masked", [False, True])  # the plain call read in C++, the general path
def test_out_is_a_write_autograd_sees(masked):
    q, k, v = operands(b=1, h=2, rows=4, keys=4, d=8)
    x = torch.randn(1, 2, 4, 8, requires_grad=True)
    saved = x.exp()  # exp's backward reads its result
    mask = torch.ones(4, 4, dtype=torch.bool) if masked else None
    with torch.no_grad():
        mha.attention(q, k, v, mask, out=saved)
    close(saved.detach(), sdpa(q, k, v, attn_mask=mask))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()


@pytest.mark.parametrize("masked", [False, True])
def test_an_inference_tensor_as_out_outside_inference_mode_is_refused(masked):
    q, k, v = operands(b=1, h=2, rows=4, keys=4, d=8)
    mask = torch.ones(4, 4, dtype=torch.bool) if masked else None
    with torch.inference_mode():
        out = torch.empty(1, 2, 4, 8)
    with pytest.raises(mha.InvalidArgument, match="out is an inference tensor"):
        mha.attention(q, k, v, mask, out=out)
    with torch.inference_mode():
        mha.attention(q, k, v, mask, out=out)  # inside inference mode, as torch allows
    close(out, sdpa(q, k, v, attn_mask=mask))


def test_a_plans_out_is_a_write_autograd_sees():
    cfg = mha.Config(d_in=8, d_out=8, n_heads=2, context_length=8)
    rng = np.random.default_rng(0)
    weights = {
        f"{name}.weight": rng.uniform(-0.3, 0.3, (8, 8)).astype(np.float32)
        for name in ("W_query", "W_key", "W_value", "out_proj")
    }
    weights["out_proj.bias"] = np.zeros(8, np.float32)
    plan = mha.Plan(cfg, weights)
    x = torch.randn(1, 4, 8)
    w = torch.randn(1, 4, 8, requires_grad=True)
    saved = torch.randn(1, 4, 8)  # mul saves it for w's gradient
    product = (w * saved).sum()
    plan(x, out=saved)
    close(saved, plan(x).double(), atol=0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        product.backward()
    with torch.inference_mode():
        out = torch.empty(1, 4, 8)
    with pytest.raises(mha.InvalidArgument, match="out is an inference tensor"):
        plan(x, out=out)


# -- 15, 16. one dtype rule with a cache; keys expanded along the key dimension ----------------------


def test_a_cache_call_of_mixed_dtypes_is_refused_as_without_one():
    q, k, v = operands(b=1, h=2, rows=1, keys=1, d=16)
    cache = mha.AttentionCache(1, 8, 2, 16, kv="fp32")
    for call in (
        lambda: mha.attention(q, k.bfloat16(), v.bfloat16()),
        lambda: mha.attention(q, k.bfloat16(), v.bfloat16(), is_causal=True, cache=cache),
    ):
        with pytest.raises(mha.InvalidArgument, match="expected all float32 or all bfloat16"):
            call()
    assert cache.lengths == [0]


@pytest.mark.parametrize("kind", ["torch", "numpy", "cache"])
def test_keys_expanded_along_the_key_dimension_are_computed(kind):
    q = operands(b=1, h=2, rows=5, keys=5, d=8)[0]
    k = torch.randn(1, 2, 1, 8).expand(1, 2, 5, 8)
    v = torch.randn(1, 2, 5, 8)
    if kind == "cache":
        cache = mha.AttentionCache(1, 8, 2, 8, kv="fp32")
        got = mha.attention(q, k, v, is_causal=True, causal_alignment="bottom_right", cache=cache)
        want = sdpa(q, k, v, is_causal=True)
    elif kind == "numpy":
        got = mha.attention(q.numpy(), np.broadcast_to(k.numpy(), k.shape), v.numpy())
        want = sdpa(q, k, v)
    else:
        got = mha.attention(q, k, v)
        want = sdpa(q, k, v)
    close(got, want)


# -- 6, 9. operands swapped by another thread; threads past the cores --------------------------------


def run_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="2")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )


def test_an_operand_set_to_other_memory_by_another_thread_mid_call_is_held():
    # Before the plain call held its operands' storages, the first call crashed (SIGSEGV).
    done = run_python(
        """
        import threading, torch, mha
        q = torch.randn(1, 4, 64, 64); k = torch.randn(1, 4, 4096, 64); v = torch.randn(1, 4, 4096, 64)
        stop = False
        def swap():
            while not stop:
                k.set_(torch.randn(1, 4, 4096, 64)); v.set_(torch.randn(1, 4, 4096, 64))
        t = threading.Thread(target=swap); t.start()
        try:
            for _ in range(200):
                mha.attention(q, k, v, is_causal=True)
        finally:
            stop = True; t.join()
        print("held")
        """
    )
    assert done.returncode == 0 and done.stdout.strip() == "held", done.stderr[-2000:]


def test_openmp_threads_past_the_cores_start_no_more_threads():
    done = run_python(
        """
        import os, torch, mha
        q, k, v = (torch.randn(1, 16, 256, 64) for _ in range(3))
        mha.attention(q, k, v, backend="tbb", executor="openmp", threads=1024, is_causal=True)
        print(len(os.listdir("/proc/self/task")))
        """
    )
    if done.returncode != 0 and "no OpenMP" in done.stderr:
        pytest.skip("this build of mha has no OpenMP executor")
    assert done.returncode == 0, done.stderr[-2000:]
    # PyTorch's own threads and the team: far from the 1024 asked for.
    assert int(done.stdout.split()[-1]) <= 2 * max(os.cpu_count() or 1, 2) + 8


# -- 10. an int8 cache and values past its range --------------------------------------------------------


def test_an_int8_cache_refuses_values_past_its_range_by_name():
    q, k, v = operands(b=1, h=2, rows=1, keys=1, d=16)
    cache = mha.AttentionCache(1, 8, 2, 16, kv="int8")
    v = v.clone()
    v[0, 1, 0, 3] = 2.0**127
    with pytest.raises(mha.InvalidArgument, match=r"a value \(sequence 0, K/V head 1, token 0, element 3\)"):
        mha.attention(q, k, v, is_causal=True, cache=cache)
    assert cache.lengths == [0]
    v[0, 1, 0, 3] = 2.0**126  # within the range: finite
    assert torch.isfinite(mha.attention(q, k, v, is_causal=True, cache=cache)).all()
