"""Figures (matplotlib, Agg): each saved as <stem>.png in the report folder (256 colours: a
plot's few colours and their anti-aliasing lose nothing visible, at a third of the bytes), and
as <stem>.svg too when the report is written with its HTML (also_svg).

Conventions: colour = backend (fixed per name, so figures of different runs compare), line
style = formulation (solid split_weight, dashed wrapper, dash-dot fused_qkv), log2 x axis with the measured values
as ticks, log y for rates and ratios, the 1.0 line on every ratio plot.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator  # noqa: E402

from ..schema import is_peer, peer_library  # noqa: E402
from .series import Series, SeriesTable  # noqa: E402
from .wording import threads_text  # noqa: E402

plt.rcParams.update(
    {
        "svg.hashsalt": "mha_report",  # reproducible SVG ids
        "font.size": 9,
        "axes.titlesize": 9,
        "legend.fontsize": 8,
        "axes.grid": True,
        "grid.alpha": 0.3,
    }
)

_BACKEND_COLOURS = {
    "naive": "#7f7f7f",
    "xsimd": "#1f77b4",
    "onednn": "#ff7f0e",
    "tbb": "#2ca02c",
    "torch": "#d62728",
    "torch_nn_mha": "#9467bd",
    "torch_prealloc": "#e377c2",
}
_SPARE_COLOURS = ["#8c564b", "#17becf", "#bcbd22", "#393b79", "#637939"]
_MARKERS = {
    "naive": "o",
    "xsimd": "s",
    "onednn": "^",
    "tbb": "D",
    "torch": "v",
    "torch_nn_mha": "P",
    "torch_prealloc": "X",
}
_FORM_STYLE = {"split_weight": "-", "wrapper": "--", "fused_qkv": "-."}
# The measured points of each formulation (the scaling model's figure).
FORM_MARKERS = {"split_weight": "o", "wrapper": "s", "fused_qkv": "D"}
# time_bars: bars of these formulations hatched (split_weight plain).
_FORM_HATCH = {"wrapper": "//", "fused_qkv": ".."}


def subplots(*args, **kwargs):
    """plt.subplots on the Agg backend this module selects, for the sections that draw their own
    figures with these conventions (scaling)."""
    return plt.subplots(*args, **kwargs)


def colour(backend: str) -> str:
    if backend in _BACKEND_COLOURS:
        return _BACKEND_COLOURS[backend]
    return _SPARE_COLOURS[sum(map(ord, backend)) % len(_SPARE_COLOURS)]


def backend_label(backend: str) -> str:
    return f"{backend} ({peer_library(backend)})" if is_peer(backend) else backend


def line_style(backend: str, formulation: str | None = None) -> dict:
    """Keyword arguments of ax.plot for one backend (and formulation)."""
    style = {
        "color": colour(backend),
        "marker": _MARKERS.get(backend, "x"),
        "markersize": 4,
        "linewidth": 1.4,
        "linestyle": _FORM_STYLE.get(formulation, "-") if formulation else "-",
        "label": backend_label(backend) + (f" · {formulation}" if formulation else ""),
    }
    return style


# Whether save() writes an SVG beside each PNG (the report's --html; committed reports keep
# their PNGs only, so every clone does not pay for three copies of each figure).
_svg = False


def also_svg(enabled: bool) -> None:
    global _svg
    _svg = enabled


def save(fig, folder: Path, stem: str) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    try:
        from PIL import Image
    except ImportError:  # Pillow comes with matplotlib; without it the PNG is written as drawn
        (folder / f"{stem}.png").write_bytes(buffer.getvalue())
    else:
        buffer.seek(0)
        image = Image.open(buffer).convert("RGB")
        image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
            folder / f"{stem}.png", optimize=True
        )
    if _svg:
        fig.savefig(folder / f"{stem}.svg", metadata={"Date": None})
    plt.close(fig)


def _plain_number(value: float, _pos=None) -> str:
    if value >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.3g}"


def log2_x(ax, values: list[int]) -> None:
    """Log2 x axis whose ticks are exactly the measured values, written as plain integers."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(values))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
    if len(ticks) > 1:
        ax.set_xlim(ticks[0] / 1.25, ticks[-1] * 1.25)


def log_y(ax) -> None:
    """Log y axis labelled with plain numbers: 1-2-5 steps over a wide range, finer steps over
    a narrow one (a ratio axis spanning 0.8-1.3 still gets labels). Call after plotting."""
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    subs = (1.0, 2.0, 5.0) if high / low > 30 else (1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(_plain_number))
    ax.yaxis.set_minor_locator(NullLocator())


def figure_legend(fig, axes) -> float:
    """One legend for all panels, below them; returns its height in inches."""
    handles, labels = {}, []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = h
                labels.append(label)
    if not labels:
        return 0.0
    columns = min(4, len(labels))
    fig.legend(
        [handles[label] for label in labels],
        labels,
        loc="lower center",
        ncol=columns,
        bbox_to_anchor=(0.5, 0.0),
        frameon=False,
    )
    return 0.22 * math.ceil(len(labels) / columns) + 0.1


def series_grid(
    folder: Path,
    stem: str,
    title: str,
    series_list: list[Series],
    thread_counts: list[int],
    table_for: Callable[[Series, int], SeriesTable | None],
    draw: Callable[[object, SeriesTable], None],
    ylabel: str,
) -> None:
    """One panel per (thread count: rows) x (series: columns); `draw` fills a panel from its
    table. Rows and columns without any data are left out; a panel without data says so."""
    thread_counts = [n for n in thread_counts if any(table_for(s, n) for s in series_list)]
    series_list = [s for s in series_list if any(table_for(s, n) for n in thread_counts)]
    nrows, ncols = len(thread_counts), len(series_list)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.4 * ncols, 3.6 * nrows + 1.0), squeeze=False)
    for r, threads in enumerate(thread_counts):
        for c, series in enumerate(series_list):
            ax = axes[r][c]
            ax.set_title(f"{series.title}, {threads_text(threads)}")
            table = table_for(series, threads)
            log2_x(ax, [series.x(s) for s in series.shapes])
            ax.set_xlabel(series.x_name)
            ax.set_ylabel(ylabel)
            if table is None:
                ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
                continue
            draw(ax, table)
    fig.suptitle(title, fontsize=11)
    legend_height = figure_legend(fig, [ax for row in axes for ax in row])
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, legend_height / height, 1, 1 - 0.35 / height))
    save(fig, folder, stem)


def _ratio_limits(ax) -> None:
    """Room around the 1.0 line on a ratio axis, symmetric in log space when the data allow."""
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(min(low, 0.8), max(high, 1.25))


def draw_ratios(one: str = "1.0 = same speed", named: bool = True) -> Callable:
    """Ratio lines of (backend, formulation) columns (a line style per formulation) and the 1.0
    line labelled `one`; named=False labels the lines with the backend alone (its
    formulation is the only one drawn: the split/wrapper speedup of runs without fused_qkv)."""

    def draw(ax, table: SeriesTable) -> None:
        for backend, form in table.columns:
            points = table.column((backend, form))
            style = line_style(backend, form if named else None)
            ax.plot([x for x, _ in points], [v for _, v in points], **style)
        ax.axhline(1.0, color="black", linewidth=1.0, linestyle=":", label=one)
        _ratio_limits(ax)
        log_y(ax)

    return draw


def draw_gflops(peak_lines: Callable[[SeriesTable], list[tuple[str, float]]]) -> Callable:
    """GFLOP/s lines; peak_lines(table) gives the peaks its columns are read against, as
    (label, GFLOP/s at the table's thread count). One peak: a line and a right axis in % of it;
    several (backends at different ISAs): a labelled line each, no % axis."""

    def draw(ax, table: SeriesTable) -> None:
        for backend, form in table.columns:
            points = table.column((backend, form))
            ax.plot([x for x, _ in points], [v for _, v in points], **line_style(backend, form))
        ax.set_yscale("log")
        lines = peak_lines(table)
        styles = (("-.", "black"), (":", "#555555"), ("--", "#999999"))
        for (label, p), (style, tone) in zip(lines, styles):
            ax.axhline(p, color=tone, linewidth=0.9, linestyle=style, label=label)
        if lines:
            low, high = ax.get_ylim()
            ax.set_ylim(low, max([high] + [p * 1.15 for _, p in lines]))
        log_y(ax)
        if len(lines) == 1:
            p = lines[0][1]
            secondary = ax.secondary_yaxis(
                "right", functions=(lambda g: g / p * 100, lambda pct: pct * p / 100)
            )
            secondary.set_ylabel("% of peak")
            secondary.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            secondary.yaxis.set_major_formatter(FuncFormatter(_plain_number))
            secondary.yaxis.set_minor_locator(NullLocator())

    return draw


def draw_decode_time(bounds: Callable[[SeriesTable], list[tuple[list[str], list[tuple[int, float]]]]]):
    """Time per decode step (table values: seconds, drawn in ms) per backend · formulation
    along past; bounds(table) gives the bandwidth-bound curves, each drawn as a black line
    (labelled with its formulations when they differ)."""

    def draw(ax, table: SeriesTable) -> None:
        for backend, form in table.columns:
            points = table.column((backend, form))
            ax.plot([x for x, _ in points], [v * 1e3 for _, v in points], **line_style(backend, form))
        curves = bounds(table)
        styles = (("-.", "black"), (":", "#555555"))
        for (forms, points), (style, tone) in zip(curves, styles):
            label = "bandwidth bound" + (f" ({', '.join(forms)})" if len(curves) > 1 else "")
            ax.plot(
                [x for x, _ in points],
                [v * 1e3 for _, v in points],
                color=tone,
                linewidth=1.0,
                linestyle=style,
                label=label,
            )
        ax.set_yscale("log")
        log_y(ax)

    return draw


def time_bars(folder: Path, stem: str, panels: list[tuple[str, list[str], dict]]) -> None:
    """Median time per shape (groups) and backend · formulation (bars), one panel per thread
    count: panels = [(title, shape labels, {(backend, formulation): [seconds | None per shape]})].
    Log time axis; bars of the wrapper hatched //, of fused_qkv dotted."""
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(max(6.4, 1.6 + 1.2 * max(len(p[1]) for p in panels) * 1.5), 3.4 * len(panels) + 0.8),
        squeeze=False,
    )
    for ax, (title, labels, bars) in zip((row[0] for row in axes), panels):
        width = 0.8 / max(len(bars), 1)
        for i, ((backend, form), times) in enumerate(bars.items()):
            xs = [j + (i - (len(bars) - 1) / 2) * width for j, t in enumerate(times) if t is not None]
            ys = [t * 1e3 for t in times if t is not None]
            ax.bar(
                xs,
                ys,
                width,
                color=colour(backend),
                hatch=_FORM_HATCH.get(form),
                edgecolor="white",
                label=backend_label(backend) + f" · {form}",
            )
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(
            labels, rotation=15 if len(labels) > 2 else 0, ha="right" if len(labels) > 2 else "center"
        )
        values = [t for times in bars.values() for t in times if t]
        if values and max(values) > 10 * min(values):  # a wide range: log axis, labelled so
            ax.set_yscale("log")
            log_y(ax)
            ax.set_ylabel("median time (ms, log scale)")
        else:  # bars from zero, so their heights compare
            ax.set_ylabel("median time (ms)")
        ax.set_title(title)
    fig.suptitle("Time per forward pass (lower is faster)", fontsize=11)
    legend_height = figure_legend(fig, [row[0] for row in axes])
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, legend_height / height, 1, 1 - 0.35 / height))
    save(fig, folder, stem)


def draw_relative_time(ax, table: SeriesTable) -> None:
    """table values: time / fastest linkable time per backend (best formulation)."""
    for backend in table.columns:
        points = table.column(backend)
        style = line_style(backend)
        if is_peer(backend):
            style["linestyle"] = ":"
        ax.plot([x for x, _ in points], [v for _, v in points], **style)
    ax.axhline(1.0, color="black", linewidth=1.0, linestyle=":", label="1.0 = fastest mha backend")
    _ratio_limits(ax)
    log_y(ax)


def ab_strip(folder: Path, stem: str, groups: list[tuple[str, list[tuple[float, str]]]]) -> None:
    """A/B ratios: one column per group (backend · formulation), one dot per benchmark,
    coloured by verdict ('faster', 'slower', 'noise', 'n/a')."""
    verdict_colour = {"faster": "#2ca02c", "slower": "#d62728", "noise": "#9e9e9e", "n/a": "#cccccc"}
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(groups) + 2.5), 4.6))
    for i, (_, points) in enumerate(groups):
        n = len(points)
        for j, (ratio, verdict) in enumerate(points):
            x = i + (j - (n - 1) / 2) * min(0.6 / max(n, 1), 0.08)
            ax.plot(x, ratio, "o", markersize=4, color=verdict_colour[verdict])
    present = [v for v in verdict_colour if any(v == verdict for _, pts in groups for _, verdict in pts)]
    for v in present:  # legend entries in a fixed order, only for verdicts that occur
        ax.plot([], [], "o", markersize=4, color=verdict_colour[v], label=v)
    ax.axhline(1.0, color="black", linewidth=1.0, linestyle=":", label="1.0 = unchanged")
    ratios = [r for _, pts in groups for r, _ in pts]
    ax.set_yscale("log")
    if ratios:
        spread = max(abs(math.log2(r)) for r in ratios)
        bound = 2 ** max(spread * 1.15, 0.1)
        ax.set_ylim(1 / bound, bound)
    log_y(ax)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g for g, _ in groups], rotation=30, ha="right")
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylabel("time ratio after / before (< 1: faster)")
    ax.set_title("A/B: median time ratio per benchmark")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    save(fig, folder, stem)


_PATH_COLOURS = {"PyTorch": "#d62728", "OpenVINO": "#9467bd", "ONNX Runtime": "#8c564b"}


def peer_bars(folder: Path, stem: str, panels: list[tuple[str, list[str], dict]]) -> None:
    """Each peer library's fastest time relative to mha's fastest, per shape (groups) and library
    (a stem from the 1.0 line to its ratio), one panel per class, precision and thread count:
    panels = [(title, shape labels, {library: [ratio | None per shape]})]. Log ratio axis; a
    stem below 1.0 is a shape where the library is faster."""
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(max(6.4, 1.6 + 1.0 * max(len(p[1]) for p in panels)), 2.9 * len(panels) + 0.8),
        squeeze=False,
    )
    markers = "os^Dv"
    for ax, (title, labels, bars) in zip((row[0] for row in axes), panels):
        width = 0.6 / max(len(bars), 1)
        for i, (library, ratios) in enumerate(bars.items()):
            xs = [j + (i - (len(bars) - 1) / 2) * width for j, r in enumerate(ratios) if r is not None]
            ys = [r for r in ratios if r is not None]
            style = _PATH_COLOURS.get(library, colour(library))
            ax.vlines(xs, 1.0, ys, color=style, linewidth=2)
            ax.plot(xs, ys, linestyle="", marker=markers[i % len(markers)], color=style, label=library)
        ax.axhline(1.0, color="black", linewidth=1.0, label="mha's fastest backend")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(
            labels, rotation=15 if len(labels) > 2 else 0, ha="right" if len(labels) > 2 else "center"
        )
        ax.set_xlim(-0.6, len(labels) - 0.4)
        _ratio_limits(ax)
        log_y(ax)
        ax.set_ylabel("time / mha's time")
        ax.set_title(title)
    fig.suptitle("Peers' fastest time / mha's fastest time (below 1.0: the peer is faster)", fontsize=11)
    legend_height = figure_legend(fig, [row[0] for row in axes])
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, legend_height / height, 1, 1 - 0.35 / height))
    save(fig, folder, stem)
