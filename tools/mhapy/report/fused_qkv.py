"""Fused-QKV against split-weight: per backend, series and threads, split_weight time /
fused_qkv time and where fused_qkv is faster, within noise, slower; and the claim mha makes of
it, checked on the backend to link. The section against H and the answer word them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from ..problem import Shape
from . import figures
from .document import Bullets, Figure, Heading, Para, Table
from .formulations import speedup, speedup_is_tie
from .linking import NOISE_MIN_REPETITIONS, by_precision, link_summary
from .results import ResultSet
from .series import Series, SeriesTable
from .wording import fmt_ratio, threads_text


# The claim mha makes of fused_qkv (one projection for Q, K and V instead of three), checked by
# the answer on the backend to link at every thread count (RaceVerdict.held): it is never slower
# than split_weight beyond noise at any shape of the H and grouped K/V series (the heads
# preset's).
FUSED_QKV_CLAIM = "fused_qkv is at least as fast as split_weight at every shape, within noise"


@dataclass
class Race:
    """One backend's `formulation` against `reference` (fused_qkv against split_weight) along
    one series at one thread count: per point (x, ratio = reference time / formulation time,
    above 1 `formulation` is faster; verdict 'faster' | 'tie' | 'slower': `formulation`'s,
    'tie' within noise by speedup_is_tie) for every x both were measured at."""

    backend: str
    series: Series
    threads: int
    points: list[tuple[int, float, str]]
    formulation: str = "fused_qkv"
    reference: str = "split_weight"

    @property
    def median(self) -> float:
        return statistics.median(r for _, r, _ in self.points)

    @property
    def low(self) -> tuple[int, float]:
        """(x, ratio) of the smallest ratio."""
        return min(((x, r) for x, r, _ in self.points), key=lambda t: t[1])

    @property
    def high(self) -> tuple[int, float]:
        return max(((x, r) for x, r, _ in self.points), key=lambda t: t[1])

    def where(self, verdict: str) -> list[tuple[int, float]]:
        """(x, ratio) of the points with that verdict, in x order."""
        return [(x, r) for x, r, v in self.points if v == verdict]


def races(
    results: ResultSet,
    series_list: list[Series],
    formulation: str = "fused_qkv",
    reference: str = "split_weight",
) -> list[Race]:
    """A Race per (series, thread count, backend) with both formulations measured somewhere on
    the series, in that order (backends: mha first). Empty without `formulation`."""
    out = []
    for series in series_list:
        for n in results.thread_counts():
            for b in results.backends():
                points = []
                for s in series.shapes:
                    ratio = speedup(results, b, s, n, formulation, reference)
                    if ratio is not None:
                        tie = speedup_is_tie(results, b, s, n, formulation, reference)
                        verdict = "tie" if tie else "faster" if ratio > 1 else "slower"
                        points.append((series.x(s), ratio, verdict))
                if points:
                    out.append(Race(b, series, n, points, formulation, reference))
    return out


@dataclass
class RaceVerdict:
    """Over every shape of some races (each shape once, though several series hold it) of one
    backend at one thread count: shapes where the formulation is faster, tied within noise,
    slower; the ratios' median, min and max; held = never slower beyond noise."""

    backend: str
    threads: int
    faster: int
    tie: int
    slower: list[tuple[Shape, float]]
    median: float
    low: float
    high: float

    @property
    def shapes(self) -> int:
        return self.faster + self.tie + len(self.slower)

    @property
    def held(self) -> bool:
        return not self.slower


def race_verdict(results: ResultSet, race_list: list[Race], backend: str, threads: int) -> RaceVerdict | None:
    """The races of `backend` at `threads` over their distinct shapes (see RaceVerdict); None
    when it has none."""
    mine = [r for r in race_list if r.backend == backend and r.threads == threads]
    seen: dict[Shape, tuple[float, str]] = {}
    for race in mine:
        for s in race.series.shapes:
            for x, ratio, verdict in race.points:
                if race.series.x(s) == x:
                    seen[s] = (ratio, verdict)
    if not seen:
        return None
    ratios = [r for r, _ in seen.values()]
    return RaceVerdict(
        backend,
        threads,
        sum(v == "faster" for _, v in seen.values()),
        sum(v == "tie" for _, v in seen.values()),
        sorted((s, r) for s, (r, v) in seen.items() if v == "slower"),
        statistics.median(ratios),
        min(ratios),
        max(ratios),
    )


def claim_verdicts(results: ResultSet, series_list: list[Series]) -> list[RaceVerdict]:
    """FUSED_QKV_CLAIM checked per thread count on the backend to link there (the fp32 answer's
    when bf16 was measured): fused_qkv against split_weight over every shape of the series, a
    RaceVerdict each (held: the claim holds there). Empty without both formulations."""
    race_list = races(results, series_list)
    verdicts = []
    linking = by_precision(results)[0][0]
    for n in results.thread_counts():
        ls = link_summary(linking, n)
        v = race_verdict(results, race_list, ls.backend, n) if ls else None
        if v is not None:
            verdicts.append(v)
    return verdicts


# ---- in words ----


def _h_list(points: list[tuple[int, float]], name: str = "H") -> str:
    """'H 4, 8, 12 (1.02× – 1.10×)': where, and the range of the ratios; '–' when none."""
    if not points:
        return "–"
    low, high = fmt_ratio(min(r for _, r in points)), fmt_ratio(max(r for _, r in points))
    span = low if low == high else f"{low} – {high}"
    return f"{name} {', '.join(str(x) for x, _ in points)} ({span})"


def section(results: ResultSet, series_list: list[Series], folder: Path, prefix: str = "") -> list:
    """fused_qkv against split_weight along the series: a figure of split_weight time /
    fused_qkv time, and per backend, series and threads where fused_qkv is faster, within
    noise, slower, by how much. Nothing without both formulations."""
    race_list = races(results, series_list)
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
            f"measured noise; needs ≥ {NOISE_MIN_REPETITIONS} repetitions)."
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


def _verdict_text(v: RaceVerdict) -> str:
    """One thread count's verdict on the claim: held at all shapes, or where fused_qkv is slower
    beyond noise; the ratios' median and range."""
    counts = f"{v.faster} faster beyond noise, {v.tie} within noise"
    if v.held:
        text = (
            f"{threads_text(v.threads)}, {v.backend} (the backend to link): fused_qkv **at least as fast "
            f"as split_weight (within noise) at all {v.shapes} shapes** ({counts})"
        )
    else:
        slower = ", ".join(f"{s.label()} ({fmt_ratio(r)})" for s, r in v.slower)
        text = (
            f"{threads_text(v.threads)}, {v.backend} (the backend to link): fused_qkv **slower than "
            f"split_weight beyond noise at {len(v.slower)} of {v.shapes} shapes**: {slower}; at "
            f"least as fast (within noise) at the other {v.faster + v.tie} ({counts})"
        )
    return text + (
        f"; split_weight time / fused_qkv time median {fmt_ratio(v.median)}, "
        f"{fmt_ratio(v.low)} – {fmt_ratio(v.high)}."
    )


def answer_blocks(results: ResultSet, series_list: list[Series]) -> list:
    """The answer's part: FUSED_QKV_CLAIM on the backend to link, per thread count, over every
    shape of series_list (the H and grouped K/V series of the forward passes, `results`)."""
    verdicts = claim_verdicts(results, series_list)
    if not verdicts:
        return []
    return [
        Para(
            f"Fused-QKV against split-weight on the backend to link (mha's claim: {FUSED_QKV_CLAIM}), "
            "over every shape of the H series and "
            "grouped K/V series measured in both (ratio = split_weight time / fused_qkv time, "
            "above 1.0 fused_qkv is faster; 'Fused-QKV vs split-weight against H' has each "
            "backend and series):"
        ),
        Bullets([_verdict_text(v) for v in verdicts]),
    ]
