"""Speculative decoding's verification step: T new tokens per sequence over a KV cache (past > 0,
T > 1; the decode preset's decode_verify series), each held against the same step with one new
token: its cost in one-token steps and the acceptance rate a drafter must reach for it to pay
(the break-even), per (plan, cache) pair, beside the peers' steps at the same shapes (PyTorch's
SDPA over its cache with an explicit bottom-right causal mask: its is_causal is top-left).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..problem import Shape
from ..schema import is_peer
from . import figures
from .decode import cache_pair, step_family
from .document import Figure, Heading, Para, Table
from .results import Measurement, ResultSet
from .wording import fmt_time, threads_text


def expected_tokens(acceptance: float, rows: int) -> float:
    """Tokens a step of `rows` new tokens yields when each of its rows - 1 drafted tokens is
    accepted with probability `acceptance` as long as those before it were (the accepted prefix
    and the step's own token): 1 + a + ... + a^(rows - 1)."""
    return sum(acceptance**i for i in range(rows))


def break_even(cost: float, rows: int) -> float | None:
    """The acceptance at which a step of `rows` new tokens costing `cost` one-token steps yields
    tokens as fast as one-token steps do (expected_tokens = cost): 0.0 where cost <= 1 (any
    acceptance pays), None where cost >= rows (none does)."""
    if cost <= 1.0:
        return 0.0
    if cost >= rows:
        return None
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens(mid, rows) < cost else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class Step:
    """A verification step's family: the shape with one new token (its other T values vary) and
    the thread count."""

    family: Shape
    threads: int

    def text(self) -> str:
        return f"B={self.family.batch}, past={self.family.past}, {threads_text(self.threads)}"


def _fastest(ms: list[Measurement]) -> Measurement | None:
    return min(ms, key=lambda m: m.median_s) if ms else None


@dataclass
class PathCosts:
    """One path's steps of a family: the one-token step's time (seconds) and, per T > 1, the
    T-token step's time over it."""

    one_s: float
    ratios: dict[int, float] = field(default_factory=dict)


def costs(results: ResultSet) -> dict[Step, dict[str, PathCosts]]:
    """Per step family: per path ("mha (fp32 plan, int8 cache)": mha's fastest backend and
    formulation at each T; a peer's "torch_sdpa (fp32 plan)"), its costs, for the families
    measured at T = 1 and some T > 1."""
    by: dict[tuple, list[Measurement]] = {}
    for key, m in results.measurements.items():
        s = key.shape
        if not s.is_decode:
            continue
        path = f"{key.backend} ({s.precision} plan)" if is_peer(key.backend) else f"mha ({cache_pair(s)})"
        family = Step(replace(step_family(s), seq_len=1), key.threads)
        by.setdefault((family, path, s.seq_len), []).append(m)
    out: dict[Step, dict[str, PathCosts]] = {}
    for (family, path, rows), ms in by.items():
        one = _fastest(by.get((family, path, 1), []))
        if rows == 1 or one is None:
            continue
        found = out.setdefault(family, {}).setdefault(path, PathCosts(one.median_s))
        found.ratios[rows] = _fastest(ms).median_s / one.median_s
    return {f: paths for f, paths in sorted(out.items(), key=lambda kv: (kv[0].family, kv[0].threads))}


def others(results: ResultSet) -> ResultSet:
    """The decode steps this section does not take (the decode sections'): one new token per
    sequence, or T whose step was not measured with one."""
    ones = {(replace(k.shape, seq_len=1), k.threads) for k in results.measurements if k.shape.seq_len == 1}
    return results.only(
        lambda k: k.shape.seq_len == 1 or (replace(k.shape, seq_len=1), k.threads) not in ones
    )


def _cell(cost: float, rows: int) -> str:
    a = break_even(cost, rows)
    pays = "never pays" if a is None else "pays at any acceptance" if a == 0.0 else f"pays above {a:.0%}"
    return f"{cost:.2f}× ({pays})"


def _figure(found: dict[Step, dict[str, PathCosts]], folder: Path, stem: str) -> None:
    """One panel per (thread count: rows) x (batch and past: columns)."""
    threads = sorted({step.threads for step in found})
    shapes = sorted({step.family for step in found})
    # One colour per path in every panel (a panel may lack some): matplotlib's "C0", "C1", ...
    names = sorted({path for paths in found.values() for path in paths})
    colour = {path: f"C{i % 10}" for i, path in enumerate(names)}
    fig, axes = figures.subplots(
        len(threads), len(shapes), figsize=(4.2 * len(shapes), 3.4 * len(threads) + 1.2), squeeze=False
    )
    for r, n in enumerate(threads):
        for c, family in enumerate(shapes):
            ax = axes[r][c]
            ax.set_title(Step(family, n).text(), fontsize=9)
            paths = found.get(Step(family, n))
            if not paths:
                ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
                continue
            rows = sorted({t for p in paths.values() for t in p.ratios} | {1})
            ax.plot(rows, rows, color="0.6", linestyle=":", label="T one-token steps")
            for path, path_costs in sorted(paths.items()):
                by_rows = path_costs.ratios
                xs = [1] + sorted(by_rows)
                style = "-" if path.startswith("mha ") else "--"
                ax.plot(
                    xs,
                    [1.0] + [by_rows[t] for t in xs[1:]],
                    marker="o",
                    markersize=3,
                    color=colour[path],
                    linestyle=style,
                    label=path,
                )
            figures.log2_x(ax, rows)
            ax.set_xlabel("new tokens per sequence (T)")
            ax.set_ylabel("time / one-token step")
            ax.grid(True, alpha=0.3)
    fig.suptitle("Verification steps: time against one new token", fontsize=11)
    legend_height = figures.figure_legend(fig, [ax for row in axes for ax in row])
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, legend_height / height, 1, 1 - 0.35 / height))
    figures.save(fig, folder, stem)


def section(results: ResultSet, folder: Path, prefix: str = "") -> list:
    """'Verifying drafted tokens': per step family a table of each path's cost at each T in
    one-token steps with its break-even acceptance, and a figure; nothing without T > 1 steps."""
    found = costs(results)
    if not found:
        return []
    stem = prefix + "verify_cost"
    _figure(found, folder, stem)
    blocks: list = [
        Heading(2, "Verifying drafted tokens (speculative decoding)"),
        Para(
            "A speculative decoder's verification step: T new tokens per sequence through the "
            "cache (T - 1 drafted tokens and the last accepted one, each seeing the cache and the "
            "new tokens before it: causal, bottom-right), against the same step with one new "
            "token. Cells: the one-token step's time, then the T-token step's time over it (mha: its fastest "
            "backend and formulation at each T; a peer: its own steps; PyTorch's SDPA takes an "
            "explicit bottom-right mask, its is_causal being top-left) and the per-token "
            "acceptance a drafter must reach for the step to pay: where 1 + a + ... + a^(T-1) "
            "tokens a step equal its cost in one-token steps. The drafter's own time is not "
            "counted (prompt lookup's is nearly nothing; a draft model's is not)."
        ),
        Figure(stem, "Time of a T-token step over a one-token step against T; dotted: T one-token steps"),
    ]
    for step, paths in found.items():
        rows = sorted({t for p in paths.values() for t in p.ratios})
        table_rows = [
            [path, fmt_time(c.one_s)] + [_cell(c.ratios[t], t) if t in c.ratios else "–" for t in rows]
            for path, c in sorted(paths.items(), key=lambda kv: (not kv[0].startswith("mha "), kv[0]))
        ]
        blocks += [
            Heading(3, step.text()),
            Table(
                ["path", "T=1"] + [f"T={t}" for t in rows], table_rows, numeric=set(range(1, len(rows) + 2))
            ),
        ]
    return blocks
