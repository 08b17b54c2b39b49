"""The table of notes.md from inputs/: per forced ISA and benchmark, the median time of each side
of the two pairs (before-1/after-1, run first, and after-2/before-2, run last), their ratio
(after / before) and a verdict per pair by the two-sided Mann-Whitney U test of the 5
repetitions (p < 0.05), as mhapy.report's A/B mode rules (which reads mha_bench's names, not
bench_attention's). Run: /usr/bin/python3 compare.py
"""

import json
import statistics
from pathlib import Path

from scipy.stats import mannwhitneyu

INPUTS = Path(__file__).parent / "inputs"


def times(side: str) -> dict[str, list[float]]:
    result: dict[str, list[float]] = {}
    for b in json.loads((INPUTS / f"{side}.json").read_text())["benchmarks"]:
        if b.get("run_type") == "iteration":
            name = b["name"].removesuffix("/real_time").removesuffix("/threads:1")
            result.setdefault(name, []).append(b["real_time"])
    return result


def verdict(before: list[float], after: list[float]) -> str:
    if mannwhitneyu(before, after, alternative="two-sided").pvalue >= 0.05:
        return "noise"
    return "faster" if statistics.median(after) < statistics.median(before) else "slower"


def main() -> None:
    print("| ISA | benchmark | before ms (1 / 2) | after ms (1 / 2) | ratio 1 | ratio 2 | verdict |")
    print("|---|---|---|---|---|---|---|")
    for isa in ("avx512", "avx2", "sse2"):
        pairs = [(times(f"{isa}-before-{p}"), times(f"{isa}-after-{p}")) for p in (1, 2)]
        for name in pairs[0][0]:
            before = [statistics.median(b[name]) for b, _ in pairs]
            after = [statistics.median(a[name]) for _, a in pairs]
            verdicts = {verdict(b[name], a[name]) for b, a in pairs}
            print(
                f"| {isa} | {name} | {before[0]:.2f} / {before[1]:.2f} | {after[0]:.2f} / {after[1]:.2f}"
                f" | {after[0] / before[0]:.3f} | {after[1] / before[1]:.3f} | {'/'.join(sorted(verdicts))} |"
            )


if __name__ == "__main__":
    main()
