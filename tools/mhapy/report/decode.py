"""Decode: incremental calls (past > 0) against the streaming-read bandwidth: the time per step
along the cached length, the bandwidth bound of each step (bytes_min / the measured bandwidth)
and % of it; the sections on the time per step and on the formulations in decode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from .. import schema
from ..schema import is_peer
from ..problem import Shape, decode_bytes
from . import figures
from .document import Figure, Heading, Para, Table
from .formulations import Against, series_table_block, speedup_table
from .linking import choose
from .results import Measurement, ResultSet, context_number
from .series import Series, SeriesTable, past_series, variants
from .wording import above_100, fmt_ratio, fmt_time, threads_text


@dataclass
class Bandwidth:
    """Measured streaming-read bandwidth, GB/s (1e9 bytes per second): one thread, and
    `threads` threads at once (mha_bench's mha_stream_read_* keys)."""

    one_core: float | None = None
    all_cores: float | None = None
    threads: int | None = None
    source: str = "not measured"

    def for_threads(self, threads: int) -> float | None:
        if threads == 1 and self.one_core:
            return self.one_core
        if self.all_cores and threads == self.threads:
            return self.all_cores
        return None

    def any(self) -> bool:
        return bool(self.one_core or self.all_cores)


def _file_bandwidth(source: str, context: dict) -> Bandwidth:
    one, all_cores = (
        context_number(context.get(schema.STREAM_ONE_CORE)),
        context_number(context.get(schema.STREAM_ALL_CORES)),
    )
    threads = context_number(context.get(schema.STREAM_THREADS))
    return Bandwidth(
        one if one and one > 0 else None,
        all_cores if all_cores and all_cores > 0 else None,
        int(threads) if threads else None,
        f"`{Path(source).name}`",
    )


@dataclass
class Bandwidths:
    """The bandwidth each decode benchmark's bound divides by: its own file's; files without
    one (peers) the machine's best (the highest one-thread and all-thread
    figures of its files)."""

    files: dict[str, Bandwidth]
    fallback: Bandwidth

    def for_measurement(self, m: Measurement) -> Bandwidth:
        own = self.files.get(m.source)
        return own if own is not None and own.any() else self.fallback

    def bound_s(self, m: Measurement | None) -> float | None:
        """bytes_min (the counter, else problem.decode_bytes) / the bandwidth of the thread
        count, seconds; None without a bandwidth for it."""
        if m is None:
            return None
        rate = self.for_measurement(m).for_threads(m.key.threads)
        return None if not rate else bytes_min(m) / (rate * 1e9)

    def percent(self, m: Measurement | None) -> float | None:
        bound = self.bound_s(m)
        return None if bound is None else 100.0 * bound / m.median_s

    def any(self) -> bool:
        return self.fallback.any()


def bytes_min(m: Measurement) -> float:
    """The least bytes the call reads: its bytes_min counter, else problem.decode_bytes."""
    return m.bytes_min if m.bytes_min is not None else decode_bytes(m.key.shape, m.key.formulation)


def find_bandwidths(results: ResultSet) -> Bandwidths:
    files = {source: _file_bandwidth(source, context) for source, context in results.contexts}
    best = Bandwidth(source="the highest figures of the machine's files")
    for bw in files.values():
        if bw.one_core and (best.one_core is None or bw.one_core > best.one_core):
            best.one_core = bw.one_core
        if bw.all_cores and (best.all_cores is None or bw.all_cores > best.all_cores):
            best.all_cores, best.threads = bw.all_cores, bw.threads
    return Bandwidths(files, best)


def decode_time_table(results: ResultSet, series: Series, threads: int) -> SeriesTable | None:
    """Median time per call of each (backend, formulation) along a past series; None when
    nothing was measured there."""
    columns = [
        (b, f) for b, f in variants(results) if any(results.get(b, f, s, threads) for s in series.shapes)
    ]
    if not columns:
        return None
    rows = [
        (series.x(s), [(m.median_s if (m := results.get(b, f, s, threads)) else None) for b, f in columns])
        for s in series.shapes
    ]
    return SeriesTable(series, threads, columns, rows)


def decode_bounds(
    results: ResultSet, bandwidths: Bandwidths, table: SeriesTable
) -> list[tuple[list[str], list[tuple[int, float]]]]:
    """The bandwidth-bound curves of a decode table: per formulation, at each past, the bound of
    the first column (mha backends first) measured there; formulations with the same curve (no
    grouped K/V heads: they read the same bytes) share it. [(formulations, [(past, bound s)])]."""
    per_form: dict[str, dict[int, float]] = {}
    for shape in table.series.shapes:
        x = table.series.x(shape)
        for backend, form in table.columns:
            points = per_form.setdefault(form, {})
            bound = bandwidths.bound_s(results.get(backend, form, shape, table.threads))
            if x not in points and bound is not None:
                points[x] = bound
    curves: dict[tuple, list[str]] = {}
    for form, points in per_form.items():
        if points:
            curves.setdefault(tuple(sorted(points.items())), []).append(form)
    return [(forms, list(points)) for points, forms in curves.items()]


# ---- in words ----

# How a decode step's bandwidth bound and % of it are read (Bandwidths.bound_s, percent).
BANDWIDTH_RULE = (
    "The bandwidth bound of a decode step is `bytes_min` (every weight once and the keys "
    "and values of the past + T tokens once: the least it reads) / the measured "
    "streaming-read bandwidth of its thread count: `mha_stream_read_gbps_one_core` for "
    "threads:1, `mha_stream_read_gbps_all_cores` for `mha_stream_read_threads` threads "
    "(other thread counts get no bound). % of bound = bound / time: 100% streams those bytes "
    "as fast as the machine reads memory; above 100%, part of them came from a cache (the "
    "weights, 9 MiB at d_model 768, stay in a large last-level cache from step to step)."
)


def _bandwidth_text(bandwidths: Bandwidths) -> str:
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
    c = choose(results, shape, threads)
    if c.best is None:
        return "–"
    text = f"{c.best.key.backend} {c.best.key.formulation}"
    if c.runner_up is not None:
        text += f" ({c.runner_up.key.backend} +{c.margin * 100:.0f}%" + (", within noise)" if c.tie else ")")
    return text


def sections(results: ResultSet, bandwidths: Bandwidths, folder: Path, prefix: str = "") -> list:
    """Time per decode step against past with the bandwidth bound, % of the bound, the
    fastest backend per shape, and split-weight vs wrapper in decode."""
    series_list = past_series(results.shapes())
    if not series_list:
        return []
    threads = results.thread_counts()
    tables = {(s, n): decode_time_table(results, s, n) for s in series_list for n in threads}
    curves = {key: decode_bounds(results, bandwidths, t) for key, t in tables.items() if t}
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
            f"time of that call. {BANDWIDTH_RULE} Cells: time per step and, in "
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
    blocks += above_100(
        above,
        lambda count, pct, variant, past, n: (
            f"**{count} step(s) beat the bandwidth bound** (up to "
            f"{pct:.0f}%: {variant} at past={past}, {threads_text(n)}): part of the bytes came from a "
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
            Heading(3, f"{series.title}, {threads_text(n)}"),
            Table(header, rows, numeric=set(range(len(header) - 1))),
        ]
    return (
        blocks
        + cache_precision_section(results, bandwidths)
        + _decode_speedup_section(results, series_list, folder, prefix)
    )


# ---- the KV cache's precision ----

# The (plan, cache) precisions a decode step can run with, in the order the table lists them.
CACHE_COMBINATIONS = (
    ("fp32", "fp32"),
    ("fp32", "int8"),
    ("fp32", "k8v4"),
    ("fp32", "int4"),
    ("bf16", "bf16"),
    ("bf16", "int8"),
    ("bf16", "k8v4"),
    ("bf16", "int4"),
)


def peer_cache(m: Measurement) -> str:
    """The KV cache a peer's decode step kept, as the runner appends it to the label ("...; KV
    cache u8"), or "not recorded" when the label does not end so."""
    found = re.search(r"; KV cache (\w+)$", m.label)
    return found.group(1) if found else "not recorded"


def step_family(s: Shape) -> Shape:
    """A decode shape without its precisions: the step every (plan, cache) pair computes."""
    return replace(s, precision="fp32", kv_precision="")


@dataclass
class CacheStep:
    """One decode step (a shape without its precisions, a thread count) measured by mha with
    more than one (plan, cache) pair: mha's fastest backend and formulation per pair, the
    fastest peer over every pair's shapes (each library's cache as it recorded it) and the
    fastest path of all."""

    family: Shape
    threads: int
    best: dict[tuple[str, str], Measurement]
    peer: Measurement | None

    def fastest(self) -> Measurement:
        paths = list(self.best.values()) + ([self.peer] if self.peer else [])
        return min(paths, key=lambda m: m.median_s)

    def step_text(self) -> str:
        return f"B={self.family.batch}, past={self.family.past}"


def _pair_text(m: Measurement) -> str:
    """The plan and cache precisions a step ran with: mha's from its shape, a peer's cache as it
    recorded it."""
    if is_peer(m.key.backend):
        return f"{m.key.shape.precision} plan, {peer_cache(m)} cache"
    return cache_pair(m.key.shape)


def cache_pair(s: Shape) -> str:
    """The plan and cache precisions mha's step at `s` runs with: "fp32 plan, int8 cache"."""
    return f"{s.precision} plan, {s.kv_precision or s.precision} cache"


def path_text(m: Measurement) -> str:
    """ "mha xsimd (bf16 plan, int8 cache)", "openvino (bf16 plan, bf16 cache)"."""
    who = m.key.backend if is_peer(m.key.backend) else f"mha {m.key.backend}"
    return f"{who} ({_pair_text(m)})"


def cache_steps(results: ResultSet) -> list[CacheStep]:
    """The decode steps measured with several (plan, cache) pairs (linking.choose per pair)."""
    steps = sorted({(step_family(k.shape), k.threads) for k in results.measurements if k.shape.is_decode})
    out = []
    for family, threads in steps:
        chosen = {
            (plan, cache): choose(results, replace(family, precision=plan, kv_precision=cache), threads)
            for plan, cache in CACHE_COMBINATIONS
        }
        best = {pair: c.best for pair, c in chosen.items() if c.best is not None}
        if len(best) < 2:
            continue
        peers = [c.peer for c in chosen.values() if c.peer is not None]
        out.append(CacheStep(family, threads, best, min(peers, key=lambda m: m.median_s, default=None)))
    return out


def cache_precision_rows(results: ResultSet, bandwidths: Bandwidths) -> list[list[str]]:
    """One row per CacheStep: mha's time per (plan, cache) pair with % of its bandwidth bound,
    the fastest peer with its plan and cache, the fastest path of all, the best int8 step's
    speedup over the fp32 one, and the best k8v4 and int4 steps' over the best int8 one."""
    rows = []
    for step in cache_steps(results):
        cells = []
        for pair in CACHE_COMBINATIONS:
            m = step.best.get(pair)
            pct = bandwidths.percent(m) if m else None
            cells.append(
                "–"
                if m is None
                else f"{fmt_time(m.median_s)}" + (f" ({pct:.0f}%)" if pct else "") + f" {m.key.backend}"
            )
        peer = step.peer
        cells.append(
            "–" if peer is None else f"{fmt_time(peer.median_s)} {peer.key.backend} ({_pair_text(peer)})"
        )
        cells.append(path_text(step.fastest()))
        fp32 = step.best.get(("fp32", "fp32"))
        fastest = {
            cache: min((step.best[(plan, cache)] for plan in ("fp32", "bf16") if (plan, cache) in step.best),
                       key=lambda m: m.median_s, default=None)
            for cache in ("int8", "k8v4", "int4")
        }  # fmt: skip
        int8 = fastest["int8"]
        speedup = fmt_ratio(fp32.median_s / int8.median_s) if fp32 and int8 else "–"
        four_bit = [
            fmt_ratio(int8.median_s / fastest[cache].median_s) if int8 and fastest[cache] else "–"
            for cache in ("k8v4", "int4")
        ]
        rows.append([step.step_text(), threads_text(step.threads)] + cells + [speedup] + four_bit)
    return rows


def cache_answer(results: ResultSet) -> list[str]:
    """The decode answer's cache precisions: per step measured with several, the fastest path
    (mha's with its plan and cache, or a peer's with its own) and what it beats."""
    items = []
    for step in cache_steps(results):
        fastest = step.fastest()
        # The next two of mha's pairs, and the fastest peer whatever its rank.
        ranked = sorted(step.best.values(), key=lambda m: m.median_s)
        others = [m for m in ranked if m is not fastest][:2]
        others += [step.peer] if step.peer is not None and step.peer is not fastest else []
        beside = "; ".join(f"{path_text(m)} {fmt_time(m.median_s)}" for m in others)
        items.append(
            f"**Decode {step.step_text()}, {threads_text(step.threads)}: {path_text(fastest)}**, "
            f"{fmt_time(fastest.median_s)} per step" + (f" (then {beside})" if beside else "") + "."
        )
    return items


def cache_precision_section(results: ResultSet, bandwidths: Bandwidths) -> list:
    """The decode steps measured with several KV cache precisions, side by side, with the peers'
    fastest step and the cache it kept."""
    rows = cache_precision_rows(results, bandwidths)
    if not rows:
        return []
    header = ["step", "threads"] + [f"{plan} plan, {cache} cache" for plan, cache in CACHE_COMBINATIONS]
    header += ["fastest peer (its plan and KV cache)", "fastest path", "int8 / fp32 speedup"]
    header += ["k8v4 / int8 speedup", "int4 / int8 speedup"]
    return [
        Heading(2, "Decode: the KV cache's precision"),
        Para(
            "The same decode step with each (plan, KV cache) precision mha ran it in (docs/design.md "
            "§1.7): the fastest mha backend's time per step, in brackets % of its bandwidth bound "
            "(`bytes_min` counts the weights in the plan's precision and the cache in its own: "
            "4, 2 or 1 byte per element, plus 4 bytes of scale and zero per int8 row, 8 per u8 row of "
            "OpenVINO's; k8v4's keys as int8's, its values half a byte per element and 4 bytes per "
            "group of 32; int4's values as k8v4's, its keys half a byte per element and 4 bytes per "
            "channel a group of 64 tokens). The peers' "
            "column is the fastest peer of any of the step's (plan, cache) pairs, with the cache "
            "it kept as it recorded it (OpenVINO keeps the compute precision when pinned, u8 by "
            "default: openvino_u8kv, or pinned for an int8 step); the fastest path is the fastest "
            "of them all. Speedups: the fp32 step's time over the faster int8 step's, and that over "
            "the faster k8v4 step's and the faster int4 step's."
        ),
        Table(
            header, rows, numeric=set(range(2, len(header) - 4)) | set(range(len(header) - 3, len(header)))
        ),
    ]


def _decode_speedup_section(results: ResultSet, series_list: list[Series], folder: Path, prefix: str) -> list:
    threads = results.thread_counts()
    tables = {(s, n): speedup_table(results, s, n) for s in series_list for n in threads}
    if not any(tables.values()):
        return []
    stem = prefix + "decode_speedup_vs_past"
    against = Against(results)
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
            blocks.append(Heading(3, f"{series.title}, {threads_text(n)}"))
            blocks.append(series_table_block(table, [against.column(c) for c in table.columns], fmt_ratio))
    return blocks
