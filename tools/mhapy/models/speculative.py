"""Speculative decoding in a real model, end to end: transformers' generate() with prompt-lookup
decoding (prompt_lookup_num_tokens: candidates copied from the prompt's n-grams) and with
assisted generation (a draft model), against plain greedy decoding, per attention implementation
and KV cache, on Gemma 3 270M's real weights (scripts/gemma3-model.sh) over real text that
repeats itself.

    PYTHONPATH=tools:<build>/python <peers' python> -m mhapy.models.speculative \
        [--model DIR] --prompt-tokens 1024 --new-tokens 128 --caches sdpa,mha_int8 --out F

Each prompt is a real document (GPL-3 from /usr/share/common-licenses, the source of Python's
json.encoder module) cut to --prompt-tokens tokens, followed by a request to quote it and its
first line again, so that the continuation repeats the prompt (what prompt lookup is for: code
edits, quoting, summaries that cite). Per prompt and cache (mhapy.models.hf' implementations:
"sdpa" with transformers' DynamicCache, "mha_int8" with an int8 MhaCache, ...), each way of
decoding runs --new-tokens greedy tokens, --rounds times:

- "greedy": generate() one token per step;
- "lookup": prompt-lookup decoding, --lookup candidate tokens per step at most;
- "assisted": with --draft-layers > 0, a draft model made of the model's first N layers (its own
  embedding, final norm and head: a self-speculative drafter, as LayerSkip's early exit),
  through transformers' DynamicCache.

Recorded: the new tokens and whether they equal greedy's through the same cache (speculation must
not change them), the decode time (generate() of all the new tokens less generate() of the first,
the prefill's, measured once per prompt and cache: medians over the rounds), tokens/s, and the model's forward calls (the first
prefills the prompt; each verifies the drafted tokens it is fed, the first's too) with the tokens
they fed: accepted drafted tokens = new tokens - calls, acceptance = accepted / drafted. Writes
JSON (a context and a record per case) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .accuracy import LICENCES, case, cpu_model, failure
from .arguments import names
from .hf import CACHED

KIND = "speculative"
VERSION = 1
# Asked after the document: its quoting starts with the document's first line, given again.
REQUEST = "\n\n---\nQuote the text above again, word for word, from its first line:\n\n"
# Decoding ways, in the order they run.
WAYS = ("greedy", "lookup", "assisted")


def documents() -> list[tuple[str, str]]:
    """(name, text) of the real documents this machine has: GPL-3, json.encoder's source."""
    import json.encoder

    found = []
    gpl3 = LICENCES / "GPL-3"
    if gpl3.is_file():
        found.append(("GPL-3", gpl3.read_text(encoding="utf-8", errors="replace")))
    source = Path(json.encoder.__file__)
    if source.is_file():
        found.append(("json/encoder.py", source.read_text(encoding="utf-8")))
    return found


def quoting_prompt(tokenizer: Any, text: str, tokens: int) -> list[int]:
    """The first lines of `text` that fit, then REQUEST and the text's first line: at most `tokens`
    token ids (the tokenizer's BOS first). ValueError when `tokens` cannot hold the request."""
    first = text.splitlines()[0] if text.strip() else ""
    tail = list(tokenizer(REQUEST + first, add_special_tokens=False)["input_ids"])
    head = list(tokenizer(text)["input_ids"])[: tokens - len(tail)]
    if tokens - len(tail) < 2:
        raise ValueError(f"--prompt-tokens {tokens}: the request alone takes {len(tail)} tokens")
    return head + tail


def draft_of(model: Any, layers: int) -> Any:
    """A draft model: `model`'s first `layers` decoder layers with its embedding, final norm and
    head, sharing their weights (no copy), in its own module."""
    import copy

    import torch

    config = copy.deepcopy(model.config)
    total = config.num_hidden_layers
    if not 0 < layers < total:
        raise ValueError(f"--draft-layers {layers}: expected 1 to {total - 1} of the model's {total}")
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    with torch.device("meta"):  # no weights made: they are the model's
        draft = type(model)(config)
    draft.load_state_dict(
        {k: v for k, v in model.state_dict().items() if not k.startswith(_deeper(model, layers))},
        strict=False,
        assign=True,
    )
    draft.tie_weights()
    # The buffers a state_dict leaves out (the rotary embeddings' frequencies), the model's too.
    own = dict(model.named_buffers())
    for name, _ in list(draft.named_buffers()):
        path, _, leaf = name.rpartition(".")
        draft.get_submodule(path)._buffers[leaf] = own[name]
    if left := [n for n, t in [*draft.named_parameters(), *draft.named_buffers()] if t.is_meta]:
        raise ValueError(f"draft of {layers} layers: {', '.join(left[:3])} not found in the model")
    return draft.eval()


def _deeper(model: Any, layers: int) -> tuple[str, ...]:
    """The state_dict prefixes of `model`'s decoder layers from `layers` on."""
    prefix = "model.layers."
    return tuple(f"{prefix}{i}." for i in range(layers, model.config.num_hidden_layers))


class StepCounter:
    """Counts a model's forward calls and the tokens each feeds (a pre-hook on its forward)."""

    def __init__(self, model: Any) -> None:
        self.fed: list[int] = []
        self.handle = model.register_forward_pre_hook(self.seen, with_kwargs=True)

    def seen(self, module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.fed.append(int(ids.shape[-1]) if ids is not None else 0)

    def close(self) -> None:
        self.handle.remove()


def run(
    model: Any, c: Any, prompt: Any, new_tokens: int, way: str, options: dict
) -> tuple[list[int], float, list[int]]:
    """One generate() of `new_tokens` greedy tokens after `prompt` (1, n) through the case's cache,
    decoding `way`: the new tokens, the seconds, and the tokens each forward call fed."""
    import torch

    model.set_attn_implementation(c.attention)
    cache = c.cache(model, prompt.shape[-1] + new_tokens + 64) if c.cache else None
    extra = {
        "lookup": dict(prompt_lookup_num_tokens=options["lookup"]),
        "assisted": dict(assistant_model=options["draft"]),
    }.get(way, {})
    counter = StepCounter(model)
    try:
        begin = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                past_key_values=cache,
                **extra,
            )
        seconds = time.perf_counter() - begin
    finally:
        counter.close()
    return out[0, prompt.shape[-1] :].tolist(), seconds, counter.fed


def prefill_seconds(model: Any, name: str, prompt: Any, options: dict) -> float:
    """generate() of one token after `prompt` through cache `name` (its prefill): the median of
    the rounds, what every way of decoding through that cache is held against."""
    c = case(name)
    return statistics.median(run(model, c, prompt, 1, "greedy", options)[1] for _ in range(options["rounds"]))


def measure(model: Any, name: str, prompt: Any, way: str, options: dict, prefill_s: float) -> dict:
    """Decoding `way` through cache `name`: tokens, decode seconds (the median over the rounds of
    the full run less the prefill's, prefill_seconds), tokens/s and the verification steps'
    counts."""
    c = case(name)
    full = []
    for _ in range(options["rounds"]):
        tokens, seconds, fed = run(model, c, prompt, options["new_tokens"], way, options)
        full.append(seconds)
    decode_s = max(statistics.median(full) - prefill_s, 1e-9)
    # Each call feeds the prompt (the first) or the last token, then the drafted tokens it
    # verifies, and gains the drafted tokens it accepts and one of its own.
    drafted = fed[0] - prompt.shape[-1] + sum(n - 1 for n in fed[1:])
    accepted = len(tokens) - len(fed)
    return dict(
        tokens=tokens,
        decode_s=decode_s,
        prefill_s=prefill_s,
        tokens_per_s=(len(tokens) - 1) / decode_s,
        calls=len(fed),
        drafted=drafted,
        accepted=accepted,
        acceptance=accepted / drafted if drafted else None,
    )


def evaluate(
    model: Any, prompts: dict[str, Any], caches: list[str], ways: list[str], options: dict, log: Any = print
) -> list[dict]:
    """A record per (prompt, cache, way); a case that fails is recorded with why, the rest go on.
    "same_as_greedy": the tokens equal greedy decoding's through the same cache."""
    records = []
    for doc, prompt in prompts.items():
        for name in caches:
            greedy_tokens, prefill_s = None, None
            for way in ways:
                record = dict(prompt=doc, prompt_tokens=int(prompt.shape[-1]), cache=name, way=way)
                try:
                    if prefill_s is None:
                        prefill_s = prefill_seconds(model, name, prompt, options)
                    record.update(measure(model, name, prompt, way, options, prefill_s))
                except Exception as e:  # recorded, not fatal: the other cases still run
                    record["failure"] = failure(e)
                if "tokens" in record:
                    if way == "greedy":
                        greedy_tokens = record["tokens"]
                    record["same_as_greedy"] = (
                        None if greedy_tokens is None else record["tokens"] == greedy_tokens
                    )
                records.append(record)
                log(json.dumps({k: v for k, v in record.items() if k != "tokens"}))
    return records


def markdown(records: list[dict]) -> str:
    """The records as a table: per prompt and cache, each way's tokens/s, its speedup over the same
    cache's greedy and over sdpa's greedy, acceptance and whether the tokens are greedy's."""
    rate = {(r["prompt"], r["cache"], r["way"]): r.get("tokens_per_s") for r in records}
    lines = [
        "| prompt | cache | decoding | tokens/s | vs its greedy | vs sdpa greedy | acceptance | calls | tokens = greedy's |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in records:
        if "failure" in r:
            lines.append(f"| {r['prompt']} | {r['cache']} | {r['way']} | {r['failure']} | | | | | |")
            continue
        own, sdpa = rate.get((r["prompt"], r["cache"], "greedy")), rate.get((r["prompt"], "sdpa", "greedy"))
        ratio = lambda base: f"{r['tokens_per_s'] / base:.2f}x" if base else ""  # noqa: E731
        acceptance = "" if r["acceptance"] is None else f"{r['acceptance']:.0%}"
        same = {True: "yes", False: "**no**", None: ""}[r["same_as_greedy"]]
        lines.append(
            f"| {r['prompt']} | {r['cache']} | {r['way']} | {r['tokens_per_s']:.1f} | {ratio(own)} | "
            f"{ratio(sdpa)} | {acceptance} | {r['calls']} | {same} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from . import gemma3

    parser = argparse.ArgumentParser(
        prog="python -m mhapy.models.speculative", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", default=None, help=f"a model folder (default: {gemma3.folder()})")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument(
        "--caches", type=names, default=["sdpa", "mha_int8"], help="hf_models' implementations"
    )
    parser.add_argument("--ways", type=names, default=["greedy", "lookup"], help=f"of {', '.join(WAYS)}")
    parser.add_argument("--lookup", type=int, default=10, help="prompt lookup's most candidate tokens a step")
    parser.add_argument("--draft-layers", type=int, default=0, help="assisted: the draft's layers (0: none)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    for flag in ("prompt_tokens", "new_tokens", "lookup", "rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: expected 1 or more")
    if unknown := [w for w in args.ways if w not in WAYS]:
        parser.error(f"--ways {','.join(unknown)}: expected some of {', '.join(WAYS)}")
    if "greedy" not in args.ways:
        parser.error("--ways: greedy is the reference every other way is held against; include it")
    if "assisted" in args.ways and args.draft_layers < 1:
        parser.error("--ways assisted needs --draft-layers N (the draft model's layers)")
    if bad := [c for c in args.caches if c not in ("sdpa", "eager", "mha", *CACHED)]:
        parser.error(f"--caches {','.join(bad)}: expected sdpa, eager, mha or one of {', '.join(CACHED)}")

    import torch
    import transformers

    import mha
    import mha.transformers  # noqa: F401  registers "mha"

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    transformers.logging.set_verbosity_error()
    folder = Path(args.model) if args.model else gemma3.folder()
    try:
        tokenizer, model = gemma3.load(folder)
    except OSError as e:
        print(f"speculative: {e}", file=sys.stderr)
        return 1
    try:
        prompts = {
            name: torch.tensor([quoting_prompt(tokenizer, text, args.prompt_tokens)])
            for name, text in documents()
        }
        options = dict(
            lookup=args.lookup,
            new_tokens=args.new_tokens,
            rounds=args.rounds,
            draft=draft_of(model, args.draft_layers) if "assisted" in args.ways else None,
        )
    except ValueError as e:
        print(f"speculative: {e}", file=sys.stderr)
        return 1
    if not prompts:
        print(f"speculative: no documents found ({LICENCES}/GPL-3, json/encoder.py)", file=sys.stderr)
        return 1
    cpu, flags = cpu_model()
    context = dict(
        kind=KIND,
        version=VERSION,
        cpu=cpu,
        cpu_flags=flags,
        threads=torch.get_num_threads(),
        load_average_start=os.getloadavg(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        mha=str(Path(mha.__file__).parent),
        model=str(folder),
        options={k: v for k, v in vars(args).items() if k != "out"},
    )
    records = evaluate(model, prompts, args.caches, args.ways, options)
    context["load_average_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(context=context, records=records), indent=1))
    print(f"\n{model.config.model_type} on {cpu}, {context['threads']} threads\n")
    print(markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
