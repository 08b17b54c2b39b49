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
then the input's T). Safetensors files are written without an extra package
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
    KVCacheMultiHeadAttention,
    KVCacheMultiHeadAttentionWrapper,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
)

# tools/mhapy/golden.py -> the repository's tests/golden
GOLDEN_DIR = pathlib.Path(__file__).resolve().parents[2] / "tests" / "golden"
# The module of each file layout (cases.json "layout", README "Weight files"), and with a KV
# cache for the incremental cases.
LAYOUTS = {"split": MultiHeadAttention, "wrapper": MultiHeadAttentionWrapper}
KV_LAYOUTS = {"split": KVCacheMultiHeadAttention, "wrapper": KVCacheMultiHeadAttentionWrapper}


# name, layout, B, T, d_in, d_out (total), H, context_length, and what each case covers.
# heads_in_metadata False: the test passes --heads. batch 0: a 2-D (T, d_in) input. prefill and
# chunk: an incremental case (new cases go last: a case's seed is its index).
# fmt: off
CASES = [
    dict(name="split_basic", layout="split", batch=2, seq=6, d_in=8, d_out=8, heads=2, context=8),
    dict(name="split_qkv_bias", layout="split", batch=1, seq=5, d_in=6, d_out=12, heads=3, context=5,
         qkv_bias=True),
    dict(name="split_no_out_proj", layout="split", batch=2, seq=7, d_in=10, d_out=8, heads=4, context=7,
         out_proj=False, heads_in_metadata=False),
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
         context=8, qkv_bias=True, heads_in_metadata=False),
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
]
# What a case leaves out.
DEFAULTS = dict(qkv_bias=False, causal=True, out_proj=True, heads_in_metadata=True, dtype="F32",
                input_dtype=np.float32, mask_dtype=None, prefill=None, chunk=None)
# fmt: on


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
    switches = {k: c[k] for k in ("qkv_bias", "causal", "out_proj")}
    incremental = c["chunk"] is not None
    layouts = KV_LAYOUTS if incremental else LAYOUTS
    module = layouts[c["layout"]](c["d_in"], c["d_out"], c["context"], c["heads"], **switches)
    module.eval()
    round_to(module, c["dtype"])

    batch = max(c["batch"], 1)
    x = torch.randn(batch, c["seq"], c["d_in"]) * 2.0
    with torch.no_grad():
        y = incremental_calls(module, x, c["prefill"], c["chunk"]) if incremental else module(x)
    if c["batch"] == 0:  # a 2-D (T, d_in) file for the command's 2-D path
        x, y = x[0], y[0]

    name = c["name"]
    tensors = {}
    for key, t in module.state_dict().items():
        dtype = (c["mask_dtype"] or c["dtype"]) if key.endswith("mask") else c["dtype"]
        tensors[key] = (dtype, t.shape, tensor_bytes(t.detach().contiguous(), dtype))
    metadata = {"num_heads": str(c["heads"])} if c["heads_in_metadata"] else {}
    write_safetensors(out / f"{name}.safetensors", tensors, metadata)
    np.save(out / f"{name}.x.npy", x.numpy().astype(c["input_dtype"]))
    np.save(out / f"{name}.y.npy", y.numpy().astype(np.float32))
    entry = {
        "name": name,
        "layout": c["layout"],
        "heads_option": None if c["heads_in_metadata"] else c["heads"],
        "causal": c["causal"],
        "weights": f"{name}.safetensors",
        "input": f"{name}.x.npy",
        "output": f"{name}.y.npy",
    }
    return entry | ({"prefill": c["prefill"], "chunk": c["chunk"]} if incremental else {})


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
