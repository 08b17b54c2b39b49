"""What the report computes from a ResultSet: peak, series, speedups, scaling, recommendations.

Pure functions of the measurements (no plotting, no text layout), so tests can check every
number the report prints.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import schema
from ..problem import Shape, decode_bytes
from ..schema import is_peer
from .results import Measurement, ResultSet

# Every formulation (mhapy.problem.FORMULATIONS), the ones compared with the wrapper (its
# speedup tables: wrapper time / their time) first, split_weight the reference of fused_qkv.
FORMULATIONS = ("split_weight", "fused_qkv", "wrapper")
AGAINST_WRAPPER = ("split_weight", "fused_qkv")

# "Which backend to link": a runner-up less than this much slower is a tie.
TIE_MARGIN = 0.05


# ---------------------------------------------------------------------------------------------
# Peak


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


# mha_bench's context keys (bench/machine_context.cpp), read first. Other files may name their
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

_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


def _number(value) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = _NUMBER.search(str(value))
    return float(match.group(0)) if match else None


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
    threads = _number(context.get(PEAK_THREADS_KEY, context.get("num_cpus")))
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
            number = _number(context[key])
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
                (_number(c.get("num_cpus")) for _, c in results.contexts if c.get("num_cpus")), None
            )
            peak.all_core_threads = int(threads) if threads else None
    if sources:
        peak.source = ", ".join(sources)
    return peak


# ---------------------------------------------------------------------------------------------
# Peaks per file and ISA (mha_bench's per-ISA keys and peak/<isa>/... entries)

PEAK_ISAS = ("avx512", "avx2", "portable")
# A file's peak this far below the best for the same CPU model and ISA, or trials spreading
# this much (min vs max), gets a warning: % of peak from that file is flattered.
PEAK_LOW = 0.10
PEAK_SPREAD = 0.10


@dataclass
class FilePeaks:
    """The peaks of one input file: per ISA (max of the context's per-ISA keys and its
    peak/<isa>/... entries; older files: the plain keys count for mha_fma_peak_isa), the file's
    best peak (today's keys, or the best ISA), and per (ISA, '1-core' | 'all-core') every figure
    measured: the start-up trials (mha_fma_peak_trials_one_core_<isa>; all-core: the context's
    peak) and the peak entries' GFLOPS; and its bf16 dot-product peak (empty: not measured, or
    0 on a CPU without AVX512_BF16)."""

    source: str
    cpu_model: str
    per_isa: dict[str, Peak]
    best: Peak
    trials: dict[tuple[str, str], list[float]]
    bf16_dot: Peak = field(default_factory=Peak)


def _bf16_dot_peak(context: dict, name: str) -> Peak:
    """The bf16 dot-product peak of one file's context (BF16_DOT_ONE_CORE_KEY, and
    BF16_DOT_ALL_CORES_KEY on the FMA peaks' thread count, _peak_threads): a Peak, so the FMA
    peaks' thread rule (Peak.for_threads) applies to it unchanged. A figure that is absent
    (files written before it) or not > 0 (a CPU without AVX512_BF16) is None."""
    figures = {}
    for key in (BF16_DOT_ONE_CORE_KEY, BF16_DOT_ALL_CORES_KEY):
        number = _number(context[key]) if key in context else None
        figures[key] = number if number and number > 0 else None
    found = [f"'{key}'" for key, number in figures.items() if number]
    all_cores = figures[BF16_DOT_ALL_CORES_KEY]
    return Peak(
        figures[BF16_DOT_ONE_CORE_KEY],
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
    # Older files: the plain keys were measured at mha_fma_peak_isa.
    plain_isa = str(context.get("mha_fma_peak_isa", ""))
    for isa in PEAK_ISAS:
        mine = [e for e in entries if e.isa == isa and e.source == source]
        one_values = [e.gflops for e in mine if e.threads == 1]
        all_values = [e.gflops for e in mine if e.threads > 1 and e.threads == threads]
        sources = []
        for keys, values in (
            ((f"{PEAK_ONE_CORE_KEY}_{isa}", PEAK_ONE_CORE_KEY), one_values),
            ((f"{PEAK_ALL_CORES_KEY}_{isa}", PEAK_ALL_CORES_KEY), all_values),
        ):
            key = keys[0] if keys[0] in context else keys[1] if isa == plain_isa else None
            number = _number(context[key]) if key in context else None
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
        values = [_number(v) for v in str(context.get(trial_key, "")).split(",") if v.strip()]
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
    return FilePeaks(source, model, per_isa, best, trials, _bf16_dot_peak(context, name))


@dataclass
class MatchedPeak:
    """The peak one benchmark's % of peak divides by (Peaks.matched_peak), by `basis`:
    'fma': the FP32 FMA peak of its backend's ISA: every fp32 benchmark, and the bf16 ones of a
    backend whose bf16 kernels store bf16 and widen it to fp32 for FP32 FMAs;
    'bf16_dot': a bf16 benchmark of a backend whose kernels multiply bf16 pairs natively
    (vdpbf16ps): the bf16 dot-product peak;
    'fma_no_dot': native bf16, but its file has no bf16 dot peak > 0: the FP32 FMA peak instead
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
    # (file, backend) -> its mha_backend_<name>_bf16_peak_isa: BF16_DOT or an FMA peak ISA.
    bf16_isa: dict[tuple[str, str], str] = field(default_factory=dict)

    RULE = (
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
        "measured bf16 dot-product peak (the 'bf16 dot' row), or, without one above 0, the FP32 "
        "FMA peak; an ISA: that ISA's FP32 FMA peak; no such key (older files): none, % of "
        "peak n/a. Same thread rule."
    )

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
        MatchedPeak): by its mha_backend_<name>_bf16_peak_isa. BF16_DOT: the file's bf16 dot
        peak, or, when the file has none > 0, the backend's FP32 FMA peak (as bench_attention
        does); an FMA peak ISA: that ISA's FP32 FMA peak (for_measurement's rule); no key
        (files written before it): unknown, no peak. --peak-1core / --peak-all replace the
        FP32 FMA peaks only."""
        isa = self.bf16_isa.get((source, backend))
        if isa is None:
            return MatchedPeak("unknown", None, "unknown")
        own = self.files.get(source)
        if isa == BF16_DOT:
            if own and (own.bf16_dot.one_core or own.bf16_dot.all_cores):
                return MatchedPeak("bf16_dot", own.bf16_dot, "bf16 dot")
            peak, name = self._backend_fma(source, backend)
            return MatchedPeak("fma_no_dot", peak, f"{name} (no bf16 dot peak)")
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
            if bf16 and (str(value) == BF16_DOT or str(value) in PEAK_ISAS):
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


def peak_warnings(all_peaks: list[Peaks]) -> list[str]:
    """Warnings over every input: a file's per-ISA peak more than PEAK_LOW below the best for
    the same CPU model and ISA among the inputs (all-core peaks: measured on the same thread
    count), or its figures for one peak (start-up trials and peak entries) spreading more than
    PEAK_SPREAD (min vs max). Either way its % of peak is flattered."""
    files = list({fp.source: fp for peaks in all_peaks for fp in peaks.files.values()}.values())
    out = []
    for fp in files:
        name = Path(fp.source).name
        for isa, peak in sorted(fp.per_isa.items()):
            for attr, what in (("one_core", "1-core"), ("all_cores", "all-core")):
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
                on = "" if attr == "one_core" else f" on {peak.all_core_threads} threads"
                if mine < (1 - PEAK_LOW) * best:
                    out.append(
                        f"`{name}`: its {isa} {what} FMA peak, {mine:.1f} GFLOP/s{on}, is "
                        f"{(1 - mine / best) * 100:.0f}% below the {best:.1f} GFLOP/s measured in "
                        f"`{Path(where).name}` on the same CPU model ({fp.cpu_model}): % of peak "
                        "from this file is flattered."
                    )
                values = fp.trials.get((isa, what), [])
                if len(values) >= 2 and min(values) < (1 - PEAK_SPREAD) * max(values):
                    out.append(
                        f"`{name}`: its {isa} {what} FMA peak trials and peak entries spread "
                        f"{(1 - min(values) / max(values)) * 100:.0f}% ({min(values):.1f} to "
                        f"{max(values):.1f} GFLOP/s over {len(values)} figures): the machine was "
                        "not steady; % of peak from this file is flattered."
                    )
    return out


# ---------------------------------------------------------------------------------------------
# Series: shapes that differ only in H (fixed d_model or fixed head_dim) or only in T


@dataclass(frozen=True)
class Series:
    """Shapes along one axis. kind: 'd_model' (fixed d_in, d_out; H varies), 'head_dim'
    (fixed head_dim, d_model = head_dim * H), 'seq' (T varies), 'past' (cached tokens vary:
    decode) or 'kv' (fixed d_model, H varies, K/V heads grouped by `group`: 'H/g', g query
    heads per K/V head, or '1', one K/V head; see kv_series). shapes sorted by x."""

    kind: str
    shapes: tuple[Shape, ...]
    group: str = ""

    def x(self, shape: Shape) -> int:
        return {"seq": shape.seq_len, "past": shape.past}.get(self.kind, shape.n_heads)

    @property
    def x_name(self) -> str:
        return {"seq": "T (tokens)", "past": "past (cached tokens)"}.get(self.kind, "H (heads)")

    @property
    def title(self) -> str:
        s = self.shapes[0]
        flags = "".join(f", {f}" for f in s.extras(past=False))
        d = f"{s.d_out}" if s.d_in == s.d_out else f"{s.d_in}->{s.d_out}"
        if self.kind == "d_model":
            return f"fixed d_model = {d} (B={s.batch}, T={s.seq_len}{flags})"
        if self.kind == "head_dim":
            return (
                f"fixed head_dim = {s.head_dim}, d_model = {s.head_dim}·H (B={s.batch}, T={s.seq_len}{flags})"
            )
        if self.kind == "past":
            return f"B={s.batch}, T={s.seq_len}, d_model = {d}, H = {s.n_heads}{flags}"
        if self.kind == "kv":
            flags = "".join(f", {f}" for f in replace(s, n_kv_heads=0).extras(past=False))
            return f"{kv_group_text(self.group)}, d_model = {d} (B={s.batch}, T={s.seq_len}{flags})"
        return f"d_model = {d}, H = {s.n_heads} (B={s.batch}{flags})"


def kv_group_text(group: str) -> str:
    """A kv series' grouping in words: 'H/4 K/V heads (groups of 4)', '1 K/V head (MQA)'."""
    if group == "1":
        return "1 K/V head (MQA)"
    return f"{group} K/V heads (groups of {group[2:]})"


def _flag_key(s: Shape) -> tuple:
    """What a series keeps fixed besides its sizes: flags, K/V heads, precision, RoPE base,
    past."""
    return (s.causal, s.qkv_bias, s.out_proj, s.out_proj_bias, s.n_kv_heads, s.precision, s.rope_base, s.past)


def _series_from_groups(kind: str, groups: dict, x, least: int = 2) -> list[Series]:
    found = []
    for members in groups.values():
        if len({x(s) for s in members}) >= least:
            found.append(Series(kind, tuple(sorted(members, key=x))))
    # Ties broken by the whole first shape: the order never depends on set iteration.
    return sorted(
        found, key=lambda s: (s.shapes[0].batch, s.shapes[0].seq_len, s.shapes[0].d_out, s.shapes[0])
    )


def heads_series(shapes: list[Shape]) -> list[Series]:
    """Every group of >= 2 shapes that differ only in H (fixed d_model), then every group that
    keeps head_dim fixed with d_in = d_out = head_dim * H. A shape may be in several series.
    K/V heads are fixed along a series (_flag_key): a shape with grouped K/V heads is never on
    a line of shapes with H K/V heads. The report passes the shapes outside kv_series here
    (mha_heads_series)."""
    by_d_model: dict[tuple, list[Shape]] = {}
    by_head_dim: dict[tuple, list[Shape]] = {}
    for s in set(shapes):
        by_d_model.setdefault((s.batch, s.seq_len, s.d_in, s.d_out) + _flag_key(s), []).append(s)
        if s.d_in == s.d_out:
            by_head_dim.setdefault((s.batch, s.seq_len, s.head_dim) + _flag_key(s), []).append(s)
    h = lambda s: s.n_heads  # noqa: E731
    return _series_from_groups("d_model", by_d_model, h) + _series_from_groups("head_dim", by_head_dim, h)


def grouped_kv_shapes(shapes: list[Shape]) -> list[Shape]:
    """The shapes with fewer K/V heads than H (n_kv_heads set) whose MHA twin, the same shape
    with H K/V heads, is among `shapes`: the shapes the grouped-query section compares with
    MHA (the heads preset's heads_kv, the decode preset's decode_kv)."""
    present = set(shapes)
    return sorted(s for s in present if s.n_kv_heads and replace(s, n_kv_heads=0) in present)


def _kv_group_rank(group: str) -> tuple:
    return (1, 0) if group == "1" else (0, int(group[2:]))


def kv_series(shapes: list[Shape]) -> list[Series]:
    """The grouped K/V forward passes (grouped_kv_shapes, past = 0) along H: per family (the
    fixed-d_model key of heads_series without the K/V heads) one series per grouping, kind
    'kv': 'H/g' (each K/V head shared by g query heads, g = H / K/V heads; a single K/V head
    counts in it too when another shape of the family has groups of g, as H = 8 with H/8 = 1)
    and '1' (one K/V head, MQA), even of one shape. Ordered by family, then H/g by g, then
    '1'."""
    families: dict[tuple, list[Shape]] = {}
    for s in grouped_kv_shapes(shapes):
        if not s.is_decode:
            key = (s.batch, s.seq_len, s.d_in, s.d_out) + _flag_key(replace(s, n_kv_heads=0))
            families.setdefault(key, []).append(s)
    found = []
    for key, members in families.items():
        sizes = {s.n_heads // s.n_kv_heads for s in members if s.n_kv_heads > 1}
        groups: dict[str, list[Shape]] = {}
        for s in members:
            g = s.n_heads // s.n_kv_heads
            if s.n_kv_heads > 1 or g in sizes:
                groups.setdefault(f"H/{g}", []).append(s)
            if s.n_kv_heads == 1:
                groups.setdefault("1", []).append(s)
        for group, members_ in groups.items():
            series = Series("kv", tuple(sorted(members_, key=lambda s: s.n_heads)), group)
            found.append(((key[:4], repr(key), _kv_group_rank(group)), series))
    return [series for _, series in sorted(found, key=lambda t: t[0])]


def mha_heads_series(shapes: list[Shape]) -> tuple[list[Series], list[Series]]:
    """(heads_series of the shapes outside kv_series, kv_series): the H series of the
    forward-pass sections and the grouped-query ones. A grouped K/V shape with its MHA twin
    measured is read against it (kv_series); one without (a run at a fixed --kv-heads) stays in
    the H series, along the others of its K/V heads."""
    kv = kv_series(shapes)
    grouped = {s for series in kv for s in series.shapes}
    return heads_series([s for s in shapes if s not in grouped]), kv


def seq_series(shapes: list[Shape]) -> list[Series]:
    """Every group of >= 2 shapes that differ only in T."""
    groups: dict[tuple, list[Shape]] = {}
    for s in set(shapes):
        groups.setdefault((s.batch, s.d_in, s.d_out, s.n_heads) + _flag_key(s), []).append(s)
    return _series_from_groups("seq", groups, lambda s: s.seq_len)


def past_series(shapes: list[Shape]) -> list[Series]:
    """The incremental calls (past > 0) grouped by everything but past, one series per group,
    even of one shape (a decode run of one cached length still gets its figure)."""
    groups: dict[tuple, list[Shape]] = {}
    for s in set(shapes):
        if s.is_decode:
            key = (s.batch, s.seq_len, s.d_in, s.d_out, s.n_heads) + _flag_key(s)[:-1]
            groups.setdefault(key, []).append(s)
    return _series_from_groups("past", groups, lambda s: s.past, least=1)


# ---------------------------------------------------------------------------------------------
# Split / wrapper speedup and GFLOP/s along a series


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


def formulations_measured(results: ResultSet) -> list[str]:
    """The formulations measured, in FORMULATIONS' order."""
    found = {k.formulation for k in results.measurements}
    return [f for f in FORMULATIONS if f in found]


def against_wrapper(results: ResultSet) -> list[str]:
    """The formulations a speedup table compares with the wrapper: those of AGAINST_WRAPPER
    measured (split_weight alone in runs without fused_qkv)."""
    return [f for f in formulations_measured(results) if f in AGAINST_WRAPPER]


@dataclass
class SeriesTable:
    """Values along one series at one thread count. columns: names; rows: (x, [value|None])."""

    series: Series
    threads: int
    columns: list
    rows: list[tuple[int, list]]

    def column(self, name) -> list[tuple[int, float]]:
        i = self.columns.index(name)
        return [(x, values[i]) for x, values in self.rows if values[i] is not None]


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


def variants(results: ResultSet) -> list[tuple[str, str]]:
    """(backend, formulation) pairs measured, mha backends first."""
    pairs = {(k.backend, k.formulation) for k in results.measurements}
    return sorted(pairs, key=lambda p: (is_peer(p[0]), p[0], p[1]))


def gflops_table(results: ResultSet, series: Series, threads: int) -> SeriesTable | None:
    """Model GFLOP/s per (backend, formulation) along the series; None when nothing has the
    GFLOPS counter there."""
    columns = []
    for backend, form in variants(results):
        points = [results.get(backend, form, s, threads) for s in series.shapes]
        if any(m is not None and m.gflops is not None for m in points):
            columns.append((backend, form))
    if not columns:
        return None
    rows = []
    for s in series.shapes:
        values = []
        for backend, form in columns:
            m = results.get(backend, form, s, threads)
            values.append(None if m is None else m.gflops)
        rows.append((series.x(s), values))
    return SeriesTable(series, threads, columns, rows)


def percent_of_peak(gflops: float | None, peak: Peak, threads: int) -> float | None:
    p = peak.for_threads(threads)
    return None if gflops is None or not p else 100.0 * gflops / p


# ---------------------------------------------------------------------------------------------
# Thread scaling


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


# ---------------------------------------------------------------------------------------------
# fp32 vs bf16: each bf16 benchmark against its fp32 twin, each as % of its matching peak


def is_bf16(m: Measurement) -> bool:
    return m.key.shape.precision == "bf16"


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


# ---------------------------------------------------------------------------------------------
# Which backend to link


@dataclass
class Choice:
    """For one shape and thread count: the fastest linkable (backend, formulation), the best of
    any other linkable backend (the alternative to linking it), the margin between them, and
    the fastest peer as a reference point."""

    shape: Shape
    threads: int
    best: Measurement | None
    runner_up: Measurement | None
    margin: float | None  # runner_up time / best time - 1
    tie: bool
    peer: Measurement | None
    recommendation: str


def _variant(m: Measurement) -> str:
    return f"{m.key.backend} {m.key.formulation}"


def _ranges_overlap(a: Measurement, b: Measurement) -> bool:
    if a.repetitions < 2 or b.repetitions < 2:
        return False
    return min(b.times_s) <= max(a.times_s) and min(a.times_s) <= max(b.times_s)


def _times(ratio: float) -> str:
    return f"{ratio:.2f}×"


def choose(results: ResultSet, shape: Shape, threads: int) -> Choice:
    candidates = [m for k, m in results.measurements.items() if k.shape == shape and k.threads == threads]
    linkable = sorted((m for m in candidates if not is_peer(m.key.backend)), key=lambda m: m.median_s)
    peers = sorted((m for m in candidates if is_peer(m.key.backend)), key=lambda m: m.median_s)
    peer = peers[0] if peers else None
    if not linkable:
        return Choice(shape, threads, None, None, None, False, peer, "no mha backend measured here")
    best = linkable[0]
    others = [m for m in linkable if m.key.backend != best.key.backend]
    runner_up = others[0] if others else None
    # The same backend's other formulations, fastest first: how much the formulation matters.
    siblings = [m for m in linkable[1:] if m.key.backend == best.key.backend]
    form_note = (
        " ("
        + ", ".join(f"{m.key.formulation}: {_times(m.median_s / best.median_s)} slower" for m in siblings)
        + ")"
        if siblings
        else ""
    )
    if runner_up is None:
        text = f"only {best.key.backend} measured: run {best.key.formulation}{form_note}"
        return Choice(shape, threads, best, None, None, False, peer, text)
    margin = runner_up.median_s / best.median_s - 1
    tie = margin < TIE_MARGIN or _ranges_overlap(best, runner_up)
    if tie:
        text = (
            f"{best.key.backend} or {runner_up.key.backend}: within noise "
            f"({margin * 100:.1f}% apart); either will do"
        )
    else:
        text = (
            f"link {best.key.backend}, run {best.key.formulation}{form_note}; "
            f"{_times(1 + margin)} faster than {runner_up.key.backend}"
        )
    return Choice(shape, threads, best, runner_up, margin, tie, peer, text)


def choices(results: ResultSet) -> list[Choice]:
    """One Choice per (shape, threads) measured, ordered by threads, then shape."""
    cells = sorted({(k.threads, k.shape) for k in results.measurements})
    return [choose(results, shape, threads) for threads, shape in cells]


def win_counts(chosen: list[Choice], threads: int) -> list[tuple[str, int, int]]:
    """(backend formulation, shapes won, shapes with a choice) at one thread count, most wins
    first; ties count for the faster one."""
    relevant = [c for c in chosen if c.threads == threads and c.best is not None]
    wins: dict[str, int] = {}
    for c in relevant:
        wins[_variant(c.best)] = wins.get(_variant(c.best), 0) + 1
    return sorted(((v, n, len(relevant)) for v, n in wins.items()), key=lambda t: (-t[1], t[0]))


def relative_time_table(results: ResultSet, series: Series, threads: int) -> SeriesTable | None:
    """Per backend (mha backends, then peers): its fastest formulation's time divided by the
    fastest mha backend's time at each point (1.0 = the one to link). None when fewer than two
    backends were measured along the series."""
    columns = [
        b
        for b in results.backends()
        if any(results.get(b, f, s, threads) for s in series.shapes for f in FORMULATIONS)
    ]
    if len(columns) < 2:
        return None
    rows = []
    for s in series.shapes:
        fastest = choose(results, s, threads).best
        values = []
        for b in columns:
            times = [m.median_s for f in FORMULATIONS if (m := results.get(b, f, s, threads))]
            values.append(min(times) / fastest.median_s if times and fastest else None)
        rows.append((series.x(s), values))
    return SeriesTable(series, threads, columns, rows)


# ---------------------------------------------------------------------------------------------
# The answer first: noise, the backend to link per thread count, split/wrapper ties

# Noise is measured only from benchmarks with at least this many repetitions.
NOISE_MIN_REPETITIONS = 3


def noise_by_backend(results: ResultSet) -> dict[str, float]:
    """Run-to-run noise per backend: the median coefficient of variation (stddev / mean of the
    repetition times) over its benchmarks with >= NOISE_MIN_REPETITIONS repetitions."""
    cvs: dict[str, list[float]] = {}
    for m in results.measurements.values():
        if m.repetitions >= NOISE_MIN_REPETITIONS and m.cv is not None:
            cvs.setdefault(m.key.backend, []).append(m.cv)
    return {b: statistics.median(v) for b, v in sorted(cvs.items())}


@dataclass
class LinkSummary:
    """Which backend to link at one thread count, over every shape measured there: the backend
    whose fastest formulation has the lowest geometric-mean time relative to the fastest mha
    time, its formulations' wins, the runner-up backend and the margin between their geometric
    means (over the shapes both measured); tie when the margin is under TIE_MARGIN or under the
    larger of the two backends' measured noise."""

    threads: int
    backend: str
    wins: int
    shapes: int
    formulations: list[tuple[str, int]]  # (formulation, shapes where it is the faster one)
    runner_up: str | None
    margin: float | None
    common: int
    tie: bool
    noise: float | None


def _best_time(results: ResultSet, backend: str, shape: Shape, threads: int) -> Measurement | None:
    found = [m for f in FORMULATIONS if (m := results.get(backend, f, shape, threads))]
    return min(found, key=lambda m: m.median_s) if found else None


def link_summary(results: ResultSet, threads: int) -> LinkSummary | None:
    shapes = sorted({k.shape for k in results.measurements if k.threads == threads})
    backends = [b for b in results.backends() if not is_peer(b)]
    best = {b: {s: m for s in shapes if (m := _best_time(results, b, s, threads))} for b in backends}
    best = {b: v for b, v in best.items() if v}
    if not best:
        return None

    def geomean_ratio(a: str, b: str) -> tuple[float, int]:
        common = [s for s in best[a] if s in best[b]]
        if not common:
            return 1.0, 0
        logs = [math.log(best[a][s].median_s / best[b][s].median_s) for s in common]
        return math.exp(sum(logs) / len(logs)), len(common)

    # Rank by shapes covered first (a backend measured on fewer shapes cannot win by absence),
    # then by geometric mean relative to every other backend.
    def score(b: str) -> tuple:
        others = [geomean_ratio(b, o)[0] for o in best if o != b]
        return (-len(best[b]), math.exp(sum(map(math.log, others)) / len(others)) if others else 1.0)

    ranked = sorted(best, key=score)
    chosen = ranked[0]
    wins = sum(
        1 for c in choices(results) if c.threads == threads and c.best and c.best.key.backend == chosen
    )
    forms: dict[str, int] = {}
    for m in best[chosen].values():
        forms[m.key.formulation] = forms.get(m.key.formulation, 0) + 1
    noise = noise_by_backend(results)
    runner_up = margin = None
    common, tie, level = 0, False, None
    if len(ranked) > 1:
        runner_up = min(ranked[1:], key=lambda o: geomean_ratio(o, chosen)[0])
        ratio, common = geomean_ratio(runner_up, chosen)
        margin = ratio - 1
        levels = [noise[b] for b in (chosen, runner_up) if b in noise]
        level = max(levels) if levels else None
        tie = margin < TIE_MARGIN or (level is not None and margin < level)
    return LinkSummary(
        threads,
        chosen,
        wins,
        len(shapes),
        sorted(forms.items(), key=lambda t: -t[1]),
        runner_up,
        margin,
        common,
        tie,
        level,
    )


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
    if _ranges_overlap(slow, fast):
        return True
    noise = noise_by_backend(results).get(backend)
    return noise is not None and abs(slow.median_s / fast.median_s - 1) < 2 * noise


# ---------------------------------------------------------------------------------------------
# fused_qkv against split_weight (issue 15: at least as fast at every shape of the heads preset,
# within noise, on the fastest backend)


@dataclass
class Race:
    """One backend's `formulation` against `reference` (fused_qkv against split_weight) along
    one series at one thread count: per point (x, ratio = reference time / formulation time,
    above 1 `formulation` is faster; verdict 'faster' | 'tie' | 'slower': `formulation`'s,
    'tie' within noise by speedup_is_tie) for every x both were measured at."""

    backend: str
    series: Series
    threads: int
    points: list[tuple[int, float, str]]
    formulation: str = "fused_qkv"
    reference: str = "split_weight"

    @property
    def median(self) -> float:
        return statistics.median(r for _, r, _ in self.points)

    @property
    def low(self) -> tuple[int, float]:
        """(x, ratio) of the smallest ratio."""
        return min(((x, r) for x, r, _ in self.points), key=lambda t: t[1])

    @property
    def high(self) -> tuple[int, float]:
        return max(((x, r) for x, r, _ in self.points), key=lambda t: t[1])

    def where(self, verdict: str) -> list[tuple[int, float]]:
        """(x, ratio) of the points with that verdict, in x order."""
        return [(x, r) for x, r, v in self.points if v == verdict]


def races(
    results: ResultSet,
    series_list: list[Series],
    formulation: str = "fused_qkv",
    reference: str = "split_weight",
) -> list[Race]:
    """A Race per (series, thread count, backend) with both formulations measured somewhere on
    the series, in that order (backends: mha first). Empty without `formulation`."""
    out = []
    for series in series_list:
        for n in results.thread_counts():
            for b in results.backends():
                points = []
                for s in series.shapes:
                    ratio = speedup(results, b, s, n, formulation, reference)
                    if ratio is not None:
                        tie = speedup_is_tie(results, b, s, n, formulation, reference)
                        verdict = "tie" if tie else "faster" if ratio > 1 else "slower"
                        points.append((series.x(s), ratio, verdict))
                if points:
                    out.append(Race(b, series, n, points, formulation, reference))
    return out


@dataclass
class RaceVerdict:
    """Over every shape of some races (each shape once, though several series hold it) of one
    backend at one thread count: shapes where the formulation is faster, tied within noise,
    slower; the ratios' median, min and max; held = never slower beyond noise."""

    backend: str
    threads: int
    faster: int
    tie: int
    slower: list[tuple[Shape, float]]
    median: float
    low: float
    high: float

    @property
    def shapes(self) -> int:
        return self.faster + self.tie + len(self.slower)

    @property
    def held(self) -> bool:
        return not self.slower


def race_verdict(results: ResultSet, race_list: list[Race], backend: str, threads: int) -> RaceVerdict | None:
    """The races of `backend` at `threads` over their distinct shapes (see RaceVerdict); None
    when it has none."""
    mine = [r for r in race_list if r.backend == backend and r.threads == threads]
    seen: dict[Shape, tuple[float, str]] = {}
    for race in mine:
        for s in race.series.shapes:
            for x, ratio, verdict in race.points:
                if race.series.x(s) == x:
                    seen[s] = (ratio, verdict)
    if not seen:
        return None
    ratios = [r for r, _ in seen.values()]
    return RaceVerdict(
        backend,
        threads,
        sum(v == "faster" for _, v in seen.values()),
        sum(v == "tie" for _, v in seen.values()),
        sorted((s, r) for s, (r, v) in seen.items() if v == "slower"),
        statistics.median(ratios),
        min(ratios),
        max(ratios),
    )


# ---------------------------------------------------------------------------------------------
# Several machines: which backend to link on each


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
                other.median_s / mine.median_s - 1 < TIE_MARGIN or _ranges_overlap(mine, other)
            ):
                return False
    return True


# ---------------------------------------------------------------------------------------------
# Decode: incremental calls (past > 0) against the streaming-read bandwidth


@dataclass
class Bandwidth:
    """Measured streaming-read bandwidth, GB/s (1e9 bytes per second): one thread, and
    `threads` threads at once (mha_bench's mha_stream_read_* keys)."""

    one_core: float | None = None
    all_cores: float | None = None
    threads: int | None = None
    source: str = "not measured"

    RULE = (
        "The bandwidth bound of a decode step is `bytes_min` (every weight once and the keys "
        "and values of the past + T tokens once: the least it reads) / the measured "
        "streaming-read bandwidth of its thread count: `mha_stream_read_gbps_one_core` for "
        "threads:1, `mha_stream_read_gbps_all_cores` for `mha_stream_read_threads` threads "
        "(other thread counts get no bound). % of bound = bound / time: 100% streams those bytes "
        "as fast as the machine reads memory; above 100%, part of them came from a cache (the "
        "weights, 9 MiB at d_model 768, stay in a large last-level cache from step to step)."
    )

    def for_threads(self, threads: int) -> float | None:
        if threads == 1 and self.one_core:
            return self.one_core
        if self.all_cores and threads == self.threads:
            return self.all_cores
        return None

    def any(self) -> bool:
        return bool(self.one_core or self.all_cores)


def _file_bandwidth(source: str, context: dict) -> Bandwidth:
    one, all_cores = (
        _number(context.get(schema.STREAM_ONE_CORE)),
        _number(context.get(schema.STREAM_ALL_CORES)),
    )
    threads = _number(context.get(schema.STREAM_THREADS))
    return Bandwidth(
        one if one and one > 0 else None,
        all_cores if all_cores and all_cores > 0 else None,
        int(threads) if threads else None,
        f"`{Path(source).name}`",
    )


@dataclass
class Bandwidths:
    """The bandwidth each decode benchmark's bound divides by: its own file's; files without
    one (peers, older files) the machine's best (the highest one-thread and all-thread
    figures of its files)."""

    files: dict[str, Bandwidth]
    fallback: Bandwidth

    def for_measurement(self, m: Measurement) -> Bandwidth:
        own = self.files.get(m.source)
        return own if own is not None and own.any() else self.fallback

    def bound_s(self, m: Measurement | None) -> float | None:
        """bytes_min (the counter, else problem.decode_bytes) / the bandwidth of the thread
        count, seconds; None without a bandwidth for it."""
        if m is None:
            return None
        rate = self.for_measurement(m).for_threads(m.key.threads)
        return None if not rate else bytes_min(m) / (rate * 1e9)

    def percent(self, m: Measurement | None) -> float | None:
        bound = self.bound_s(m)
        return None if bound is None else 100.0 * bound / m.median_s

    def any(self) -> bool:
        return self.fallback.any()


def bytes_min(m: Measurement) -> float:
    """The least bytes the call reads: its bytes_min counter, else problem.decode_bytes."""
    return m.bytes_min if m.bytes_min is not None else decode_bytes(m.key.shape, m.key.formulation)


def find_bandwidths(results: ResultSet) -> Bandwidths:
    files = {source: _file_bandwidth(source, context) for source, context in results.contexts}
    best = Bandwidth(source="the highest figures of the machine's files")
    for bw in files.values():
        if bw.one_core and (best.one_core is None or bw.one_core > best.one_core):
            best.one_core = bw.one_core
        if bw.all_cores and (best.all_cores is None or bw.all_cores > best.all_cores):
            best.all_cores, best.threads = bw.all_cores, bw.threads
    return Bandwidths(files, best)


def decode_time_table(results: ResultSet, series: Series, threads: int) -> SeriesTable | None:
    """Median time per call of each (backend, formulation) along a past series; None when
    nothing was measured there."""
    columns = [
        (b, f) for b, f in variants(results) if any(results.get(b, f, s, threads) for s in series.shapes)
    ]
    if not columns:
        return None
    rows = [
        (series.x(s), [(m.median_s if (m := results.get(b, f, s, threads)) else None) for b, f in columns])
        for s in series.shapes
    ]
    return SeriesTable(series, threads, columns, rows)


def decode_bounds(
    results: ResultSet, bandwidths: Bandwidths, table: SeriesTable
) -> list[tuple[list[str], list[tuple[int, float]]]]:
    """The bandwidth-bound curves of a decode table: per formulation, at each past, the bound of
    the first column (mha backends first) measured there; formulations with the same curve (no
    grouped K/V heads: they read the same bytes) share it. [(formulations, [(past, bound s)])]."""
    per_form: dict[str, dict[int, float]] = {}
    for shape in table.series.shapes:
        x = table.series.x(shape)
        for backend, form in table.columns:
            points = per_form.setdefault(form, {})
            bound = bandwidths.bound_s(results.get(backend, form, shape, table.threads))
            if x not in points and bound is not None:
                points[x] = bound
    curves: dict[tuple, list[str]] = {}
    for form, points in per_form.items():
        if points:
            curves.setdefault(tuple(sorted(points.items())), []).append(form)
    return [(forms, list(points)) for points, forms in curves.items()]


# ---------------------------------------------------------------------------------------------
# Grouped-query attention: fewer K/V heads than H, against the MHA twin (H K/V heads)


def kv_ratio(results: ResultSet, backend: str, form: str, shape: Shape, threads: int) -> float | None:
    """time(shape) / time(its MHA twin, the same shape with H K/V heads), same backend,
    formulation and threads (below 1: the grouped K/V heads are faster); None unless both were
    measured."""
    grouped = results.get(backend, form, shape, threads)
    mha = results.get(backend, form, replace(shape, n_kv_heads=0), threads)
    return None if grouped is None or mha is None else grouped.median_s / mha.median_s


def kv_table(results: ResultSet, series: Series, threads: int) -> SeriesTable | None:
    """kv_ratio per (backend, formulation) along a kv series; None when nothing has both."""
    columns = [
        (b, f)
        for b, f in variants(results)
        if any(kv_ratio(results, b, f, s, threads) is not None for s in series.shapes)
    ]
    if not columns:
        return None
    rows = [(series.x(s), [kv_ratio(results, b, f, s, threads) for b, f in columns]) for s in series.shapes]
    return SeriesTable(series, threads, columns, rows)


# Issue 15's decode target: at B = 1 after 8192 cached tokens, a K/V head per 4 query heads (the
# decode_kv preset's 3 of 12) at least 3x faster per step than 12 K/V heads.
KV_DECODE_TARGET = {"batch": 1, "past": 8192, "group": 4, "speedup": 3.0}


@dataclass
class KvDecodeRow:
    """One decode point of one backend, formulation and thread count: the MHA shape (`mha`: H
    K/V heads; its B and past the point's) and per K/V head count (H first, then fewer) the
    measured step, or None."""

    backend: str
    formulation: str
    threads: int
    mha: Shape
    cells: dict[int, Measurement | None]

    def speedup(self, kv: int) -> float | None:
        """time with H K/V heads / time with kv (above 1: kv is faster)."""
        mha, grouped = self.cells.get(self.mha.n_heads), self.cells.get(kv)
        return None if mha is None or grouped is None else mha.median_s / grouped.median_s


def kv_decode_family(shape: Shape) -> Shape:
    """What one grouped-query decode table keeps fixed: the MHA shape at B = 1, past = 1."""
    return replace(shape, n_kv_heads=0, batch=1, past=1)


def kv_decode_rows(results: ResultSet) -> dict[Shape, tuple[list[int], list[KvDecodeRow]]]:
    """The decode steps (past > 0) of grouped_kv_shapes with their MHA twins: per family
    (kv_decode_family) the K/V head counts measured (H, then fewer) and a row per backend,
    formulation, thread count, B and past with fewer K/V heads measured. Families, rows in order
    (threads, backend, formulation, B, past)."""
    grouped = [s for s in grouped_kv_shapes(results.shapes()) if s.is_decode]
    families: dict[Shape, set[int]] = {}
    for s in grouped:
        families.setdefault(kv_decode_family(s), {s.n_heads}).add(s.n_kv_heads)
    points = {replace(s, n_kv_heads=0) for s in grouped}
    out = {}
    for family in sorted(families):
        kvs = sorted(families[family], reverse=True)
        rows = []
        for mha in sorted(p for p in points if kv_decode_family(p) == family):
            for n in results.thread_counts():
                for b, f in variants(results):
                    cells = {k: results.get(b, f, replace(mha, n_kv_heads=k), n) for k in kvs}
                    if any(m for k, m in cells.items() if k != mha.n_heads):
                        rows.append(KvDecodeRow(b, f, n, mha, cells))
        rows.sort(key=lambda r: (r.threads, is_peer(r.backend), r.backend, r.formulation, r.mha))
        out[family] = (kvs, rows)
    return out
