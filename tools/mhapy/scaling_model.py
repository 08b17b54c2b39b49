"""The scaling model of mha's tbb backend (docs/design.md §3.2): a run's time at any thread count,
predicted from one traced run on one thread (`mha_bench --trace`).

A traced run is a list of phases (a projection's GEMM tiles, attention's cache appends, its
tasks, its merges, out_proj's tiles): the tasks of a phase may run at once, and a phase starts
when the one before has finished. On n threads the model takes each phase as

    max(makespan of its tasks on n workers, its bytes / bandwidth(n)) + its own overhead

plus the run's serial time, where
- a task keeps the time it took on one thread (its kernel is the single-threaded one);
- the makespan is greedy list scheduling in the recorded order: each task goes to the first
  free worker (work stealing at task granularity; TBB's chunking of neighbouring tasks and its
  wake-up latency are not modelled);
- the bytes are what the phase must move at least (a GEMM's operands, a KV cache's keys and
  values); bandwidth(n) is the measured streaming read at the thread counts measured (between
  two, each core adds the lower count's per-core share until the higher count's total), and
  beyond them n times the per-core share of the largest measured count, capped by the socket's
  bandwidth (an assumption the caller states); a phase that read faster on one core
  than the streaming probe (part of it from cache) keeps that factor at every n;
- a phase's overhead (its span less its tasks) and the serial time (the run less its phases)
  stay what they were on one thread.

The model is calibrated on its own input: on one thread it returns the traced run's time.
"""

from __future__ import annotations

import argparse
import heapq
import sys
from dataclasses import dataclass
from pathlib import Path

from .json_file import read_json

NS = 1e-9

# The default bandwidth of all cores of a many-core machine, GB/s, beyond the thread counts
# measured: a server socket's streaming read in round figures (8 channels of DDR5-4800 are 307
# GB/s of peak, of which streaming reads reach about two thirds). An assumption, always printed
# beside the figures that use it; --socket-bandwidth replaces it.
DEFAULT_SOCKET_GBPS = 200.0


class TraceError(ValueError):
    """A trace file that is not what `mha_bench --trace` writes."""


@dataclass(frozen=True)
class Phase:
    kind: str
    bytes: int
    span_s: float
    tasks_s: tuple[float, ...]

    @property
    def work_s(self) -> float:
        return sum(self.tasks_s)

    @property
    def overhead_s(self) -> float:
        """The phase's time on one thread that no task accounts for (starting and ending the loop)."""
        return max(0.0, self.span_s - self.work_s)


@dataclass(frozen=True)
class Trace:
    """One traced run: the benchmark it stands for and its phases in order."""

    name: str
    problem: str
    threads: int
    run_s: float
    phases: tuple[Phase, ...]

    @property
    def serial_s(self) -> float:
        """The run's time outside every phase (the driver between loops, entering the arena)."""
        return max(0.0, self.run_s - sum(p.span_s for p in self.phases))

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.phases)


@dataclass(frozen=True)
class Bandwidth:
    """Streaming-read bandwidth, GB/s, by thread count: the measured points; between two, each
    core adding the lower count's per-core share up to the higher count's total; beyond the
    largest, its per-core share times n up to `socket_gbps`."""

    measured: dict[int, float]
    socket_gbps: float = DEFAULT_SOCKET_GBPS

    def __post_init__(self) -> None:
        if not self.measured or any(n < 1 or not g > 0 for n, g in self.measured.items()):
            raise TraceError(f"bandwidth: expected positive GB/s at thread counts >= 1, got {self.measured}")
        if not self.socket_gbps > 0:
            raise TraceError(f"socket bandwidth {self.socket_gbps}: expected a positive GB/s figure")

    def gbps(self, n: int) -> float:
        points = sorted(self.measured.items())
        if n <= points[0][0]:
            return points[0][1] * n / points[0][0]
        for (n0, g0), (n1, g1) in zip(points, points[1:]):
            if n <= n1:
                # Each core adds the per-core share of the count below until the count above's
                # total is reached (never below the straight line between the two).
                return max(g0 + (g1 - g0) * (n - n0) / (n1 - n0), min(g0 / n0 * n, g1))
        top_n, top_g = points[-1]
        return max(top_g, min(top_g / top_n * n, self.socket_gbps))


@dataclass(frozen=True)
class Prediction:
    threads: int
    time_s: float
    memory_bound_s: float  # the phases' bytes over bandwidth, summed: the run's bandwidth bound
    bandwidth_bound_s: float  # the time of the phases whose bytes, not their tasks, set it


def makespan(tasks: tuple[float, ...], workers: int) -> float:
    """Greedy list scheduling of `tasks` in order onto `workers` identical workers."""
    if workers < 1:
        raise ValueError(f"workers {workers}: expected >= 1")
    if workers >= len(tasks):
        return max(tasks, default=0.0)
    free = [0.0] * workers
    for t in tasks:
        heapq.heappush(free, heapq.heappop(free) + t)
    return max(free)


def predict(trace: Trace, threads: int, bandwidth: Bandwidth) -> Prediction:
    """The run of `trace` on `threads` threads (the trace must be a one-thread run)."""
    if trace.threads != 1:
        raise TraceError(
            f"{trace.name}: the model schedules a one-thread trace, this one ran {trace.threads}"
        )
    if threads < 1:
        raise ValueError(f"threads {threads}: expected >= 1")
    time = trace.serial_s
    total_memory = memory_bound = 0.0
    one_core = bandwidth.gbps(1) * 1e9
    for phase in trace.phases:
        tasks = makespan(phase.tasks_s, threads)
        memory = 0.0
        if phase.bytes > 0:
            # A phase that beat the streaming probe on one core (cache hits) keeps its factor.
            factor = max(1.0, phase.bytes / one_core / phase.work_s) if phase.work_s > 0 else 1.0
            memory = phase.bytes / (bandwidth.gbps(threads) * 1e9 * factor)
        if memory > tasks:
            memory_bound += memory
        total_memory += memory
        time += max(tasks, memory) + phase.overhead_s
    return Prediction(threads, time, total_memory, memory_bound)


@dataclass(frozen=True)
class TraceFile:
    cpu_model: str
    hardware_threads: int
    isa: str
    bandwidth: dict[int, float]
    traces: tuple[Trace, ...]
    path: str

    def bandwidth_curve(self, socket_gbps: float = DEFAULT_SOCKET_GBPS) -> Bandwidth:
        return Bandwidth(self.bandwidth, socket_gbps)


def _number(value, what: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TraceError(f"{path}: {what} is {value!r}, expected a number >= 0")
    return float(value)


def load(path: str | Path) -> TraceFile:
    """A file `mha_bench --trace` wrote. Raises TraceError naming what is wrong with it."""
    name = str(path)
    data = read_json(path, TraceError)
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("context"), dict)
        or not isinstance(data.get("traces"), list)
    ):
        raise TraceError(f"{name}: expected an object with 'context' and 'traces' (mha_bench --trace)")
    context = data["context"]
    raw_bandwidth = context.get("mha_bandwidth_gbps")
    if not isinstance(raw_bandwidth, dict) or not raw_bandwidth:
        raise TraceError(f"{name}: context has no mha_bandwidth_gbps")
    try:
        bandwidth = {
            int(n): _number(g, f"the bandwidth on {n} threads", name) for n, g in raw_bandwidth.items()
        }
    except ValueError as e:
        raise TraceError(f"{name}: mha_bandwidth_gbps: {e}") from e
    traces = []
    for i, t in enumerate(data["traces"]):
        where = f"{name}: trace {i}"
        if not isinstance(t, dict) or not isinstance(t.get("phases"), list):
            raise TraceError(f"{where}: expected an object with 'phases'")
        phases = []
        for j, p in enumerate(t["phases"]):
            tasks = p.get("tasks_ns") if isinstance(p, dict) else None
            if not isinstance(tasks, list):
                raise TraceError(f"{where}, phase {j}: expected an object with 'tasks_ns'")
            phases.append(
                Phase(
                    str(p.get("kind", "?")),
                    int(_number(p.get("bytes"), f"phase {j}'s bytes", where)),
                    _number(p.get("span_ns"), f"phase {j}'s span_ns", where) * NS,
                    tuple(_number(x, f"a task of phase {j}", where) * NS for x in tasks),
                )
            )
        threads = t.get("threads")
        if not isinstance(threads, int) or threads < 1:
            raise TraceError(f"{where}: threads is {threads!r}, expected a whole number >= 1")
        traces.append(
            Trace(
                str(t.get("name", "")),
                str(t.get("problem", "")),
                threads,
                _number(t.get("run_ns"), "run_ns", where) * NS,
                tuple(phases),
            )
        )
    return TraceFile(
        str(context.get("mha_cpu_model", "unknown CPU")),
        int(context.get("mha_hardware_threads", max(bandwidth))),
        str(context.get("mha_tbb_isa", "?")),
        bandwidth,
        tuple(traces),
        name,
    )


def doubling(limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit`, and `limit` itself."""
    out, n = [], 1
    while n < limit:
        out.append(n)
        n *= 2
    return out + [limit]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m mhapy.scaling_model",
        description="Predict the tbb backend's time per run at more threads from a one-thread "
        "trace (mha_bench --trace FILE --threads 1).",
    )
    p.add_argument("trace", help="the trace file")
    p.add_argument(
        "--max-threads", type=int, default=128, help="predict at 1, 2, 4, ... up to this (default 128)"
    )
    p.add_argument(
        "--socket-bandwidth",
        type=float,
        default=DEFAULT_SOCKET_GBPS,
        help=f"GB/s of all cores beyond the measured thread counts (default {DEFAULT_SOCKET_GBPS:g}, an assumption)",
    )
    args = p.parse_args(argv)
    if args.max_threads < 1:
        p.error(f"--max-threads {args.max_threads}: expected >= 1")
    try:
        file = load(args.trace)
        bandwidth = file.bandwidth_curve(args.socket_bandwidth)
    except TraceError as e:
        print(f"mhapy.scaling_model: {e}", file=sys.stderr)
        return 1
    counts = doubling(args.max_threads)
    print(
        f"# {file.cpu_model}, tbb on {file.isa}; bandwidth measured at "
        + ", ".join(f"{n} threads {g:.1f} GB/s" for n, g in sorted(file.bandwidth.items()))
        + f"; beyond, at most {args.socket_bandwidth:g} GB/s (assumed)"
    )
    print("problem\t" + "\t".join(f"{n} thr ms (eff)" for n in counts))
    for trace in file.traces:
        if trace.threads != 1:
            continue
        one = predict(trace, 1, bandwidth).time_s
        cells = []
        for n in counts:
            t = predict(trace, n, bandwidth).time_s
            cells.append(f"{t * 1e3:.3g} ({one / t / n:.2f})")
        print(trace.problem + "\t" + "\t".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
