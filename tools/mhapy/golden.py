"""Writes the PyTorch goldens: for each case, the module's state_dict (safetensors), an input and
PyTorch's output (.npy), and cases.json describing how to run them.

The modules are mhapy.torch_modules' (docs/design.md §1): the split-weight MultiHeadAttention
and the wrapper of CausalAttention heads, dropout 0 in eval mode, with and without the mask
(`causal`) and out_proj. The cases with `prefill` and `chunk` are incremental (docs/design.md
§1.4): the same modules with a KV cache (KVCacheMultiHeadAttention, KVCacheMultiHeadAttentionWrapper,
the seeds' torch.cat cache) are fed `prefill` tokens in a first call (none when 0), then `chunk`
tokens per call with use_cache=True, and the output file holds every call's y in order, one
(B, T, d_out) tensor; `mha run --incremental --prefill N --chunk S` feeds the input the same way.
Those modules register no mask buffer, so their weight files have none (the context length is
then the input's T). The other layouts mha reads (mha/io.hpp) come from the modules of the
other formats: GroupedQueryAttention (grouped K/V heads and rotary embedding, as the seeds'
lineage writes it; under Hugging Face's Llama names for the llama layout), nn.MultiheadAttention
with a causal attn_mask, and GPT2Attention; cases.json names each file's layout and the options
the test gives mha (heads_option, kv_heads_option, rope_base_option, prefix: one block of a
whole-model checkpoint, the others and the model's other tensors random, there to be skipped).
Safetensors files are written without an extra package
(mhapy.tensor_files): F32, F16, BF16, F64 and a BOOL mask all appear, so the readers'
conversions are checked against PyTorch too.

Run with Debian's interpreter and python3-torch, from the repository:
    PYTHONPATH=tools /usr/bin/python3 -m mhapy.golden [--out DIR]   (default: tests/golden)
The tests need only the files this writes, not torch. The committed y.npy files were computed
with OpenBLAS's SkylakeX kernels under torch: other BLAS kernels give outputs that differ in the
last bits (OPENBLAS_CORETYPE=SkylakeX reproduces them on any x86-64 with AVX-512), everything
else is reproduced byte for byte (tools/tests/test_golden.py).
"""

import argparse
import json
import pathlib

import numpy as np
import torch

from .tensor_files import write_safetensors
from .torch_modules import (
    GPT2Attention,
    GroupedQueryAttention,
    KVCacheMultiHeadAttention,
    KVCacheMultiHeadAttentionWrapper,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    TorchNNMultiheadAttention,
)

# tools/mhapy/golden.py -> the repository's tests/golden
GOLDEN_DIR = pathlib.Path(__file__).resolve().parents[2] / "tests" / "golden"
# The module of each file layout (cases.json "layout", docs/cli.md, "Weight files"), and with a KV
# cache for the incremental cases.
LAYOUTS = {"split": MultiHeadAttention, "wrapper": MultiHeadAttentionWrapper}
KV_LAYOUTS = {"split": KVCacheMultiHeadAttention, "wrapper": KVCacheMultiHeadAttentionWrapper}


# name, layout, B, T, d_in, d_out (total), H, context_length, and what each case covers.
# batch 0: a 2-D (T, d_in) input. prefill and chunk: an incremental case (new cases go last: a
# case's seed is its index). module: the PyTorch module of the other layouts (MODULES; None: the
# seeds' module of `layout`). metadata: the file's (None: num_heads). options: what the test
# gives mha (heads, kv_heads, rope_base, prefix). blocks: a whole-model checkpoint of that many
# blocks whose block `block` is the case's module.
# fmt: off
CASES = [
    dict(name="split_basic", layout="split", batch=2, seq=6, d_in=8, d_out=8, heads=2, context=8),
    dict(name="split_qkv_bias", layout="split", batch=1, seq=5, d_in=6, d_out=12, heads=3, context=5,
         qkv_bias=True),
    dict(name="split_no_out_proj", layout="split", batch=2, seq=7, d_in=10, d_out=8, heads=4, context=7,
         out_proj=False, metadata={}, options=dict(heads=4)),
    dict(name="split_noncausal_f16", layout="split", batch=2, seq=9, d_in=8, d_out=8, heads=2, context=12,
         causal=False, dtype="F16"),
    dict(name="split_h96_hd2", layout="split", batch=1, seq=4, d_in=8, d_out=192, heads=96, context=4,
         out_proj=False),
    dict(name="split_t1_bf16", layout="split", batch=2, seq=1, d_in=8, d_out=12, heads=3, context=4,
         dtype="BF16"),
    dict(name="split_b3_f64", layout="split", batch=3, seq=5, d_in=12, d_out=6, heads=2, context=6,
         qkv_bias=True, dtype="F64", input_dtype=np.float64),
    dict(name="split_t33", layout="split", batch=2, seq=33, d_in=32, d_out=32, heads=4, context=40,
         qkv_bias=True),
    dict(name="wrapper_basic", layout="wrapper", batch=2, seq=5, d_in=6, d_out=6, heads=3, context=6,
         out_proj=False),
    dict(name="wrapper_qkv_bias_out_proj_2d", layout="wrapper", batch=0, seq=7, d_in=5, d_out=6, heads=2,
         context=8, qkv_bias=True, metadata={}, options=dict(heads=2)),
    dict(name="wrapper_noncausal_bool_mask", layout="wrapper", batch=3, seq=3, d_in=4, d_out=8, heads=4,
         context=3, causal=False, out_proj=False, mask_dtype="BOOL"),
    # Through a KV cache: a prefill, then token by token (both formulations); chunks of 3 after a
    # prefill (the causal mask's bottom-right corner, T > 1 after past > 0); non-causal chunks
    # from the start, where each call sees the tokens fed so far, never later ones.
    dict(name="split_kv_prefill_tokens", layout="split", batch=2, seq=9, d_in=8, d_out=12, heads=3,
         context=9, qkv_bias=True, prefill=4, chunk=1),
    dict(name="wrapper_kv_prefill_tokens", layout="wrapper", batch=3, seq=6, d_in=6, d_out=8, heads=4,
         context=6, prefill=2, chunk=1),
    dict(name="split_kv_chunks", layout="split", batch=2, seq=11, d_in=10, d_out=8, heads=2, context=11,
         out_proj=False, prefill=5, chunk=3),
    dict(name="wrapper_kv_chunks_noncausal", layout="wrapper", batch=2, seq=10, d_in=8, d_out=8, heads=2,
         context=10, causal=False, qkv_bias=True, prefill=0, chunk=4),
    # Grouped K/V heads and rotary embedding as the seeds' lineage writes them (the Llama chapter's
    # GroupedQueryAttention): split names, W_key and W_value of num_kv_groups · head_dim rows, an
    # out_proj without bias. The K/V heads from the metadata the seeds name num_kv_groups, or
    # from the shapes alone (multi-query) with H and the base given as options.
    dict(name="gqa_rope", module="gqa", layout="split", batch=2, seq=12, d_in=12, d_out=16, heads=4, kv_heads=2,
         rope_base=10000.0, context=16, metadata=dict(num_heads="4", num_kv_groups="2", rope_base="10000")),
    dict(name="gqa_rope_mqa_options", module="gqa", layout="split", batch=1, seq=40, d_in=16, d_out=24, heads=6,
         kv_heads=1, rope_base=500000.0, context=64, metadata={}, options=dict(heads=6, rope_base=500000.0)),
    # torch.nn.MultiheadAttention (in_proj), causal through attn_mask: boolean with biases; a float
    # -inf mask without (bias=False), H as an option, a 2-D input.
    dict(name="torch_mha_causal", module="torch_mha", layout="torch_mha", batch=2, seq=7, d_in=12, d_out=12,
         heads=3, context=7, qkv_bias=True),
    dict(name="torch_mha_no_bias_float_mask", module="torch_mha", layout="torch_mha", batch=0, seq=6, d_in=8,
         d_out=8, heads=2, context=6, float_mask=True, metadata={}, options=dict(heads=2)),
    # GPT-2's attention (Conv1D: weights stored transposed; the mask buffers), alone and as block
    # h.1.attn. of a whole-model checkpoint (metadata {"format": "pt"} as Hugging Face writes it).
    dict(name="gpt2_attn", module="gpt2", layout="gpt2", batch=2, seq=9, d_in=16, d_out=16, heads=4, context=12),
    dict(name="gpt2_model_h1", module="gpt2", layout="gpt2", batch=2, seq=8, d_in=16, d_out=16, heads=2,
         context=10, blocks=3, block=1, metadata={"format": "pt"}, options=dict(heads=2, prefix="h.1.attn.")),
    # Llama's attention (Hugging Face's names, the function of GroupedQueryAttention: grouped K/V
    # heads, RoPE, no biases): metadata as Hugging Face's config names it; and layer 1 of a
    # whole-model BF16 checkpoint, everything given as options (the prefix without its '.').
    dict(name="llama_attn", module="gqa", layout="llama", batch=2, seq=10, d_in=16, d_out=16, heads=4, kv_heads=2,
         rope_base=500000.0, context=16, metadata=dict(num_heads="4", num_kv_heads="2", rope_theta="500000.0")),
    dict(name="llama_model_layer1", module="gqa", layout="llama", batch=1, seq=17, d_in=16, d_out=16, heads=4,
         kv_heads=2, rope_base=10000.0, context=32, dtype="BF16", blocks=2, block=1, metadata={"format": "pt"},
         options=dict(heads=4, kv_heads=2, rope_base=10000.0, prefix="model.layers.1.self_attn")),
]
# What a case leaves out.
DEFAULTS = dict(qkv_bias=False, causal=True, out_proj=True, dtype="F32",
                input_dtype=np.float32, mask_dtype=None, prefill=None, chunk=None, module=None, kv_heads=None,
                rope_base=None, float_mask=False, metadata=None, options={}, blocks=None, block=None)
# fmt: on

# The modules of the other layouts, from a case.
MODULES = {
    "gqa": lambda c: GroupedQueryAttention(
        c["d_in"], c["d_out"], c["context"], c["heads"], c["kv_heads"], c["rope_base"]
    ),
    "torch_mha": lambda c: TorchNNMultiheadAttention(
        c["d_out"], c["heads"], c["context"], c["causal"], bias=c["qkv_bias"], float_mask=c["float_mask"]
    ),
    "gpt2": lambda c: GPT2Attention(c["d_out"], c["heads"], c["context"]),
}
# Hugging Face's LlamaAttention computes GroupedQueryAttention's function (its repeat_kv gives
# query head h the K/V head h // group_size, as repeat_interleave does) under these names.
LLAMA_NAMES = {"W_query": "q_proj", "W_key": "k_proj", "W_value": "v_proj", "out_proj": "o_proj"}
# A whole-model checkpoint: the prefix of block i, and the other tensors (name, shape) of a model
# of width d (a vocabulary of 11 tokens, 4 d hidden units).
MODEL_PREFIX = {"gpt2": "h.{}.attn.", "llama": "model.layers.{}.self_attn."}


def model_tensors(layout, blocks, d):
    if layout == "gpt2":
        per_block = [("ln_1.weight", (d,)), ("ln_1.bias", (d,)), ("ln_2.weight", (d,)), ("ln_2.bias", (d,)),
                     ("mlp.c_fc.weight", (d, 4 * d)), ("mlp.c_fc.bias", (4 * d,)),
                     ("mlp.c_proj.weight", (4 * d, d)), ("mlp.c_proj.bias", (d,))]  # fmt: skip
        named = [(f"h.{i}.{n}", s) for i in range(blocks) for n, s in per_block]
        return (
            [("wte.weight", (11, d)), ("wpe.weight", (32, d))]
            + named
            + [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
        )
    per_block = [("input_layernorm.weight", (d,)), ("post_attention_layernorm.weight", (d,)),
                 ("mlp.gate_proj.weight", (4 * d, d)), ("mlp.up_proj.weight", (4 * d, d)),
                 ("mlp.down_proj.weight", (d, 4 * d))]  # fmt: skip
    named = [(f"model.layers.{i}.{n}", s) for i in range(blocks) for n, s in per_block]
    return (
        [("model.embed_tokens.weight", (11, d))]
        + named
        + [("model.norm.weight", (d,)), ("lm_head.weight", (11, d))]
    )


def tensor_bytes(t, dtype):
    if dtype == "F32":
        return t.float().numpy().astype("<f4").tobytes()
    if dtype == "F16":
        return t.half().numpy().astype("<f2").tobytes()
    if dtype == "BF16":
        return t.bfloat16().view(torch.int16).numpy().astype("<i2").tobytes()
    if dtype == "F64":
        return t.double().numpy().astype("<f8").tobytes()
    if dtype == "BOOL":
        return t.bool().numpy().astype(np.uint8).tobytes()
    raise ValueError(dtype)


def round_to(module, dtype):
    """Rounds the parameters to the storage dtype, so PyTorch computes with what the file holds."""
    cast = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}[dtype]
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(cast).float())


def make_case(index, case, out):
    c = DEFAULTS | case
    torch.manual_seed(1000 + index)
    incremental = c["chunk"] is not None
    if c["module"] is None:
        switches = {k: c[k] for k in ("qkv_bias", "causal", "out_proj")}
        layouts = KV_LAYOUTS if incremental else LAYOUTS
        blocks = [layouts[c["layout"]](c["d_in"], c["d_out"], c["context"], c["heads"], **switches)]
    else:
        blocks = [MODULES[c["module"]](c) for _ in range(c["blocks"] or 1)]
    module = blocks[c["block"] or 0]
    for m in blocks:
        m.eval()
        round_to(m, c["dtype"])

    batch = max(c["batch"], 1)
    x = torch.randn(batch, c["seq"], c["d_in"]) * 2.0
    with torch.no_grad():
        y = incremental_calls(module, x, c["prefill"], c["chunk"]) if incremental else module(x)
    if c["batch"] == 0:  # a 2-D (T, d_in) file for the command's 2-D path
        x, y = x[0], y[0]

    name = c["name"]
    tensors = {}
    for i, m in enumerate(blocks):
        prefix = MODEL_PREFIX[c["layout"]].format(i) if c["blocks"] else ""
        for key, t in state_dict(m, c["layout"]).items():
            dtype = (c["mask_dtype"] or c["dtype"]) if key.endswith("mask") else c["dtype"]
            tensors[prefix + key] = (dtype, t.shape, tensor_bytes(t.detach().contiguous(), dtype))
    if c["blocks"]:
        for key, shape in model_tensors(c["layout"], c["blocks"], c["d_out"]):
            tensors[key] = (c["dtype"], shape, tensor_bytes(torch.randn(shape), c["dtype"]))
    metadata = {"num_heads": str(c["heads"])} if c["metadata"] is None else c["metadata"]
    write_safetensors(out / f"{name}.safetensors", tensors, metadata)
    np.save(out / f"{name}.x.npy", x.numpy().astype(c["input_dtype"]))
    np.save(out / f"{name}.y.npy", y.numpy().astype(np.float32))
    options = c["options"]
    entry = {
        "name": name,
        "layout": c["layout"],
        "heads_option": options.get("heads"),
        "causal": c["causal"],
        "weights": f"{name}.safetensors",
        "input": f"{name}.x.npy",
        "output": f"{name}.y.npy",
    }
    entry |= {f"{k}_option": options[k] for k in ("kv_heads", "rope_base") if k in options}
    entry |= {"prefix": options["prefix"]} if "prefix" in options else {}
    return entry | ({"prefill": c["prefill"], "chunk": c["chunk"]} if incremental else {})


def state_dict(module, layout):
    """The module's state_dict under the names of `layout`."""
    if layout == "torch_mha":  # nn.MultiheadAttention's own, without the wrapper's mask buffer
        return module.attn.state_dict()
    if layout == "llama":
        return {LLAMA_NAMES[k.split(".")[0]] + k[k.index(".") :]: t for k, t in module.state_dict().items()}
    return module.state_dict()


def incremental_calls(module, x, prefill, chunk):
    """x fed through the module's KV cache as `mha run --incremental` feeds it: `prefill` tokens
    first (none when 0), then `chunk` per call; every call's y, concatenated on the tokens axis."""
    module.reset_cache()
    outputs, at = [], 0
    while at < x.shape[1]:
        t = min(prefill if at == 0 and prefill > 0 else chunk, x.shape[1] - at)
        outputs.append(module(x[:, at : at + t], use_cache=True))
        at += t
    return torch.cat(outputs, dim=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=GOLDEN_DIR, help=f"folder (default {GOLDEN_DIR})")
    out = parser.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    manifest = {
        "generator": "python3 -m mhapy.golden",
        "torch": torch.__version__,
        "cases": [make_case(i, case, out) for i, case in enumerate(CASES)],
    }
    (out / "cases.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in out.iterdir() if p.suffix in (".npy", ".safetensors"))
    print(f"wrote {len(CASES)} cases to {out} ({total} bytes of tensors)")


if __name__ == "__main__":
    main()
