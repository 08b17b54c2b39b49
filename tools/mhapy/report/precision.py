"""fp32 vs bf16: each bf16 benchmark against its fp32 twin, each as % of its matching peak
(Peaks.matched_peak), summarised per backend; the section that words them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from ..problem import Shape
from ..schema import is_peer
from .document import Heading, Para, Table
from .linking import choices, win_counts
from .peaks import MatchedPeak, Peaks
from .results import Measurement, ResultSet, is_bf16
from .wording import fmt_ratio, fmt_time, threads_text


@dataclass
class PrecisionPair:
    """One bf16 benchmark and its fp32 twin: the benchmark whose canonical name is the same
    without '/bf16' (same backend, formulation, shape but the precision, threads); fp32 None
    when that was not measured (the row is listed without a speedup). fp32_pct, bf16_pct: each
    time as % of its matched peak (Peaks.percent, the rule of every % of peak: the FP32 FMA
    peak, and for bf16 the peak bf16_peak names); either None without a GFLOPS counter or a
    known peak for the thread count."""

    bf16: Measurement
    fp32: Measurement | None
    fp32_pct: float | None
    bf16_pct: float | None
    bf16_peak: MatchedPeak

    @property
    def backend(self) -> str:
        return self.bf16.key.backend

    @property
    def formulation(self) -> str:
        return self.bf16.key.formulation

    @property
    def threads(self) -> int:
        return self.bf16.key.threads

    @property
    def shape(self) -> Shape:
        """The shape without its precision (the fp32 one): the row's label."""
        return replace(self.bf16.key.shape, precision="fp32")

    @property
    def speedup(self) -> float | None:
        """fp32 time / bf16 time (above 1: bf16 is faster); None without the fp32 twin."""
        return None if self.fp32 is None else self.fp32.median_s / self.bf16.median_s


def precision_pairs(results: ResultSet, peaks: Peaks) -> list[PrecisionPair]:
    """Every bf16 benchmark of `results` paired with its fp32 twin (see PrecisionPair), none
    left out, ordered by backend (mha backends first), threads, shape, formulation. Empty when
    nothing was measured in bf16 (fp32-only runs, files written before bf16)."""
    pairs = []
    for m in results.measurements.values():
        if not is_bf16(m):  # fp32 benchmarks are found from their bf16 twin
            continue
        key = m.key
        fp32 = results.get(key.backend, key.formulation, replace(key.shape, precision="fp32"), key.threads)
        pairs.append(
            PrecisionPair(
                m, fp32, peaks.percent(fp32), peaks.percent(m), peaks.bf16_peak(m.source, key.backend)
            )
        )
    return sorted(pairs, key=lambda p: (is_peer(p.backend), p.backend, p.threads, p.shape, p.formulation))


@dataclass
class PrecisionSummary:
    """One backend's bf16 speedups over fp32 (fp32 time / bf16 time): median, min, max over its
    paired benchmarks (None without any), how many pairs bf16 is faster in, the unpaired bf16
    benchmarks, and over the pairs the median % of peak of each precision (each against its
    own peak; None when unknown)."""

    backend: str
    pairs: int
    faster: int
    unpaired: int
    median: float | None
    low: float | None
    high: float | None
    fp32_pct: float | None
    bf16_pct: float | None


def precision_summary(pairs: list[PrecisionPair]) -> list[PrecisionSummary]:
    """Per backend of `pairs`, in their order (see PrecisionSummary)."""
    out = []
    for backend in dict.fromkeys(p.backend for p in pairs):
        mine = [p for p in pairs if p.backend == backend]
        ratios = [p.speedup for p in mine if p.speedup is not None]

        def median(values: list) -> float | None:
            values = [v for v in values if v is not None]
            return statistics.median(values) if values else None

        out.append(
            PrecisionSummary(
                backend,
                len(ratios),
                sum(r > 1 for r in ratios),
                len(mine) - len(ratios),
                median(ratios),
                min(ratios, default=None),
                max(ratios, default=None),
                median([p.fp32_pct for p in mine if p.fp32 is not None]),
                median([p.bf16_pct for p in mine if p.fp32 is not None]),
            )
        )
    return out


# ---- in words ----


def _pct_cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def _precision_row(p: PrecisionPair, with_peak: bool) -> list[str]:
    """formulation, shape, threads, fp32 time ('no fp32 run' when unpaired), bf16 time, speedup
    and, with_peak, each precision's % of its peak ('n/a': unknown) and the bf16 peak's name."""
    cells = [
        p.formulation,
        p.shape.label(),
        str(p.threads),
        "no fp32 run" if p.fp32 is None else fmt_time(p.fp32.median_s),
        fmt_time(p.bf16.median_s),
        fmt_ratio(p.speedup),
    ]
    if with_peak:
        cells += ["–" if p.fp32 is None else _pct_cell(p.fp32_pct), _pct_cell(p.bf16_pct), p.bf16_peak.name]
    return cells


def _names(backends: dict[str, set[str]], with_peaks: bool = False) -> str:
    """'**naive**, **tbb**'; with_peaks: '**naive** (portable FMA), **tbb** (avx2 FMA)'."""
    return ", ".join(
        f"**{b}**" + (f" ({', '.join(sorted(names))})" if with_peaks else "") for b, names in backends.items()
    )


def _bf16_peak_text(pairs: list[PrecisionPair]) -> str:
    """Which peak each backend's bf16 figures are read against, and why."""
    by_basis: dict[str, dict[str, set[str]]] = {}
    for p in pairs:
        by_basis.setdefault(p.bf16_peak.basis, {}).setdefault(p.backend, set()).add(p.bf16_peak.name)
    sentences = []
    for basis, what, why in (
        (
            "bf16_dot",
            "bf16 dot-product peak",
            "their bf16 kernels multiply bf16 pairs natively (vdpbf16ps, two products per fp32 lane)",
        ),
        (
            "bf16_tile",
            "AMX tile-product peak",
            "their bf16 kernels multiply bf16 pairs on AMX tiles (TDPBF16PS, 16 x 16 x 32 products "
            "per instruction)",
        ),
    ):
        if basis not in by_basis:
            continue
        dots = sorted(
            {
                (p.bf16_peak.peak.one_core, p.bf16_peak.peak.all_cores, p.bf16_peak.peak.all_core_threads)
                for p in pairs
                if p.bf16_peak.basis == basis
            },
            key=str,
        )
        figures_text = "; ".join(
            ", ".join(
                text
                for text in (
                    f"{one:.1f} GFLOP/s on 1 core" if one else "",
                    f"{every:.1f} GFLOP/s on {threads} threads" if every else "",
                )
                if text
            )
            for one, every, threads in dots
        )
        sentences.append(
            f"{_names(by_basis[basis])}: against the measured {what} ({figures_text}): {why}, "
            "so the FP32 FMA peak is not their limit."
        )
    if "fma" in by_basis:
        sentences.append(
            f"{_names(by_basis['fma'], True)}: against the FP32 FMA peak of their ISA, as their "
            "fp32 figures: their bf16 kernels only store bf16 and widen it to fp32, so their "
            "arithmetic is FP32 FMAs."
        )
    if "fma_no_dot" in by_basis:
        sentences.append(
            f"{_names(by_basis['fma_no_dot'], True)}: their bf16 kernels multiply bf16 pairs natively, "
            "but their file has no such peak above 0 "
            "(`mha_bf16_dot_peak_gflops_*`, `mha_bf16_tile_peak_gflops_*`), so they are read against their FP32 FMA peak "
            "instead, which such kernels can exceed."
        )
    if "unknown" in by_basis:
        sentences.append(
            f"{_names(by_basis['unknown'])}: their file does not say whether their bf16 kernels "
            "are native (no `mha_backend_<name>_bf16_peak_isa`: written before it), so their bf16 "
            "% of peak is n/a."
        )
    return "Which peak the bf16 figures are read against, per backend: " + " ".join(sentences)


def _precision_reading(pairs: list[PrecisionPair], what: str) -> str:
    """Per backend, from the data: the median speedup of bf16 over fp32 (range, how often bf16
    is faster, median % of peak of each)."""
    parts = []
    for s in precision_summary(pairs):
        if s.median is None:
            parts.append(f"**{s.backend}**: no fp32 run to compare its {s.unpaired} bf16 benchmark(s) with")
            continue
        text = (
            f"**{s.backend}** {fmt_ratio(s.median)} (median over {s.pairs} pair(s), "
            f"{fmt_ratio(s.low)} – {fmt_ratio(s.high)}; bf16 faster in {s.faster} of {s.pairs})"
        )
        if s.bf16_pct is not None and s.fp32_pct is not None:
            text += f", bf16 at a median {s.bf16_pct:.0f}% of its peak against {s.fp32_pct:.0f}% in fp32"
        parts.append(text)
    return f"Speedup of bf16 over fp32 ({what}), per backend: " + "; ".join(parts) + "."


def _bf16_fastest_text(results: ResultSet) -> str:
    """Which mha backend and formulation is fastest in bf16, per thread count, over the forward
    passes measured in bf16 (shapes won, as 'Which backend to link'); '' when none."""
    bf16 = results.forward().only(lambda k: k.shape.precision == "bf16")
    chosen = choices(bf16)
    fastest = []
    for n in bf16.thread_counts():
        wins = win_counts(chosen, n)
        if wins:
            fastest.append(f"{threads_text(n)}: " + ", ".join(f"{v} on {k} of {t}" for v, k, t in wins))
    if not fastest:
        return ""
    return (
        "Fastest in bf16 (fastest mha backend and formulation per shape, shapes won): "
        + "; ".join(fastest)
        + "."
    )


def section(results: ResultSet, peaks: Peaks) -> list:
    """fp32 vs bf16, when bf16 was measured: per backend, each bf16 benchmark against its fp32
    twin (times, speedup, each as % of its matching peak), a reading of the data and which
    peak each backend's bf16 figures are read against; decode steps in a table of their own,
    without % of peak."""
    pairs = precision_pairs(results, peaks)
    if not pairs:
        return []
    forward = [p for p in pairs if not p.shape.is_decode]
    decode = [p for p in pairs if p.shape.is_decode]
    blocks: list = [
        Heading(2, "fp32 vs bf16"),
        Para(
            "Each bf16 benchmark against the fp32 benchmark of the same backend, formulation, "
            "shape and threads (its name without `/bf16`): speedup = fp32 time / bf16 time, "
            "above 1.0 bf16 is faster (– and 'no fp32 run': no fp32 twin was measured). % of "
            "peak = model GFLOP/s (the same FLOP count in both precisions) / the peak matching "
            "each: fp32 the FP32 FMA peak of the backend's ISA, as everywhere in this report; "
            "bf16 the bf16 dot-product peak (`mha_bf16_dot_peak_gflops_*`) where the backend's "
            "`mha_backend_<name>_bf16_peak_isa` is `bf16_dot`, the AMX tile-product peak "
            "(`mha_bf16_tile_peak_gflops_*`) where it is `bf16_tile`, each where that peak was "
            "measured, otherwise the same FP32 FMA peak; n/a: peak unknown. Both follow the same thread "
            "rule: the 1-core peak for threads:1, otherwise the all-core peak scaled by threads "
            "/ the thread count it was measured on."
        ),
    ]
    reading = [_precision_reading(forward, "forward passes")] if forward else []
    reading += [_bf16_fastest_text(results)]
    reading += [_precision_reading(decode, "decode steps")] if decode else []
    blocks.append(Para(" ".join(text for text in reading if text)))
    blocks.append(Para(_bf16_peak_text(pairs)))
    header = ["formulation", "shape", "threads", "fp32 time", "bf16 time", "speedup (fp32/bf16)"]
    for backend in dict.fromkeys(p.backend for p in forward):
        blocks += [
            Heading(3, backend),
            Table(
                header + ["fp32 % of peak", "bf16 % of peak", "bf16 peak"],
                [_precision_row(p, True) for p in forward if p.backend == backend],
                numeric={2, 3, 4, 5, 6, 7},
            ),
        ]
    if decode:
        blocks += [
            Heading(3, "Decode steps (past > 0)"),
            Para(
                "Time per step in each precision and the speedup; no % of peak: a step is bound "
                "by memory (the decode sections), not by arithmetic."
            ),
            Table(
                ["backend"] + header,
                [[p.backend] + _precision_row(p, False) for p in decode],
                numeric={3, 4, 5, 6},
            ),
        ]
    return blocks
