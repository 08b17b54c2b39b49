"""Several machines: per shape at 1 thread and at each machine's most threads, the backend to
link on each machine and whether they differ beyond noise; the cross-machine table.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..problem import Shape
from .document import Para, Table
from .linking import TIE_MARGIN, choose, ranges_overlap
from .results import Measurement, ResultSet


@dataclass
class CrossRow:
    """One shape at 1 thread ('1') or each machine's most threads ('all'): per machine the
    fastest mha backend · formulation (None: not measured there); differs when the measured
    machines disagree."""

    shape: Shape
    threads: str
    cells: list[Measurement | None]
    # Every machine's own pick and the other machines' picks are within noise there (the
    # per-shape rule: margin under TIE_MARGIN or overlapping repetition ranges).
    within_noise: bool = False

    @property
    def differs(self) -> bool:
        picks = {(m.key.backend, m.key.formulation) for m in self.cells if m is not None}
        return len(picks) > 1

    @property
    def backend_differs(self) -> bool:
        return len({m.key.backend for m in self.cells if m is not None}) > 1


def cross_machine(machines: list[ResultSet]) -> list[CrossRow]:
    shapes = sorted({s for r in machines for s in r.shapes()})
    rows = []
    for label in ("1", "all"):
        for shape in shapes:
            cells = []
            for r in machines:
                counts = sorted({k.threads for k in r.measurements if k.shape == shape})
                n = 1 if label == "1" else (counts[-1] if counts and counts[-1] > 1 else None)
                cells.append(choose(r, shape, n).best if n in counts else None)
            if any(cells):
                row = CrossRow(shape, label, cells)
                row.within_noise = row.differs and _picks_within_noise(machines, cells)
                rows.append(row)
    return rows


def _picks_within_noise(machines: list[ResultSet], cells: list) -> bool:
    picks = {(m.key.backend, m.key.formulation) for m in cells if m is not None}
    for r, mine in zip(machines, cells):
        if mine is None:
            continue
        for backend, form in picks:
            other = r.get(backend, form, mine.key.shape, mine.key.threads)
            if other is None:
                return False
            if other is not mine and not (
                other.median_s / mine.median_s - 1 < TIE_MARGIN or ranges_overlap(mine, other)
            ):
                return False
    return True


# ---- in words ----


def _cross_flag(r: CrossRow) -> str:
    if not r.differs:
        return ""
    what = "backend differs" if r.backend_differs else "formulation differs"
    return f"{what} (within noise)" if r.within_noise else f"**{what}**"


def section(machines: list[ResultSet]) -> list:
    """The cross-machine table under the answer: per shape and thread label, each machine's
    pick, flagged where they differ (in bold beyond noise), and how many rows differ."""
    rows = cross_machine(machines)
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
            f"machines' picks are less than {TIE_MARGIN * 100:.0f}% slower than its own "
            "or their repetition ranges overlap; 'formulation differs' when the backend is the "
            "same)."
        ),
        Table(["shape", "threads"] + [r.machine_label() for r in machines] + ["choice"], table),
    ]
