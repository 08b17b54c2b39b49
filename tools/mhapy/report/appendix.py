"""Appendix: machine and build: every input file's context, and the peaks each benchmark's %
of peak is read against (peaks.py's numbers in words), with the rule; and the wording of the
peak warnings the report opens with.
"""

from __future__ import annotations

from pathlib import Path

from ..schema import is_peer
from .document import Heading, Para, Table
from .peaks import LowPeak, Peak, Peaks, UnsteadyPeak
from .results import ResultSet, is_bf16

# The rule every % of peak in the report follows (Peaks.matched_peak), stated under the peaks.
PEAK_RULE = (
    "% of peak divides model GFLOP/s by the measured FP32 FMA peak of the ISA an fp32 "
    "benchmark's backend runs at (its `mha_backend_<name>_peak_isa`: avx512, avx2 or "
    "portable), taken from the same result file as the benchmark: the larger of the "
    "context's `mha_fma_peak_gflops_one_core_<isa>` / `..._all_cores_<isa>` and the "
    "`peak/<isa>/...` entries measured during the run. Backends without a peak ISA use "
    "their file's best peak; peers the best peak of the machine's files. The "
    "thread rule: the 1-core "
    "peak for threads:1, otherwise the all-core peak scaled by threads / the thread count "
    "it was measured on. A bf16 benchmark (every section: GFLOP/s tables and figures, "
    "'fp32 vs bf16') is read against the peak its backend's "
    "`mha_backend_<name>_bf16_peak_isa` names: `bf16_dot` (native bf16 kernels): the "
    "measured bf16 dot-product peak (the 'bf16 dot' row), `bf16_tile` (AMX tiles) the "
    "tile-product peak (the 'bf16 tile' row), or, without one above 0, the FP32 "
    "FMA peak; an ISA: that ISA's FP32 FMA peak; no such key (older files): none, % of "
    "peak n/a. Same thread rule."
)

_CONTEXT_SKIP = {"caches", "load_avg"}

# Google Benchmark's `library_build_type` describes libbenchmark itself (Debian's package says
# "debug"), not the code it timed; readers take it for the latter, so the table says whose it is.
_CONTEXT_EXPLAINED = {
    "library_build_type": "Google Benchmark library's build, not the timed code's (see mha_build_type)",
}


def _context_rows(context: dict) -> list[list[str]]:
    rows = []
    for key, value in context.items():
        if key in _CONTEXT_SKIP or isinstance(value, (dict, list)):
            continue
        note = _CONTEXT_EXPLAINED.get(key)
        rows.append([f"`{key}`", f"{value} ({note})" if note else str(value)])
    caches = context.get("caches")
    if isinstance(caches, list) and caches:
        text = ", ".join(
            f"L{c.get('level', '?')} {c.get('type', '')} {int(c.get('size', 0)) // 1024} KiB"
            + (f" (shared by {c['num_sharing']})" if c.get("num_sharing", 1) > 1 else "")
            for c in caches
            if isinstance(c, dict)
        )
        rows.append(["`caches`", text])
    if isinstance(context.get("load_avg"), list):
        rows.append(["`load_avg`", ", ".join(f"{v:.2f}" for v in context["load_avg"])])
    return rows


def _read_against(results: ResultSet, peaks: Peaks, peak: Peak) -> str:
    """The backends whose benchmarks' % of peak divides by `peak` (Peaks.matched_peak): 'naive,
    xsimd (bf16)', a backend's bf16 benchmarks named apart; '–' when none."""
    names = {
        m.key.backend + (" (bf16)" if is_bf16(m) else "")
        for m in results.measurements.values()
        if peaks.matched_peak(m).peak is peak
    }
    return ", ".join(sorted(names)) or "–"


def _peak_blocks(results: ResultSet, peaks: Peaks, level: int) -> list:
    blocks: list = [Heading(level, "Measured peak")]
    peak = peaks.fallback
    if not peaks.any():
        return blocks + [
            Para(
                "No measured FP32 FMA peak in the inputs (no context key with 'peak' for 1 core "
                "or all cores, and no --peak-1core / --peak-all): % of peak is not reported."
            )
        ]
    rows = [
        [
            f"`{Path(fp.source).name}`",
            isa,
            "–" if p.one_core is None else f"{p.one_core:.1f}",
            "–" if p.all_cores is None else f"{p.all_cores:.1f} ({p.all_core_threads} threads)",
            _read_against(results, peaks, p),
            p.source,
        ]
        for fp in peaks.files.values()
        for isa, p in list(fp.per_isa.items()) + [("best", fp.best)]
        if p.one_core or p.all_cores
    ]
    # The native bf16 peaks (dot and tile products), with the backends whose bf16 benchmarks are
    # read against them.
    rows += [
        [
            f"`{Path(fp.source).name}`",
            kind,
            "–" if native.one_core is None else f"{native.one_core:.1f}",
            "–"
            if native.all_cores is None
            else f"{native.all_cores:.1f} ({native.all_core_threads} threads)",
            _read_against(results, peaks, native),
            native.source,
        ]
        for fp in peaks.files.values()
        for kind, native in (("bf16 dot", fp.bf16_dot), ("bf16 tile", fp.bf16_tile))
        if native.one_core or native.all_cores
    ]
    if rows and not peaks.overridden:
        blocks.append(
            Table(
                ["file", "ISA", "1 core GFLOP/s", "all cores GFLOP/s", "backends read against it", "from"],
                rows,
                numeric={2, 3},
            )
        )
    per = ", ".join(
        text
        for text in (
            f"1 core: **{peak.one_core:.1f} GFLOP/s**" if peak.one_core else "",
            f"all cores: **{peak.all_cores:.1f} GFLOP/s**" if peak.all_cores else "",
            f"all-core peak measured on {peak.all_core_threads} threads" if peak.all_cores else "",
        )
        if text
    )
    what = "Every benchmark's peak" if peaks.overridden else "Best peak of the machine's files (peers)"
    blocks.append(Para(f"{what}: FP32 FMA {per}; from {peak.source}. {PEAK_RULE}"))
    return blocks


def section(results: ResultSet, peaks: Peaks, level: int = 2) -> list:
    blocks: list = [Heading(level, "Appendix: machine and build")]
    for path, context in results.contexts:
        backends = sorted({m.key.backend for m in results.measurements.values() if m.source == path})
        kind = "peers" if backends and all(map(is_peer, backends)) else "benchmarks"
        blocks.append(Heading(level + 1, f"{kind}: `{Path(path).name}`"))
        rows = _context_rows(context)
        blocks.append(Table(["key", "value"], rows) if rows else Para("This file has no context."))
    return blocks + _peak_blocks(results, peaks, level + 1)


def peak_warning_text(w: LowPeak | UnsteadyPeak) -> str:
    """A peak warning (peaks.peak_warnings) in words, naming the file and the figures."""
    name = Path(w.source).name
    if isinstance(w, LowPeak):
        on = "" if w.cores == "1-core" else f" on {w.threads} threads"
        return (
            f"`{name}`: its {w.isa} {w.cores} FMA peak, {w.gflops:.1f} GFLOP/s{on}, is "
            f"{(1 - w.gflops / w.best) * 100:.0f}% below the {w.best:.1f} GFLOP/s measured in "
            f"`{Path(w.best_source).name}` on the same CPU model ({w.cpu_model}): % of peak "
            "from this file is flattered."
        )
    low, high = min(w.figures), max(w.figures)
    return (
        f"`{name}`: its {w.isa} {w.cores} FMA peak trials and peak entries spread "
        f"{(1 - low / high) * 100:.0f}% ({low:.1f} to "
        f"{high:.1f} GFLOP/s over {len(w.figures)} figures): the machine was "
        "not steady; % of peak from this file is flattered."
    )
