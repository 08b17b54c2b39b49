"""The report's "Whole models" section: Hugging Face models on each attention implementation
(python -m mhapy.models_bench), with what choosing mha's attention does to them."""

from __future__ import annotations

import json
from pathlib import Path

from .document import Block, Bullets, Heading, Para, Table

_CASE = ("model", "dtype", "batch", "threads", "prefill", "decode")


class ModelsError(ValueError):
    pass


def load(paths: list[str | Path]) -> list[dict]:
    """The records of models_bench JSON files, in file order."""
    records: list[dict] = []
    for path in paths:
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
            found = document["models"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelsError(f"{path}: not a models_bench result file ({e})") from e
        for r in found:
            missing = [k for k in (*_CASE, "attention") if k not in r]
            if missing:
                raise ModelsError(f"{path}: a record lacks {', '.join(missing)}")
        records += found
    return records


def _baseline(records: list[dict], r: dict) -> dict | None:
    return next(
        (
            s
            for s in records
            if s["attention"] == "sdpa" and "error" not in s and all(s[k] == r[k] for k in _CASE)
        ),
        None,
    )


def section(records: list[dict]) -> list[Block]:
    """The table (one row per case and implementation) and the answer: mha against sdpa per case,
    faster or slower said plainly."""
    if not records:
        return []
    rows, answer = [], []
    for r in records:
        case = [
            r["model"],
            r["dtype"],
            str(r["batch"]),
            str(r["threads"]),
            f"{r['prefill']}+{r['decode']}",
            r["attention"],
        ]
        if "error" in r:
            rows.append(case + [f"not timed: {r['error']}", "", "", "", ""])
            continue
        base = _baseline(records, r)
        versus = ""
        if base is not None and r["attention"] != "sdpa":
            ttft = base["ttft_s"] / r["ttft_s"]
            rate = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
            versus = f"{ttft:.2f}x / {rate:.2f}x"
            if r["attention"] == "mha":
                verdict = "no slower than sdpa" if ttft >= 0.97 and rate >= 0.97 else "**slower than sdpa**"
                answer.append(
                    f"{r['model']} {r['dtype']}, batch {r['batch']}, {r['threads']} thread(s): time to first token "
                    f"{ttft:.2f}x sdpa's speed, decode {rate:.2f}x ({verdict}); attention's share "
                    f"{r['prefill_attention_share']:.0%} of the prefill and {r['decode_attention_share']:.0%} of decode "
                    f"(sdpa: {base['prefill_attention_share']:.0%}, {base['decode_attention_share']:.0%})"
                )
        rows.append(
            case
            + [
                f"{r['ttft_s']:.3f}",
                f"{r['prefill_attention_share']:.0%}",
                f"{r['decode_tokens_per_s']:.1f}",
                f"{r['decode_attention_share']:.0%}",
                versus,
            ]
        )
    cpus = sorted({r.get("cpu", "?") for r in records})
    return [
        Heading(2, "Whole models: what mha's attention does to them"),
        Para(
            "Hugging Face models with random weights (the same in every run) on each attention implementation "
            "(`python -m mhapy.models_bench`, on " + ", ".join(cpus) + "): the time to the first token (a "
            "prefill) and the decode rate through transformers' own cache, the best of the runs, and the share "
            "of each spent inside the attention function. Each implementation's logits were checked against "
            "sdpa's first. 'vs sdpa' is sdpa's time over this one's (prefill / decode): above 1 is faster."
        ),
        Bullets(answer) if answer else Para("No mha case was timed beside an sdpa one."),
        Table(
            [
                "model",
                "dtype",
                "batch",
                "threads",
                "tokens",
                "attention",
                "TTFT s",
                "attn",
                "decode tok/s",
                "attn",
                "vs sdpa",
            ],
            rows,
            {2, 3, 6, 7, 8, 9},
        ),
    ]
