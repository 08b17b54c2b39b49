"""The A/B of runs.csv (mha_bench's medians, 8 runs in the order before, after, after, before,
before, after, after, before): per benchmark, the after/before ratio of each adjacent pair and
their median, and the ratio of the two builds' fastest runs; "slower" where both pass 1.05.
Wrote ab.txt: python3 ab.py > ab.txt"""

import collections
import csv
import statistics

times = collections.defaultdict(dict)  # (preset, benchmark) -> run -> (build, time)
with open("runs.csv", newline="") as f:
    for r in csv.DictReader(f):
        times[(r["preset"], r["benchmark"])][int(r["run"])] = (r["build"], float(r["median_real_time"]))

for preset in ("quick", "decode", "decode_b1"):
    cases = sorted(k for k in times if k[0] == preset)
    print(f"== {preset}: {len(cases)} benchmarks, after/before")
    medians, fastest = [], []
    for case in cases:
        runs = times[case]
        pairs = []
        for first in range(1, max(runs), 2):
            (b1, t1), (b2, t2) = runs[first], runs[first + 1]
            pairs.append(t1 / t2 if b1 == "after" else t2 / t1)
        best = {b: min(t for bb, t in runs.values() if bb == b) for b in ("before", "after")}
        median, ratio = statistics.median(pairs), best["after"] / best["before"]
        medians.append(median)
        fastest.append(ratio)
        slower = "  SLOWER" if median > 1.05 and ratio > 1.05 else ""
        name = case[1].removesuffix("/real_time")
        print(f"{name:80s} pairs {' '.join(f'{p:.3f}' for p in pairs)}  median {median:.3f}  fastest {ratio:.3f}{slower}")
    print(
        f"median over the benchmarks: of the pairs' medians {statistics.median(medians):.3f}, of the fastest "
        f"runs' ratios {statistics.median(fastest):.3f}; the largest: {max(medians):.3f} and {max(fastest):.3f}\n"
    )
