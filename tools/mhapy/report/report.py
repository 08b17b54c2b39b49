"""The report: the topics' sections in the order a reader needs them (the answer first), each
only when its data is there; one machine's sections, or after the cross-machine table a section
per machine; the appendix last.

A topic module holds its analysis (numbers and verdicts, as dataclasses) and then, under
'in words', the sections that word them: linking (which backend to link: the answer and the
per-shape table), formulations (split-weight and fused-QKV against the wrapper), fused_qkv
(fused-QKV against split-weight), throughput (GFLOP/s and % of peak), scaling (threads, and the
tbb scaling model from a task trace),
precision (fp32 vs bf16), decode, grouped_query (fewer K/V heads than H), windows (sliding
windows against causal attention and the peers' masked calls), peer_ranking (mha and
the peers), cross_machine, overview (summary, time bars, failures) and appendix (contexts,
peaks, peak warnings). Shared: results (loading), series, peaks, wording, figures, document.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..schema import is_peer
from ..scaling_model import DEFAULT_SOCKET_GBPS, TraceFile
from . import (
    appendix,
    decode,
    document,
    figures,
    formulations,
    fused_qkv,
    grouped_query,
    linking,
    cross_machine,
    overview,
    peer_ranking,
    precision,
    scaling,
    throughput,
    verify,
    whole_models,
    windows,
)
from .document import Bullets, Figure, Heading, Para
from .peaks import Peaks, peak_warnings
from .results import ReportError, ResultSet, shard_problems
from .series import Series, mha_heads_series, seq_series


def _answer(results: ResultSet, heads: list[Series], level: int = 2, kv: list[Series] = ()) -> list:
    """The answer first: the backend to link (forward passes, decode), the noise, the fastest
    path of each decode step measured with several KV cache precisions (decode.cache_answer), the speedup
    of split_weight (and fused_qkv) over the wrapper along the H series of the forward passes,
    and fused_qkv against split_weight on the backend to link (H and grouped K/V series)."""
    forward = results.forward()
    return (
        [
            Heading(level, "Answer: which backend to link"),
            # Then, for decode steps measured in several cache precisions, the fastest path of each.
            Bullets(linking.answer_bullets(results) + decode.cache_answer(results.decode())),
        ]
        + formulations.answer_blocks(forward, heads)
        + fused_qkv.answer_blocks(forward, list(heads) + list(kv))
    )


@dataclass(frozen=True)
class ModelInputs:
    """What the scaling model reads besides the results: `mha_bench --trace` files (each applies
    to the machine of its CPU model and thread count) and the bandwidth of all cores assumed
    beyond the thread counts a trace measured."""

    traces: tuple[TraceFile, ...] = ()
    socket_gbps: float = DEFAULT_SOCKET_GBPS

    def for_machine(self, results: ResultSet) -> TraceFile | None:
        m = results.machine
        for t in self.traces:
            if m is not None and (t.cpu_model, t.hardware_threads) == (m.cpu_model, m.threads):
                return t
        return None


def emulation_warning(results: ResultSet) -> list:
    """A paragraph saying the timings are an emulator's where a file was measured under one
    (its context's mha_emulation, which mha_bench fills in: e.g. aarch64 code under qemu-user on
    an x86 host), else nothing."""
    emulators = sorted({str(c["mha_emulation"]) for _, c in results.contexts if c.get("mha_emulation")})
    if not emulators:
        return []
    return [
        Para(
            "**Measured under emulation**: these timings are the emulator's, not this CPU's "
            f"(mha_emulation: {'; '.join(emulators)}). They show that the code runs and what it "
            "computes; its speed waits for a run on the CPU itself."
        )
    ]


def _notes(notes: str) -> list:
    """The run's written analysis (Markdown: see document.parse_notes) under its heading; none
    where there is none."""
    return [Heading(2, "Notes on this run")] + document.parse_notes(notes, 3) if notes.strip() else []


def _machine_blocks(
    results: ResultSet,
    peaks: Peaks,
    folder: Path,
    notes: str,
    prefix: str,
    answer: bool,
    model: ModelInputs = ModelInputs(),
) -> tuple[list, list]:
    """One machine's sections (answer, summary, notes, figures, link tables, fp32 vs bf16,
    decode, scaling model, failures, absent) and its appendix. The forward-pass sections read
    the forward passes only (past = 0); the incremental calls (past > 0) have the decode
    sections."""
    forward = results.forward()
    heads, kv = mha_heads_series(forward.shapes())
    seqs = seq_series(forward.shapes())
    blocks: list = emulation_warning(results)
    blocks += _answer(results, heads, kv=kv) if answer else []
    blocks += peer_ranking.section(results, folder, prefix)
    blocks += overview.summary(results)
    blocks += _notes(notes)
    absent = []
    if forward.measurements:
        blocks += _forward_blocks(forward, heads, seqs, peaks, folder, prefix, absent, kv)
    else:
        absent.append(
            "forward passes (past = 0): none in the inputs, so no split/wrapper speedup against "
            "H, GFLOP/s, thread scaling or per-shape link table."
        )
    bf16 = precision.section(results, peaks)
    blocks += bf16
    if not bf16:
        absent.append("fp32 vs bf16: no bf16 benchmarks in the inputs (`mha_bench --precision fp32,bf16`).")
    bandwidths = decode.find_bandwidths(results)
    steps = decode.sections(verify.others(results.decode()), bandwidths, folder, prefix)
    if not steps:
        absent.append("decode: no incremental calls (past > 0) in the inputs (`mha_bench --preset decode`).")
    elif not bandwidths.any():
        absent.append(
            "decode bandwidth bound and % of bound: no measured streaming-read bandwidth "
            "(`mha_stream_read_gbps_*`) in the inputs."
        )
    if not any(is_peer(b) for b in results.backends()):
        absent.append("peers: not in the inputs (`scripts/sweep.sh --with-peers`, python -m mhapy.peers).")
    for path, context in results.contexts:
        if context.get("peers_unavailable"):
            absent.append(
                f"{context.get('mha_peers', 'a peer library')}: {context['peers_unavailable']} (`{Path(path).name}`)."
            )
    blocks += steps
    blocks += verify.section(results.decode(), folder, prefix)
    grouped = grouped_query.section(results, kv, bandwidths, folder, prefix)
    if not grouped:
        absent.append(
            "grouped-query attention: no shapes with fewer K/V heads than H next to the same shape "
            "with H K/V heads (the heads preset's series heads_kv, the decode preset's decode_kv)."
        )
    blocks += grouped
    blocks += windows.section(results)
    trace = model.for_machine(results)
    modelled = scaling.model_section(results, trace, folder, prefix, model.socket_gbps) if trace else []
    if trace and not modelled:
        absent.append(
            f"scaling model: `{Path(trace.path).name}` traces no shape that tbb was measured on at 1 thread here."
        )
    elif model.traces and not trace:
        absent.append(
            "scaling model: the trace files given ("
            + ", ".join(
                f"`{Path(t.path).name}`: {t.cpu_model}, {t.hardware_threads} threads" for t in model.traces
            )
            + ") describe other machines."
        )
    blocks += modelled
    blocks += overview.failures_section(results)
    if absent:
        blocks += [Heading(2, "Not in this run"), Bullets(absent)]
    return blocks, appendix.section(results, peaks)


def _forward_blocks(
    results: ResultSet,
    heads: list[Series],
    seqs: list[Series],
    peaks: Peaks,
    folder: Path,
    prefix: str,
    absent: list[str],
    kv: list[Series] = (),
) -> list:
    """The forward-pass sections (figures, scaling, link tables) of a machine's forward passes;
    what they cannot show is added to `absent`. kv: the grouped K/V series (their own section;
    here in fused_qkv against split_weight)."""
    blocks: list = []
    if heads:
        speed = formulations.section(results, heads, folder, prefix)
        blocks += speed
        if not speed:
            absent.append("split/wrapper speedup: no backend has both formulations along an H series.")
    if heads or kv:
        blocks += fused_qkv.section(results, list(heads) + list(kv), folder, prefix)
    if heads:
        blocks += throughput.section(results, heads, peaks, folder, "heads", prefix)
    else:
        absent.append(
            "split/wrapper speedup and GFLOP/s against H: no shapes that differ only in H "
            "(run the heads preset)."
        )
    if seqs:
        blocks += throughput.section(results, seqs, peaks, folder, "seq", prefix)
    else:
        absent.append("GFLOP/s against T: no shapes that differ only in T (run the seq preset).")
    parallel = scaling.section(results, folder, prefix)
    link = linking.section(results, heads + seqs, folder, prefix)
    # Bars for the shapes no series figure shows; for every shape when no other figure was
    # drawn (e.g. one backend and formulation along a series, without the GFLOPS counter).
    drawn = any(isinstance(b, Figure) for b in blocks + parallel + link)
    blocks += overview.time_bars_section(results, heads + seqs + list(kv) if drawn else [], folder, prefix)
    blocks += parallel
    if not parallel:
        absent.append("thread scaling: no shape was measured at 1 thread and at more.")
    if not any(m.flops for m in results.measurements.values()):
        absent.append("GFLOP/s and % of peak: no GFLOPS counter in the inputs.")
    elif not peaks.any():
        absent.append("% of peak: no measured peak in the inputs.")
    return blocks + link


def _shift(blocks: list, by: int) -> list:
    for b in blocks:
        if isinstance(b, Heading):
            b.level += by
    return blocks


def build(
    machines: list[ResultSet] | ResultSet,
    peaks: list[Peaks] | Peaks,
    folder: Path,
    title: str,
    notes: str = "",
    model: ModelInputs = ModelInputs(),
    models: list[dict] | None = None,
) -> list:
    """Writes the figures into folder and returns the report's blocks: title, warnings, the
    answer, then one machine's sections (or a section per machine, after a cross-machine
    table), whole models on each attention implementation (`models`: mhapy.models.bench's
    records), and the machine context as an appendix. `notes` (Markdown: see
    document.parse_notes) is the run's written analysis, placed after the summary."""
    if isinstance(machines, ResultSet):
        machines, peaks = [machines], [peaks]
    # Every input once (a peers file may belong to several machines).
    contexts = list({path: context for r in machines for path, context in r.contexts}.items())
    repeated = sum(r.repeated for r in machines)
    blocks: list = [
        Heading(1, title),
        Para(
            "Generated by `python3 -m mhapy.report` from "
            + ", ".join(f"`{Path(p).name}`" for p, _ in contexts)
            + ". Times are medians over repetitions of the real time per forward pass (per step: incremental call, for decode)."
            + (
                f" {repeated} benchmarks were measured in more than one run; each "
                "shows its run with the lowest median (`--best-run`)."
                if repeated
                else ""
            )
        ),
    ]
    warnings = [
        f"**{key}** (`{Path(path).name}`): {value}"
        for path, context in contexts
        for key, value in context.items()
        if "warning" in key.lower()
    ]
    warnings += [f"**peak**: {appendix.peak_warning_text(w)}" for w in peak_warnings(peaks)]
    warnings += [f"**shards** ({r.machine_label()}): {text}" for r in machines for text in shard_problems(r)]
    if warnings:
        blocks += [Heading(2, "Warnings"), Bullets(warnings)]
    whole = whole_models.section(models or [])
    if len(machines) == 1:
        body, back = _machine_blocks(machines[0], peaks[0], folder, notes, "", True, model)
        return blocks + body + whole + back
    blocks += [Heading(2, "Answer: which backend to link")]
    for r in machines:
        blocks += [Para(f"**{r.machine_label()}**:"), Bullets(linking.answer_bullets(r))]
    blocks += cross_machine.section(machines)
    blocks += _notes(notes)
    appendices: list = []
    used: set[str] = set()
    for i, (r, p) in enumerate(zip(machines, peaks)):
        slug = r.machine.slug() if r.machine else f"machine{i + 1}"
        prefix = (slug if slug not in used else f"{slug}_{i + 1}") + "_"
        used.add(slug)
        body, back = _machine_blocks(r, p, folder, "", prefix, True, model)
        blocks += [Heading(2, f"Machine: {r.machine_label()}")] + _shift(body, 1)
        appendices += [Heading(3, r.machine_label())] + _shift(back[1:], 1)
    return blocks + whole + [Heading(2, "Appendix: machine and build")] + appendices


def generate(
    machines: list[ResultSet] | ResultSet,
    peaks: list[Peaks] | Peaks,
    folder: Path,
    title: str = "mha performance report",
    notes: str = "",
    model: ModelInputs = ModelInputs(),
    with_html: bool = False,
    models: list[dict] | None = None,
) -> list:
    """Writes report.md and every figure (PNG) into folder; with_html also report.html and the
    figures' SVGs."""
    folder.mkdir(parents=True, exist_ok=True)
    figures.also_svg(with_html)
    blocks = build(machines, peaks, folder, title, notes, model, models)
    document.write(blocks, title, folder, with_html)
    return blocks


def generate_models(
    models: list[dict],
    sources: list[str],
    folder: Path,
    title: str,
    notes: str = "",
    with_html: bool = False,
) -> list:
    """A report of whole models alone (mhapy.models.bench's records, without a sweep: no answer,
    peaks or appendix, which come from a sweep's context): title, notes, the whole-models
    section. Writes report.md (with_html also report.html) into folder."""
    if not models:
        raise ReportError("the --models files hold no records")
    folder.mkdir(parents=True, exist_ok=True)
    blocks: list = [
        Heading(1, title),
        Para(
            "Generated by `python3 -m mhapy.report` from "
            + ", ".join(f"`{Path(p).name}`" for p in sources)
            + " (whole models only: no benchmark sweep, so no backend answer, peaks or machine appendix)."
        ),
    ]
    blocks += _notes(notes)
    blocks += whole_models.section(models)
    document.write(blocks, title, folder, with_html)
    return blocks
