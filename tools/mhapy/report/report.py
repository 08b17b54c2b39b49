"""The main report: sections built from a ResultSet, each only when its data is there."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..schema import is_peer
from . import analysis, document, figures, peer_ranking
from .analysis import Peaks, Series, SeriesTable
from .document import Bullets, Figure, Heading, Para, Table
from .results import Machine, ResultSet, benchmarks_present, selections, shard_problems


# A benchmark whose repetitions vary more than this (stddev / mean) is called noisy.
NOISY_CV = 0.05


# ---- number formats shared with the A/B report ----


def fmt_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def fmt_gflops(value: float | None, pct: float | None = None) -> str:
    if value is None:
        return "–"
    text = f"{value:.1f}" if value < 1000 else f"{value:.0f}"
    return text if pct is None else f"{text} ({pct:.0f}%)"


def _threads_text(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")


# ---- context ----

_CONTEXT_SKIP = {"caches", "load_avg"}

# Google Benchmark's `library_build_type` describes libbenchmark itself (Debian's package says
# "debug"), not the code it timed; readers take it for the latter, so the table says whose it is.
_CONTEXT_EXPLAINED = {
    "library_build_type": "Google Benchmark library's build, not the timed code's (see mha_build_type)",
}


def _context_rows(context: dict) -> list[list[str]]:
    rows = []
    for key, value in context.items():
        if key in _CONTEXT_SKIP or isinstance(value, (dict, list)):
            continue
        note = _CONTEXT_EXPLAINED.get(key)
        rows.append([f"`{key}`", f"{value} ({note})" if note else str(value)])
    caches = context.get("caches")
    if isinstance(caches, list) and caches:
        text = ", ".join(
            f"L{c.get('level', '?')} {c.get('type', '')} {int(c.get('size', 0)) // 1024} KiB"
            + (f" (shared by {c['num_sharing']})" if c.get("num_sharing", 1) > 1 else "")
            for c in caches
            if isinstance(c, dict)
        )
        rows.append(["`caches`", text])
    if isinstance(context.get("load_avg"), list):
        rows.append(["`load_avg`", ", ".join(f"{v:.2f}" for v in context["load_avg"])])
    return rows


def _read_against(results: ResultSet, peaks: Peaks, peak: analysis.Peak) -> str:
    """The backends whose benchmarks' % of peak divides by `peak` (Peaks.matched_peak): 'naive,
    xsimd (bf16)', a backend's bf16 benchmarks named apart; '–' when none."""
    names = {
        m.key.backend + (" (bf16)" if analysis.is_bf16(m) else "")
        for m in results.measurements.values()
        if peaks.matched_peak(m).peak is peak
    }
    return ", ".join(sorted(names)) or "–"


def _peak_blocks(results: ResultSet, peaks: Peaks, level: int) -> list:
    blocks: list = [Heading(level, "Measured peak")]
    peak = peaks.fallback
    if not peaks.any():
        return blocks + [
            Para(
                "No measured FP32 FMA peak in the inputs (no context key with 'peak' for 1 core "
                "or all cores, and no --peak-1core / --peak-all): % of peak is not reported."
            )
        ]
    rows = [
        [
            f"`{Path(fp.source).name}`",
            isa,
            "–" if p.one_core is None else f"{p.one_core:.1f}",
            "–" if p.all_cores is None else f"{p.all_cores:.1f} ({p.all_core_threads} threads)",
            _read_against(results, peaks, p),
            p.source,
        ]
        for fp in peaks.files.values()
        for isa, p in list(fp.per_isa.items()) + [("best", fp.best)]
        if p.one_core or p.all_cores
    ]
    # The bf16 dot-product peaks, with the backends whose bf16 benchmarks are read against them.
    rows += [
        [
            f"`{Path(fp.source).name}`",
            "bf16 dot",
            "–" if dot.one_core is None else f"{dot.one_core:.1f}",
            "–" if dot.all_cores is None else f"{dot.all_cores:.1f} ({dot.all_core_threads} threads)",
            _read_against(results, peaks, dot),
            dot.source,
        ]
        for fp in peaks.files.values()
        for dot in [fp.bf16_dot]
        if dot.one_core or dot.all_cores
    ]
    if rows and not peaks.overridden:
        blocks.append(
            Table(
                ["file", "ISA", "1 core GFLOP/s", "all cores GFLOP/s", "backends read against it", "from"],
                rows,
                numeric={2, 3},
            )
        )
    per = ", ".join(
        text
        for text in (
            f"1 core: **{peak.one_core:.1f} GFLOP/s**" if peak.one_core else "",
            f"all cores: **{peak.all_cores:.1f} GFLOP/s**" if peak.all_cores else "",
            f"all-core peak measured on {peak.all_core_threads} threads" if peak.all_cores else "",
        )
        if text
    )
    what = "Every benchmark's peak" if peaks.overridden else "Best peak of the machine's files (peers)"
    blocks.append(Para(f"{what}: FP32 FMA {per}; from {peak.source}. {Peaks.RULE}"))
    return blocks


def _context_section(results: ResultSet, peaks: Peaks, level: int = 2) -> list:
    blocks: list = [Heading(level, "Appendix: machine and build")]
    for path, context in results.contexts:
        backends = sorted({m.key.backend for m in results.measurements.values() if m.source == path})
        kind = "peers" if backends and all(map(is_peer, backends)) else "benchmarks"
        blocks.append(Heading(level + 1, f"{kind}: `{Path(path).name}`"))
        rows = _context_rows(context)
        blocks.append(Table(["key", "value"], rows) if rows else Para("This file has no context."))
    return blocks + _peak_blocks(results, peaks, level + 1)


# ---- split vs wrapper ----


def _series_table_block(table: SeriesTable, header: list[str], cell) -> Table:
    """One row per point of the series: x, then cell(value) per column."""
    rows = [[str(x)] + [cell(v) for v in values] for x, values in table.rows]
    return Table([table.series.x_name] + header, rows, numeric=set(range(len(header) + 1)))


# How the text names a formulation.
_FORM_NAMES = {"split_weight": "split-weight", "fused_qkv": "fused-QKV", "wrapper": "wrapper"}


class _Against:
    """The wording of a comparison with the wrapper, for the formulations compared
    (analysis.against_wrapper): split_weight alone (runs without fused_qkv) reads as the
    split/wrapper speedup it always was; more, as a speedup over the wrapper per formulation."""

    def __init__(self, results: ResultSet):
        self.forms = analysis.against_wrapper(results)
        self.named = self.forms != ["split_weight"]

    def column(self, column: tuple[str, str]) -> str:
        """A table's name for a (backend, formulation) speedup column."""
        return f"{column[0]} {column[1]}" if self.named else column[0]

    @property
    def heading(self) -> str:
        """'Split-weight vs wrapper', 'Split-weight and fused-QKV vs wrapper'."""
        text = " and ".join(_FORM_NAMES[f] for f in self.forms) + " vs wrapper"
        return text[0].upper() + text[1:]

    @property
    def ratio(self) -> str:
        """The y axis: 'wrapper time / split_weight time (×)'."""
        return f"wrapper time / {self.forms[0] if not self.named else 'formulation'} time (×)"

    @property
    def definition(self) -> str:
        if not self.named:
            return (
                "Speedup = median time of the wrapper / median time of split_weight, same backend, "
                "shape and threads: above 1.0 split-weight is faster."
            )
        return (
            "Speedup = median time of the wrapper / median time of the formulation ("
            + ", ".join(self.forms)
            + "), same backend, shape and threads: above 1.0 that formulation is faster than "
            "the wrapper. Columns and lines: backend · formulation (lines: solid split_weight, "
            "dash-dot fused_qkv)."
        )


def _speedup_section(results: ResultSet, series_list: list[Series], folder: Path, prefix: str = "") -> list:
    threads = results.thread_counts()
    tables = {(s, n): analysis.speedup_table(results, s, n) for s in series_list for n in threads}
    if not any(tables.values()):
        return []
    against = _Against(results)
    blocks: list = [
        Heading(2, f"{against.heading} against H"),
        Para(
            f"{against.definition} Both series of the heads "
            "preset: fixed d_model (head_dim shrinks as H grows) and fixed head_dim (d_model "
            "grows with H)."
            + (
                " Shapes with grouped K/V heads measured next to their MHA twin are in "
                "'Grouped-query attention', not here."
                if analysis.kv_series(results.shapes())
                else ""
            )
        ),
    ]
    figures.series_grid(
        folder,
        prefix + "speedup_vs_heads",
        "Split-weight speedup over the wrapper" if not against.named else "Speedup over the wrapper",
        series_list,
        threads,
        lambda s, n: tables[(s, n)],
        figures.draw_ratios(named=against.named),
        against.ratio,
    )
    blocks.append(
        Figure(
            prefix + "speedup_vs_heads",
            "Split/wrapper speedup against H, per backend"
            if not against.named
            else "Speedup over the wrapper against H, per backend and formulation",
        )
    )
    for (series, n), table in tables.items():
        if table is None:
            continue
        blocks.append(Heading(3, f"{series.title}, {_threads_text(n)}"))
        blocks.append(_series_table_block(table, [against.column(c) for c in table.columns], fmt_ratio))
    return blocks


def _h_list(points: list[tuple[int, float]], name: str = "H") -> str:
    """'H 4, 8, 12 (1.02× – 1.10×)': where, and the range of the ratios; '–' when none."""
    if not points:
        return "–"
    low, high = fmt_ratio(min(r for _, r in points)), fmt_ratio(max(r for _, r in points))
    span = low if low == high else f"{low} – {high}"
    return f"{name} {', '.join(str(x) for x, _ in points)} ({span})"


def _race_section(results: ResultSet, series_list: list[Series], folder: Path, prefix: str = "") -> list:
    """fused_qkv against split_weight along the series: a figure of split_weight time /
    fused_qkv time, and per backend, series and threads where fused_qkv is faster, within
    noise, slower, by how much. Nothing without both formulations."""
    race_list = analysis.races(results, series_list)
    if not race_list:
        return []
    threads = results.thread_counts()
    tables = {}
    for series in series_list:
        for n in threads:
            mine = [r for r in race_list if r.series == series and r.threads == n]
            columns = [(r.backend, "fused_qkv") for r in mine]
            rows = [
                (series.x(s), [next((v for x, v, _ in r.points if x == series.x(s)), None) for r in mine])
                for s in series.shapes
            ]
            tables[(series, n)] = SeriesTable(series, n, columns, rows) if mine else None
    stem = prefix + "fused_vs_split"
    figures.series_grid(
        folder,
        stem,
        "Fused-QKV speedup over split-weight",
        series_list,
        threads,
        lambda s, n: tables[(s, n)],
        figures.draw_ratios(named=False),
        "split_weight time / fused_qkv time (×)",
    )
    rows = [
        [
            r.backend,
            r.series.title,
            str(r.threads),
            fmt_ratio(r.median),
            f"{fmt_ratio(r.low[1])} (H={r.low[0]}) – {fmt_ratio(r.high[1])} (H={r.high[0]})",
            _h_list(r.where("faster")),
            _h_list(r.where("tie")),
            _h_list(r.where("slower")),
        ]
        for r in race_list
    ]
    return [
        Heading(2, "Fused-QKV vs split-weight against H"),
        Para(
            "Ratio = median time of split_weight / median time of fused_qkv, same backend, shape and "
            "threads: above 1.0 fused_qkv (one projection for Q, K and V) is faster. Per "
            "backend, series and threads: the median ratio over the points both were measured "
            "at, its range, and at which H fused_qkv is faster, within noise, or slower "
            "(noise: overlapping repetition ranges, or a difference under twice the backend's "
            f"measured noise; needs ≥ {analysis.NOISE_MIN_REPETITIONS} repetitions)."
        ),
        Figure(
            stem, "split_weight time / fused_qkv time against H, per backend (above 1.0: fused_qkv faster)"
        ),
        Table(
            [
                "backend",
                "series",
                "threads",
                "median",
                "range",
                "fused_qkv faster",
                "within noise",
                "split_weight faster",
            ],
            rows,
            numeric={2, 3},
        ),
    ]


def _peak_lines(results: ResultSet, peaks: Peaks):
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


def _above_100(above: list[tuple], say) -> list:
    """A paragraph on the cells above 100% of their yardstick: say(count, *the worst), the worst
    being (%, backend formulation, x, threads); nothing when there are none."""
    return [Para(say(len(above), *max(above)))] if above else []


def _gflops_section(
    results: ResultSet, series_list: list[Series], peaks: Peaks, folder: Path, axis: str, prefix: str = ""
) -> list:
    threads = results.thread_counts()
    tables = {(s, n): analysis.gflops_table(results, s, n) for s in series_list for n in threads}
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
                if any(analysis.is_bf16(m) for m in results.measurements.values())
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
        figures.draw_gflops(_peak_lines(results, peaks)),
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
    blocks += _above_100(
        above[False],
        lambda count, pct, variant, x, n: (
            f"**{count} value(s) exceed 100% of the measured peak** (up to "
            f"{pct:.0f}%: {variant} at {short}={x}, {_threads_text(n)}): the peak calibration measured "
            "less than these runs reached (a busy machine during calibration, or turbo), so % of peak "
            "is overstated there."
        ),
    )
    blocks += _above_100(
        above[True],
        lambda count, pct, variant, x, n: (
            f"{count} bf16 value(s) exceed 100% of the FP32 FMA peak "
            f"(up to {pct:.0f}%: {variant} at {short}={x}, {_threads_text(n)}): their kernels multiply "
            "bf16 pairs natively, but their file has no bf16 dot-product peak to read them against, "
            "so the FP32 FMA peak stands in; native bf16 kernels can exceed it."
        ),
    )
    for (series, n), table in tables.items():
        if table is None:
            continue
        header = [f"{b} {f}" for b, f in table.columns]
        blocks.append(Heading(3, f"{series.title}, {_threads_text(n)}"))
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


def _scaling_section(results: ResultSet, folder: Path, prefix: str = "") -> list:
    scaling = analysis.thread_scaling(results)
    if not scaling:
        return []
    figures.thread_scaling(folder, prefix + "thread_scaling", scaling)
    rows = [
        [
            s.backend,
            s.formulation,
            str(s.threads),
            fmt_ratio(s.geomean),
            f"{s.efficiency * 100:.0f}%",
            f"{fmt_ratio(s.low)} – {fmt_ratio(s.high)}",
            str(s.shapes),
        ]
        for s in scaling
    ]
    return [
        Heading(2, "Thread scaling"),
        Para(
            "Parallel speedup = median time on 1 thread / median time on n threads, over every "
            "shape measured at both; efficiency = speedup / n."
        ),
        Figure(prefix + "thread_scaling", "Speedup over 1 thread, geometric mean over shapes"),
        Table(
            ["backend", "formulation", "threads", "speedup (geomean)", "efficiency", "min – max", "shapes"],
            rows,
            numeric={2, 3, 4, 5, 6},
        ),
    ]


# ---- which backend to link ----


def _choice_row(c: analysis.Choice) -> list[str]:
    def variant(m):
        return "–" if m is None else f"{m.key.backend} {m.key.formulation}"

    peer = "–"
    if c.peer is not None:
        peer = f"{variant(c.peer)} {fmt_time(c.peer.median_s)}"
        if c.best is not None:
            peer += f" ({fmt_ratio(c.peer.median_s / c.best.median_s)})"
    return [
        c.shape.label(),
        variant(c.best),
        "–" if c.best is None else fmt_time(c.best.median_s),
        variant(c.runner_up),
        "–" if c.runner_up is None else fmt_time(c.runner_up.median_s),
        "–" if c.margin is None else f"{c.margin * 100:.{1 if c.margin < 1 else 0}f}%",
        peer,
        c.recommendation,
    ]


def _best_word(results: ResultSet) -> str:
    """'faster' of two formulations measured (or one), 'fastest' of three."""
    return "faster" if len(analysis.formulations_measured(results)) <= 2 else "fastest"


def _link_section(results: ResultSet, series_list: list[Series], folder: Path, prefix: str = "") -> list:
    chosen = analysis.choices(results)
    if not any(c.best for c in chosen):
        return [
            Heading(2, "Which backend to link"),
            Para("No mha backend was measured (peers only): nothing to recommend."),
        ]
    blocks: list = [
        Heading(2, "Which backend to link"),
        Para(
            "Per shape and thread count: the fastest mha backend and formulation, the best of "
            "any other mha backend (the alternative to linking it), and the margin = runner-up "
            f"time / fastest time − 1. A margin under {analysis.TIE_MARGIN * 100:.0f}%, or "
            "overlapping repetition ranges, is called within noise. The fastest peer (PyTorch, "
            "OpenVINO, ONNX Runtime) is shown beside them: its time, and in brackets that time / "
            "the fastest mha time ('mha and the peers' ranks them)."
        ),
    ]
    summary = []
    for n in results.thread_counts():
        wins = analysis.win_counts(chosen, n)
        if wins:
            text = "; ".join(f"{v}: {k} of {total}" for v, k, total in wins)
            summary.append(f"{_threads_text(n)}: fastest on the most shapes: {text}")
    blocks.append(Bullets(summary))
    threads = results.thread_counts()
    tables = {(s, n): analysis.relative_time_table(results, s, n) for s in series_list for n in threads}
    if any(tables.values()):
        figures.series_grid(
            folder,
            prefix + "link_choice",
            f"Each backend's {_best_word(results)} formulation, relative to the fastest mha backend",
            series_list,
            threads,
            lambda s, n: tables[(s, n)],
            figures.draw_relative_time,
            "time / fastest mha time (×)",
        )
        blocks.append(
            Figure(prefix + "link_choice", "Time relative to the fastest mha backend (1.0 = link this one)")
        )
    for n in threads:
        blocks.append(Heading(3, _threads_text(n)))
        blocks.append(
            Table(
                ["shape", "fastest", "time", "runner-up", "time", "margin", "fastest peer", "recommendation"],
                [_choice_row(c) for c in chosen if c.threads == n],
                numeric={2, 4, 5},
            )
        )
    return blocks


# ---- the answer first ----


def _noise_text(results: ResultSet) -> str:
    noise = analysis.noise_by_backend(results)
    if noise:
        per = ", ".join(f"{b} {v * 100:.1f}%" for b, v in noise.items())
        return (
            "Run-to-run noise, measured (median coefficient of variation of the repetition "
            f"times, benchmarks with ≥ {analysis.NOISE_MIN_REPETITIONS} repetitions): {per}."
        )
    if not any(m.repetitions > 1 for m in results.measurements.values()):
        return "One repetition per benchmark: run-to-run noise is not known."
    return (
        f"Fewer than {analysis.NOISE_MIN_REPETITIONS} repetitions per benchmark: run-to-run noise "
        "is not measured (the per-shape rule below uses the repetition ranges)."
    )


def _link_bullets(results: ResultSet, kind: str = "") -> list[str]:
    """The answer per thread count; kind ('decode') names what the shapes are."""
    items = []
    what = f"{kind} shapes" if kind else "shapes"
    for n in results.thread_counts():
        ls = analysis.link_summary(results, n)
        if ls is None:
            continue
        forms = ", ".join(f"{f} on {k}" for f, k in ls.formulations)
        text = (
            f"**{kind + ', ' if kind else ''}{_threads_text(n)}: link {ls.backend}** (its {_best_word(results)} "
            f"formulation: {forms} of {sum(k for _, k in ls.formulations)} {what}); fastest mha "
            f"backend on {ls.wins} of {ls.shapes} {what}"
        )
        if ls.runner_up is None:
            text += "; no other mha backend measured."
        else:
            noise = "" if ls.noise is None else f" or under the measured noise, {ls.noise * 100:.1f}%"
            verdict = "within noise: either will do" if ls.tie else "not within noise"
            text += (
                f"; runner-up {ls.runner_up}, {ls.margin * 100:.1f}% slower (geometric mean over "
                f"the {ls.common} {what} both measured): {verdict} (noise = a margin under "
                f"{analysis.TIE_MARGIN * 100:.0f}%{noise})."
            )
        items.append(text)
    return items


def _by_precision(results: ResultSet, kind: str = "") -> list[tuple[ResultSet, str]]:
    """[(results, kind)] as given when nothing was measured in bf16; otherwise its fp32 and its
    bf16 benchmarks apart, kind prefixed 'fp32' / 'bf16' (together, a backend that declines
    bf16 would rank lower for measuring fewer shapes)."""
    if not any(analysis.is_bf16(m) for m in results.measurements.values()):
        return [(results, kind)]
    return [
        (results.only(lambda k, p=precision: k.shape.precision == p), f"{precision} {kind}".strip())
        for precision in ("fp32", "bf16")
    ]


def _answer_bullets(results: ResultSet) -> list[str]:
    """Which backend to link: for forward passes (past = 0) and, separately, for decode
    (past > 0), per thread count, fp32 and bf16 apart when bf16 was measured; then the
    measured noise."""
    parts = _by_precision(results.forward()) + _by_precision(results.decode(), "decode")
    items = [text for part, kind in parts for text in _link_bullets(part, kind)]
    if not items:
        items = ["No mha backend was measured (peers only): nothing to recommend."]
    return items + [_noise_text(results)]


def _speedup_cell(
    results: ResultSet, backend: str, form: str, series: Series, n: int, x: int, v: float
) -> str:
    shape = next(s for s in series.shapes if series.x(s) == x)
    tie = analysis.speedup_is_tie(results, backend, shape, n, form)
    return f"{fmt_ratio(v)} (H={x})" + (", tie within noise" if tie else "")


def _race_verdicts(results: ResultSet, series_list: list[Series]) -> list[str]:
    """Per thread count, fused_qkv against split_weight on the backend to link there (the fp32
    answer's when bf16 was measured) over every shape of the series: at how many shapes it is
    at least as fast within noise, where it is slower, the ratios' median and range. Empty
    without both formulations."""
    race_list = analysis.races(results, series_list)
    items = []
    linking = _by_precision(results)[0][0]
    for n in results.thread_counts():
        ls = analysis.link_summary(linking, n)
        v = analysis.race_verdict(results, race_list, ls.backend, n) if ls else None
        if v is None:
            continue
        counts = f"{v.faster} faster beyond noise, {v.tie} within noise"
        if v.held:
            text = (
                f"{_threads_text(n)}, {v.backend} (the backend to link): fused_qkv **at least as fast "
                f"as split_weight (within noise) at all {v.shapes} shapes** ({counts})"
            )
        else:
            slower = ", ".join(f"{s.label()} ({fmt_ratio(r)})" for s, r in v.slower)
            text = (
                f"{_threads_text(n)}, {v.backend} (the backend to link): fused_qkv **slower than "
                f"split_weight beyond noise at {len(v.slower)} of {v.shapes} shapes**: {slower}; at "
                f"least as fast (within noise) at the other {v.faster + v.tie} ({counts})"
            )
        text += (
            f"; split_weight time / fused_qkv time median {fmt_ratio(v.median)}, "
            f"{fmt_ratio(v.low)} – {fmt_ratio(v.high)}."
        )
        items.append(text)
    return items


def _answer(results: ResultSet, heads: list[Series], level: int = 2, kv: list[Series] = ()) -> list:
    """The answer first: the backend to link (forward passes, decode), the noise, the speedup
    of split_weight (and fused_qkv) over the wrapper along the H series of the forward passes,
    and fused_qkv against split_weight on the backend to link (H and grouped K/V series)."""
    blocks: list = [Heading(level, "Answer: which backend to link")]
    blocks.append(Bullets(_answer_bullets(results)))
    results = results.forward()
    against = _Against(results)
    rows = []
    for series in heads:
        for n in results.thread_counts():
            table = analysis.speedup_table(results, series, n)
            for backend, form in table.columns if table else []:
                points = table.column((backend, form))
                (x0, v0), (x1, v1) = points[0], points[-1]
                best_x, best_v = max(points, key=lambda p: p[1])
                rows.append(
                    [backend]
                    + ([form] if against.named else [])
                    + [series.title, str(n)]
                    + [
                        _speedup_cell(results, backend, form, series, n, x, v)
                        for x, v in ((x0, v0), (x1, v1), (best_x, best_v))
                    ]
                )
    if rows:
        if against.named:
            what = (
                "Speedup over the wrapper per formulation (wrapper time / that formulation's "
                "time; above 1.0 the formulation is faster)."
            )
        else:
            what = (
                "Split-weight speedup over the wrapper (wrapper time / split_weight time; above "
                "1.0 split-weight is faster)."
            )
        blocks.append(
            Para(
                f"{what} A difference smaller than the noise (overlapping "
                "repetition ranges, or under twice the backend's measured noise; needs "
                f"≥ {analysis.NOISE_MIN_REPETITIONS} repetitions) is a tie within noise, as at "
                "H = 1 where split-weight and the wrapper do identical work:"
                if against.named
                else f"{what} A difference smaller than the noise (overlapping "
                "repetition ranges, or under twice the backend's measured noise; needs "
                f"≥ {analysis.NOISE_MIN_REPETITIONS} repetitions) is a tie within noise, as at "
                "H = 1 where both do identical work:"
            )
        )
        first = ["backend", "formulation"] if against.named else ["backend"]
        blocks.append(
            Table(
                first + ["series", "threads", "smallest H", "largest H", "largest speedup"],
                rows,
                numeric={len(first) + i for i in range(1, 5)},
            )
        )
    verdicts = _race_verdicts(results, list(heads) + list(kv))
    if verdicts:
        blocks.append(
            Para(
                "Fused-QKV against split-weight on the backend to link (issue 15's target: at least "
                "as fast at every shape, within noise), over every shape of the H series and "
                "grouped K/V series measured in both (ratio = split_weight time / fused_qkv time, "
                "above 1.0 fused_qkv is faster; 'Fused-QKV vs split-weight against H' has each "
                "backend and series):"
            )
        )
        blocks.append(Bullets(verdicts))
    return blocks


# ---- mha and the peers ----


def _mechanism(m) -> str:
    """How a peer's variant computes (its entry's label after the check's text)."""
    return m.label.split("inputs); ", 1)[-1] if "inputs); " in m.label else m.key.backend


def _peer_cell(r: peer_ranking.ClassRanking, library: str) -> str:
    if library not in r.versus_mha:
        return "–"
    ratio, shapes = r.versus_mha[library]
    text = fmt_ratio(1 / ratio) + ("" if shapes == r.shapes else f" ({shapes} of {r.shapes})")
    return f"**{text}**" if ratio > 1 else text


def _peers_section(results: ResultSet, folder: Path, prefix: str = "") -> list:
    """The answer with the peers: per shape class, precision and thread count the fastest path
    (an mha backend or a peer library), each library's time against mha's best, and every shape
    where a peer wins, by how much and how it computes. Empty without peers and mha backends."""
    ranked = peer_ranking.rankings(results)
    if not ranked:
        return []
    libraries = sorted({lib for r in ranked for lib in r.versus_mha})
    rows = [
        [r.shape_class, r.precision, str(r.threads), str(r.shapes), f"**{r.fastest}**", r.best_mha or "–"]
        + [_peer_cell(r, lib) for lib in libraries]
        for r in ranked
    ]
    blocks: list = [
        Heading(2, "Answer: mha and the peers"),
        Para(
            "Per class of shapes, precision and thread count: the fastest path (an mha backend at its "
            "fastest formulation, or a peer library at its fastest variant: the lowest geometric mean of "
            "its time / the fastest time at each shape, among the paths measured on every shape of the "
            "class), mha's fastest backend, and each peer library's time / mha's fastest time (geometric "
            "mean over the shapes both measured; below 1.0, in bold, the peer is faster). Every peer "
            "output was checked against the float64 oracle on mha's own inputs before it was timed."
        ),
        Table(["class", "precision", "threads", "shapes", "fastest", "mha's fastest"] + libraries, rows),
    ]
    wins = []
    for r in ranked:
        by_library: dict[str, list] = {}
        for w in r.peer_wins:
            by_library.setdefault(peer_ranking.path_of(w.peer.key.backend), []).append(w)
        for library, ws in by_library.items():
            top = ws[0]
            wins.append(
                f"**{library} beats mha on {r.shape_class} ({r.precision}, {_threads_text(r.threads)}) at "
                f"{len(ws)} of {r.shapes} shapes**, by up to {fmt_ratio(top.ratio)} ({top.shape.label()}: "
                f"{top.peer.key.backend} {fmt_time(top.peer.median_s)} against mha's {top.mha.key.backend} "
                f"{fmt_time(top.mha.median_s)}); how it computes: {_mechanism(top.peer)}."
            )
    blocks.append(
        Bullets(wins) if wins else Para("No peer beats mha's fastest backend at any shape measured here.")
    )
    panels = []
    for r in ranked:
        bars = {lib: [r.ratios[shape][lib] for shape in r.ratios] for lib in libraries if lib in r.versus_mha}
        title = f"{r.shape_class}, {r.precision}, {_threads_text(r.threads)}"
        panels.append((title, [shape.label() for shape in r.ratios], bars))
    if panels:
        figures.peer_bars(folder, prefix + "peers", panels)
        blocks.append(
            Figure(prefix + "peers", "Each peer library's fastest time / mha's fastest time, per shape")
        )
    return blocks


# ---- fp32 vs bf16 ----


def _pct_cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def _precision_row(p: analysis.PrecisionPair, with_peak: bool) -> list[str]:
    """formulation, shape, threads, fp32 time ('no fp32 run' when unpaired), bf16 time, speedup
    and, with_peak, each precision's % of its peak ('n/a': unknown) and the bf16 peak's name."""
    cells = [
        p.formulation,
        p.shape.label(),
        str(p.threads),
        "no fp32 run" if p.fp32 is None else fmt_time(p.fp32.median_s),
        fmt_time(p.bf16.median_s),
        fmt_ratio(p.speedup),
    ]
    if with_peak:
        cells += ["–" if p.fp32 is None else _pct_cell(p.fp32_pct), _pct_cell(p.bf16_pct), p.bf16_peak.name]
    return cells


def _names(backends: dict[str, set[str]], with_peaks: bool = False) -> str:
    """'**naive**, **tbb**'; with_peaks: '**naive** (portable FMA), **tbb** (avx2 FMA)'."""
    return ", ".join(
        f"**{b}**" + (f" ({', '.join(sorted(names))})" if with_peaks else "") for b, names in backends.items()
    )


def _bf16_peak_text(pairs: list[analysis.PrecisionPair]) -> str:
    """Which peak each backend's bf16 figures are read against, and why."""
    by_basis: dict[str, dict[str, set[str]]] = {}
    for p in pairs:
        by_basis.setdefault(p.bf16_peak.basis, {}).setdefault(p.backend, set()).add(p.bf16_peak.name)
    sentences = []
    if "bf16_dot" in by_basis:
        dots = sorted(
            {
                (p.bf16_peak.peak.one_core, p.bf16_peak.peak.all_cores, p.bf16_peak.peak.all_core_threads)
                for p in pairs
                if p.bf16_peak.basis == "bf16_dot"
            },
            key=str,
        )
        figures_text = "; ".join(
            ", ".join(
                text
                for text in (
                    f"{one:.1f} GFLOP/s on 1 core" if one else "",
                    f"{every:.1f} GFLOP/s on {threads} threads" if every else "",
                )
                if text
            )
            for one, every, threads in dots
        )
        sentences.append(
            f"{_names(by_basis['bf16_dot'])}: against the measured bf16 dot-product peak "
            f"({figures_text}): their bf16 kernels multiply bf16 pairs natively (vdpbf16ps, two "
            "products per fp32 lane), so the FP32 FMA peak is not their limit."
        )
    if "fma" in by_basis:
        sentences.append(
            f"{_names(by_basis['fma'], True)}: against the FP32 FMA peak of their ISA, as their "
            "fp32 figures: their bf16 kernels only store bf16 and widen it to fp32, so their "
            "arithmetic is FP32 FMAs."
        )
    if "fma_no_dot" in by_basis:
        sentences.append(
            f"{_names(by_basis['fma_no_dot'], True)}: their bf16 kernels multiply bf16 pairs natively, "
            "but their file has no bf16 dot-product peak above 0 "
            "(`mha_bf16_dot_peak_gflops_*`), so they are read against their FP32 FMA peak "
            "instead, which such kernels can exceed."
        )
    if "unknown" in by_basis:
        sentences.append(
            f"{_names(by_basis['unknown'])}: their file does not say whether their bf16 kernels "
            "are native (no `mha_backend_<name>_bf16_peak_isa`: written before it), so their bf16 "
            "% of peak is n/a."
        )
    return "Which peak the bf16 figures are read against, per backend: " + " ".join(sentences)


def _precision_reading(pairs: list[analysis.PrecisionPair], what: str) -> str:
    """Per backend, from the data: the median speedup of bf16 over fp32 (range, how often bf16
    is faster, median % of peak of each)."""
    parts = []
    for s in analysis.precision_summary(pairs):
        if s.median is None:
            parts.append(f"**{s.backend}**: no fp32 run to compare its {s.unpaired} bf16 benchmark(s) with")
            continue
        text = (
            f"**{s.backend}** {fmt_ratio(s.median)} (median over {s.pairs} pair(s), "
            f"{fmt_ratio(s.low)} – {fmt_ratio(s.high)}; bf16 faster in {s.faster} of {s.pairs})"
        )
        if s.bf16_pct is not None and s.fp32_pct is not None:
            text += f", bf16 at a median {s.bf16_pct:.0f}% of its peak against {s.fp32_pct:.0f}% in fp32"
        parts.append(text)
    return f"Speedup of bf16 over fp32 ({what}), per backend: " + "; ".join(parts) + "."


def _bf16_fastest_text(results: ResultSet) -> str:
    """Which mha backend and formulation is fastest in bf16, per thread count, over the forward
    passes measured in bf16 (shapes won, as 'Which backend to link'); '' when none."""
    bf16 = results.forward().only(lambda k: k.shape.precision == "bf16")
    chosen = analysis.choices(bf16)
    fastest = []
    for n in bf16.thread_counts():
        wins = analysis.win_counts(chosen, n)
        if wins:
            fastest.append(f"{_threads_text(n)}: " + ", ".join(f"{v} on {k} of {t}" for v, k, t in wins))
    if not fastest:
        return ""
    return (
        "Fastest in bf16 (fastest mha backend and formulation per shape, shapes won): "
        + "; ".join(fastest)
        + "."
    )


def _precision_section(results: ResultSet, peaks: Peaks) -> list:
    """fp32 vs bf16, when bf16 was measured: per backend, each bf16 benchmark against its fp32
    twin (times, speedup, each as % of its matching peak), a reading of the data and which
    peak each backend's bf16 figures are read against; decode steps in a table of their own,
    without % of peak."""
    pairs = analysis.precision_pairs(results, peaks)
    if not pairs:
        return []
    forward = [p for p in pairs if not p.shape.is_decode]
    decode = [p for p in pairs if p.shape.is_decode]
    blocks: list = [
        Heading(2, "fp32 vs bf16"),
        Para(
            "Each bf16 benchmark against the fp32 benchmark of the same backend, formulation, "
            "shape and threads (its name without `/bf16`): speedup = fp32 time / bf16 time, "
            "above 1.0 bf16 is faster (– and 'no fp32 run': no fp32 twin was measured). % of "
            "peak = model GFLOP/s (the same FLOP count in both precisions) / the peak matching "
            "each: fp32 the FP32 FMA peak of the backend's ISA, as everywhere in this report; "
            "bf16 the bf16 dot-product peak (`mha_bf16_dot_peak_gflops_*`) where the backend's "
            "`mha_backend_<name>_bf16_peak_isa` is `bf16_dot` and that peak was measured, "
            "otherwise the same FP32 FMA peak; n/a: peak unknown. Both follow the same thread "
            "rule: the 1-core peak for threads:1, otherwise the all-core peak scaled by threads "
            "/ the thread count it was measured on."
        ),
    ]
    reading = [_precision_reading(forward, "forward passes")] if forward else []
    reading += [_bf16_fastest_text(results)]
    reading += [_precision_reading(decode, "decode steps")] if decode else []
    blocks.append(Para(" ".join(text for text in reading if text)))
    blocks.append(Para(_bf16_peak_text(pairs)))
    header = ["formulation", "shape", "threads", "fp32 time", "bf16 time", "speedup (fp32/bf16)"]
    for backend in dict.fromkeys(p.backend for p in forward):
        blocks += [
            Heading(3, backend),
            Table(
                header + ["fp32 % of peak", "bf16 % of peak", "bf16 peak"],
                [_precision_row(p, True) for p in forward if p.backend == backend],
                numeric={2, 3, 4, 5, 6, 7},
            ),
        ]
    if decode:
        blocks += [
            Heading(3, "Decode steps (past > 0)"),
            Para(
                "Time per step in each precision and the speedup; no % of peak: a step is bound "
                "by memory (the decode sections), not by arithmetic."
            ),
            Table(
                ["backend"] + header,
                [[p.backend] + _precision_row(p, False) for p in decode],
                numeric={3, 4, 5, 6},
            ),
        ]
    return blocks


# ---- summary, failures, absences ----


def _summary(results: ResultSet) -> list:
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


def _bars_section(results: ResultSet, series_list: list[Series], folder: Path, prefix: str = "") -> list:
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
        for backend, form in analysis.variants(results):
            times = [(m.median_s if (m := results.get(backend, form, s, n)) else None) for s in here]
            if any(times):
                bars[(backend, form)] = times
        panels.append((_threads_text(n), [s.label() for s in here], bars))
    stem = prefix + "time_bars"
    figures.time_bars(folder, stem, panels)
    return [
        Heading(2, "Time per backend and formulation"),
        Para(
            "Median time per forward pass "
            + ("for the shapes that belong to no H or T series " if series_list else "")
            + (
                "(lower is faster; hatched: wrapper)."
                if "fused_qkv" not in analysis.formulations_measured(results)
                else "(lower is faster; hatched //: wrapper, dotted: fused_qkv)."
            )
        ),
        Figure(stem, "Median time per backend and formulation, per thread count"),
    ]


def _failures_section(results: ResultSet) -> list:
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


def _machine_blocks(
    results: ResultSet, peaks: Peaks, folder: Path, notes: str, prefix: str, answer: bool
) -> tuple[list, list]:
    """One machine's sections (answer, summary, notes, figures, link tables, fp32 vs bf16,
    decode, failures, absent) and its appendix. The forward-pass sections read the forward
    passes only (past = 0); the incremental calls (past > 0) have the decode sections."""
    forward = results.forward()
    heads, kv = analysis.mha_heads_series(forward.shapes())
    seqs = analysis.seq_series(forward.shapes())
    blocks: list = _answer(results, heads, kv=kv) if answer else []
    blocks += _peers_section(results, folder, prefix)
    blocks += _summary(results)
    if notes.strip():
        blocks += [Heading(2, "Notes on this run")] + document.parse_notes(notes, 3)
    absent = []
    if forward.measurements:
        blocks += _forward_blocks(forward, heads, seqs, peaks, folder, prefix, absent, kv)
    else:
        absent.append(
            "forward passes (past = 0): none in the inputs, so no split/wrapper speedup against "
            "H, GFLOP/s, thread scaling or per-shape link table."
        )
    precision = _precision_section(results, peaks)
    blocks += precision
    if not precision:
        absent.append("fp32 vs bf16: no bf16 benchmarks in the inputs (`mha_bench --precision fp32,bf16`).")
    bandwidths = analysis.find_bandwidths(results)
    decode = _decode_sections(results.decode(), bandwidths, folder, prefix)
    if not decode:
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
    blocks += decode
    grouped = _kv_section(results, kv, bandwidths, folder, prefix)
    if not grouped:
        absent.append(
            "grouped-query attention: no shapes with fewer K/V heads than H next to the same shape "
            "with H K/V heads (the heads preset's series heads_kv, the decode preset's decode_kv)."
        )
    blocks += grouped
    blocks += _failures_section(results)
    if absent:
        blocks += [Heading(2, "Not in this run"), Bullets(absent)]
    return blocks, _context_section(results, peaks)


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
        speed = _speedup_section(results, heads, folder, prefix)
        blocks += speed
        if not speed:
            absent.append("split/wrapper speedup: no backend has both formulations along an H series.")
    if heads or kv:
        blocks += _race_section(results, list(heads) + list(kv), folder, prefix)
    if heads:
        blocks += _gflops_section(results, heads, peaks, folder, "heads", prefix)
    else:
        absent.append(
            "split/wrapper speedup and GFLOP/s against H: no shapes that differ only in H "
            "(run the heads preset)."
        )
    if seqs:
        blocks += _gflops_section(results, seqs, peaks, folder, "seq", prefix)
    else:
        absent.append("GFLOP/s against T: no shapes that differ only in T (run the seq preset).")
    scaling = _scaling_section(results, folder, prefix)
    link = _link_section(results, heads + seqs, folder, prefix)
    # Bars for the shapes no series figure shows; for every shape when no other figure was
    # drawn (e.g. one backend and formulation along a series, without the GFLOPS counter).
    drawn = any(isinstance(b, Figure) for b in blocks + scaling + link)
    blocks += _bars_section(results, heads + seqs + list(kv) if drawn else [], folder, prefix)
    blocks += scaling
    if not scaling:
        absent.append("thread scaling: no shape was measured at 1 thread and at more.")
    if not any(m.flops for m in results.measurements.values()):
        absent.append("GFLOP/s and % of peak: no GFLOPS counter in the inputs.")
    elif not peaks.any():
        absent.append("% of peak: no measured peak in the inputs.")
    return blocks + link


# ---- decode ----


def _bandwidth_text(bandwidths: analysis.Bandwidths) -> str:
    """Which streaming-read bandwidths the bounds divide by."""
    if not bandwidths.any():
        return (
            "No measured streaming-read bandwidth in the inputs (`mha_stream_read_gbps_*`): no "
            "bound is drawn and no % of bound given."
        )
    figures_by_file = []
    for bw in list(bandwidths.files.values()):
        if bw.any():
            parts = [f"{bw.one_core:.1f} GB/s on 1 thread"] if bw.one_core else []
            parts += [f"{bw.all_cores:.1f} GB/s on {bw.threads} threads"] if bw.all_cores else []
            figures_by_file.append(f"{', '.join(parts)} ({bw.source})")
    return (
        "Measured streaming-read bandwidth: "
        + "; ".join(figures_by_file)
        + ". Files without one (peers) are read against the machine's best."
    )


def _bound_text(curves: list, x: int) -> str:
    found = [(forms, dict(points)[x]) for forms, points in curves if x in dict(points)]
    if len(found) == 1:
        return fmt_time(found[0][1])
    return " / ".join(f"{fmt_time(t)} ({', '.join(forms)})" for forms, t in found) or "–"


def _fastest_text(results: ResultSet, shape, threads: int) -> str:
    c = analysis.choose(results, shape, threads)
    if c.best is None:
        return "–"
    text = f"{c.best.key.backend} {c.best.key.formulation}"
    if c.runner_up is not None:
        text += f" ({c.runner_up.key.backend} +{c.margin * 100:.0f}%" + (", within noise)" if c.tie else ")")
    return text


def _decode_sections(
    results: ResultSet, bandwidths: analysis.Bandwidths, folder: Path, prefix: str = ""
) -> list:
    """Time per decode step against past with the bandwidth bound, % of the bound, the
    fastest backend per shape, and split-weight vs wrapper in decode."""
    series_list = analysis.past_series(results.shapes())
    if not series_list:
        return []
    threads = results.thread_counts()
    tables = {(s, n): analysis.decode_time_table(results, s, n) for s in series_list for n in threads}
    curves = {key: analysis.decode_bounds(results, bandwidths, t) for key, t in tables.items() if t}
    stem = prefix + "decode_time_vs_past"
    figures.series_grid(
        folder,
        stem,
        "Time per decode step against cached tokens",
        series_list,
        threads,
        lambda s, n: tables[(s, n)],
        figures.draw_decode_time(lambda t: curves[(t.series, t.threads)]),
        "ms per step",
    )
    blocks: list = [
        Heading(2, "Decode: time per step against cached tokens"),
        Para(
            "A decode benchmark times one incremental call (`plan::run` through a KV cache): T "
            "new tokens per sequence of the batch after `past` cached ones (the decode preset: "
            "T = 1, so every sequence gets one token per step). Time per step = median real "
            f"time of that call. {analysis.Bandwidth.RULE} Cells: time per step and, in "
            "brackets, % of the bound; the last column is the fastest mha backend and "
            "formulation with the runner-up backend's margin (the per-shape rule of 'Which "
            "backend to link'). Decode benchmarks are in no forward-pass section: their GFLOP/s "
            "and % of FMA peak say little about a step bound by memory."
        ),
        Para(_bandwidth_text(bandwidths)),
        Figure(stem, "Time per decode step (log scales) against cached tokens; black: bandwidth bound"),
    ]
    above = [
        (pct, f"{m.key.backend} {m.key.formulation}", m.key.shape.past, m.key.threads)
        for m in results.measurements.values()
        if (pct := bandwidths.percent(m)) is not None and pct > 100
    ]
    blocks += _above_100(
        above,
        lambda count, pct, variant, past, n: (
            f"**{count} step(s) beat the bandwidth bound** (up to "
            f"{pct:.0f}%: {variant} at past={past}, {_threads_text(n)}): part of the bytes came from a "
            "cache, not memory, so the bound does not hold there."
        ),
    )
    for (series, n), table in tables.items():
        if table is None:
            continue
        rows = []
        for shape, (x, values) in zip(series.shapes, table.rows):
            cells = [
                "–" if v is None else fmt_time(v) + (f" ({p:.0f}%)" if (p := bandwidths.percent(m)) else "")
                for (b, f), v in zip(table.columns, values)
                for m in [results.get(b, f, shape, n)]
            ]
            rows.append(
                [str(x), _bound_text(curves[(series, n)], x)] + cells + [_fastest_text(results, shape, n)]
            )
        header = [series.x_name, "bandwidth bound"] + [f"{b} {f}" for b, f in table.columns] + ["fastest"]
        blocks += [
            Heading(3, f"{series.title}, {_threads_text(n)}"),
            Table(header, rows, numeric=set(range(len(header) - 1))),
        ]
    return blocks + _decode_speedup_section(results, series_list, folder, prefix)


def _decode_speedup_section(results: ResultSet, series_list: list[Series], folder: Path, prefix: str) -> list:
    threads = results.thread_counts()
    tables = {(s, n): analysis.speedup_table(results, s, n) for s in series_list for n in threads}
    if not any(tables.values()):
        return []
    stem = prefix + "decode_speedup_vs_past"
    against = _Against(results)
    figures.series_grid(
        folder,
        stem,
        "Split-weight speedup over the wrapper in decode"
        if not against.named
        else "Speedup over the wrapper in decode",
        series_list,
        threads,
        lambda s, n: tables[(s, n)],
        figures.draw_ratios(named=against.named),
        against.ratio,
    )
    if not against.named:
        text = (
            "Speedup = median time of the wrapper's decode step / split_weight's, same backend, "
            "shape and threads: above 1.0 split-weight is faster. Both read the same bytes "
            "(each caches the K/V heads: the wrapper one buffer per head, split-weight all heads' "
            "at once)."
        )
    else:
        text = (
            "Speedup = median time of the wrapper's decode step / the formulation's ("
            + ", ".join(against.forms)
            + "), same backend, shape and threads: above 1.0 that formulation is faster. All "
            "read the same bytes (each caches the K/V heads: the wrapper one buffer per head, "
            "the others all heads' at once)."
        )
    blocks: list = [
        Heading(2, f"Decode: {against.heading[0].lower() + against.heading[1:]}"),
        Para(text),
        Figure(
            stem,
            "Split/wrapper speedup in decode against cached tokens, per backend"
            if not against.named
            else "Speedup over the wrapper in decode against cached tokens, per backend and formulation",
        ),
    ]
    for (series, n), table in tables.items():
        if table is not None:
            blocks.append(Heading(3, f"{series.title}, {_threads_text(n)}"))
            blocks.append(_series_table_block(table, [against.column(c) for c in table.columns], fmt_ratio))
    return blocks


# ---- grouped-query attention ----


def _kv_family_title(series: Series) -> str:
    """What the grouped K/V series of one family share: the kv title after its grouping."""
    return series.title.split(", ", 1)[1] if ", " in series.title else series.title


def _kv_reading(results: ResultSet, kv: list[Series], n: int) -> str:
    """Per grouping at n threads: the median time relative to MHA over every backend,
    formulation and H, with the extremes and where."""
    parts = []
    for series in kv:
        table = analysis.kv_table(results, series, n)
        cells = [
            (v, f"{b} {f} H={x}")
            for x, values in (table.rows if table else [])
            for (b, f), v in zip(table.columns, values)
            if v is not None and not is_peer(b)
        ]
        if cells:
            low, high = min(cells), max(cells)
            family = f" ({_kv_family_title(series)})" if len({_kv_family_title(k) for k in kv}) > 1 else ""
            parts.append(
                f"{series.group}{family}: median {fmt_ratio(statistics.median(v for v, _ in cells))}, "
                f"{fmt_ratio(low[0])} ({low[1]}) – {fmt_ratio(high[0])} ({high[1]})"
            )
    return f"{_threads_text(n)}: " + "; ".join(parts) if parts else ""


def _kv_prefill(results: ResultSet, kv: list[Series], folder: Path, prefix: str) -> list:
    """Forward passes with grouped K/V heads against MHA along H: a reading, a figure (a panel
    per grouping and thread count) and per family, thread count and backend a table of the
    relative times per formulation and grouping."""
    threads = results.thread_counts()
    tables = {(s, n): analysis.kv_table(results, s, n) for s in kv for n in threads}
    if not any(tables.values()):
        return []
    stem = prefix + "kv_heads_vs_heads"
    figures.series_grid(
        folder,
        stem,
        "Time with grouped K/V heads relative to MHA (H K/V heads)",
        kv,
        threads,
        lambda s, n: tables[(s, n)],
        figures.draw_ratios("1.0 = MHA (H K/V heads)"),
        "time / MHA time (×)",
    )
    readings = [text for n in threads if (text := _kv_reading(results, kv, n))]
    blocks: list = [
        Heading(3, "Forward passes against H"),
        Para(
            "Relative time = median time with the grouping / median time with H K/V heads, per "
            "backend and formulation: below 1.0 the grouping is faster."
            + (
                " Per grouping, the median and extremes over mha backends, formulations and H: "
                + "; ".join(readings)
                + "."
                if readings
                else ""
            )
        ),
        Figure(
            stem, "Time relative to MHA against H, per grouping, backend and formulation (below 1.0: faster)"
        ),
    ]
    families = list(dict.fromkeys(_kv_family_title(s) for s in kv))
    for family in families:
        mine = [s for s in kv if _kv_family_title(s) == family]
        xs = sorted({series.x(shape) for series in mine for shape in series.shapes})
        for n in threads:
            for backend in results.backends():
                columns = [
                    (form, series)
                    for form in analysis.FORMULATIONS
                    for series in mine
                    if tables[(series, n)] and (backend, form) in tables[(series, n)].columns
                ]
                if not columns:
                    continue
                rows = []
                for x in xs:
                    cells = []
                    for form, series in columns:
                        shape = next((sh for sh in series.shapes if series.x(sh) == x), None)
                        value = None if shape is None else analysis.kv_ratio(results, backend, form, shape, n)
                        cells.append(fmt_ratio(value))
                    rows.append([str(x)] + cells)
                header = ["H (heads)"] + [f"{form} {series.group}" for form, series in columns]
                blocks += [
                    Heading(4, f"{backend}, {family}, {_threads_text(n)}"),
                    Table(header, rows, numeric=set(range(len(header)))),
                ]
    return blocks


def _kv_target_text(
    results: ResultSet, family, kvs: list[int], rows: list, bandwidths: analysis.Bandwidths
) -> str:
    """Issue 15's decode target (analysis.KV_DECODE_TARGET): at its B and past, the speedup of
    H/group K/V heads over H per mha backend, formulation and thread count, whether it reaches
    the target, and what the bandwidth bound allows; '' when the family has no such grouping."""
    target = analysis.KV_DECODE_TARGET
    kv = family.n_heads // target["group"]
    if family.n_heads % target["group"] or kv not in kvs:
        return ""
    at = [
        r
        for r in rows
        if r.mha.batch == target["batch"] and r.mha.past == target["past"] and not is_peer(r.backend)
    ]
    where = f"B={target['batch']}, past={target['past']}"
    head = (
        f"Target (issue 15): {kv} K/V heads at least {target['speedup']:.0f}× faster per step than "
        f"{family.n_heads} at {where}"
    )
    parts = []
    for n in results.thread_counts():
        cells = []
        for r in (r for r in at if r.threads == n):
            sp = r.speedup(kv)
            if sp is None:
                continue
            verdict = "meets it" if sp >= target["speedup"] else "short of it"
            bounds = [bandwidths.bound_s(r.cells.get(k)) for k in (family.n_heads, kv)]
            allowed = f", the bound allows {fmt_ratio(bounds[0] / bounds[1])}" if all(bounds) else ""
            cells.append(f"{r.backend} {r.formulation} {fmt_ratio(sp)} ({verdict}{allowed})")
        if cells:
            parts.append(f"{_threads_text(n)}: " + ", ".join(cells))
    if not parts:
        return f"{head}: not measured."
    return f"{head}: " + "; ".join(parts) + "."


def _kv_decode(results: ResultSet, bandwidths: analysis.Bandwidths) -> list:
    """Decode steps with grouped K/V heads against MHA: per family, thread count and backend a
    table of the time per step with each K/V head count (and % of its bandwidth bound), the
    speedups over MHA (and what the bounds allow), the bounds; the target reading first."""
    families = analysis.kv_decode_rows(results)
    if not families:
        return []
    blocks: list = [
        Heading(3, "Decode steps"),
        Para(
            "Time per step = median time of one incremental call (T = 1: one new token per "
            "sequence of the batch, so also the time per generated token of each sequence), "
            "with each number of K/V heads; in brackets % of its bandwidth bound (the decode "
            "section's rule: `bytes_min` / the measured streaming-read bandwidth). Speedup = "
            "time with H K/V heads / time with fewer, above 1.0 grouping is faster; in brackets "
            "what the bounds allow (the ratio of the bounds: the speedup of a step that only "
            "streams its bytes). Bounds: each formulation's `bytes_min`."
        ),
    ]
    for family, (kvs, rows) in families.items():
        h = family.n_heads
        title = f"T={family.seq_len}, d_model = {family.d_out}, H = {h}" + "".join(
            f", {f}" for f in family.extras(past=False)
        )
        target = _kv_target_text(results, family, kvs, rows, bandwidths)
        if target:
            blocks.append(Para(target))
        fewer = [k for k in kvs if k != h]
        flat = sorted(
            {
                r.formulation
                for r in rows
                for k in fewer
                if (mha := bandwidths.bound_s(r.cells.get(h)))
                and (grouped := bandwidths.bound_s(r.cells.get(k)))
                if grouped >= mha
            }
        )
        if flat:
            blocks.append(
                Para(
                    f"The bounds of {', '.join(flat)} do not shrink with fewer K/V heads: their "
                    "`bytes_min` counts H cached heads (a file from an mha_bench that counted K/V "
                    "heads for split_weight only), though docs/design.md §1.4 has every formulation "
                    "cache the K/V heads. Their % of bound is overstated there and the speedup "
                    "their bounds allow understated; split_weight's are the ones to read."
                )
            )
        header = ["formulation", "B", "past"]
        header += [f"{k} K/V head{'s' if k > 1 else ''}" + (" (MHA)" if k == h else "") for k in kvs]
        header += [f"{k} vs {h}" for k in fewer] + ["bound " + " / ".join(map(str, kvs))]
        for n in results.thread_counts():
            for backend in results.backends():
                mine = [r for r in rows if r.threads == n and r.backend == backend]
                if not mine:
                    continue
                table = []
                for r in mine:
                    bounds = {k: bandwidths.bound_s(r.cells.get(k)) for k in kvs}
                    cells = []
                    for k in kvs:
                        m = r.cells.get(k)
                        pct = bandwidths.percent(m)
                        cells.append(
                            "–" if m is None else fmt_time(m.median_s) + (f" ({pct:.0f}%)" if pct else "")
                        )
                    for k in fewer:
                        sp = r.speedup(k)
                        allowed = (
                            f" ({fmt_ratio(bounds[h] / bounds[k])})"
                            if sp is not None and bounds[h] and bounds[k]
                            else ""
                        )
                        cells.append(fmt_ratio(sp) + allowed)
                    cells.append(" / ".join("–" if bounds[k] is None else fmt_time(bounds[k]) for k in kvs))
                    table.append([r.formulation, str(r.mha.batch), str(r.mha.past)] + cells)
                blocks += [
                    Heading(4, f"{backend}, {title}, {_threads_text(n)}"),
                    Table(header, table, numeric=set(range(1, len(header)))),
                ]
    return blocks


def _kv_section(
    results: ResultSet, kv: list[Series], bandwidths: analysis.Bandwidths, folder: Path, prefix: str
) -> list:
    """Grouped-query attention, when shapes with fewer K/V heads than H were measured next to
    their MHA twin: forward passes against H (kv: the forward kv_series) and decode steps."""
    prefill = _kv_prefill(results.forward(), kv, folder, prefix) if kv else []
    decode = _kv_decode(results.decode(), bandwidths)
    if not prefill and not decode:
        return []
    return (
        [
            Heading(2, "Grouped-query attention"),
            Para(
                "Shapes with fewer K/V heads than H (`/kvh<K>` in the name: K/V heads shared by H/K "
                "query heads each; one K/V head is multi-query attention, MQA) against the same shape "
                "with H K/V heads (MHA), same backend, formulation and threads. Groupings along H: "
                "H/g, g query heads per K/V head (at H = 8, H/8 is also the one K/V head of MQA), "
                "and 1 (MQA). These shapes are in no other section's figures but the per-shape "
                "table of 'Which backend to link'"
                + (
                    " and 'Fused-QKV vs split-weight against H'."
                    if analysis.races(results.forward(), kv)
                    else "."
                )
            ),
        ]
        + prefill
        + decode
    )


def _shift(blocks: list, by: int) -> list:
    for b in blocks:
        if isinstance(b, Heading):
            b.level += by
    return blocks


def _label(results: ResultSet) -> str:
    return results.machine.label() if results.machine else "this machine"


def _cross_flag(r: analysis.CrossRow) -> str:
    if not r.differs:
        return ""
    what = "backend differs" if r.backend_differs else "formulation differs"
    return f"{what} (within noise)" if r.within_noise else f"**{what}**"


def _cross_machine(machines: list[ResultSet]) -> list:
    rows = analysis.cross_machine(machines)
    table = [
        [r.shape.label(), r.threads]
        + ["–" if m is None else f"{m.key.backend}·{m.key.formulation}" for m in r.cells]
        + [_cross_flag(r)]
        for r in rows
    ]
    differing = sum(r.differs for r in rows)
    beyond = sum(r.differs and not r.within_noise for r in rows)
    return [
        Para(
            "Which backend to link on each machine, per shape: the fastest mha backend · "
            "formulation at 1 thread and at the most threads measured on that machine ('all'). "
            f"**{differing} of {len(rows)} rows differ** between machines, **{beyond} beyond "
            "noise** (flagged in bold; 'within noise' when, on every machine, the other "
            f"machines' picks are less than {analysis.TIE_MARGIN * 100:.0f}% slower than its own "
            "or their repetition ranges overlap; 'formulation differs' when the backend is the "
            "same)."
        ),
        Table(["shape", "threads"] + [_label(r) for r in machines] + ["choice"], table),
    ]


def build(
    machines: list[ResultSet] | ResultSet,
    peaks: list[Peaks] | Peaks,
    folder: Path,
    title: str,
    notes: str = "",
) -> list:
    """Writes the figures into folder and returns the report's blocks: title, warnings, the
    answer, then one machine's sections (or a section per machine, after a cross-machine
    table), and the machine context as an appendix. `notes` (Markdown: see
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
    warnings += [f"**peak**: {text}" for text in analysis.peak_warnings(peaks)]
    warnings += [f"**shards** ({_label(r)}): {text}" for r in machines for text in shard_problems(r)]
    if warnings:
        blocks += [Heading(2, "Warnings"), Bullets(warnings)]
    if len(machines) == 1:
        body, appendix = _machine_blocks(machines[0], peaks[0], folder, notes, "", True)
        return blocks + body + appendix
    blocks += [Heading(2, "Answer: which backend to link")]
    for r in machines:
        blocks += [Para(f"**{_label(r)}**:"), Bullets(_answer_bullets(r))]
    blocks += _cross_machine(machines)
    if notes.strip():
        blocks += [Heading(2, "Notes on this run")] + document.parse_notes(notes, 3)
    appendices: list = []
    used: set[str] = set()
    for i, (r, p) in enumerate(zip(machines, peaks)):
        slug = r.machine.slug() if r.machine else f"machine{i + 1}"
        prefix = (slug if slug not in used else f"{slug}_{i + 1}") + "_"
        used.add(slug)
        body, appendix = _machine_blocks(r, p, folder, "", prefix, True)
        blocks += [Heading(2, f"Machine: {_label(r)}")] + _shift(body, 1)
        appendices += [Heading(3, _label(r))] + _shift(appendix[1:], 1)
    return blocks + [Heading(2, "Appendix: machine and build")] + appendices


def generate(
    machines: list[ResultSet] | ResultSet,
    peaks: list[Peaks] | Peaks,
    folder: Path,
    title: str = "mha performance report",
    notes: str = "",
) -> list:
    """Writes report.md, report.html and every figure (PNG + SVG) into folder."""
    folder.mkdir(parents=True, exist_ok=True)
    blocks = build(machines, peaks, folder, title, notes)
    document.write(blocks, title, folder)
    return blocks
