"""Grouped-query attention: shapes with fewer K/V heads than H against their MHA twin (the same
shape with H K/V heads), in forward passes along H and in decode steps against their bandwidth
bounds, and the claim mha makes of grouped-query decode; the section that words them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from ..problem import Shape
from ..schema import is_peer
from . import figures
from .decode import Bandwidths
from .document import Figure, Heading, Para, Table
from .fused_qkv import races
from .results import Measurement, ResultSet
from .series import FORMULATIONS, Series, SeriesTable, grouped_kv_shapes, variants
from .wording import fmt_ratio, fmt_time, threads_text


def kv_ratio(results: ResultSet, backend: str, form: str, shape: Shape, threads: int) -> float | None:
    """time(shape) / time(its MHA twin, the same shape with H K/V heads), same backend,
    formulation and threads (below 1: the grouped K/V heads are faster); None unless both were
    measured."""
    grouped = results.get(backend, form, shape, threads)
    mha = results.get(backend, form, replace(shape, n_kv_heads=0), threads)
    return None if grouped is None or mha is None else grouped.median_s / mha.median_s


def kv_table(results: ResultSet, series: Series, threads: int) -> SeriesTable | None:
    """kv_ratio per (backend, formulation) along a kv series; None when nothing has both."""
    columns = [
        (b, f)
        for b, f in variants(results)
        if any(kv_ratio(results, b, f, s, threads) is not None for s in series.shapes)
    ]
    if not columns:
        return None
    rows = [(series.x(s), [kv_ratio(results, b, f, s, threads) for b, f in columns]) for s in series.shapes]
    return SeriesTable(series, threads, columns, rows)


@dataclass
class KvDecodeRow:
    """One decode point of one backend, formulation and thread count: the MHA shape (`mha`: H
    K/V heads; its B and past the point's) and per K/V head count (H first, then fewer) the
    measured step, or None."""

    backend: str
    formulation: str
    threads: int
    mha: Shape
    cells: dict[int, Measurement | None]

    def speedup(self, kv: int) -> float | None:
        """time with H K/V heads / time with kv (above 1: kv is faster)."""
        mha, grouped = self.cells.get(self.mha.n_heads), self.cells.get(kv)
        return None if mha is None or grouped is None else mha.median_s / grouped.median_s


def kv_decode_family(shape: Shape) -> Shape:
    """What one grouped-query decode table keeps fixed: the MHA shape at B = 1, past = 1."""
    return replace(shape, n_kv_heads=0, batch=1, past=1)


def kv_decode_rows(results: ResultSet) -> dict[Shape, tuple[list[int], list[KvDecodeRow]]]:
    """The decode steps (past > 0) of grouped_kv_shapes with their MHA twins: per family
    (kv_decode_family) the K/V head counts measured (H, then fewer) and a row per backend,
    formulation, thread count, B and past with fewer K/V heads measured. Families, rows in order
    (threads, backend, formulation, B, past)."""
    grouped = [s for s in grouped_kv_shapes(results.shapes()) if s.is_decode]
    families: dict[Shape, set[int]] = {}
    for s in grouped:
        families.setdefault(kv_decode_family(s), {s.n_heads}).add(s.n_kv_heads)
    points = {replace(s, n_kv_heads=0) for s in grouped}
    out = {}
    for family in sorted(families):
        kvs = sorted(families[family], reverse=True)
        rows = []
        for mha in sorted(p for p in points if kv_decode_family(p) == family):
            for n in results.thread_counts():
                for b, f in variants(results):
                    cells = {k: results.get(b, f, replace(mha, n_kv_heads=k), n) for k in kvs}
                    if any(m for k, m in cells.items() if k != mha.n_heads):
                        rows.append(KvDecodeRow(b, f, n, mha, cells))
        rows.sort(key=lambda r: (r.threads, is_peer(r.backend), r.backend, r.formulation, r.mha))
        out[family] = (kvs, rows)
    return out


@dataclass(frozen=True)
class KvDecodeClaim:
    """A speedup claimed for grouped-query decode: at B = batch after `past` cached tokens, a
    step with one K/V head per `group` query heads at least `speedup` times faster than with H
    K/V heads."""

    batch: int
    past: int
    group: int
    speedup: float


# The claim mha makes of grouped-query decode: at B = 1 after 8192 cached tokens, where the K/V
# cache is most of what a step reads, a K/V head per 4 query heads (the decode_kv preset's 3 of
# 12) makes a step at least 3x faster than H K/V heads.
KV_DECODE_CLAIM = KvDecodeClaim(batch=1, past=8192, group=4, speedup=3.0)


@dataclass
class KvClaimCheck:
    """KV_DECODE_CLAIM at one mha backend, formulation and thread count: the measured speedup,
    whether the claim holds, and what the bandwidth bounds allow (bound with H K/V heads / bound
    with H/group; None without both bounds)."""

    backend: str
    formulation: str
    threads: int
    speedup: float
    holds: bool
    allowed: float | None


def kv_claim_checks(
    family: Shape, kvs: list[int], rows: list[KvDecodeRow], bandwidths: Bandwidths
) -> list[KvClaimCheck] | None:
    """KV_DECODE_CLAIM checked on one kv_decode_rows family (its K/V head counts kvs, its rows):
    at the claim's B and past, a check per mha backend, formulation and thread count measured
    there, in the rows' order (empty: none measured); None when the family has no grouping of
    H/group K/V heads."""
    claim = KV_DECODE_CLAIM
    kv = family.n_heads // claim.group
    if family.n_heads % claim.group or kv not in kvs:
        return None
    checks = []
    for r in rows:
        if r.mha.batch != claim.batch or r.mha.past != claim.past or is_peer(r.backend):
            continue
        sp = r.speedup(kv)
        if sp is None:
            continue
        bounds = [bandwidths.bound_s(r.cells.get(k)) for k in (family.n_heads, kv)]
        allowed = bounds[0] / bounds[1] if all(bounds) else None
        checks.append(KvClaimCheck(r.backend, r.formulation, r.threads, sp, sp >= claim.speedup, allowed))
    return checks


# ---- in words ----


def _kv_family_title(series: Series) -> str:
    """What the grouped K/V series of one family share: the kv title after its grouping."""
    return series.title.split(", ", 1)[1] if ", " in series.title else series.title


def _kv_reading(results: ResultSet, kv: list[Series], n: int) -> str:
    """Per grouping at n threads: the median time relative to MHA over every backend,
    formulation and H, with the extremes and where."""
    parts = []
    for series in kv:
        table = kv_table(results, series, n)
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
    return f"{threads_text(n)}: " + "; ".join(parts) if parts else ""


def _kv_prefill(results: ResultSet, kv: list[Series], folder: Path, prefix: str) -> list:
    """Forward passes with grouped K/V heads against MHA along H: a reading, a figure (a panel
    per grouping and thread count) and per family, thread count and backend a table of the
    relative times per formulation and grouping."""
    threads = results.thread_counts()
    tables = {(s, n): kv_table(results, s, n) for s in kv for n in threads}
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
                    for form in FORMULATIONS
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
                        value = None if shape is None else kv_ratio(results, backend, form, shape, n)
                        cells.append(fmt_ratio(value))
                    rows.append([str(x)] + cells)
                header = ["H (heads)"] + [f"{form} {series.group}" for form, series in columns]
                blocks += [
                    Heading(4, f"{backend}, {family}, {threads_text(n)}"),
                    Table(header, rows, numeric=set(range(len(header)))),
                ]
    return blocks


def _kv_claim_text(family: Shape, checks: list[KvClaimCheck]) -> str:
    """KV_DECODE_CLAIM's checks on one family in words, per thread count: the speedup of each
    mha backend and formulation, whether it meets the claim, what the bandwidth bound allows."""
    claim = KV_DECODE_CLAIM
    head = (
        f"mha's claim: {family.n_heads // claim.group} K/V heads at least {claim.speedup:.0f}× "
        f"faster per step than {family.n_heads} at B={claim.batch}, past={claim.past}"
    )
    parts = []
    for n in dict.fromkeys(c.threads for c in checks):
        cells = [
            f"{c.backend} {c.formulation} {fmt_ratio(c.speedup)} ("
            + ("meets it" if c.holds else "short of it")
            + ("" if c.allowed is None else f", the bound allows {fmt_ratio(c.allowed)}")
            + ")"
            for c in checks
            if c.threads == n
        ]
        parts.append(f"{threads_text(n)}: " + ", ".join(cells))
    if not parts:
        return f"{head}: not measured."
    return f"{head}: " + "; ".join(parts) + "."


def _kv_decode(results: ResultSet, bandwidths: Bandwidths) -> list:
    """Decode steps with grouped K/V heads against MHA: per family, thread count and backend a
    table of the time per step with each K/V head count (and % of its bandwidth bound), the
    speedups over MHA (and what the bounds allow), the bounds; the claim checked first."""
    families = kv_decode_rows(results)
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
        checks = kv_claim_checks(family, kvs, rows, bandwidths)
        if checks is not None:
            blocks.append(Para(_kv_claim_text(family, checks)))
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
                    Heading(4, f"{backend}, {title}, {threads_text(n)}"),
                    Table(header, table, numeric=set(range(1, len(header)))),
                ]
    return blocks


def section(results: ResultSet, kv: list[Series], bandwidths: Bandwidths, folder: Path, prefix: str) -> list:
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
                + (" and 'Fused-QKV vs split-weight against H'." if races(results.forward(), kv) else ".")
            ),
        ]
        + prefill
        + decode
    )
