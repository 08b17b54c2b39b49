"""The results of mha_bench and mhapy.peers as the report reads them: keys, measurements,
machines, shards (mhapy.report.loading reads the files).

Contract of the input (what this module needs, nothing more):
- a top-level object with "benchmarks" (a list) and optionally "context" (an object);
- attention benchmarks are named mha/<backend>/<problem>/threads:<n>, <problem> being the
  canonical problem string of include/mha/problem.hpp (mha::to_string; mhapy.problem.PARTS
  mirrors its grammar), the formulation one of mhapy.problem.FORMULATIONS, its parts after the
  formulation, and threads:<n>, in any order, as mha::parse_problem reads them, optionally
  followed by the components Google Benchmark appends itself (real_time, min_time:...,
  repeats:..., ...);
- each entry has real_time and time_unit (ns, us, ms or s); run_type "iteration" entries are
  repetitions, run_type "aggregate" entries (aggregate_name mean/median/stddev/cv) summaries;
- an entry with error_occurred (1.7.1) or skipped (1.8+) records a failed or skipped benchmark;
- the counter GFLOPS (model FLOPs per second / 1e9) when present gives the FLOP count, and
  bytes_min (incremental calls) the least bytes a call reads; the plain counters B, T, d_in,
  d_out, H, head_dim, past, n_threads when present must agree with the name.
Everything else is carried along (the context is shown in the report) but not required.
Bad input raises ReportError naming the file, the benchmark and what was expected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .. import schema
from ..problem import Shape

_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


def context_number(value) -> float | None:
    """A context value as a number: ints and floats as they are, otherwise the first number in
    its text ('231.1 GFLOP/s': 231.1); None without one."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = _NUMBER.search(str(value))
    return float(match.group(0)) if match else None


class ReportError(Exception):
    """Bad input to the report generator; the message names the file, value and expectation."""


@dataclass(frozen=True, order=True)
class Key:
    """What one benchmark measures: backend, formulation, shape, thread count."""

    backend: str
    formulation: str
    shape: Shape
    threads: int

    def name(self) -> str:
        """The canonical benchmark name (without Google Benchmark's own suffixes)."""
        return f"mha/{self.backend}/{self.formulation}/{self.shape.problem_suffix()}/threads:{self.threads}"


@dataclass
class Measurement:
    """The repetitions of one benchmark, reduced.

    times_s: real time per iteration of each repetition, seconds (empty when the file holds
    aggregates only); median_s: their median (or the median aggregate); flops: model FLOPs per
    iteration from the GFLOPS counter, None without that counter; bytes_min: the least bytes an
    incremental call reads, from the bytes_min counter (None without it)."""

    key: Key
    source: str
    times_s: list[float]
    median_s: float
    flops: float | None
    cv: float | None
    label: str = ""
    bytes_min: float | None = None

    @property
    def gflops(self) -> float | None:
        """Model GFLOP/s at the median time."""
        return None if self.flops is None else self.flops / self.median_s * 1e-9

    @property
    def repetitions(self) -> int:
        return len(self.times_s)


def is_bf16(m: Measurement) -> bool:
    return m.key.shape.precision == "bf16"


@dataclass
class Failure:
    """A benchmark that was skipped (time budget) or failed its check, with the reason."""

    name: str
    message: str
    source: str
    key: Key | None = None


@dataclass(frozen=True)
class PeakEntry:
    """One repetition of a peak/<isa>/threads:<n>/at:<k> benchmark: FP32 FMA GFLOP/s measured
    during the run (not an attention benchmark)."""

    isa: str
    threads: int
    at: int
    gflops: float
    gflops_min: float | None
    source: str


# How the report writes mha_dispatch's values; others ('mixed (...)') are shown as they are.
DISPATCH_NAMES = {
    "avx512": "AVX-512",
    "avx2": "AVX2",
    "sse2": "SSE2",
    "neon": "NEON",
    "native": "native dispatch",
}


@dataclass(frozen=True, order=True)
class Machine:
    """What a result describes: CPU model, hardware threads and the ISA mha dispatched to
    (never the host name): these three identify it. overrides: the environment that forced the
    dispatch, or '' (only the label uses it)."""

    cpu_model: str
    threads: int
    dispatch: str
    overrides: str = field(default="", compare=False)

    def dispatch_name(self) -> str:
        return DISPATCH_NAMES.get(self.dispatch, self.dispatch)

    def label(self) -> str:
        """'Intel(R) Xeon(R) Processor, 2 threads, AVX-512'; forced by overrides: 'AVX2
        dispatch on Intel(R) Xeon(R) Processor, 2 threads'."""
        threads = f"{self.threads} thread" + ("" if self.threads == 1 else "s")
        if self.overrides:
            return f"{self.dispatch_name()} dispatch on {self.cpu_model}, {threads}"
        return f"{self.cpu_model}, {threads}, {self.dispatch_name()}"

    def slug(self) -> str:
        """A file-name-safe short name (figure names of a machine start with it)."""
        text = f"{self.cpu_model}-{self.threads}t-{self.dispatch}" + ("-forced" if self.overrides else "")
        return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _dispatch_from(context: dict) -> str:
    """mha_dispatch (every mha_bench file has it: schema.upgraded_context), else 'native'."""
    return str(context.get("mha_dispatch") or "native")


def machine_of(context: dict) -> Machine:
    """The machine a file's context describes (see Machine)."""
    model = str(context.get("mha_cpu_model") or context.get("cpu_model") or "unknown CPU")
    threads = context.get("mha_hardware_threads") or context.get("num_cpus") or 0
    try:
        threads = int(float(threads))
    except (TypeError, ValueError):
        threads = 0
    return Machine(
        model, threads, _dispatch_from(context), str(context.get("mha_isa_overrides") or "").strip()
    )


# Context keys mha_bench writes about --shard I/N (bench/README.md): which part of which
# selection a file holds. The selection is the benchmarks the run's flags selected on that
# machine; its fingerprint is a hash of their sorted names.
SHARD_KEY = "mha_shard"
SELECTION_KEY = "mha_selection"
SELECTION_SIZE_KEY = "mha_selection_benchmarks"
SHARD_SIZE_KEY = "mha_shard_benchmarks"


@dataclass(frozen=True)
class ShardFile:
    """What one result file says about its shard: part index of count of the selection with
    fingerprint `selection` (selection_size benchmarks, size of them in this file)."""

    source: str
    index: int
    count: int
    selection: str
    selection_size: int | None
    size: int | None
    preset: str = ""

    def label(self) -> str:
        return f"{self.index}/{self.count}"


def shard_of(context: dict, source: str) -> ShardFile | None:
    """The shard a file's context names, or None when it names none (files written before
    --shard, peers). A malformed value raises ReportError."""
    text = context.get(SHARD_KEY)
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise ReportError(f"{source}: context {SHARD_KEY} '{text}', expected I/N with 1 <= I <= N")

    def count(key: str) -> int | None:
        value = context.get(key)
        if value in (None, ""):
            return None
        try:
            return int(str(value))
        except ValueError:
            raise ReportError(f"{source}: context {key} '{value}', expected a count") from None

    return ShardFile(
        source,
        int(match[1]),
        int(match[2]),
        str(context.get(SELECTION_KEY) or "unknown"),
        count(SELECTION_SIZE_KEY),
        count(SHARD_SIZE_KEY),
        str(context.get("mha_preset") or ""),
    )


@dataclass
class Selection:
    """The files of one machine that hold shards of one selection split into `count` parts:
    files[i] are the files of shard i (1-based; more than one: repeated runs of that shard)."""

    selection: str
    count: int
    selection_size: int | None
    preset: str
    files: dict[int, list[str]] = field(default_factory=dict)

    @property
    def present(self) -> list[int]:
        return sorted(self.files)

    @property
    def missing(self) -> list[int]:
        return [i for i in range(1, self.count + 1) if i not in self.files]

    @property
    def complete(self) -> bool:
        return not self.missing

    def short(self) -> str:
        """'selection 1f2e3d4c (preset quick, 24 benchmarks)'."""
        what = ", ".join(
            text
            for text in (
                f"preset {self.preset}" if self.preset else "",
                f"{self.selection_size} benchmarks" if self.selection_size is not None else "",
            )
            if text
        )
        return f"selection {self.selection[:8]}" + (f" ({what})" if what else "")


def selections(results: ResultSet) -> list[Selection]:
    """The machine's files grouped by (selection fingerprint, shard count), in input order."""
    groups: dict[tuple[str, int], Selection] = {}
    for f in results.shards:
        group = groups.setdefault(
            (f.selection, f.count), Selection(f.selection, f.count, f.selection_size, f.preset)
        )
        group.files.setdefault(f.index, []).append(f.source)
    return list(groups.values())


def benchmarks_present(results: ResultSet, group: Selection) -> int | None:
    """How many of the selection's benchmarks the present shards hold (their files' own counts),
    or None when a file does not say."""
    total = 0
    for index, sources in group.files.items():
        sizes = [f.size for f in results.shards if f.source == sources[0] and f.index == index]
        if not sizes or sizes[0] is None:
            return None
        total += sizes[0]
    return total


def shard_problems(results: ResultSet) -> list[str]:
    """What is wrong with the shards of one machine's files, one sentence each: shards missing
    from a selection, and shards of different selections (or partitions) combined. Empty when
    every sharded selection is complete and there is at most one."""
    groups = selections(results)
    problems = []
    for g in groups:
        if g.missing:
            present = benchmarks_present(results, g)
            held = (
                f"; the report holds {present} of its {g.selection_size} benchmarks"
                if present is not None and g.selection_size is not None
                else ""
            )
            problems.append(
                f"shard{'s' if len(g.missing) > 1 else ''} "
                + ", ".join(f"{i}/{g.count}" for i in g.missing)
                + f" of {g.short()} {'are' if len(g.missing) > 1 else 'is'} missing (present: "
                + (", ".join(f"{i}/{g.count}" for i in g.present))
                + f"){held}: rerun the missing shard{'s' if len(g.missing) > 1 else ''} "
                "with the same flags"
            )
    sharded = [g for g in groups if g.count > 1]
    if len(sharded) > 1:
        problems.append(
            "shards of different selections are mixed: "
            + "; ".join(
                f"{g.short()}: shard{'s' if len(g.present) > 1 else ''} "
                + ", ".join(f"{i}/{g.count}" for i in g.present)
                for g in sharded
            )
            + ". Shards merge into one run only when they come from the same flags on the same "
            "machine (same selection fingerprint and shard count)"
        )
    return problems


@dataclass
class ResultSet:
    """Every benchmark of one or more files, merged by canonical name."""

    measurements: dict[Key, Measurement] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    contexts: list[tuple[str, dict]] = field(default_factory=list)
    # Benchmarks whose names are not attention benchmarks (name, file): listed, not analysed.
    unrecognised: list[tuple[str, str]] = field(default_factory=list)
    # Benchmarks measured in more than one file (load(best_run=True) kept the fastest run).
    repeated: int = 0
    # FMA peak probes measured during the run (peak/<isa>/...): used for the peak, not listed.
    peak_entries: list[PeakEntry] = field(default_factory=list)
    # The machine these results describe (load_machines sets it; load leaves it None).
    machine: Machine | None = None
    # The shard each mha_bench file holds (context mha_shard ...), in input order; files
    # without one (peers, runs before sharding) are not listed.
    shards: list[ShardFile] = field(default_factory=list)

    def machine_label(self) -> str:
        """How the report names the machine (Machine.label); 'this machine' when unset."""
        return self.machine.label() if self.machine else "this machine"

    def backends(self) -> list[str]:
        """Backends measured: mha backends first (alphabetical), then peers."""
        names = {k.backend for k in self.measurements}
        return sorted(names, key=lambda b: (schema.is_peer(b), b))

    def thread_counts(self) -> list[int]:
        return sorted({k.threads for k in self.measurements})

    def shapes(self) -> list[Shape]:
        return sorted({k.shape for k in self.measurements})

    def get(self, backend: str, formulation: str, shape: Shape, threads: int):
        return self.measurements.get(Key(backend, formulation, shape, threads))

    def only(self, keep) -> ResultSet:
        """The benchmarks (measured, failed) whose Key passes keep(key); contexts, peak entries,
        other benchmarks and the machine as they are."""
        return ResultSet(
            {k: m for k, m in self.measurements.items() if keep(k)},
            [f for f in self.failures if f.key is None or keep(f.key)],
            self.contexts,
            self.unrecognised,
            self.repeated,
            self.peak_entries,
            self.machine,
            self.shards,
        )

    def forward(self) -> ResultSet:
        """The full forward passes (past = 0): what the forward-pass sections analyse."""
        return self.only(lambda k: not k.shape.is_decode)

    def decode(self) -> ResultSet:
        """The incremental calls (past > 0): the decode section's."""
        return self.only(lambda k: k.shape.is_decode)
