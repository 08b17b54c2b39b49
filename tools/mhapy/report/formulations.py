"""Split-weight and fused-QKV against the wrapper: the speedup over the wrapper per backend and
formulation along a series, and when a difference is a tie within noise; the section against H,
its part of the answer, and the wording decode's speedup section shares.
"""

from __future__ import annotations

from pathlib import Path

from ..problem import Shape
from . import figures
from .document import Figure, Heading, Para, Table
from .linking import NOISE_MIN_REPETITIONS, noise_by_backend, ranges_overlap
from .results import ResultSet
from .series import Series, SeriesTable, formulations_measured, kv_series
from .wording import fmt_ratio, threads_text

# The formulations compared with the wrapper (wrapper time / their time), in this order.
AGAINST_WRAPPER = ("split_weight", "fused_qkv")


def speedup(
    results: ResultSet,
    backend: str,
    shape: Shape,
    threads: int,
    formulation: str = "split_weight",
    reference: str = "wrapper",
) -> float | None:
    """time(reference) / time(formulation) on the same backend, shape and threads (> 1:
    `formulation` is faster; by default split_weight against the wrapper); None unless both
    were measured."""
    slow = results.get(backend, reference, shape, threads)
    fast = results.get(backend, formulation, shape, threads)
    if slow is None or fast is None:
        return None
    return slow.median_s / fast.median_s


def against_wrapper(results: ResultSet) -> list[str]:
    """The formulations a speedup table compares with the wrapper: those of AGAINST_WRAPPER
    measured (split_weight alone in runs without fused_qkv)."""
    return [f for f in formulations_measured(results) if f in AGAINST_WRAPPER]


def speedup_table(results: ResultSet, series: Series, threads: int) -> SeriesTable | None:
    """Speedup over the wrapper (wrapper time / the formulation's time) along the series, one
    column (backend, formulation) per backend and formulation of against_wrapper(results)
    measured with the wrapper there; None when there is none."""
    columns = [
        (b, f)
        for b in results.backends()
        for f in against_wrapper(results)
        if any(speedup(results, b, s, threads, f) is not None for s in series.shapes)
    ]
    if not columns:
        return None
    rows = [(series.x(s), [speedup(results, b, s, threads, f) for b, f in columns]) for s in series.shapes]
    return SeriesTable(series, threads, columns, rows)


def speedup_is_tie(
    results: ResultSet,
    backend: str,
    shape: Shape,
    threads: int,
    formulation: str = "split_weight",
    reference: str = "wrapper",
) -> bool:
    """A difference between two formulations (by default split/wrapper) within noise:
    overlapping repetition ranges, or |speedup - 1| under twice the backend's measured noise
    (needs >= NOISE_MIN_REPETITIONS repetitions)."""
    slow = results.get(backend, reference, shape, threads)
    fast = results.get(backend, formulation, shape, threads)
    if slow is None or fast is None:
        return False
    if min(slow.repetitions, fast.repetitions) < NOISE_MIN_REPETITIONS:
        return False
    if ranges_overlap(slow, fast):
        return True
    noise = noise_by_backend(results).get(backend)
    return noise is not None and abs(slow.median_s / fast.median_s - 1) < 2 * noise


# ---- in words ----


def series_table_block(table: SeriesTable, header: list[str], cell) -> Table:
    """One row per point of the series: x, then cell(value) per column."""
    rows = [[str(x)] + [cell(v) for v in values] for x, values in table.rows]
    return Table([table.series.x_name] + header, rows, numeric=set(range(len(header) + 1)))


# How the text names a formulation.
_FORM_NAMES = {"split_weight": "split-weight", "fused_qkv": "fused-QKV", "wrapper": "wrapper"}


class Against:
    """The wording of a comparison with the wrapper, for the formulations compared
    (against_wrapper): split_weight alone (runs without fused_qkv) reads as the
    split/wrapper speedup it always was; more, as a speedup over the wrapper per formulation."""

    def __init__(self, results: ResultSet):
        self.forms = against_wrapper(results)
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


def section(results: ResultSet, series_list: list[Series], folder: Path, prefix: str = "") -> list:
    threads = results.thread_counts()
    tables = {(s, n): speedup_table(results, s, n) for s in series_list for n in threads}
    if not any(tables.values()):
        return []
    against = Against(results)
    blocks: list = [
        Heading(2, f"{against.heading} against H"),
        Para(
            f"{against.definition} Both series of the heads "
            "preset: fixed d_model (head_dim shrinks as H grows) and fixed head_dim (d_model "
            "grows with H)."
            + (
                " Shapes with grouped K/V heads measured next to their MHA twin are in "
                "'Grouped-query attention', not here."
                if kv_series(results.shapes())
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
        blocks.append(Heading(3, f"{series.title}, {threads_text(n)}"))
        blocks.append(series_table_block(table, [against.column(c) for c in table.columns], fmt_ratio))
    return blocks


def _speedup_cell(
    results: ResultSet, backend: str, form: str, series: Series, n: int, x: int, v: float
) -> str:
    shape = next(s for s in series.shapes if series.x(s) == x)
    tie = speedup_is_tie(results, backend, shape, n, form)
    return f"{fmt_ratio(v)} (H={x})" + (", tie within noise" if tie else "")


def answer_blocks(results: ResultSet, heads: list[Series]) -> list:
    """The answer's part: per backend, formulation, H series and threads, the speedup over the
    wrapper at the smallest and the largest H and the largest one, ties within noise said.
    results: the forward passes."""
    blocks: list = []
    against = Against(results)
    rows = []
    for series in heads:
        for n in results.thread_counts():
            table = speedup_table(results, series, n)
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
                f"≥ {NOISE_MIN_REPETITIONS} repetitions) is a tie within noise, as at "
                "H = 1 where split-weight and the wrapper do identical work:"
                if against.named
                else f"{what} A difference smaller than the noise (overlapping "
                "repetition ranges, or under twice the backend's measured noise; needs "
                f"≥ {NOISE_MIN_REPETITIONS} repetitions) is a tie within noise, as at "
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
    return blocks
