"""Peaks: which measured peak each benchmark's % of peak divides by (the FP32 FMA peak of its
backend's ISA, or for bf16 the peak its backend names), per file and ISA, and the files whose
peaks are low or unsteady. Numbers and verdicts only; the appendix words them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .results import Measurement, ResultSet, context_number, is_bf16


@dataclass
class Peak:
    """A measured peak, GFLOP/s (the FP32 FMA peak of an ISA, or the bf16 dot-product peak:
    both use this rule), and the rule that picks the peak of an n-thread run: n == 1: the
    1-core peak; n > 1: the all-core peak * min(n, T) / T, where T is the thread count the
    all-core peak was measured on (the 1-core peak alone is not assumed to scale)."""

    one_core: float | None = None
    all_cores: float | None = None
    all_core_threads: int | None = None
    source: str = "not measured"

    def for_threads(self, threads: int) -> float | None:
        if threads == 1 and self.one_core:
            return self.one_core
        if self.all_cores and self.all_core_threads:
            t = self.all_core_threads
            return self.all_cores * min(threads, t) / t
        return None


def percent_of_peak(gflops: float | None, peak: Peak, threads: int) -> float | None:
    p = peak.for_threads(threads)
    return None if gflops is None or not p else 100.0 * gflops / p


# mha_bench's context keys (bench/machine/machine_context.cpp), read first. Other files may name their
# peak differently: classify_peak_key() accepts those, explicitly.
PEAK_ONE_CORE_KEY = "mha_fma_peak_gflops_one_core"
PEAK_ALL_CORES_KEY = "mha_fma_peak_gflops_all_cores"
PEAK_THREADS_KEY = "mha_fma_peak_threads"
# The bf16 dot-product peak (vdpbf16ps), measured on the same thread count as the FMA peaks;
# "0" where the CPU has no AVX512_BF16. Per backend, mha_backend_<name>_bf16_peak_isa says
# which peak its bf16 benchmarks are read against: BF16_DOT, or an FMA peak ISA (PEAK_ISAS).
BF16_DOT_ONE_CORE_KEY = "mha_bf16_dot_peak_gflops_one_core"
BF16_DOT_ALL_CORES_KEY = "mha_bf16_dot_peak_gflops_all_cores"
BF16_DOT = "bf16_dot"
# The AMX tile-product peak (TDPBF16PS), likewise; "0" where the kernels may not use tiles.
# BF16_TILE is the bf16_peak_isa of backends on AMX.
BF16_TILE_ONE_CORE_KEY = "mha_bf16_tile_peak_gflops_one_core"
BF16_TILE_ALL_CORES_KEY = "mha_bf16_tile_peak_gflops_all_cores"
BF16_TILE = "bf16_tile"


def classify_peak_key(key: str) -> str | None:
    """'one' for a 1-core peak context key, 'all' for an all-core one, None otherwise.

    A peak key contains 'peak' and 'gflops'; it is all-core when it says 'all' (all_cores,
    allcores...), 1-core when it says 1/one/single next to core/thread/cpu (peak_gflops_1core,
    fma_peak_gflops_one_core...). Per-ISA variants (..._one_core_avx2) count only when no
    plain key exists: the shortest matching key wins. Keys naming bf16 (mha_bf16_dot_peak_...)
    are not FP32 FMA peaks: None."""
    k = key.lower()
    if "peak" not in k or "gflops" not in k or "bf16" in k:
        return None
    if "all" in k:
        return "all"
    if re.search(r"(^|[^0-9])(1|one|single)[_\- ]?(core|thread|cpu)", k):
        return "one"
    return None


def _peak_threads(context: dict) -> int | None:
    """The thread count a context's all-core peaks (FMA and bf16 dot alike) were measured on:
    mha_fma_peak_threads, else num_cpus; None when it names neither."""
    threads = context_number(context.get(PEAK_THREADS_KEY, context.get("num_cpus")))
    return int(threads) if threads else None


def find_peak(results: ResultSet, one_core: float | None = None, all_cores: float | None = None) -> Peak:
    """The peak from the first context that has one, unless given explicitly. The all-core
    peak's thread count is the context's mha_fma_peak_threads, else its num_cpus."""
    peak = Peak()
    sources = []
    for path, context in results.contexts:
        if peak.one_core is not None and peak.all_cores is not None:
            break
        found = {}
        for key in sorted(context, key=len):
            kind = classify_peak_key(key)
            number = context_number(context[key])
            if kind and kind not in found and number and number > 0:
                found[kind] = (key, number)
        if peak.one_core is None and "one" in found:
            peak.one_core = found["one"][1]
            sources.append(f"'{found['one'][0]}' in {path}")
        if peak.all_cores is None and "all" in found:
            peak.all_cores = found["all"][1]
            sources.append(f"'{found['all'][0]}' in {path}")
            peak.all_core_threads = _peak_threads(context)
    if one_core is not None:
        peak.one_core = one_core
        sources.append("--peak-1core")
    if all_cores is not None:
        peak.all_cores = all_cores
        sources.append("--peak-all")
        if peak.all_core_threads is None:
            threads = next(
                (context_number(c.get("num_cpus")) for _, c in results.contexts if c.get("num_cpus")), None
            )
            peak.all_core_threads = int(threads) if threads else None
    if sources:
        peak.source = ", ".join(sources)
    return peak


# ---------------------------------------------------------------------------------------------
# Peaks per file and ISA (mha_bench's per-ISA keys and peak/<isa>/... entries)

PEAK_ISAS = ("avx512", "avx2", "neon", "portable")
# A file's peak this far below the best for the same CPU model and ISA, or trials spreading
# this much (min vs max), gets a warning: % of peak from that file is flattered.
PEAK_LOW = 0.10
PEAK_SPREAD = 0.10


@dataclass
class FilePeaks:
    """The peaks of one input file: per ISA (max of the context's per-ISA keys and its
    peak/<isa>/... entries), the file's
    best peak (today's keys, or the best ISA), and per (ISA, '1-core' | 'all-core') every figure
    measured: the start-up trials (mha_fma_peak_trials_one_core_<isa>; all-core: the context's
    peak) and the peak entries' GFLOPS; and its bf16 dot-product and AMX tile-product peaks
    (empty: not measured, or 0 on a CPU without AVX512_BF16 / AMX)."""

    source: str
    cpu_model: str
    per_isa: dict[str, Peak]
    best: Peak
    trials: dict[tuple[str, str], list[float]]
    bf16_dot: Peak = field(default_factory=Peak)
    bf16_tile: Peak = field(default_factory=Peak)

    def native_bf16(self, isa: str) -> Peak:
        """The native bf16 peak a bf16_peak_isa names: BF16_DOT or BF16_TILE."""
        return self.bf16_tile if isa == BF16_TILE else self.bf16_dot


def _native_bf16_peak(context: dict, name: str, one_core_key: str, all_cores_key: str) -> Peak:
    """A native bf16 peak of one file's context (the dot-product peak's keys, BF16_DOT_*, or the
    tile-product peak's, BF16_TILE_*; all cores on the FMA peaks' thread count, _peak_threads):
    a Peak, so the FMA peaks' thread rule (Peak.for_threads) applies to it unchanged. A figure
    that is absent (files written before it) or not > 0 (a CPU without it) is None."""
    figures = {}
    for key in (one_core_key, all_cores_key):
        number = context_number(context[key]) if key in context else None
        figures[key] = number if number and number > 0 else None
    found = [f"'{key}'" for key, number in figures.items() if number]
    all_cores = figures[all_cores_key]
    return Peak(
        figures[one_core_key],
        all_cores,
        _peak_threads(context) if all_cores else None,
        f"{' and '.join(found)} in {name}" if found else "not measured",
    )


def _file_peaks(source: str, context: dict, entries: list) -> FilePeaks:
    model = str(context.get("mha_cpu_model") or context.get("cpu_model") or "unknown CPU")
    # All-core peak entries count on the thread count of the context's all-core peak (without
    # one: the most threads any entry of this file ran).
    threads = _peak_threads(context) or max(
        (e.threads for e in entries if e.source == source and e.threads > 1), default=None
    )
    per_isa: dict[str, Peak] = {}
    trials: dict[tuple[str, str], list[float]] = {}
    name = Path(source).name
    for isa in PEAK_ISAS:
        mine = [e for e in entries if e.isa == isa and e.source == source]
        one_values = [e.gflops for e in mine if e.threads == 1]
        all_values = [e.gflops for e in mine if e.threads > 1 and e.threads == threads]
        sources = []
        for key, values in (
            (f"{PEAK_ONE_CORE_KEY}_{isa}", one_values),
            (f"{PEAK_ALL_CORES_KEY}_{isa}", all_values),
        ):
            number = context_number(context[key]) if key in context else None
            if number and number > 0:
                values.append(number)
                sources.append(f"'{key}'")
        if mine:
            sources.append(f"{len(mine)} peak/{isa}/... entries")
        if not one_values and not all_values:
            continue
        per_isa[isa] = Peak(
            max(one_values, default=None),
            max(all_values, default=None),
            threads if all_values else None,
            f"{' and '.join(sources)} in {name}",
        )
        trial_key = f"mha_fma_peak_trials_one_core_{isa}"
        values = [context_number(v) for v in str(context.get(trial_key, "")).split(",") if v.strip()]
        values += [e.gflops for e in mine if e.threads == 1]
        trials[(isa, "1-core")] = [v for v in values if v]
        trials[(isa, "all-core")] = all_values
    single = ResultSet(contexts=[(source, context)])
    best = find_peak(single)
    for peak in per_isa.values():
        if peak.one_core and (best.one_core is None or peak.one_core > best.one_core):
            best.one_core, best.source = peak.one_core, peak.source
        if peak.all_cores and (best.all_cores is None or peak.all_cores > best.all_cores):
            best.all_cores, best.all_core_threads = peak.all_cores, peak.all_core_threads
    return FilePeaks(
        source,
        model,
        per_isa,
        best,
        trials,
        _native_bf16_peak(context, name, BF16_DOT_ONE_CORE_KEY, BF16_DOT_ALL_CORES_KEY),
        _native_bf16_peak(context, name, BF16_TILE_ONE_CORE_KEY, BF16_TILE_ALL_CORES_KEY),
    )


@dataclass
class MatchedPeak:
    """The peak one benchmark's % of peak divides by (Peaks.matched_peak), by `basis`:
    'fma': the FP32 FMA peak of its backend's ISA: every fp32 benchmark, and the bf16 ones of a
    backend whose bf16 kernels store bf16 and widen it to fp32 for FP32 FMAs;
    'bf16_dot': a bf16 benchmark of a backend whose kernels multiply bf16 pairs natively
    (vdpbf16ps): the bf16 dot-product peak; 'bf16_tile': the same on AMX tiles (TDPBF16PS): the
    tile-product peak;
    'fma_no_dot': native bf16, but its file has no such peak > 0: the FP32 FMA peak instead
    (which such kernels can exceed); 'unknown': a bf16 benchmark whose file does not say (no
    mha_backend_<name>_bf16_peak_isa, written before it): peak None, % of peak not given.
    name: how a table names the peak ('bf16 dot', 'avx512 FMA', 'best FMA', ...)."""

    basis: str
    peak: Peak | None
    name: str

    @property
    def label(self) -> str:
        """How a figure labels a line at this peak: 'avx512 FMA peak', 'bf16 dot peak',
        'avx512 FMA peak (no bf16 dot peak)'."""
        head, _, note = self.name.partition(" (")
        return f"{head} peak" + (f" ({note}" if note else "")


@dataclass
class Peaks:
    """Which peak each benchmark's % of peak divides by: the peak of its backend's peak_isa
    (mha_backend_<name>_peak_isa) in the file it came from; backends without that key: their
    file's best peak; peers (files without a peak): the best peak of the machine's
    files (the highest 1-core and all-core figures). --peak-1core / --peak-all replace every
    peak."""

    files: dict[str, FilePeaks]
    backend_isa: dict[tuple[str, str], str]
    fallback: Peak
    overridden: bool = False
    # (file, backend) -> its mha_backend_<name>_bf16_peak_isa: BF16_DOT, BF16_TILE or an FMA
    # peak ISA.
    bf16_isa: dict[tuple[str, str], str] = field(default_factory=dict)

    def isa_of(self, m: Measurement) -> str | None:
        """The ISA whose FP32 FMA peak m's backend is read against, None when its file has no
        peak of that ISA (or the peaks are overridden)."""
        return self._isa(m.source, m.key.backend)

    def _isa(self, source: str, backend: str) -> str | None:
        if self.overridden:
            return None
        isa = self.backend_isa.get((source, backend))
        peaks = self.files.get(source)
        return isa if peaks and isa in peaks.per_isa else None

    def _backend_fma(self, source: str, backend: str) -> tuple[Peak, str]:
        """The FP32 FMA peak `backend` ran at in file `source`, and its name (_fma_peak)."""
        return self._fma_peak(source, self._isa(source, backend))

    def _fma_peak(self, source: str, isa: str | None) -> tuple[Peak, str]:
        """The FP32 FMA peak of `isa` in file `source`, by the rule above, and its name for
        tables: '<isa> FMA'; without that ISA's peak the file's best ('best FMA'), else the
        machine's best or the given peak ('FMA (--peak-1core/--peak-all)')."""
        own = self.files.get(source)
        if self.overridden:
            return self.fallback, "FMA (--peak-1core/--peak-all)"
        if own and isa in own.per_isa:
            return own.per_isa[isa], f"{isa} FMA"
        if own and (own.best.one_core or own.best.all_cores):
            return own.best, "best FMA"
        return self.fallback, "best FMA"

    def for_measurement(self, m: Measurement) -> Peak:
        """The FP32 FMA peak of m's backend (whatever m's precision): see matched_peak for the
        peak m's % of peak divides by."""
        return self._backend_fma(m.source, m.key.backend)[0]

    def matched_peak(self, m: Measurement) -> MatchedPeak:
        """The peak m's % of peak divides by, in every section of the report: a bf16
        benchmark's bf16_peak (its backend's bf16_peak_isa), any other the FP32 FMA peak of its
        backend's ISA (for_measurement)."""
        if is_bf16(m):
            return self.bf16_peak(m.source, m.key.backend)
        return MatchedPeak("fma", *self._backend_fma(m.source, m.key.backend))

    def bf16_peak(self, source: str, backend: str) -> MatchedPeak:
        """The peak the bf16 benchmarks of `backend` in file `source` are read against (see
        MatchedPeak): by its mha_backend_<name>_bf16_peak_isa. BF16_DOT / BF16_TILE: the file's
        bf16 dot / tile peak, or, when the file has none > 0, the backend's FP32 FMA peak (as
        bench_attention does); an FMA peak ISA: that ISA's FP32 FMA peak (for_measurement's rule); no key
        (files written before it): unknown, no peak. --peak-1core / --peak-all replace the
        FP32 FMA peaks only."""
        isa = self.bf16_isa.get((source, backend))
        if isa is None:
            return MatchedPeak("unknown", None, "unknown")
        own = self.files.get(source)
        if isa in (BF16_DOT, BF16_TILE):
            kind = "tile" if isa == BF16_TILE else "dot"
            native = own.native_bf16(isa) if own else None
            if native and (native.one_core or native.all_cores):
                return MatchedPeak(isa, native, f"bf16 {kind}")
            peak, name = self._backend_fma(source, backend)
            return MatchedPeak("fma_no_dot", peak, f"{name} (no bf16 {kind} peak)")
        return MatchedPeak("fma", *self._fma_peak(source, isa))

    def percent(self, m: Measurement | None) -> float | None:
        """m's model GFLOP/s as % of its matched_peak for its thread count (fp32 and bf16
        alike: the one rule of every % of peak in the report); None without a GFLOPS counter or
        a peak."""
        peak = None if m is None else self.matched_peak(m).peak
        return None if peak is None else percent_of_peak(m.gflops, peak, m.key.threads)

    def any(self) -> bool:
        return bool(self.fallback.one_core or self.fallback.all_cores)


def find_peaks(results: ResultSet, one_core: float | None = None, all_cores: float | None = None) -> Peaks:
    """Per-file, per-ISA peaks of one machine's results (see Peaks)."""
    files = {
        source: _file_peaks(source, context, results.peak_entries) for source, context in results.contexts
    }
    backend_isa, bf16_isa = {}, {}
    for source, context in results.contexts:
        for key, value in context.items():
            bf16 = re.match(r"^mha_backend_(.+)_bf16_peak_isa$", key)
            match = re.match(r"^mha_backend_(.+)_peak_isa$", key)
            if bf16 and (str(value) in (BF16_DOT, BF16_TILE) or str(value) in PEAK_ISAS):
                bf16_isa[(source, bf16.group(1))] = str(value)
            elif match and not bf16 and str(value) in PEAK_ISAS:
                backend_isa[(source, match.group(1))] = str(value)
    overridden = one_core is not None or all_cores is not None
    fallback = find_peak(results, one_core, all_cores)
    if not overridden:
        raised = False
        for fp in files.values():
            b = fp.best
            if b.one_core and (fallback.one_core is None or b.one_core > fallback.one_core):
                fallback.one_core, raised = b.one_core, True
            if b.all_cores and (fallback.all_cores is None or b.all_cores > fallback.all_cores):
                fallback.all_cores, fallback.all_core_threads, raised = b.all_cores, b.all_core_threads, True
        if raised:
            fallback.source = "the highest 1-core and all-core figures of the machine's files"
    return Peaks(files, backend_isa, fallback, overridden, bf16_isa)


@dataclass
class LowPeak:
    """A file's peak (`cores`: '1-core', or 'all-core' on `threads` threads) of one ISA, more
    than PEAK_LOW below the best of the same CPU model and ISA among the inputs (`best`, from
    `best_source`): % of peak from that file is flattered."""

    source: str
    isa: str
    cores: str
    gflops: float
    threads: int | None
    best: float
    best_source: str
    cpu_model: str


@dataclass
class UnsteadyPeak:
    """A file's figures behind one peak (start-up trials and peak entries; `cores` as in
    LowPeak) spreading more than PEAK_SPREAD, min vs max: the machine was not steady, and % of
    peak from that file is flattered."""

    source: str
    isa: str
    cores: str
    figures: list[float]


def peak_warnings(all_peaks: list[Peaks]) -> list[LowPeak | UnsteadyPeak]:
    """Over every input, per file, ISA and peak (1-core, then all-core): a LowPeak when it is
    more than PEAK_LOW below the best for the same CPU model and ISA among the inputs (all-core
    peaks: measured on the same thread count), then an UnsteadyPeak when its figures spread more
    than PEAK_SPREAD."""
    files = list({fp.source: fp for peaks in all_peaks for fp in peaks.files.values()}.values())
    out: list[LowPeak | UnsteadyPeak] = []
    for fp in files:
        for isa, peak in sorted(fp.per_isa.items()):
            for attr, cores in (("one_core", "1-core"), ("all_cores", "all-core")):
                mine = getattr(peak, attr)
                rivals = [
                    (getattr(o.per_isa[isa], attr), o.source)
                    for o in files
                    if o.cpu_model == fp.cpu_model
                    and isa in o.per_isa
                    and getattr(o.per_isa[isa], attr)
                    and (attr == "one_core" or o.per_isa[isa].all_core_threads == peak.all_core_threads)
                ]
                if not mine or not rivals:
                    continue
                best, where = max(rivals)
                threads = None if attr == "one_core" else peak.all_core_threads
                if mine < (1 - PEAK_LOW) * best:
                    out.append(LowPeak(fp.source, isa, cores, mine, threads, best, where, fp.cpu_model))
                values = fp.trials.get((isa, cores), [])
                if len(values) >= 2 and min(values) < (1 - PEAK_SPREAD) * max(values):
                    out.append(UnsteadyPeak(fp.source, isa, cores, values))
    return out
