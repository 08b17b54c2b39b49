"""Whole models on each attention implementation: what choosing mha's attention does to a
Hugging Face model's prefill and decode on this machine (scripts/sweep.sh --with-models).

    PYTHONPATH=tools:<build>/python <peers' python> -m mhapy.models_bench --out results/x-models.json

For each model (random weights from a fixed seed: the same weights in every run and for every
implementation), precision, batch and thread count, and for attn_implementation "eager", "sdpa"
and "mha": the time to the first token (a prefill of --prefill tokens) and the decode rate
(--decode tokens greedily after it, through transformers' own cache), best of --repetitions, and
the share of each in the attention function (timed around it). Each implementation's logits on a
short prompt are first checked against "sdpa"'s (fp32: 1e-4 of the largest; bf16: 2^-5) and a
failing one is recorded as such, not timed. Writes JSON (one record per case), which
`python3 -m mhapy.report ... --models FILE` turns into the report's "Whole models" section.
OpenVINO through optimum-intel, the end-to-end peer for whole models, is not run: optimum-intel
is not in the peers' pinned environment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
from collections.abc import Iterator
from typing import Any

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
        max_position_embeddings=4096,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
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
IMPLEMENTATIONS = ("eager", "sdpa", "mha")


def build(name: str, dtype: Any) -> Any:
    import torch
    import transformers

    spec = dict(MODELS[name])
    kind = spec.pop("kind")
    cfg = (transformers.GPT2Config if kind == "gpt2" else transformers.LlamaConfig)(**spec)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, attn_implementation="sdpa", dtype=torch.float32
    )
    return model.to(dtype).eval()


@contextlib.contextmanager
def timed_attention(model: Any, implementation: str, clock: dict) -> Iterator[None]:
    """Adds the seconds spent inside the attention function to clock["attention"]."""
    import transformers

    def wrap(f):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                clock["attention"] += time.perf_counter() - start

        return timed

    mapping = transformers.AttentionInterface._global_mapping
    if implementation == "eager":  # the model's own module-level function, looked up per call
        module = sys.modules[type(model).__module__]
        saved = module.eager_attention_forward
        module.eager_attention_forward = wrap(saved)
        try:
            yield
        finally:
            module.eager_attention_forward = saved
        return
    saved = mapping[implementation]
    mapping[implementation] = wrap(saved)
    try:
        yield
    finally:
        mapping[implementation] = saved


def check(model: Any, implementation: str, dtype: Any) -> str | None:
    """None when the implementation's logits on a short prompt agree with sdpa's, else why not."""
    import torch

    ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        want = model(ids).logits.double()
        model.set_attn_implementation(implementation)
        got = model(ids).logits.double()
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    bound = (1e-4 if dtype == torch.float32 else 2.0**-5) * scale
    return None if err <= bound else f"logits differ from sdpa's by {err:.3g} (bound {bound:.3g})"


def measure(model: Any, implementation: str, batch: int, prefill: int, decode: int, repetitions: int) -> dict:
    import torch

    model.set_attn_implementation(implementation)
    ids = torch.randint(
        0, model.config.vocab_size, (batch, prefill), generator=torch.Generator().manual_seed(2)
    )
    best: dict[str, float] = {}
    for _ in range(repetitions):
        clock = {"attention": 0.0}
        with timed_attention(model, implementation, clock), torch.no_grad():
            start = time.perf_counter()
            model(ids, use_cache=False)
            ttft = time.perf_counter() - start
            prefill_attention = clock["attention"]
            clock["attention"] = 0.0
            start = time.perf_counter()
            model.generate(ids, max_new_tokens=decode, min_new_tokens=decode, do_sample=False, pad_token_id=0)
            total = time.perf_counter() - start
        decode_s = max(total - ttft, 1e-9)  # generate's prefill costs what the forward did
        decode_attention = max(clock["attention"] - prefill_attention, 0.0)
        if not best or ttft < best["ttft_s"]:
            best.update(ttft_s=ttft, prefill_attention_share=prefill_attention / ttft)
        rate = batch * (decode - 1) / decode_s
        if "decode_tokens_per_s" not in best or rate > best["decode_tokens_per_s"]:
            best.update(
                decode_tokens_per_s=rate, decode_attention_share=min(decode_attention / decode_s, 1.0)
            )
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mhapy.models_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--models", default="gpt2,llama1b", help=f"of {', '.join(MODELS)}")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", default="1,0", help="0: all cores")
    parser.add_argument("--attention", default=",".join(IMPLEMENTATIONS))
    parser.add_argument("--prefill", type=int, default=1024)
    parser.add_argument("--decode", type=int, default=128)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)

    import os

    import torch

    import mha.transformers  # noqa: F401  (registers "mha")

    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    records = []
    for name in args.models.split(","):
        if name not in MODELS:
            parser.error(f"--models: {name!r} is not one of {', '.join(MODELS)}")
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            model = build(name, dtype)
            verdicts = {impl: check(model, impl, dtype) for impl in args.attention.split(",")}
            for threads in (int(t) for t in args.threads.split(",")):
                torch.set_num_threads(threads or os.cpu_count() or 1)
                for batch in (int(b) for b in args.batches.split(",")):
                    for impl in args.attention.split(","):
                        record = dict(
                            model=name,
                            dtype=dtype_name,
                            batch=batch,
                            threads=torch.get_num_threads(),
                            attention=impl,
                            prefill=args.prefill,
                            decode=args.decode,
                            cpu=cpu,
                        )
                        if verdicts[impl]:
                            record["error"] = verdicts[impl]
                        else:
                            record.update(
                                measure(model, impl, batch, args.prefill, args.decode, args.repetitions)
                            )
                        records.append(record)
                        print(json.dumps(record), flush=True)
    with open(args.out, "w") as f:
        json.dump({"context": {"cpu": cpu, "torch": torch.__version__}, "models": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
