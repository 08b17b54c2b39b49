"""Which backend to link: per shape and thread count the fastest mha backend and formulation
against the best other backend (the per-shape rule), per thread count the backend whose fastest
formulation is fastest over every shape (the answer), and the run-to-run noise both are judged
by; then the sections that word them: the answer's bullets and 'Which backend to link'.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..problem import Shape
from ..schema import is_peer, is_rival
from . import figures
from .document import Bullets, Figure, Heading, Para, Table
from .results import Measurement, ResultSet, is_bf16
from .series import FORMULATIONS, Series, SeriesTable, formulations_measured
from .wording import fmt_ratio, fmt_time, threads_text

# A runner-up less than this much slower than the fastest is a tie (per shape, per thread
# count, across machines).
TIE_MARGIN = 0.05

# Noise is measured only from benchmarks with at least this many repetitions.
NOISE_MIN_REPETITIONS = 3


@dataclass
class Choice:
    """For one shape and thread count: the fastest linkable (backend, formulation), the best of
    any other linkable backend (the alternative to linking it), the margin between them, the
    fastest backend's other formulations, and the fastest peer as a reference point."""

    shape: Shape
    threads: int
    best: Measurement | None
    runner_up: Measurement | None
    margin: float | None  # runner_up time / best time - 1
    tie: bool
    peer: Measurement | None
    # The fastest backend's other formulations, fastest first: how much the formulation matters.
    siblings: list[Measurement] = field(default_factory=list)


def _variant(m: Measurement) -> str:
    return f"{m.key.backend} {m.key.formulation}"


def ranges_overlap(a: Measurement, b: Measurement) -> bool:
    """The [min, max] ranges of two benchmarks' repetition times overlap (each needs 2)."""
    if a.repetitions < 2 or b.repetitions < 2:
        return False
    return min(b.times_s) <= max(a.times_s) and min(a.times_s) <= max(b.times_s)


def choose(results: ResultSet, shape: Shape, threads: int) -> Choice:
    candidates = [m for k, m in results.measurements.items() if k.shape == shape and k.threads == threads]
    linkable = sorted((m for m in candidates if not is_peer(m.key.backend)), key=lambda m: m.median_s)
    peers = sorted((m for m in candidates if is_rival(m.key.backend)), key=lambda m: m.median_s)
    peer = peers[0] if peers else None
    if not linkable:
        return Choice(shape, threads, None, None, None, False, peer)
    best = linkable[0]
    others = [m for m in linkable if m.key.backend != best.key.backend]
    runner_up = others[0] if others else None
    siblings = [m for m in linkable[1:] if m.key.backend == best.key.backend]
    if runner_up is None:
        return Choice(shape, threads, best, None, None, False, peer, siblings)
    margin = runner_up.median_s / best.median_s - 1
    tie = margin < TIE_MARGIN or ranges_overlap(best, runner_up)
    return Choice(shape, threads, best, runner_up, margin, tie, peer, siblings)


def choices(results: ResultSet) -> list[Choice]:
    """One Choice per (shape, threads) measured, ordered by threads, then shape."""
    cells = sorted({(k.threads, k.shape) for k in results.measurements})
    return [choose(results, shape, threads) for threads, shape in cells]


def win_counts(chosen: list[Choice], threads: int) -> list[tuple[str, int, int]]:
    """(backend formulation, shapes won, shapes with a choice) at one thread count, most wins
    first; ties count for the faster one."""
    relevant = [c for c in chosen if c.threads == threads and c.best is not None]
    wins: dict[str, int] = {}
    for c in relevant:
        wins[_variant(c.best)] = wins.get(_variant(c.best), 0) + 1
    return sorted(((v, n, len(relevant)) for v, n in wins.items()), key=lambda t: (-t[1], t[0]))


def relative_time_table(results: ResultSet, series: Series, threads: int) -> SeriesTable | None:
    """Per backend (mha backends, then peers): its fastest formulation's time divided by the
    fastest mha backend's time at each point (1.0 = the one to link). None when fewer than two
    backends were measured along the series."""
    columns = [
        b
        for b in results.backends()
        if any(results.get(b, f, s, threads) for s in series.shapes for f in FORMULATIONS)
    ]
    if len(columns) < 2:
        return None
    rows = []
    for s in series.shapes:
        fastest = choose(results, s, threads).best
        values = []
        for b in columns:
            times = [m.median_s for f in FORMULATIONS if (m := results.get(b, f, s, threads))]
            values.append(min(times) / fastest.median_s if times and fastest else None)
        rows.append((series.x(s), values))
    return SeriesTable(series, threads, columns, rows)


def noise_by_backend(results: ResultSet) -> dict[str, float]:
    """Run-to-run noise per backend: the median coefficient of variation (stddev / mean of the
    repetition times) over its benchmarks with >= NOISE_MIN_REPETITIONS repetitions."""
    cvs: dict[str, list[float]] = {}
    for m in results.measurements.values():
        if m.repetitions >= NOISE_MIN_REPETITIONS and m.cv is not None:
            cvs.setdefault(m.key.backend, []).append(m.cv)
    return {b: statistics.median(v) for b, v in sorted(cvs.items())}


@dataclass
class LinkSummary:
    """Which backend to link at one thread count, over every shape measured there: the backend
    whose fastest formulation has the lowest geometric-mean time relative to the fastest mha
    time, its formulations' wins, the runner-up backend and the margin between their geometric
    means (over the shapes both measured); tie when the margin is under TIE_MARGIN or under the
    larger of the two backends' measured noise."""

    threads: int
    backend: str
    wins: int
    shapes: int
    formulations: list[tuple[str, int]]  # (formulation, shapes where it is the faster one)
    runner_up: str | None
    margin: float | None
    common: int
    tie: bool
    noise: float | None


def _best_time(results: ResultSet, backend: str, shape: Shape, threads: int) -> Measurement | None:
    found = [m for f in FORMULATIONS if (m := results.get(backend, f, shape, threads))]
    return min(found, key=lambda m: m.median_s) if found else None


def link_summary(results: ResultSet, threads: int) -> LinkSummary | None:
    shapes = sorted({k.shape for k in results.measurements if k.threads == threads})
    backends = [b for b in results.backends() if not is_peer(b)]
    best = {b: {s: m for s in shapes if (m := _best_time(results, b, s, threads))} for b in backends}
    best = {b: v for b, v in best.items() if v}
    if not best:
        return None

    def geomean_ratio(a: str, b: str) -> tuple[float, int]:
        common = [s for s in best[a] if s in best[b]]
        if not common:
            return 1.0, 0
        logs = [math.log(best[a][s].median_s / best[b][s].median_s) for s in common]
        return math.exp(sum(logs) / len(logs)), len(common)

    # Rank by shapes covered first (a backend measured on fewer shapes cannot win by absence),
    # then by geometric mean relative to every other backend.
    def score(b: str) -> tuple:
        others = [geomean_ratio(b, o)[0] for o in best if o != b]
        return (-len(best[b]), math.exp(sum(map(math.log, others)) / len(others)) if others else 1.0)

    ranked = sorted(best, key=score)
    chosen = ranked[0]
    wins = sum(
        1 for c in choices(results) if c.threads == threads and c.best and c.best.key.backend == chosen
    )
    forms: dict[str, int] = {}
    for m in best[chosen].values():
        forms[m.key.formulation] = forms.get(m.key.formulation, 0) + 1
    noise = noise_by_backend(results)
    runner_up = margin = None
    common, tie, level = 0, False, None
    if len(ranked) > 1:
        runner_up = min(ranked[1:], key=lambda o: geomean_ratio(o, chosen)[0])
        ratio, common = geomean_ratio(runner_up, chosen)
        margin = ratio - 1
        levels = [noise[b] for b in (chosen, runner_up) if b in noise]
        level = max(levels) if levels else None
        tie = margin < TIE_MARGIN or (level is not None and margin < level)
    return LinkSummary(
        threads,
        chosen,
        wins,
        len(shapes),
        sorted(forms.items(), key=lambda t: -t[1]),
        runner_up,
        margin,
        common,
        tie,
        level,
    )


def by_precision(results: ResultSet, kind: str = "") -> list[tuple[ResultSet, str]]:
    """[(results, kind)] as given when nothing was measured in bf16; otherwise its fp32 and its
    bf16 benchmarks apart, kind prefixed 'fp32' / 'bf16' (together, a backend that declines
    bf16 would rank lower for measuring fewer shapes)."""
    if not any(is_bf16(m) for m in results.measurements.values()):
        return [(results, kind)]
    return [
        (results.only(lambda k, p=precision: k.shape.precision == p), f"{precision} {kind}".strip())
        for precision in ("fp32", "bf16")
    ]


def by_cache(results: ResultSet, kind: str) -> list[tuple[ResultSet, str]]:
    """[(results, kind)] as given when no decode step kept another cache than its plan's
    precision; otherwise those steps apart, kind suffixed ', int8 cache' (a backend that declines
    an int8 cache would otherwise rank lower for measuring fewer shapes)."""
    caches = sorted({m.key.shape.kv_precision for m in results.measurements.values()})
    if caches == [""] or not caches:
        return [(results, kind)]
    return [
        (
            results.only(lambda k, c=cache: k.shape.kv_precision == c),
            f"{kind}, {cache} cache" if cache else kind,
        )
        for cache in caches
    ]


# ---- in words ----


def recommendation(c: Choice) -> str:
    """The per-shape verdict in words: link which backend and run which formulation (how much
    slower its other formulations are), or two backends within noise, or the only one measured."""
    if c.best is None:
        return "no mha backend measured here"
    best = c.best
    form_note = (
        " ("
        + ", ".join(
            f"{m.key.formulation}: {fmt_ratio(m.median_s / best.median_s)} slower" for m in c.siblings
        )
        + ")"
        if c.siblings
        else ""
    )
    if c.runner_up is None:
        return f"only {best.key.backend} measured: run {best.key.formulation}{form_note}"
    if c.tie:
        return (
            f"{best.key.backend} or {c.runner_up.key.backend}: within noise "
            f"({c.margin * 100:.1f}% apart); either will do"
        )
    return (
        f"link {best.key.backend}, run {best.key.formulation}{form_note}; "
        f"{fmt_ratio(1 + c.margin)} faster than {c.runner_up.key.backend}"
    )


def _choice_row(c: Choice) -> list[str]:
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
        recommendation(c),
    ]


def best_word(results: ResultSet) -> str:
    """'faster' of two formulations measured (or one), 'fastest' of three."""
    return "faster" if len(formulations_measured(results)) <= 2 else "fastest"


def section(results: ResultSet, series_list: list[Series], folder: Path, prefix: str = "") -> list:
    chosen = choices(results)
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
            f"time / fastest time − 1. A margin under {TIE_MARGIN * 100:.0f}%, or "
            "overlapping repetition ranges, is called within noise. The fastest peer (PyTorch, "
            "OpenVINO, ONNX Runtime) is shown beside them: its time, and in brackets that time / "
            "the fastest mha time ('mha and the peers' ranks them)."
        ),
    ]
    summary = []
    for n in results.thread_counts():
        wins = win_counts(chosen, n)
        if wins:
            text = "; ".join(f"{v}: {k} of {total}" for v, k, total in wins)
            summary.append(f"{threads_text(n)}: fastest on the most shapes: {text}")
    blocks.append(Bullets(summary))
    threads = results.thread_counts()
    tables = {(s, n): relative_time_table(results, s, n) for s in series_list for n in threads}
    if any(tables.values()):
        figures.series_grid(
            folder,
            prefix + "link_choice",
            f"Each backend's {best_word(results)} formulation, relative to the fastest mha backend",
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
        blocks.append(Heading(3, threads_text(n)))
        blocks.append(
            Table(
                ["shape", "fastest", "time", "runner-up", "time", "margin", "fastest peer", "recommendation"],
                [_choice_row(c) for c in chosen if c.threads == n],
                numeric={2, 4, 5},
            )
        )
    return blocks


def _noise_text(results: ResultSet) -> str:
    noise = noise_by_backend(results)
    if noise:
        per = ", ".join(f"{b} {v * 100:.1f}%" for b, v in noise.items())
        return (
            "Run-to-run noise, measured (median coefficient of variation of the repetition "
            f"times, benchmarks with ≥ {NOISE_MIN_REPETITIONS} repetitions): {per}."
        )
    if not any(m.repetitions > 1 for m in results.measurements.values()):
        return "One repetition per benchmark: run-to-run noise is not known."
    return (
        f"Fewer than {NOISE_MIN_REPETITIONS} repetitions per benchmark: run-to-run noise "
        "is not measured (the per-shape rule below uses the repetition ranges)."
    )


def _link_bullets(results: ResultSet, kind: str = "") -> list[str]:
    """The answer per thread count; kind ('decode') names what the shapes are."""
    items = []
    what = f"{kind} shapes" if kind else "shapes"
    for n in results.thread_counts():
        ls = link_summary(results, n)
        if ls is None:
            continue
        forms = ", ".join(f"{f} on {k}" for f, k in ls.formulations)
        text = (
            f"**{kind + ', ' if kind else ''}{threads_text(n)}: link {ls.backend}** (its {best_word(results)} "
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
                f"{TIE_MARGIN * 100:.0f}%{noise})."
            )
        items.append(text)
    return items


def answer_bullets(results: ResultSet) -> list[str]:
    """Which backend to link: for forward passes (past = 0) and, separately, for decode
    (past > 0), per thread count, fp32 and bf16 apart when bf16 was measured; then the
    measured noise."""
    parts = by_precision(results.forward()) + [
        part for decode, kind in by_precision(results.decode(), "decode") for part in by_cache(decode, kind)
    ]
    items = [text for part, kind in parts for text in _link_bullets(part, kind)]
    if not items:
        items = ["No mha backend was measured (peers only): nothing to recommend."]
    return items + [_noise_text(results)]
