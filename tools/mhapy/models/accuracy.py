"""A causal LM's accuracy on real text through each attention implementation and KV cache: the
judge of mha's cache formats, on a real model with real weights (Gemma 3 270M:
scripts/gemma3-model.sh makes its folder).

    PYTHONPATH=tools:<build>/python <peers' python> -m mhapy.models.accuracy \
        [--model DIR] --tokens 1024,4096 --prefill 1024 --positions 256 --out build/accuracy.json

The text is real English from this machine (--text; default: Debian's GPL-3, then the other
licences in /usr/share/common-licenses, then Python's pydoc_data/topics.py, joined as far as the
longest measure needs), tokenised with the model's tokenizer (its BOS first, as it adds it). Three
measures, each timed:

- perplexity over the first N tokens (--tokens) per attention implementation (--perplexity:
  "sdpa", "eager", "mha"): one forward pass without a cache, the logits taken in slices;
- teacher-forced decoding (--caches): a prefill of --prefill tokens through the cache under
  test, then the true next tokens one at a time for --positions positions; each position's
  next-token distribution against the reference's, sdpa with fp32 weights and transformers'
  DynamicCache: KL(reference || test) in nats (mean, median, max), the share of positions whose
  top-1 token is the reference's, and the perplexity of the true tokens over those positions;
- greedy generation of --greedy-steps tokens after the same prompt: each cache's tokens and how
  many agree with the reference's (position by position, and the first that differs);
- retrieval (--retrieval-tokens): a pass key (five digits) planted at each depth of
  --retrieval-depths in a text of that many tokens, asked for at its end; each cache's greedy
  answer, whether it holds the key, and whether it is the reference's answer.

The caches are mhapy.models.hf' implementations: "sdpa", "eager" and "mha" decode through
transformers' DynamicCache (which keeps only the window of a sliding layer), "mha_fp32",
"mha_bf16" and "mha_int8" through mha.transformers.MhaCache, "sdpa_static" through StaticCache;
and the formats mhapy.models.simulated_caches rounds in PyTorch ("sim_k8v4", "sim_int4_channel", ...,
on sdpa), to choose a format before its kernels exist.
A case that cannot run is recorded with the reason and the rest go on: "refused: ..." where mha
refuses it (mha.Unsupported), "not run: ..." where mha is not importable, "skipped: ..." where
eager's scores would not fit in memory, "error: ..." otherwise. Writes JSON (a context and a
record per case) and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import meminfo
from .hf import CACHED, attention_of, cache_for
from ..json_file import read_json
from .arguments import floats, ints, names
from .bench import steps
from .passkey import ANSWER_TOKENS, passkey_prompts
from .simulated_caches import FORMATS, simulated_cache

# The result file's kind and the version of its records' keys (bump on a change a reader must know).
KIND = "model_accuracy"
VERSION = 1
LICENCES = Path("/usr/share/common-licenses")
REFERENCE = "sdpa"  # sdpa through DynamicCache, with the model's own (fp32) weights


def text_sources() -> list[Path]:
    """The default text, in order: GPL-3, the other licences (each file once, links skipped), then
    Python's pydoc_data/topics.py; those this machine has."""
    import importlib.util

    licences = sorted(p for p in LICENCES.glob("*") if p.is_file() and not p.is_symlink())
    gpl3 = LICENCES / "GPL-3"
    sources = [gpl3] + [p for p in licences if p != gpl3]
    spec = importlib.util.find_spec("pydoc_data.topics")
    if spec and spec.origin:
        sources.append(Path(spec.origin))
    return [p for p in sources if p.is_file()]


def real_tokens(tokenizer: Any, count: int, sources: list[Path] | None = None) -> tuple[list[int], list[str]]:
    """The first `count` token ids of the sources' text joined by blank lines (as few sources as
    reach `count`; the tokenizer's own special tokens, a BOS, added as it adds them), and the paths
    of the sources used. ValueError when all of them together are shorter."""
    sources = text_sources() if sources is None else sources
    texts: list[str] = []
    ids: list[int] = []
    for path in sources:
        texts.append(Path(path).read_text(encoding="utf-8", errors="replace"))
        ids = list(tokenizer("\n\n".join(texts))["input_ids"])
        if len(ids) >= count:
            return ids[:count], [str(p) for p in sources[: len(texts)]]
    raise ValueError(f"the text ({len(sources)} files) holds {len(ids)} tokens, fewer than {count}")


@dataclass(frozen=True)
class Case:
    """A cache under test: its name, the attn_implementation it runs and how its cache is made
    (model, capacity) -> cache, or None for the model's own DynamicCache."""

    name: str
    attention: str
    cache: Callable[[Any, int], Any] | None = None


def case(name: str) -> Case:
    """hf_models' implementation `name` as a Case (mha_int8: "mha" with an int8 MhaCache, ...), or
    a simulated format's (sdpa through it)."""
    if name in FORMATS:
        return Case(name, "sdpa", lambda model, capacity: simulated_cache(model, name))
    own = name not in CACHED and name != "sdpa_static"
    return Case(
        name, attention_of(name), None if own else (lambda model, capacity: cache_for(model, name, capacity))
    )


def failure(e: BaseException) -> str:
    """A case's failure in words: "refused: ..." for mha's own refusal (mha.Unsupported)."""
    unsupported = getattr(sys.modules.get("mha"), "Unsupported", None)
    if unsupported is not None and isinstance(e, unsupported):
        return f"refused: {e}"
    return f"error: {type(e).__name__}: {e}"


def eager_too_big(model: Any, tokens: int) -> str | None:
    """Why eager's forward of `tokens` tokens would not fit, or None: a layer's scores and their
    softmax (fp32, heads x tokens^2 each) and its mask, against half of MemAvailable."""
    need = 4 * tokens * tokens * (2 * model.config.num_attention_heads + 1)
    return meminfo.too_big(need, "skipped: eager materialises a layer's scores, softmax and mask")


def perplexity(model: Any, ids: Any, attention: str, rows: int = 256) -> dict:
    """exp(mean NLL) of each token after the first given those before it, from one forward pass
    of `ids` (1-d) on `attention` without a cache; the logits made `rows` positions at a time
    (lm_head and the final soft-cap as the model's forward), so that 262k-wide logits of 32k
    positions never exist at once."""
    import torch

    model.set_attn_implementation(attention)
    softcap = getattr(model.config, "final_logit_softcapping", None)
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=ids[None], use_cache=False).last_hidden_state[0]
        nll = torch.zeros((), dtype=torch.float64)
        for start in range(0, len(ids) - 1, rows):
            stop = min(start + rows, len(ids) - 1)
            logits = model.lm_head(hidden[start:stop])
            if softcap is not None:
                logits = torch.tanh(logits / softcap) * softcap
            logp = torch.log_softmax(logits.double(), dim=-1)
            nll -= logp.gather(1, ids[start + 1 : stop + 1, None]).sum()
    mean = nll.item() / (len(ids) - 1)
    return dict(perplexity=math.exp(mean), nll=mean)


def prefilled(model: Any, c: Case, prompt: Any, capacity: int) -> tuple[Any, Any]:
    """The cache after a prefill of `prompt` (1-d) on the case's implementation and cache, and the
    logits predicting the next token (1, 1, vocab)."""
    import torch

    model.set_attn_implementation(c.attention)
    cache = c.cache(model, capacity) if c.cache else None
    out = model(
        prompt[None],
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.past_key_values, out.logits[:, -1:]


def teacher_forced(model: Any, c: Case, ids: Any, prefill: int, positions: int) -> Any:
    """The logits (positions, vocab) predicting ids[prefill], ..., ids[prefill + positions - 1]:
    a prefill of ids[:prefill], then the true tokens fed one at a time through the case's cache."""
    import torch

    with torch.no_grad():
        past, first = prefilled(model, c, ids[:prefill], prefill + positions)
        later = steps(model, past, first, prefill, positions - 1, feed=ids[None, prefill:])
    return torch.cat([first, later], dim=1)[0]


def divergence(reference: Any, test: Any, targets: Any, rows: int = 32) -> dict:
    """KL(reference || test) in nats of each row's softmax (float64), its mean, median and max;
    the share of rows whose argmax agrees; the perplexity of `targets` under `test`."""
    import torch

    kl, agree, nll = [], 0, 0.0
    for start in range(0, len(reference), rows):
        want = torch.log_softmax(reference[start : start + rows].double(), dim=-1)
        got = torch.log_softmax(test[start : start + rows].double(), dim=-1)
        kl += (want.exp() * (want - got)).sum(-1).tolist()
        agree += int((want.argmax(-1) == got.argmax(-1)).sum())
        nll -= got.gather(1, targets[start : start + rows, None]).sum().item()
    return dict(
        kl_mean=statistics.fmean(kl),
        kl_median=statistics.median(kl),
        kl_max=max(kl),
        top1_agreement=agree / len(kl),
        perplexity=math.exp(nll / len(kl)),
    )


def greedy(model: Any, c: Case, prompt: Any, count: int) -> list[int]:
    """The `count` tokens greedy decoding picks after `prompt` through the case's cache."""
    import torch

    with torch.no_grad():
        past, first = prefilled(model, c, prompt, len(prompt) + count)
        later = steps(model, past, first, len(prompt), count - 1)
    return torch.cat([first, later], dim=1)[0].argmax(-1).tolist()


def answer(model: Any, c: Case, prompt: Any) -> list[int]:
    """The ANSWER_TOKENS tokens greedy decoding gives after a retrieval prompt."""
    return greedy(model, c, prompt, ANSWER_TOKENS)


def agreement(reference: list[int], got: list[int]) -> dict:
    """How many of `got`'s tokens are the reference's, position by position, and the first
    position that differs (None: none)."""
    same = [a == b for a, b in zip(reference, got)]
    return dict(greedy_agree=sum(same), greedy_first_divergence=same.index(False) if False in same else None)


def evaluate(
    model: Any,
    ids: Any,
    tokens: list[int] = (),
    perplexity_on: list[str] = (),
    caches: list[str | Case] = (),
    prefill: int = 0,
    positions: int = 0,
    greedy_steps: int = 0,
    retrieval: list[dict] = (),
    unavailable: dict[str, str] | None = None,
    decode: Callable[[list[int]], str] | None = None,
    log: Callable[[dict], None] = lambda record: None,
) -> list[dict]:
    """Every measure's records on `ids` (1-d token ids): perplexity over each N in `tokens` per
    implementation in `perplexity_on`; for each cache in `caches` (hf_models names or Cases)
    teacher-forced KL against the reference after `prefill` tokens over `positions` positions
    (positions 0: none), greedy tokens over `greedy_steps` steps after the same prompt (0:
    none), and each `retrieval` prompt's answer (mhapy.models.passkey). `unavailable` maps an
    attn_implementation that cannot run to why ("not run: ..."); `decode` turns greedy tokens
    into text for the records; `log` sees each record as made."""
    import torch

    unavailable = unavailable or {}
    cases = [c if isinstance(c, Case) else case(c) for c in caches]
    records: list[dict] = []
    # A short untimed forward on each implementation first: a first call's set-up is no case's time.
    for attention in dict.fromkeys([*perplexity_on, *(c.attention for c in cases), REFERENCE]):
        if attention not in unavailable:
            with torch.no_grad(), contextlib.suppress(Exception):
                model.set_attn_implementation(attention)
                model(ids[None, :16])

    def run(record: dict, measure: Callable[[], dict], why: str | None = None) -> dict:
        """`record` with what `measure` returns (called now), or why it was not run or failed."""
        begin = time.perf_counter()
        why = why or unavailable.get(record["attention"])
        try:
            record.update({"error": why} if why else measure())
        except Exception as e:  # a case that cannot run is recorded, not fatal
            record["error"] = failure(e)
        record["seconds"] = round(time.perf_counter() - begin, 3)
        records.append(record)
        log(record)
        return record

    for n in tokens:
        for attention in perplexity_on:
            run(
                {"measure": "perplexity", "attention": attention, "tokens": n},
                lambda: perplexity(model, ids[:n], attention),
                eager_too_big(model, n) if attention == "eager" else None,
            )
    reference = case(REFERENCE)
    failed = "not run: the reference failed"
    if positions and cases:
        targets, kept = ids[prefill : prefill + positions], {}

        def kl(c: Case) -> dict:
            logits = teacher_forced(model, c, ids, prefill, positions)
            if c is reference:  # computed first
                kept["logits"] = logits
            return divergence(kept["logits"], logits, targets)

        head = {"measure": "kl", "prefill": prefill, "positions": positions}
        run(dict(head, cache="reference", attention=REFERENCE), lambda: kl(reference))
        for c in cases:
            run(dict(head, cache=c.name, attention=c.attention), lambda: kl(c), None if kept else failed)
        kept.clear()
    if greedy_steps and cases:
        prompt, want = ids[:prefill], []

        def generated(c: Case) -> dict:
            got = greedy(model, c, prompt, greedy_steps)
            record = {"generated": got} | ({"text": decode(got)} if decode else {})
            if c is reference:  # computed first
                want.extend(got)
                return record
            return record | agreement(want, got)

        head = {"measure": "greedy", "prefill": prefill, "steps": greedy_steps}
        run(dict(head, cache="reference", attention=REFERENCE), lambda: generated(reference))
        for c in cases:
            run(
                dict(head, cache=c.name, attention=c.attention),
                lambda: generated(c),
                None if want else failed,
            )
    for planted in retrieval if cases else ():
        prompt, want = torch.tensor(planted["ids"]), []

        def answered(c: Case) -> dict:
            got = answer(model, c, prompt)
            text = decode(got) if decode else ""
            record = {"answer": got, "text": text, "found": planted["key"] in text}
            if c is reference:  # computed first
                want.extend(got)
                return record
            return record | {"same": got == want}

        head = {"measure": "retrieval", "prefill": len(planted["ids"]), "depth": planted["depth"]}
        run(dict(head, cache="reference", attention=REFERENCE), lambda: answered(reference))
        for c in cases:
            run(
                dict(head, cache=c.name, attention=c.attention), lambda: answered(c), None if want else failed
            )
    return records


# ---- the command line, the file, the tables ----


def cpu_model() -> tuple[str, list[str]]:
    """The CPU's model name and its vector ISA flags (avx2, avx512*, amx*), from /proc/cpuinfo."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor(), []
    field = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines[:40])}
    flags = [f for f in field.get("flags", "").split() if f == "avx2" or f.startswith(("avx512", "amx"))]
    return field.get("model name", platform.processor()), sorted(flags)


def load(path: str | Path) -> dict:
    """A result file of this tool (context and records), refused with ValueError naming what is wrong."""
    data = read_json(path, ValueError)
    if not isinstance(data, dict) or data.get("context", {}).get("kind") != KIND:
        raise ValueError(f"{path}: not a {KIND} result file")
    if not isinstance(data.get("records"), list):
        raise ValueError(f"{path}: no records")
    return data


# Each measure's table: its columns and a row's cells of figures (the row of a case that failed
# says why in the first of them).
TABLES = {
    "perplexity": (
        "tokens | attention | perplexity",
        lambda r: [f"{r['perplexity']:.4f}"],
    ),
    "kl": (
        "cache | attention | prefill+positions | KL mean (nats) | median | max | top-1 | perplexity",
        lambda r: (
            [f"{r[k]:.3g}" for k in ("kl_mean", "kl_median", "kl_max")]
            + [f"{r['top1_agreement']:.2%}", f"{r['perplexity']:.4f}"]
        ),
    ),
    "retrieval": (
        "cache | attention | prompt (depth) | answer | holds the key | the reference's",
        lambda r: [
            repr(r["text"].strip()),
            "yes" if r["found"] else "no",
            "" if "same" not in r else ("same" if r["same"] else "differs"),
        ],
    ),
    "greedy": (
        "cache | attention | prompt | same tokens | first difference",
        lambda r: (
            [f"{r['greedy_agree']}/{r['steps']}", str(r["greedy_first_divergence"]).replace("None", "none")]
            if "greedy_agree" in r
            else [f"(the reference: {r['steps']} tokens)", ""]
        ),
    ),
}


def markdown(records: list[dict]) -> str:
    """The records as Markdown tables, one per measure, with the seconds each case took."""
    out = []
    for measure, (columns, figures) in TABLES.items():
        rows = [r for r in records if r["measure"] == measure]
        if not rows:
            continue
        out += [f"| {columns} | s |", "|---" * (columns.count("|") + 2) + "|"]
        for r in rows:
            if measure == "perplexity":
                head = [str(r["tokens"]), r["attention"]]
            else:
                span = (
                    f"{r['prefill']}+{r['positions']}"
                    if measure == "kl"
                    else f"{r['prefill']} ({r['depth']:.0%})"
                    if measure == "retrieval"
                    else str(r["prefill"])
                )
                head = [r["cache"], r["attention"], span]
            cells = [r["error"]] if "error" in r else figures(r)
            width = columns.count("|") + 1 - len(head)
            cells = (cells + [""] * width)[:width]
            out.append(f"| {' | '.join(head + cells)} | {r['seconds']:.1f} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from . import gemma3

    parser = argparse.ArgumentParser(
        prog="python -m mhapy.models.accuracy", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", default=None, help=f"a model folder (default: {gemma3.folder()})")
    parser.add_argument(
        "--tokens", type=ints, default=[1024], help="perplexity over the first N tokens, each N"
    )
    parser.add_argument(
        "--perplexity", type=names, default=["sdpa", "eager", "mha"], help="attn_implementations"
    )
    parser.add_argument(
        "--caches",
        type=names,
        default=["sdpa", "mha", "mha_fp32", "mha_bf16", "mha_int8"],
        help="caches under test",
    )
    parser.add_argument(
        "--prefill", type=int, default=1024, help="prompt tokens before the KL positions and greedy steps"
    )
    parser.add_argument(
        "--positions", type=int, default=256, help="teacher-forced positions compared (0: none)"
    )
    parser.add_argument("--greedy-steps", type=int, default=64, help="greedy tokens per cache (0: none)")
    parser.add_argument(
        "--retrieval-tokens", type=int, default=0, help="a pass key's prompt of this many tokens (0: none)"
    )
    parser.add_argument(
        "--retrieval-depths", type=floats, default=[0.1, 0.5, 0.9], help="where the key is planted (shares)"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument(
        "--text", action="append", default=None, metavar="FILE", help="text files (default: the licences...)"
    )
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    for flag in ("prefill", "positions", "greedy_steps", "threads", "retrieval_tokens"):
        if getattr(args, flag) < 0:
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: expected 0 or more")
    if (args.positions or args.greedy_steps) and args.caches and args.prefill < 1:
        parser.error("--prefill: expected 1 or more tokens before the positions and greedy steps")

    import torch
    import transformers

    unavailable, executor = {}, None
    try:
        import mha
        import mha.transformers  # registers "mha"

        executor = mha.default_executor()
    except ImportError as e:
        unavailable["mha"] = f"not run: mha is not importable ({e})"
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    folder = Path(args.model) if args.model else gemma3.folder()
    begin = time.perf_counter()
    try:
        tokenizer, model = gemma3.load(folder)
    except OSError as e:
        print(f"model_accuracy: {e}", file=sys.stderr)
        return 1
    load_s = time.perf_counter() - begin
    needed = max(
        [*args.tokens, args.prefill + args.positions if args.caches else 0, args.retrieval_tokens, 1]
    )
    try:
        ids, sources = real_tokens(tokenizer, needed, args.text)
    except (OSError, ValueError) as e:
        print(f"model_accuracy: {e}", file=sys.stderr)
        return 1
    planted = []
    if args.retrieval_tokens:
        try:
            planted = passkey_prompts(tokenizer, ids, args.retrieval_tokens, args.retrieval_depths)
        except ValueError as e:
            print(f"model_accuracy: {e}", file=sys.stderr)
            return 1
    ids = torch.tensor(ids)
    config, (cpu, flags) = model.config, cpu_model()
    context = dict(
        kind=KIND,
        version=VERSION,
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        cpu=cpu,
        cpu_flags=flags,
        hardware_threads=os.cpu_count(),
        load_average_start=os.getloadavg(),  # others' work on the machine skews the times
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        mha=str(Path(sys.modules["mha"].__file__).parent) if "mha" in sys.modules else None,
        executor=executor,
        model=str(folder),
        model_type=config.model_type,
        dtype="float32",
        layers=config.num_hidden_layers,
        sliding_window=getattr(config, "sliding_window", None),
        layer_types=sorted(set(getattr(config, "layer_types", None) or [])),
        load_s=round(load_s, 1),
        text=sources,
        tokens=needed,
        reference=f"{REFERENCE} with DynamicCache, fp32",
        command=" ".join(["python -m mhapy.models.accuracy", *(sys.argv[1:] if argv is None else argv)]),
    )
    records = evaluate(
        model,
        ids,
        tokens=args.tokens,
        perplexity_on=args.perplexity,
        caches=args.caches,
        prefill=args.prefill,
        positions=args.positions,
        greedy_steps=args.greedy_steps,
        retrieval=planted,
        unavailable=unavailable,
        decode=tokenizer.decode,
        log=lambda r: print(
            json.dumps({k: v for k, v in r.items() if k not in ("generated", "text")}), flush=True
        ),
    )
    context["load_average_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(dict(context=context, records=records), indent=1))
    partial.replace(out)  # the file appears only when complete
    start, end = (
        " / ".join(f"{x:.1f}" for x in context[k]) for k in ("load_average_start", "load_average_end")
    )
    print(
        f"\n{config.model_type} ({folder}) on {cpu}, {context['threads']} threads, torch {torch.__version__},"
    )
    print(f"transformers {transformers.__version__}; load average {start} at the start, {end} at the end\n")
    print(markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
