"""The report's "Whole models" section: Hugging Face models on each attention implementation
(python -m mhapy.models.bench), with what choosing mha's attention does to them."""

from __future__ import annotations

import json
from pathlib import Path

from .document import Block, Bullets, Heading, Para, Table

_CASE = ("model", "dtype", "batch", "threads", "prefill", "decode")


class ModelsError(ValueError):
    pass


_BETWEEN = ("attention", "threads", "keys", "step_ms", "attention_ms")


def load(paths: list[str | Path]) -> list[dict]:
    """The records of models_bench JSON files, in file order: the whole models', then (marked
    kind "between_ops") the decode attention call between two torch ops. From several files,
    each record names its file ("run"): repeated runs of a case are each compared with their own
    run's sdpa, never with another run's."""
    records: list[dict] = []
    for path in paths:
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
            found = document["models"]
            between = document.get("between_ops", [])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelsError(f"{path}: not a models_bench result file ({e})") from e
        for r, keys in [(r, (*_CASE, "attention")) for r in found] + [(r, _BETWEEN) for r in between]:
            missing = [k for k in keys if k not in r]
            if missing:
                raise ModelsError(f"{path}: a record lacks {', '.join(missing)}")
        run = {"run": Path(path).name} if len(paths) > 1 else {}
        records += [dict(r, **run) for r in found] + [dict(r, kind="between_ops", **run) for r in between]
    return records


def _case_key(r: dict) -> tuple:
    """What makes r's case: its _CASE values, how its cache was filled, its layers and its file."""
    return tuple(r[k] for k in _CASE) + tuple(r.get(k) for k in ("fill", "layers", "run"))


def _baseline(records: list[dict], r: dict, attention: str = "sdpa") -> dict | None:
    """The timed record of `attention` in r's case, if any."""
    return next(
        (
            s
            for s in records
            if s["attention"] == attention and "error" not in s and _case_key(s) == _case_key(r)
        ),
        None,
    )


def _case_said(r: dict) -> str:
    """r's case in words: model, precision, layers, batch, tokens and threads."""
    return (
        f"{r['model']} {r['dtype']}"
        + (f" ({r['layers']} layers)" if "layers" in r else "")
        + f", batch {r['batch']}, {r['prefill']} tokens, {r['threads']} thread(s)"
        + _run(r)
    )


def _run(r: dict) -> str:
    """The file a record came from, where several were merged ("" else)."""
    return f" ({r['run']})" if "run" in r else ""


def _against_openvino(records: list[dict], r: dict) -> str:
    """OpenVINO's row said against sdpa's and mha's own caches' in its case: who decodes faster,
    plainly."""
    base = _baseline(records, r)
    said = (
        _case_said(r) + f", {r['attention']} (OpenVINO through optimum-intel, its KV cache "
        f"{r.get('openvino_kv_precision', '?')}, inference {r.get('openvino_inference_precision', '?')}): "
    )
    if base is not None:
        said += f"decode {r['decode_tokens_per_s'] / base['decode_tokens_per_s']:.2f}x sdpa's rate"
        if "ttft_s" in r and "ttft_s" in base:
            said += f", time to first token {base['ttft_s'] / r['ttft_s']:.2f}x sdpa's speed"
    versus = []
    for mine in ("mha_int8", "mha_bf16"):
        m = _baseline(records, r, mine)
        if m is not None:
            ratio = m["decode_tokens_per_s"] / r["decode_tokens_per_s"]
            versus.append(
                f"{mine} decodes at {ratio:.2f}x its rate"
                + (" (**OpenVINO is faster**)" if ratio < 0.97 else "")
            )
    return said + ("; " if base is not None and versus else "") + "; ".join(versus)


def _busy(r: dict) -> str:
    """The threads busy during decode (mean and most), where the file has them."""
    if "decode_busy_threads" not in r:
        return ""
    return f"{r['decode_busy_threads']:.1f} ({r['decode_busy_threads_most']})"


def section(records: list[dict]) -> list[Block]:
    """The table (one row per case and implementation) and the answer: mha against sdpa per case,
    faster or slower said plainly; then the decode attention call between two torch ops."""
    between = [r for r in records if r.get("kind") == "between_ops"]
    records = [r for r in records if r.get("kind") != "between_ops"]
    if not records:
        return []
    rows, answer = [], []
    for r in records:
        case = [
            r["model"] + (f", {r['layers']} layers" if "layers" in r else "") + _run(r),
            r["dtype"],
            str(r["batch"]),
            str(r["threads"]),
            f"{r['prefill']}+{r['decode']}" + (" (synthetic)" if r.get("fill") == "synthetic" else ""),
            r["attention"],
        ]
        if "error" in r:
            rows.append(case + [f"not timed: {r['error']}", "", "", "", "", "", "", "", ""])
            continue
        if r["attention"].startswith("openvino"):
            answer.append(_against_openvino(records, r))
        base = _baseline(records, r)
        versus = ""
        # A cache filled synthetically (models_bench --fill synthetic) has no time to first token.
        prefilled = "ttft_s" in r and base is not None and "ttft_s" in base
        if base is not None and r["attention"] != "sdpa":
            ttft = base["ttft_s"] / r["ttft_s"] if prefilled else None
            rate = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
            versus = f"{ttft:.2f}x / {rate:.2f}x" if prefilled else f"– / {rate:.2f}x"
            if r["attention"] in ("mha", "mha_fp32", "mha_int8", "mha_bf16"):
                verdict = (
                    "no slower than sdpa"
                    if rate >= 0.97 and (ttft is None or ttft >= 0.97)
                    else "**slower than sdpa**"
                )
                calls = (
                    f"; a decode attention call {r['decode_attention_ms']:.3f} ms (sdpa "
                    f"{base['decode_attention_ms']:.3f}), threads busy during decode {_busy(r)} (sdpa {_busy(base)})"
                    if "decode_attention_ms" in r and "decode_attention_ms" in base
                    else ""
                )
                shares = (
                    f"attention's share {r['prefill_attention_share']:.0%} of the prefill and "
                    f"{r['decode_attention_share']:.0%} of decode (sdpa: {base['prefill_attention_share']:.0%}, "
                    f"{base['decode_attention_share']:.0%})"
                    if prefilled
                    else f"attention's share {r['decode_attention_share']:.0%} of decode (sdpa: "
                    f"{base['decode_attention_share']:.0%}; the cache filled synthetically)"
                )
                answer.append(
                    _case_said(r)
                    + ("" if r["attention"] == "mha" else f", {r['attention']}")
                    + (f": time to first token {ttft:.2f}x sdpa's speed, decode" if prefilled else ": decode")
                    + f" {rate:.2f}x ({verdict}); {shares}{calls}"
                )
        rows.append(
            case
            + [
                f"{r['ttft_s']:.3f}" if "ttft_s" in r else "–",
                f"{r['prefill_attention_share']:.0%}" if "prefill_attention_share" in r else "",
                f"{r['decode_tokens_per_s']:.1f}",
                f"{r['decode_attention_share']:.0%}" if "decode_attention_share" in r else "",
                f"{r['decode_attention_ms']:.3f}" if "decode_attention_ms" in r else "",
                _busy(r),
                f"{r['cache_bytes'] / 2**20:.1f}" if "cache_bytes" in r else "",
                f"{r['peak_rss_bytes'] / 2**20:.0f}" if "peak_rss_bytes" in r else "",
                versus,
            ]
        )
    cpus = sorted({r.get("cpu", "?") for r in records})
    return (
        [
            Heading(2, "Whole models: what mha's attention does to them"),
            Para(
                "Hugging Face models with random weights (the same in every run) on each attention implementation "
                "(`python -m mhapy.models.bench`, on "
                + ", ".join(cpus)
                + "): the time to the first token (a "
                "prefill; where the tokens say 'synthetic', every cache was filled with the same random keys and "
                "values instead, and no first token was timed) and the decode rate through transformers' own cache (mha_fp32, mha_int8 and mha_bf16: "
                "through mha's, appended in place, in fp32 / int8 / bf16, whose bytes 'cache MiB' gives beside the others'), the medians of rounds that take every implementation in turn, and the share "
                "of each spent inside the attention function, a decode step's attention call in ms and the threads "
                "busy during decode (sampled from /proc/self/task: mean, and most at once). 'mha' runs on the executor "
                "mha picks (inside PyTorch, PyTorch's own OpenMP workers), 'mha_tbb' on mha's own oneTBB workers. "
                "'openvino' is OpenVINO through optimum-intel (the same weights exported, its KV cache inside the "
                "compiled model in the precision it picks; 'openvino_u8' in u8), in a process of its own, whose "
                "cache MiB are computed from the precision it reports and whose attention has no time of its own. "
                "'peak RSS' is the process's peak resident memory over a round, the model's weights included. "
                "Each implementation's logits were checked against sdpa's first. 'vs sdpa' is sdpa's time over this "
                "one's (prefill / decode): above 1 is faster."
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
                    "attn ms",
                    "busy threads",
                    "cache MiB",
                    "peak RSS MiB",
                    "vs sdpa",
                ],
                rows,
                {2, 3, 6, 7, 8, 9, 10, 12, 13},
            ),
        ]
        + _logits_section(records)
        + _profile_section(records)
        + _between_section(between)
    )


def _logits_section(records: list[dict]) -> list[Block]:
    """What each implementation's KV cache does to the model's decode logits, where measured."""
    measured = [r for r in records if "decode_logits_error" in r]
    if not measured:
        return []
    rows = [
        [
            r["model"] + _run(r),
            r["dtype"],
            str(r["batch"]),
            f"{r['prefill']}+{r['logits_steps']}",
            r["attention"],
            f"{r['decode_logits_error']:.2e}",
            f"{r['decode_logits_error_median']:.2e}",
            f"{r['top1_agreement']:.1%}",
        ]
        for r in measured
    ]
    return [
        Heading(3, "The KV cache's precision in the model"),
        Para(
            "The decode steps' logits against sdpa's with sdpa's greedy tokens fed to both: each step's largest "
            "logit error over its largest logit (the worst step and the median one), and the share of steps "
            "and sequences whose top-1 token is sdpa's. 'mha' reads transformers' cache; 'mha_fp32', 'mha_int8' "
            "and 'mha_bf16' their own (mha.transformers.MhaCache); 'openvino' and 'openvino_u8' OpenVINO's, inside "
            "its compiled model."
        ),
        Table(
            ["model", "dtype", "batch", "tokens", "attention", "worst step", "median step", "top-1 as sdpa"],
            rows,
            {2, 5, 6, 7},
        ),
    ]


# The ops a profile table names (the longest in any of its implementations); the rest are summed.
_PROFILE_ROWS = 12


def _profile_section(records: list[dict]) -> list[Block]:
    """Where a decode step's time goes (models_bench --profile-steps), per case: ms a step per op
    and implementation, and in words each implementation's step against sdpa's and the op where
    they differ most."""
    profiled = [r for r in records if "decode_profile" in r]
    if not profiled:
        return []
    blocks: list[Block] = [
        Heading(3, "Where a decode step's time goes"),
        Para(
            "Decode steps run under torch.profiler after the timed rounds (slower than theirs by the "
            "profiler's cost, alike for every implementation): the milliseconds a step spent in the attention "
            "function (all of it), in each other PyTorch op by its own time (its children's apart), the "
            f"{_PROFILE_ROWS} longest in any implementation by name and the rest summed as 'other ops', and "
            "outside every op (Python, transformers' own code)."
        ),
    ]
    cases: dict[tuple, list[dict]] = {}
    for r in profiled:
        cases.setdefault(_case_key(r), []).append(r)
    for case in cases.values():
        base = next((r for r in case if r["attention"] == "sdpa"), case[0])
        ms = [r["decode_profile"]["ms"] for r in case]
        longest = {n: max(m.get(n, 0.0) for m in ms) for n in set().union(*ms)}
        names = sorted(longest, key=lambda n: (-longest[n], n))[:_PROFILE_ROWS]
        rows = [["step (profiled)"] + [f"{r['decode_profile']['step_ms']:.3f}" for r in case]]
        rows += [[n] + [f"{m.get(n, 0.0):.3f}" for m in ms] for n in names]
        rows.append(["other ops"] + [f"{sum(v for n, v in m.items() if n not in names):.3f}" for m in ms])
        said = []
        for r in case:
            if r is base:
                continue
            mine, theirs = r["decode_profile"]["ms"], base["decode_profile"]["ms"]
            diff = {n: mine.get(n, 0.0) - theirs.get(n, 0.0) for n in mine.keys() | theirs.keys()}
            most = max(sorted(diff), key=lambda n: abs(diff[n]))
            step = r["decode_profile"]["step_ms"] - base["decode_profile"]["step_ms"]
            said.append(
                f"{r['attention']} {step:+.3f} ms a step against {base['attention']}, its largest "
                f"difference in '{most}' ({diff[most]:+.3f} ms)"
            )
        blocks += [
            Para(
                _case_said(base)
                + f", {base['decode_profile']['steps']} steps profiled"
                + (": " + "; ".join(said) if said else "")
            ),
            Table(["ms a step"] + [r["attention"] for r in case], rows, set(range(1, len(case) + 1))),
        ]
    return blocks


def _between_section(records: list[dict]) -> list[Block]:
    """One decode attention call between two torch ops, per thread count and implementation."""
    if not records:
        return []
    rows = []
    for r in records:
        base = next(
            (
                s
                for s in records
                if s["attention"] == "sdpa"
                and (s["threads"], s["keys"], s.get("run")) == (r["threads"], r["keys"], r.get("run"))
            ),
            None,
        )
        versus = f"{base['step_ms'] / r['step_ms']:.2f}x" if base and r["attention"] != "sdpa" else ""
        rows.append(
            [
                str(r["threads"]),
                str(r["keys"]),
                r["attention"] + _run(r),
                f"{r['step_ms']:.3f}",
                f"{r['attention_ms']:.3f}",
                versus,
            ]
        )
    return [
        Heading(3, "A decode attention call between two torch ops"),
        Para(
            "GPT-2's decode attention (12 heads of 64, one query over the cached keys, fp32) between two "
            "768 x 768 matmuls, as a model runs it, in a loop: the median step and the median attention call. "
            "A runtime whose workers spin between parallel regions shows here. 'vs sdpa' is sdpa's step over "
            "this one's."
        ),
        Table(["threads", "keys", "attention", "step ms", "attention ms", "vs sdpa"], rows, {0, 1, 3, 4}),
    ]
