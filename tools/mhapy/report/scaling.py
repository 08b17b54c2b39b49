"""Thread scaling: per backend and formulation, time on 1 thread / time on n threads over every
shape measured at both; the section that draws and tabulates it. And the scaling model of the
tbb backend (mhapy.scaling_model) beside the measured times, predicted to 128 threads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from .. import scaling_model
from ..problem import ProblemError, Shape, parse_shape
from ..schema import is_peer
from . import figures
from .document import Figure, Heading, Para, Table
from .results import ResultSet
from .series import variants
from .wording import fmt_ratio, fmt_time, threads_text


@dataclass
class Scaling:
    """Parallel speedup time(1 thread) / time(n threads) of one (backend, formulation) over
    every shape measured at both: geometric mean, min, max and the number of shapes."""

    backend: str
    formulation: str
    threads: int
    geomean: float
    low: float
    high: float
    shapes: int

    @property
    def efficiency(self) -> float:
        return self.geomean / self.threads


def thread_scaling(results: ResultSet) -> list[Scaling]:
    out = []
    for backend, form in variants(results):
        for n in results.thread_counts():
            if n == 1:
                continue
            ratios = []
            for shape in results.shapes():
                one = results.get(backend, form, shape, 1)
                many = results.get(backend, form, shape, n)
                if one is not None and many is not None:
                    ratios.append(one.median_s / many.median_s)
            if ratios:
                geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
                out.append(Scaling(backend, form, n, geomean, min(ratios), max(ratios), len(ratios)))
    return out


# ---- in words ----


def section(results: ResultSet, folder: Path, prefix: str = "") -> list:
    """Thread scaling: a figure and a table per backend, formulation and thread count."""
    scaling = thread_scaling(results)
    if not scaling:
        return []
    draw_thread_scaling(folder, prefix + "thread_scaling", scaling)
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


# ---- the scaling model beside the measurements (mhapy.scaling_model) ----

# Where the model and a measurement of the same run disagree by more than this, the report says
# so and gives the likeliest reason.
MODEL_DISAGREEMENT = 0.15


@dataclass
class ModelPoint:
    """One traced run at one thread count: the model's time (scaled so that its one-thread time
    is the benchmark's one-thread median) and, where measured, the benchmark's median."""

    formulation: str
    shape: Shape
    threads: int
    model_s: float
    bound_s: float  # bytes over bandwidth(threads): the run's bandwidth bound
    measured_s: float | None
    memory_bound: bool  # most of the model's time in phases bound by bandwidth, not by their tasks

    @property
    def disagreement(self) -> float | None:
        """model / measured - 1; None where not measured."""
        return None if self.measured_s is None else self.model_s / self.measured_s - 1

    def reason(self) -> str:
        """Why the model and the measurement part, from which side is faster and what bounds the
        model there."""
        d = self.disagreement
        if d is None or abs(d) <= MODEL_DISAGREEMENT:
            return ""
        if d > 0 and self.memory_bound:
            return (
                "measured faster than the streaming probe allows: the run read faster than the probe "
                "at this thread count (part of its bytes from cache, or the probe low)"
            )
        if d > 0:
            return "measured faster than the one-thread task times add up to (caches shared by more cores, turbo)"
        if self.memory_bound:
            return "measured slower: this thread count streams below the probe's bandwidth"
        return "measured slower than the schedule: wake-up, chunking or shared-resource costs the model leaves out"


def _trace_key(trace: scaling_model.Trace) -> tuple[str, Shape] | None:
    parts = trace.problem.split("/")
    try:
        return parts[0], parse_shape(parts[1:])
    except ProblemError:
        return None


def model_points(results: ResultSet, traces: scaling_model.TraceFile, socket_gbps: float) -> list[ModelPoint]:
    """Every one-thread trace of tbb on a shape the results measured on one thread, at 1, 2,
    4, ... 128 threads and at every thread count measured."""
    bandwidth = traces.bandwidth_curve(socket_gbps)
    measured_counts = set(results.thread_counts())
    points = []
    for trace in traces.traces:
        key = _trace_key(trace)
        if trace.threads != 1 or key is None:
            continue
        form, shape = key
        one = results.get("tbb", form, shape, 1)
        if one is None:
            continue
        base = scaling_model.predict(trace, 1, bandwidth).time_s
        scale = one.median_s / base
        for n in sorted(set(scaling_model.doubling(128)) | measured_counts):
            p = scaling_model.predict(trace, n, bandwidth)
            m = results.get("tbb", form, shape, n)
            points.append(
                ModelPoint(
                    form,
                    shape,
                    n,
                    p.time_s * scale,
                    trace.bytes / (bandwidth.gbps(n) * 1e9),
                    m.median_s if m else None,
                    2 * p.bandwidth_bound_s > p.time_s,
                )
            )
    return points


def _bandwidth_text(traces: scaling_model.TraceFile, socket_gbps: float) -> str:
    measured = ", ".join(f"{g:.1f} GB/s on {threads_text(n)}" for n, g in sorted(traces.bandwidth.items()))
    top = max(traces.bandwidth)
    per_core = traces.bandwidth[top] / top
    return (
        f"streaming read measured at {measured}; beyond {threads_text(top)}, {per_core:.1f} GB/s per "
        f"core up to {socket_gbps:g} GB/s for all cores (an assumed socket bandwidth, "
        "`--socket-bandwidth`)"
    )


def model_section(
    results: ResultSet,
    traces: scaling_model.TraceFile,
    folder: Path,
    prefix: str = "",
    socket_gbps: float = scaling_model.DEFAULT_SOCKET_GBPS,
) -> list:
    """The scaling model of tbb from `traces` beside the measured times: where they disagree,
    the model's times to 128 threads, and a figure per shape."""
    points = model_points(results, traces, socket_gbps)
    if not points:
        return []
    measured = [p for p in points if p.measured_s is not None and p.threads > 1]
    off = [p for p in measured if abs(p.disagreement) > MODEL_DISAGREEMENT]
    blocks: list = [
        Heading(2, "Scaling model (tbb)"),
        Para(
            f"The model (docs/design.md §3.2; `mhapy.scaling_model`) schedules the tasks of a "
            f"one-thread traced run (`{Path(traces.path).name}`, {traces.cpu_model}, tbb on "
            f"{traces.isa}) on n workers phase by phase, each phase taking at least its bytes over "
            f"the bandwidth of n threads: {_bandwidth_text(traces, socket_gbps)}. Its times are "
            "scaled so that one thread gives the benchmark's one-thread median. Beyond the "
            "machine's own threads every figure is the model's, not a measurement."
        ),
    ]
    if measured:
        worst = max(measured, key=lambda p: abs(p.disagreement))
        blocks.append(
            Para(
                f"Against the {len(measured)} measured runs on more than one thread, the model is "
                f"within {abs(worst.disagreement) * 100:.0f}% everywhere"
                + (
                    "."
                    if not off
                    else f"; {len(off)} differ by more than {MODEL_DISAGREEMENT * 100:.0f}% (the "
                    "table says which and why)."
                )
            )
        )
        blocks.append(
            Table(
                ["formulation", "shape", "threads", "measured", "model", "model / measured", "why they part"],
                [
                    [
                        p.formulation,
                        p.shape.label(),
                        str(p.threads),
                        fmt_time(p.measured_s),
                        fmt_time(p.model_s),
                        f"{p.model_s / p.measured_s:.2f}",
                        p.reason(),
                    ]
                    for p in measured
                ],
                numeric={2, 3, 4, 5},
            )
        )
    counts = [n for n in scaling_model.doubling(128) if n > 1]
    keys = sorted({(p.formulation, p.shape) for p in points}, key=lambda k: (k[1], k[0]))
    rows = []
    for form, shape in keys:
        mine = {p.threads: p for p in points if (p.formulation, p.shape) == (form, shape)}
        one = mine[1].model_s
        rows.append(
            [form, shape.label()]
            + [f"{fmt_time(mine[n].model_s)} ({one / mine[n].model_s / n:.2f})" for n in counts]
        )
    blocks += [
        Para(
            "The model's time per run and, in brackets, its parallel efficiency (time on 1 thread "
            "/ (n × time on n threads)):"
        ),
        Table(
            ["formulation", "shape"] + [f"{n} threads" for n in counts],
            rows,
            numeric=set(range(2, 2 + len(counts))),
        ),
    ]
    draw_model_scaling(folder, prefix + "scaling_model", points)
    blocks.append(
        Figure(
            prefix + "scaling_model",
            "Time per run against threads: measured (markers), the model (lines) and the bandwidth bound (grey)",
        )
    )
    return blocks


# ---- figures ----


def draw_thread_scaling(folder: Path, stem: str, scaling: list[Scaling]) -> None:
    fig, ax = figures.subplots(figsize=(6.4, 4.4))
    threads = sorted({1} | {s.threads for s in scaling})
    for backend, form in sorted(
        {(s.backend, s.formulation) for s in scaling}, key=lambda v: (is_peer(v[0]), v)
    ):
        rows = sorted(
            (s for s in scaling if (s.backend, s.formulation) == (backend, form)), key=lambda s: s.threads
        )
        xs = [1] + [s.threads for s in rows]
        ys = [1.0] + [s.geomean for s in rows]
        low = [0.0] + [max(0.0, s.geomean - s.low) for s in rows]
        high = [0.0] + [max(0.0, s.high - s.geomean) for s in rows]
        ax.errorbar(xs, ys, yerr=[low, high], capsize=3, **figures.line_style(backend, form))
    ax.plot(threads, threads, color="black", linewidth=0.8, linestyle=":", label="ideal (= threads)")
    figures.log2_x(ax, threads)
    ax.set_yscale("log")
    ax.set_ylim(0.9, max([threads[-1]] + [s.high for s in scaling]) * 1.1)
    figures.log_y(ax)
    ax.set_xlabel("threads")
    ax.set_ylabel("speedup over 1 thread (×), geometric mean over shapes")
    ax.set_title("Thread scaling (bars: min and max over shapes)")
    ax.legend(loc="upper left", frameon=False)
    fig.tight_layout()
    figures.save(fig, folder, stem)


def draw_model_scaling(folder: Path, stem: str, points: list[ModelPoint]) -> None:
    """One panel per shape: time per run against threads, the model as lines (style =
    formulation), the measured medians as markers, and the shape's bandwidth bound (grey: the
    fewest bytes of any formulation over the streaming read, where it comes within 20x of the
    model's time)."""
    shapes = sorted({p.shape for p in points})
    columns = min(4, len(shapes))
    rows = math.ceil(len(shapes) / columns)
    fig, axes = figures.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows + 0.8), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, shape in zip(flat, shapes):
        mine = [p for p in points if p.shape == shape]
        counts = sorted({p.threads for p in mine})
        for form in sorted({p.formulation for p in mine}):
            line = sorted((p for p in mine if p.formulation == form), key=lambda p: p.threads)
            style = figures.line_style("tbb", form)
            ax.plot(
                [p.threads for p in line],
                [p.model_s * 1e3 for p in line],
                color=style["color"],
                linestyle=style["linestyle"],
                label=f"model, tbb {form}",
            )
            seen = [p for p in line if p.measured_s is not None]
            ax.plot(
                [p.threads for p in seen],
                [p.measured_s * 1e3 for p in seen],
                linestyle="none",
                marker=figures.FORM_MARKERS.get(form, "x"),
                color=style["color"],
                label=f"measured, tbb {form}",
            )
        # The shape's bound: at each count, the fewest bytes any formulation must move.
        bound = {n: min(p.bound_s for p in mine if p.threads == n) for n in counts}
        if any(bound[p.threads] * 20 >= p.model_s for p in mine):
            ax.plot(
                counts,
                [bound[n] * 1e3 for n in counts],
                color="#9e9e9e",
                linestyle=":",
                label="bandwidth bound (bytes / streaming read)",
            )
        figures.log2_x(ax, counts)
        figures.log_y(ax)
        ax.set_title(shape.label())
        ax.set_xlabel("threads")
        ax.set_ylabel("ms per run")
    for ax in flat[len(shapes) :]:
        ax.set_visible(False)
    fig.suptitle("Scaling model of tbb against the measurements", fontsize=11)
    legend_height = figures.figure_legend(fig, flat[: len(shapes)])
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, legend_height / height, 1, 1 - 0.35 / height))
    figures.save(fig, folder, stem)
