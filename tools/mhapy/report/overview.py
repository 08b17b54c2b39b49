"""What a machine's results hold: the summary (benchmarks, backends, threads, noisy benchmarks,
merged shards), the time bars of the shapes no series figure shows, and the benchmarks that were
skipped, failed or are not attention benchmarks.
"""

from __future__ import annotations

from pathlib import Path

from ..schema import is_peer
from . import figures
from .document import Bullets, Figure, Heading, Para, Table
from .results import ResultSet, benchmarks_present, selections
from .series import Series, formulations_measured, variants
from .wording import threads_text

# A benchmark whose repetitions vary more than this (stddev / mean) is called noisy.
NOISY_CV = 0.05


def summary(results: ResultSet) -> list:
    mha = [b for b in results.backends() if not is_peer(b)]
    peers = [b for b in results.backends() if is_peer(b)]
    decode = len(results.decode().measurements)
    items = [
        f"{len(results.measurements)} benchmarks"
        + (f" ({decode} of them decode steps, past > 0)" if decode else "")
        + f": mha backends {', '.join(mha) or 'none'}"
        + (f"; peers {', '.join(peers)}" if peers else "; no peers")
        + f"; threads {', '.join(map(str, results.thread_counts()))}."
    ]
    noisy = [m for m in results.measurements.values() if m.cv is not None and m.cv > NOISY_CV]
    if noisy:
        worst = max(noisy, key=lambda m: m.cv)
        items.append(
            f"{len(noisy)} benchmark(s) vary by more than {NOISY_CV * 100:.0f}% (coefficient of "
            f"variation) between repetitions; worst {worst.cv * 100:.0f}%: `{worst.key.name()}`. "
            "Treat differences of that size as noise."
        )
    shards = _shards_text(results)
    if shards:
        items.append(shards)
    return [Heading(2, "Summary"), Bullets(items)]


def _shards_text(results: ResultSet) -> str:
    """Which shards of which selection the machine's files hold (mha_bench --shard I/N), when any
    file is one shard of several; '' otherwise."""
    groups = [g for g in selections(results) if g.count > 1]
    if not groups:
        return ""
    parts = []
    for g in groups:
        present = benchmarks_present(results, g)
        state = (
            "complete"
            if g.complete
            else "**incomplete: missing "
            + ", ".join(f"{i}/{g.count}" for i in g.missing)
            + "** (Warnings above)"
        )
        held = (
            f", {present} of {g.selection_size} benchmarks"
            if present is not None and g.selection_size is not None
            else ""
        )
        parts.append(", ".join(f"{i}/{g.count}" for i in g.present) + f" of {g.short()}: {state}{held}")
    text = "Shards merged into this run (`mha_bench --shard I/N`): " + "; ".join(parts) + "."
    if len(groups) > 1:
        text += " **Shards of different selections are mixed** (Warnings above)."
    return text


def time_bars_section(results: ResultSet, series_list: list[Series], folder: Path, prefix: str = "") -> list:
    """Time per backend × formulation for the shapes in none of series_list (a single-shape run,
    or the odd shapes of a mixed one; every shape when series_list is empty): with it every run
    with a timed mha benchmark gets a figure."""
    in_series = {s for series in series_list for s in series.shapes}
    shapes = [s for s in results.shapes() if s not in in_series]
    if not shapes or not any(not is_peer(k.backend) for k in results.measurements if k.shape in shapes):
        return []
    panels = []
    for n in results.thread_counts():
        here = [s for s in shapes if any(k.threads == n and k.shape == s for k in results.measurements)]
        if not here:
            continue
        bars = {}
        for backend, form in variants(results):
            times = [(m.median_s if (m := results.get(backend, form, s, n)) else None) for s in here]
            if any(times):
                bars[(backend, form)] = times
        panels.append((threads_text(n), [s.label() for s in here], bars))
    stem = prefix + "time_bars"
    figures.time_bars(folder, stem, panels)
    return [
        Heading(2, "Time per backend and formulation"),
        Para(
            "Median time per forward pass "
            + ("for the shapes that belong to no H or T series " if series_list else "")
            + (
                "(lower is faster; hatched: wrapper)."
                if "fused_qkv" not in formulations_measured(results)
                else "(lower is faster; hatched //: wrapper, dotted: fused_qkv)."
            )
        ),
        Figure(stem, "Median time per backend and formulation, per thread count"),
    ]


def failures_section(results: ResultSet) -> list:
    blocks: list = []
    if results.failures:
        rows = [[f"`{f.name}`", f.message, Path(f.source).name] for f in results.failures]
        blocks += [
            Heading(2, "Skipped and failed benchmarks"),
            Para(f"{len(rows)} benchmark(s) without timing: they appear in no table or figure."),
            Table(["benchmark", "reason", "file"], rows),
        ]
    if results.unrecognised:
        rows = [[f"`{name}`", Path(src).name] for name, src in results.unrecognised]
        blocks += [
            Heading(2, "Other benchmarks"),
            Para("Not attention benchmarks (names not 'mha/...'): listed, not analysed."),
            Table(["benchmark", "file"], rows),
        ]
    return blocks
