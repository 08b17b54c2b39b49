"""Throughput: model GFLOP/s per backend and formulation along a series (H or T), as % of the
peak each benchmark is read against (Peaks.matched_peak); the sections against H and against T.
"""

from __future__ import annotations

from pathlib import Path

from . import figures
from .document import Figure, Heading, Para, Table
from .peaks import Peaks
from .results import ResultSet, is_bf16
from .series import Series, SeriesTable, variants
from .wording import above_100, fmt_gflops, threads_text


def gflops_table(results: ResultSet, series: Series, threads: int) -> SeriesTable | None:
    """Model GFLOP/s per (backend, formulation) along the series; None when nothing has the
    GFLOPS counter there."""
    columns = []
    for backend, form in variants(results):
        points = [results.get(backend, form, s, threads) for s in series.shapes]
        if any(m is not None and m.gflops is not None for m in points):
            columns.append((backend, form))
    if not columns:
        return None
    rows = []
    for s in series.shapes:
        values = []
        for backend, form in columns:
            m = results.get(backend, form, s, threads)
            values.append(None if m is None else m.gflops)
        rows.append((series.x(s), values))
    return SeriesTable(series, threads, columns, rows)


# ---- in words ----


def peak_lines(results: ResultSet, peaks: Peaks):
    """For a GFLOP/s panel: the distinct peaks its columns are read against (Peaks.matched_peak,
    as their % of peak: a bf16 panel's native backends the bf16 dot peak)."""

    def lines(table: SeriesTable) -> list[tuple[str, float]]:
        found: dict[str, float] = {}
        for backend, form in table.columns:
            for shape in table.series.shapes:
                m = results.get(backend, form, shape, table.threads)
                if m is None:
                    continue
                matched = peaks.matched_peak(m)
                p = matched.peak.for_threads(table.threads) if matched.peak else None
                if p:
                    label = matched.label
                    if found.get(label, p) != p:  # two files' peaks: say whose
                        label += f" ({Path(m.source).name})"
                    found[label] = p
        # The FP32 FMA peak a native bf16 kernel stands against for want of a dot peak is one
        # line with the same peak of the other columns, under their label.
        found = {
            label: p
            for label, p in found.items()
            if "(no bf16 dot peak)" not in label
            or not any(q == p and "(no bf16 dot peak)" not in other for other, q in found.items())
        }
        return sorted(found.items(), key=lambda t: -t[1])

    return lines


def section(
    results: ResultSet, series_list: list[Series], peaks: Peaks, folder: Path, axis: str, prefix: str = ""
) -> list:
    """GFLOP/s and % of peak against H (axis 'heads') or T ('seq'): a figure, the cells above
    100% said, a table per series and thread count."""
    threads = results.thread_counts()
    tables = {(s, n): gflops_table(results, s, n) for s in series_list for n in threads}
    if not any(tables.values()):
        return []
    stem = f"{prefix}gflops_vs_{axis}"
    name, short = ("H", "H") if axis == "heads" else ("sequence length T", "T")
    blocks: list = [
        Heading(2, f"GFLOP/s and % of peak against {name}"),
        Para(
            "Model GFLOP/s (docs/design.md §3 FLOP count / median time) per backend and formulation; "
            "cells show GFLOP/s and, in brackets, % of the measured peak for that thread count "
            "and the ISA of that backend (see the appendix)"
            + (
                "; bf16 benchmarks (series marked bf16) against the peak 'fp32 vs bf16' names for "
                "their backend: the bf16 dot-product peak where its kernels are native, else the "
                "FP32 FMA peak (n/a: not known)."
                if any(is_bf16(m) for m in results.measurements.values())
                else "."
            )
        ),
    ]
    figures.series_grid(
        folder,
        stem,
        f"Throughput against {name}",
        series_list,
        threads,
        lambda s, n: tables[(s, n)],
        figures.draw_gflops(peak_lines(results, peaks)),
        "model GFLOP/s",
    )
    blocks.append(
        Figure(stem, f"GFLOP/s against {name}; right axis (one peak in a panel): % of measured peak")
    )
    # Cells above 100%, by whether they are bf16 read against the FP32 FMA peak for want of a
    # bf16 dot peak (their kernels can exceed it) or not (the calibration fell short).
    above: dict[bool, list] = {True: [], False: []}
    for (series, n), table in tables.items():
        for shape, (_, values) in zip(series.shapes, table.rows if table else []):
            for b, f in table.columns:
                m = results.get(b, f, shape, n)
                if (pct := peaks.percent(m)) is not None and pct > 100:
                    no_dot = peaks.matched_peak(m).basis == "fma_no_dot"
                    above[no_dot].append((pct, f"{b} {f}", series.x(shape), n))
    blocks += above_100(
        above[False],
        lambda count, pct, variant, x, n: (
            f"**{count} value(s) exceed 100% of the measured peak** (up to "
            f"{pct:.0f}%: {variant} at {short}={x}, {threads_text(n)}): the peak calibration measured "
            "less than these runs reached (a busy machine during calibration, or turbo), so % of peak "
            "is overstated there."
        ),
    )
    blocks += above_100(
        above[True],
        lambda count, pct, variant, x, n: (
            f"{count} bf16 value(s) exceed 100% of the FP32 FMA peak "
            f"(up to {pct:.0f}%: {variant} at {short}={x}, {threads_text(n)}): their kernels multiply "
            "bf16 pairs natively, but their file has no bf16 dot-product peak to read them against, "
            "so the FP32 FMA peak stands in; native bf16 kernels can exceed it."
        ),
    )
    for (series, n), table in tables.items():
        if table is None:
            continue
        header = [f"{b} {f}" for b, f in table.columns]
        blocks.append(Heading(3, f"{series.title}, {threads_text(n)}"))
        rows = [
            [str(x)]
            + [
                fmt_gflops(v, peaks.percent(results.get(b, f, shape, n)))
                for (b, f), v in zip(table.columns, values)
            ]
            for shape, (x, values) in zip(series.shapes, table.rows)
        ]
        blocks.append(Table([series.x_name] + header, rows, numeric=set(range(len(header) + 1))))
    return blocks
