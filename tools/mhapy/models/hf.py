"""The Hugging Face models the models bench (mhapy.models.bench) runs, by name, with random
weights; the attention implementations it compares; and the KV cache each decodes through."""

from __future__ import annotations

from typing import Any

from .openvino import IMPLEMENTATIONS as OPENVINO

MODELS = {
    # GPT-2 small's shape (124M parameters).
    "gpt2": dict(kind="gpt2", n_embd=768, n_head=12, n_layer=12, vocab_size=50257, n_positions=2048),
    # Llama 3.2 1B's shape: 16 layers, 32 heads of 64 over 8 K/V heads, llama3 RoPE.
    "llama1b": dict(
        kind="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=True,
    ),
    # Gemma 3 270M's shape (its config.json): 18 layers, five sliding ones (a window of 512) then a
    # full one, 4 query heads of 256 over one K/V head, a 262k vocabulary (tied).
    "gemma3": dict(
        kind="gemma3",
        hidden_size=640,
        intermediate_size=2048,
        num_hidden_layers=18,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        vocab_size=262144,
        max_position_embeddings=32768,
        sliding_window=512,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
        rope_parameters={
            "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        query_pre_attn_scalar=256,
        tie_word_embeddings=True,
    ),
    # A small one for tests and quick looks.
    "tiny": dict(
        kind="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=512,
    ),
}
# "mha" is mha's attention on the executor it picks (inside PyTorch: PyTorch's own OpenMP
# workers); "mha_tbb" the same on mha's own oneTBB workers (what "mha" ran on before), beside it;
# "mha_fp32", "mha_int8", "mha_bf16", "mha_k8v4" and "mha_int4" mha's attention with its own KV
# cache in that format (mha.transformers.MhaCache, appended in place) instead of transformers' DynamicCache
# (concatenated into new tensors at each step): mha_fp32 against mha is the cache alone.
# "sdpa_static" is sdpa with transformers' StaticCache (preallocated, written in place: no
# concatenation per step), the strongest of transformers' own caches for a long decode.
# "openvino" and "openvino_u8": OpenVINO through optimum-intel with its KV cache in the
# precision it picks on this CPU / in u8 (mhapy.models.openvino).
IMPLEMENTATIONS = (
    "eager",
    "sdpa",
    "sdpa_static",
    "mha",
    "mha_tbb",
    "mha_fp32",
    "mha_int8",
    "mha_bf16",
    "mha_k8v4",
    "mha_int4",
    *OPENVINO,
)
CACHED = {"mha_fp32": "fp32", "mha_int8": "int8", "mha_bf16": "bf16", "mha_k8v4": "k8v4", "mha_int4": "int4"}
# GPT-2 small with 16k positions (random weights): a long context on a small model.
MODELS["gpt2_16k"] = dict(MODELS["gpt2"], n_positions=16384)


def attention_of(implementation: str) -> str:
    """The attn_implementation an implementation runs."""
    if implementation == "sdpa_static":
        return "sdpa"
    return "mha" if implementation in CACHED else implementation


def cache_for(model: Any, implementation: str, capacity: int) -> Any:
    """The KV cache an implementation decodes through: an MhaCache for mha_fp32 / mha_int8 /
    mha_bf16 / mha_k8v4 / mha_int4, a StaticCache for sdpa_static, else None (transformers'
    DynamicCache)."""
    if implementation == "sdpa_static":
        import transformers

        return transformers.StaticCache(config=model.config, max_cache_len=capacity)
    if implementation not in CACHED:
        return None
    import mha.transformers

    return mha.transformers.MhaCache(model.config, capacity, kv=CACHED[implementation])


def cache_bytes(cache: Any) -> int:
    """The bytes a cache holds: an MhaCache's storage, or a DynamicCache's key and value tensors."""
    if hasattr(cache, "nbytes"):
        return int(cache.nbytes)
    return sum(
        layer.keys.nbytes + layer.values.nbytes
        for layer in cache.layers
        if getattr(layer, "keys", None) is not None
    )


def build(name: str, dtype: Any, layers: int = 0) -> Any:
    """The model `name` with random weights (seed 0) in `dtype`; `layers` > 0: only its first
    `layers` layers."""
    import torch
    import transformers

    spec = dict(MODELS[name])
    kind = spec.pop("kind")
    if layers:
        spec["n_layer" if kind == "gpt2" else "num_hidden_layers"] = layers
        if "layer_types" in spec:
            spec["layer_types"] = spec["layer_types"][:layers]
    configs = {
        "gpt2": transformers.GPT2Config,
        "llama": transformers.LlamaConfig,
        "gemma3": transformers.Gemma3TextConfig,
    }
    cfg = configs[kind](**spec)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, attn_implementation="sdpa", dtype=torch.float32
    )
    return model.to(dtype).eval()


def filled_synthetically(model: Any, implementation: str, batch: int, tokens: int, capacity: int) -> Any:
    """A cache holding `tokens` tokens per sequence of random keys and values (seed 4, N(0, 1);
    the same for every implementation's cache), as the implementation's cache_for or a
    DynamicCache: a long context without a prefill's cost. mha's caches take them through mha's
    attention function (a call of `tokens` random query rows, untimed), as a prefill does; the
    queries have one head per K/V head (grouped heads of one: the cache appends the same keys and
    values for any query heads, at a fraction of the work, a quarter for Llama's 32 over 8)."""
    import torch
    import transformers

    import mha.transformers

    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    dtype = next(model.parameters()).dtype
    cache = cache_for(model, implementation, capacity)
    if cache is None:
        cache = transformers.DynamicCache(config=config)
    # Keys and values from one generator, the queries mha's caches need from another: every
    # implementation's layers get the same keys and values.
    g, queries = torch.Generator().manual_seed(4), torch.Generator().manual_seed(5)
    positions = {"cache_position": torch.arange(tokens)}
    for layer in range(config.num_hidden_layers):
        k, v = (torch.randn(batch, kv_heads, tokens, head_dim, generator=g).to(dtype) for _ in "kv")
        k, v = cache.update(k, v, layer, positions)
        if implementation in CACHED:  # mha's cache: appended by mha's attention function
            q = torch.randn(batch, kv_heads, tokens, head_dim, generator=queries).to(dtype)
            mha.transformers.attention_forward(None, q, k, v, None, is_causal=True)
    return cache
