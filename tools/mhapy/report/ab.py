"""A/B mode: two result sets (before/after, or two machines), per-benchmark ratio of medians
and a verdict on whether the change is beyond run-to-run noise.

Verdict rule, per benchmark present in both (matched by canonical name):
- fewer than 2 repetitions on either side: 'n/a' (the ratio is shown, noise is unknown);
- scipy importable and enough repetitions for the test to reach p < alpha at all (the exact
  two-sided Mann-Whitney U minimum is 2 / C(n+m, n): n = m = 4 or more): the U-test of the two
  sets of repetition times, as Google Benchmark's compare.py does; changed when p < alpha;
- otherwise the range rule: changed when the two [min, max] ranges of repetition times do not
  overlap (for identically distributed times that happens with probability 2 / C(n+m, n):
  10% at 3 vs 3 repetitions, 0.8% at 5 vs 5).
A changed benchmark is 'faster' (ratio < 1) or 'slower'; an unchanged one is 'noise'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from . import document, figures
from .document import Bullets, Figure, Heading, Para, Table
from .wording import fmt_ratio, fmt_time
from .results import Key, Measurement, ResultSet

try:  # optional, as for compare.py
    from scipy.stats import mannwhitneyu
except ImportError:  # pragma: no cover - depends on the machine
    mannwhitneyu = None

ALPHA = 0.05


@dataclass
class Comparison:
    key: Key
    before: Measurement
    after: Measurement
    p_value: float | None
    method: str  # "U-test", "ranges" or "n/a"
    verdict: str  # "faster", "slower", "noise" or "n/a"

    @property
    def ratio(self) -> float:
        """after median / before median: < 1 is faster."""
        return self.after.median_s / self.before.median_s


def smallest_p(n: int, m: int) -> float:
    """The smallest two-sided p-value the exact U-test can return for samples of n and m."""
    return min(1.0, 2.0 / math.comb(n + m, n))


def repetitions_for_u_test(alpha: float) -> int:
    """The fewest repetitions per side (equal sides) at which the U-test can reach p < alpha."""
    n = 2
    while smallest_p(n, n) >= alpha:
        n += 1
    return n


def verdict(before: Measurement, after: Measurement, alpha: float = ALPHA, use_scipy: bool = True):
    """(p_value, method, verdict) for one benchmark; see the module docstring for the rule."""
    a, b = before.times_s, after.times_s
    if len(a) < 2 or len(b) < 2:
        return None, "n/a", "n/a"
    faster = after.median_s < before.median_s
    if use_scipy and mannwhitneyu is not None and smallest_p(len(a), len(b)) < alpha:
        p = float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
        changed = p < alpha
        method = "U-test"
    else:
        p = None
        changed = max(a) < min(b) or max(b) < min(a)
        method = "ranges"
    return p, method, ("faster" if faster else "slower") if changed else "noise"


def compare(before: ResultSet, after: ResultSet, alpha: float = ALPHA, use_scipy: bool = True):
    """(comparisons sorted by name, keys only in before, keys only in after)."""
    common = sorted(set(before.measurements) & set(after.measurements))
    out = []
    for key in common:
        b, a = before.measurements[key], after.measurements[key]
        p, method, v = verdict(b, a, alpha, use_scipy)
        out.append(Comparison(key, b, a, p, method, v))
    only_before = sorted(set(before.measurements) - set(after.measurements))
    only_after = sorted(set(after.measurements) - set(before.measurements))
    return out, only_before, only_after


def geomean_ratios(comparisons: list[Comparison]) -> list[tuple[str, int, float]]:
    """(backend · formulation, benchmarks, geometric mean of the ratios)."""
    groups: dict[str, list[float]] = {}
    for c in comparisons:
        groups.setdefault(f"{c.key.backend} · {c.key.formulation}", []).append(c.ratio)
    return [(name, len(r), math.exp(sum(map(math.log, r)) / len(r))) for name, r in sorted(groups.items())]


def _context_differences(before: ResultSet, after: ResultSet) -> list[list[str]]:
    def merged(results: ResultSet) -> dict:
        out: dict = {}
        for _, context in results.contexts:
            for k, v in context.items():
                out.setdefault(k, v)
        return out

    b, a = merged(before), merged(after)
    rows = []
    for key in sorted(set(b) | set(a)):
        if key in ("date", "load_avg") or b.get(key) == a.get(key):
            continue
        rows.append([f"`{key}`", str(b.get(key, "–")), str(a.get(key, "–"))])
    return rows


def build(
    before: ResultSet, after: ResultSet, names: tuple[str, str], folder: Path, alpha: float, use_scipy: bool
) -> list:
    comparisons, only_before, only_after = compare(before, after, alpha, use_scipy)
    title = "mha A/B comparison"
    blocks: list = [
        Heading(1, title),
        Para(
            f"Before: `{names[0]}`; after: `{names[1]}`. "
            "Ratio = after median time / before median time (< 1: faster)."
        ),
        Para(
            f"Noise: with scipy and at least {repetitions_for_u_test(alpha)} repetitions per side "
            "(the fewest at which the exact test can reach the threshold), a two-sided "
            "Mann-Whitney U test of the repetition times (as Google Benchmark's compare.py), "
            f"changed when p < {alpha}; otherwise changed when the [min, max] ranges of the "
            "repetitions do not overlap (false alarm rate 10% at 3 vs 3 repetitions); 'n/a' with "
            f"a single repetition. scipy: {'used' if use_scipy and mannwhitneyu is not None else 'not used'}."
        ),
    ]
    if not comparisons:
        blocks.append(Para("No benchmark is in both files: nothing to compare."))
    else:
        counts = {v: sum(c.verdict == v for c in comparisons) for v in ("faster", "slower", "noise", "n/a")}
        blocks.append(
            Bullets(
                [
                    f"{len(comparisons)} benchmarks in both: {counts['faster']} faster, "
                    f"{counts['slower']} slower, {counts['noise']} within noise, "
                    f"{counts['n/a']} without repetitions."
                ]
            )
        )
        blocks.append(Heading(2, "Geometric mean ratio per backend and formulation"))
        blocks.append(
            Table(
                ["backend · formulation", "benchmarks", "geomean ratio"],
                [[n, str(k), fmt_ratio(g)] for n, k, g in geomean_ratios(comparisons)],
                numeric={1, 2},
            )
        )
        groups: dict[str, list] = {}
        for c in comparisons:
            groups.setdefault(f"{c.key.backend} · {c.key.formulation}", []).append((c.ratio, c.verdict))
        figures.ab_strip(folder, "ab_ratios", sorted(groups.items()))
        blocks.append(Figure("ab_ratios", "After/before time ratio per benchmark, coloured by verdict"))
        blocks.append(Heading(2, "Per benchmark"))
        rows = [
            [
                f"`{c.key.name()}`",
                fmt_time(c.before.median_s),
                fmt_time(c.after.median_s),
                fmt_ratio(c.ratio),
                f"{(c.ratio - 1) * 100:+.1f}%",
                "–" if c.p_value is None else f"{c.p_value:.3f}",
                f"{c.verdict} ({c.method})" if c.method != "n/a" else "n/a",
            ]
            for c in comparisons
        ]
        blocks.append(
            Table(
                ["benchmark", "before", "after", "ratio", "change", "p", "verdict"],
                rows,
                numeric={1, 2, 3, 4, 5},
            )
        )
    for label, keys in (("Only in before", only_before), ("Only in after", only_after)):
        if keys:
            blocks += [Heading(2, label), Bullets([f"`{k.name()}`" for k in keys])]
    differences = _context_differences(before, after)
    blocks.append(Heading(2, "Context differences"))
    blocks.append(
        Table(["key", "before", "after"], differences)
        if differences
        else Para("The contexts agree (ignoring date and load).")
    )
    return blocks


def generate(
    before: ResultSet,
    after: ResultSet,
    names: tuple[str, str],
    folder: Path,
    alpha: float = ALPHA,
    use_scipy: bool = True,
    with_html: bool = False,
) -> list:
    """Writes report.md and ab_ratios.png into folder; with_html also report.html and
    ab_ratios.svg."""
    folder.mkdir(parents=True, exist_ok=True)
    figures.also_svg(with_html)
    blocks = build(before, after, names, folder, alpha, use_scipy)
    document.write(blocks, "mha A/B comparison", folder, with_html)
    return blocks
