"""Thread scaling: per backend and formulation, time on 1 thread / time on n threads over every
shape measured at both; the section that draws and tabulates it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from . import figures
from .document import Figure, Heading, Para, Table
from .results import ResultSet
from .series import variants
from .wording import fmt_ratio


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
