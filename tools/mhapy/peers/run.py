"""The peers' runner: the shapes mha_bench runs, computed by each peer library's variants on the
same weights and input (mhapy.inputs), each output checked against the float64 oracle
(mhapy.oracle) before it is timed, written as Google Benchmark 1.7.1 JSON that mhapy.report
reads next to mha's own results. One library per process (its thread pool and allocator to
itself); several libraries run one after another, each in a process of its own.

Usage (PYTHONPATH=tools, with the peers' environment's python: scripts/peers-env.sh):
  python -m mhapy.peers --libraries pytorch,openvino,onnxruntime --shapes shapes.json --out peers.json
  python -m mhapy.peers --libraries openvino --shape b1/t128/din768/dout768/h12 --threads 1,2 --out ov.json
--out FILE: with one library, that file; with several, FILE's name with -<library> before its
extension, one file each. --shapes takes the list `mha_bench --dump-shapes` writes (a name or
FLOP count other than mhapy.problem's is an error); --shape adds one written as in benchmark
names; --threads replaces every shape's thread counts (0 = all cores).

Every (variant, shape, thread count) gets an entry: timed, or with error_occurred and a message
that starts "declined: " (the variant does not compute the shape, or the library is not
installed: the reason follows), "wrong result: " (its output is farther from the oracle than
the tolerance), "error: " (it raised) or "skipped: " (the time budget ran out). Timing follows
Google Benchmark: iterations grow until one repetition lasts --min-time seconds, then
--repetitions repetitions. A decode step is timed after `past` cached tokens: the cache is put
back to them (untimed) at least every 1% of `past` steps. Exit status 0 when every file was
written (declined and failed entries included), 2 on bad arguments, 1 otherwise; a file
appears only when complete.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import inputs, oracle, schema
from ..json_file import read_json
from ..problem import INT8_SCALE_BYTES, ProblemError, Shape, flops, parse_shape
from .adapter import Call, Peer, Unavailable, Variant

# The libraries, each a module of this package (its file name is the library's name).
LIBRARIES = ("pytorch", "openvino", "onnxruntime", "mha_python")

# The check: fp32 computation with an fp32 cache (or none) is held to mha_bench's tolerance;
# a bf16 computation, or a cache of fewer bytes, to the bound of a bf16 module (oracle).
FP32_TOLERANCE = 1e-4


class UsageError(Exception):
    """Bad command-line input; the message names the value and what was expected."""


@dataclass
class Job:
    """One shape and the thread counts to time it at."""

    shape: Shape
    threads: list[int]


# ---------------------------------------------------------------------------------------------
# Shapes


_SHAPE_FIELDS = {"batch", "seq_len", "d_in", "d_out", "n_heads", "causal", "qkv_bias", "out_proj", "past"}
_AXES = {"n_kv_heads", "precision", "rope_base", "out_proj_bias", "kv_precision", "window"}
_FILE_FIELDS = _SHAPE_FIELDS | _AXES | {"threads", "series", "name", "flops"}


def validate(s: Shape, threads: list, where: str) -> None:
    for name in ("batch", "seq_len", "d_in", "d_out", "n_heads"):
        value = getattr(s, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{where}: {name} = {value!r}, expected an integer >= 1")
    if s.d_out % s.n_heads:
        raise UsageError(f"{where}: d_out ({s.d_out}) must be divisible by n_heads ({s.n_heads})")
    if not isinstance(s.past, int) or isinstance(s.past, bool) or s.past < 0:
        raise UsageError(f"{where}: past = {s.past!r}, expected an integer >= 0")
    if not threads or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in threads):
        raise UsageError(f"{where}: threads = {threads!r}, expected a non-empty list of integers >= 1")


def check_against_mha_bench(s: Shape, item: dict, where: str) -> None:
    """The name and FLOP count mha_bench wrote for a shape must be mhapy.problem's: the report
    parses these names, and these counts divide the peers' times."""
    if "flops" in item and not math.isclose(float(item["flops"]), flops(s), rel_tol=1e-12):
        raise UsageError(
            f"{where}: mha_bench counts {item['flops']} FLOPs, mhapy.problem.flops {flops(s)}: "
            "the two statements of docs/design.md §3 disagree"
        )
    if "name" in item and item["name"] != s.problem_suffix():
        raise UsageError(f"{where}: name {item['name']!r}, but the fields spell {s.problem_suffix()!r}")


def shapes_from_file(path: str) -> list[Job]:
    doc = read_json(path, UsageError, f"--shapes {path}")
    items = doc.get("shapes") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise UsageError(f'--shapes {path}: expected a list of shapes (or {{"shapes": [...]}})')
    jobs = []
    for i, item in enumerate(items):
        where = f"--shapes {path}: shape {i}"
        if not isinstance(item, dict):
            raise UsageError(f"{where}: expected an object, got {type(item).__name__}")
        unknown = set(item) - _FILE_FIELDS
        missing = {"batch", "seq_len", "d_in", "d_out", "n_heads"} - set(item)
        if unknown or missing:
            raise UsageError(f"{where}: unknown fields {sorted(unknown)}, missing {sorted(missing)}")
        job = Job(
            Shape(**{k: v for k, v in item.items() if k in _SHAPE_FIELDS | _AXES}), item.get("threads", [1])
        )
        validate(job.shape, job.threads, where)
        check_against_mha_bench(job.shape, item, where)
        jobs.append(job)
    return jobs


def shape_from_text(text: str) -> Shape:
    try:
        shape = parse_shape(text.split("/"))
    except ProblemError as e:
        raise UsageError(
            f"--shape {text!r}: {e}; expected b<B>/t<T>[/past<P>]/din<d_in>/dout<d_out>/h<H> "
            "and optional parts as in benchmark names (/kvh<K>, /rope<base>, /noncausal, /bf16, ...)"
        ) from None
    validate(shape, [1], f"--shape {text}")
    return shape


def parse_threads(text: str) -> list[int]:
    try:
        counts = [int(v) for v in text.split(",")]
    except ValueError:
        raise UsageError(f"--threads {text!r}: expected a comma-separated list of integers") from None
    if not counts or any(n < 0 for n in counts):
        raise UsageError(f"--threads {text!r}: expected counts >= 0 (0 = all cores)")
    cores = len(os.sched_getaffinity(0))
    return sorted({n or cores for n in counts})


# ---------------------------------------------------------------------------------------------
# Checking and timing


def tolerance(s: Shape, call: Call, rows: oracle.Rows) -> float:
    """How far from the fp32 oracle a variant's output may be: mha_bench's tolerance for an
    fp32 computation with an fp32 cache, else the bound of a bf16 module (§1.5) on the rows'
    largest score."""
    if s.precision == "fp32" and call.kv_cache_precision in (None, "f32"):
        return FP32_TOLERANCE
    return oracle.bf16_tolerance(float(rows.max_score.max()))


# A peer's KV cache formats (Call.kv_cache_precision, as the libraries name them) as mha's
# cache precisions: what its decode step reads per cached element (u8 and i8 carry a scale and
# zero point per token and head, as mha's int8 does, but in two fp32: OpenVINO's
# attn_quantkv keeps them beside the codes).
CACHE_PRECISIONS = {"f32": "fp32", "bf16": "bf16", "f16": "bf16", "u8": "int8", "i8": "int8"}
PEER_INT8_SCALE_BYTES = 8


def int8_scale_bytes(backend: str) -> int:
    """What a row of `backend`'s 8-bit cache keeps beyond its codes: mha's word from Python,
    another library's two fp32."""
    return INT8_SCALE_BYTES if backend.startswith(schema.MHA_FROM_PYTHON_PREFIX) else PEER_INT8_SCALE_BYTES


def cache_shape(s: Shape, call: Call) -> Shape:
    """s with the KV cache the call keeps, for the counters that count its bytes (bytes_min):
    openvino_u8kv's u8 cache at an fp32 shape reads int8's bytes, not fp32's."""
    kept = CACHE_PRECISIONS.get(call.kv_cache_precision or "")
    return dataclasses.replace(s, kv_precision=kept) if s.is_decode and kept else s


def first_run_error(call: Call, s: Shape, rows: oracle.Rows) -> tuple[float, float]:
    """Runs a prepared call once from its start (rewound): max |y - oracle| / max |oracle| on the
    oracle's rows, and the tolerance it must meet. A y of the wrong shape or type is an error of
    infinity."""
    call.rewind()
    call.run()
    y = call.output()
    if y.shape != (s.batch, s.seq_len, s.d_out) or y.dtype != np.float32:
        return float("inf"), tolerance(s, call, rows)
    return oracle.relative_error(y, rows), tolerance(s, call, rows)


def time_call(call: Call, min_time: float, repetitions: int) -> tuple[int, list[tuple[float, float]]]:
    """Google Benchmark's scheme: grow the iteration count until one repetition lasts >=
    min_time, then `repetitions` repetitions of that many iterations. Rewinds (untimed) every
    call.rewind_every calls. Returns (iterations, [(real s/call, thread cpu s/call)])."""

    def repetition(iterations: int) -> tuple[float, float]:
        real = cpu = 0.0
        done = 0
        while done < iterations:
            call.rewind()
            chunk = min(call.rewind_every, iterations - done)
            start, cpu_start = time.perf_counter(), time.thread_time()
            for _ in range(chunk):
                call.run()
            real += time.perf_counter() - start
            cpu += time.thread_time() - cpu_start
            done += chunk
        return real, cpu

    call.rewind()
    call.run()  # warm-up: allocators, first-call paths, kernels compiled on first use
    iterations = 1
    while True:
        elapsed, _ = repetition(iterations)
        if elapsed >= min_time or iterations >= 10**9:
            break
        grow = min_time * 1.4 / max(elapsed, 1e-9)
        iterations = max(iterations + 1, min(iterations * 10, math.ceil(iterations * grow)))
    runs = [repetition(iterations) for _ in range(repetitions)]
    return iterations, [(real / iterations, cpu / iterations) for real, cpu in runs]


# ---------------------------------------------------------------------------------------------
# Google Benchmark JSON


def bench_name(variant: Variant, s: Shape, threads: int) -> str:
    return f"mha/{variant.backend}/{variant.formulation}/{s.problem_suffix()}/threads:{threads}/real_time"


def entries(
    name: str,
    family: int,
    s: Shape,
    threads: int,
    iterations: int,
    runs,
    label: str,
    check: dict,
    scale_bytes: int = INT8_SCALE_BYTES,
) -> list[dict]:
    """Iteration entries (one per repetition) and mean/median/stddev/cv aggregates, in ms;
    scale_bytes: what an int8 cache's row keeps beyond its codes (schema.counters)."""
    base = {"name": name, "family_index": family, "per_family_instance_index": 0, "run_name": name}
    formulation = name.split("/")[2]
    out = [
        base
        | {"run_type": "iteration", "repetitions": len(runs), "repetition_index": i, "iterations": iterations}
        | {"real_time": real * 1e3, "cpu_time": cpu * 1e3, "time_unit": "ms", "threads": 1}
        | schema.counters(s, formulation, threads, real, scale_bytes)
        | check
        | {"label": label}
        for i, (real, cpu) in enumerate(runs)
    ]
    if len(runs) > 1:
        reals, cpus = [r for r, _ in runs], [c for _, c in runs]
        stats = {
            "mean": (statistics.fmean(reals), statistics.fmean(cpus)),
            "median": (statistics.median(reals), statistics.median(cpus)),
            "stddev": (statistics.stdev(reals), statistics.stdev(cpus)),
        }
        stats["cv"] = (stats["stddev"][0] / stats["mean"][0], stats["stddev"][1] / stats["mean"][1])
        for agg, (real, cpu) in stats.items():
            scale = 1.0 if agg == "cv" else 1e3
            out.append(
                base
                | {"name": f"{name}_{agg}", "run_type": "aggregate", "repetitions": len(runs)}
                | {"aggregate_name": agg, "aggregate_unit": "percentage" if agg == "cv" else "time"}
                | {
                    "iterations": len(runs),
                    "real_time": real * scale,
                    "cpu_time": cpu * scale,
                    "time_unit": "ms",
                }
            )
    return out


def untimed(name: str, family: int, message: str) -> dict:
    return {
        "name": name,
        "family_index": family,
        "per_family_instance_index": 0,
        "run_name": name,
        "run_type": "iteration",
        "error_occurred": True,
        "error_message": message,
    }


def write_atomically(path: Path, doc: dict) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


# ---------------------------------------------------------------------------------------------
# One library


def load(library: str) -> tuple[list[Variant], Peer | None, str | None]:
    """The library's variants, its Peer (None when it cannot run here) and why not."""
    module = importlib.import_module(f"{__package__}.{library}")
    try:
        return module.VARIANTS, module.make_peer(), None
    except Unavailable as e:
        return module.VARIANTS, None, str(e)


class Sweep:
    """The entries of one library's run, its progress line and time budget."""

    def __init__(self, args, total: int):
        self.args, self.total = args, total
        self.benchmarks: list[dict] = []
        self.worst: dict[str, float] = {}
        self.done, self.start = 0, time.perf_counter()

    def progress(self, text: str) -> None:
        self.done += 1
        if not self.args.quiet:
            print(f"[{self.done}/{self.total}] {text}", file=sys.stderr, flush=True)

    def untimed(self, name: str, family: int, message: str) -> None:
        self.benchmarks.append(untimed(name, family, message))
        self.progress(f"{name}: {message}")

    def measure(self, peer: Peer, variant: Variant, job: Job, family: int, w, x, rows: oracle.Rows) -> None:
        """Prepares, checks and times the variant at each of the job's thread counts."""
        s = job.shape
        for n in job.threads:
            name = bench_name(variant, s, n)
            budget = self.args.time_budget
            if budget is not None and time.perf_counter() - self.start > budget:
                self.untimed(name, family, f"skipped: time budget of {budget:g} s used up")
                continue
            call = None
            try:
                call = peer.prepare(variant, s, w, x, n)
                error, bound = first_run_error(call, s, rows)
                check = {"check_rows": len(rows.rows), "check_rel_err": error, "check_tolerance": bound}
                check |= call.counters
                if not error <= bound:  # NaN fails too
                    self.untimed(
                        name,
                        family,
                        f"wrong result: max |y - oracle| / max |oracle| = {error:.3g} > {bound:.3g}",
                    )
                    continue
                self.worst[variant.backend] = max(self.worst.get(variant.backend, 0.0), error)
                iterations, runs = time_call(call, self.args.min_time, self.args.repetitions)
                cache = f"; KV cache {call.kv_cache_precision}" if call.kv_cache_precision else ""
                label = (
                    f"checked: max |y - oracle| / max |oracle| = {error:.2g} <= {bound:.2g} on "
                    f"{len(rows.rows)} rows (float64 oracle, mha_bench's inputs); {variant.what}{cache}"
                )
                self.benchmarks += entries(
                    name,
                    family,
                    cache_shape(s, call),
                    n,
                    iterations,
                    runs,
                    label,
                    check,
                    int8_scale_bytes(variant.backend),
                )
                self.progress(f"{name}: {statistics.median(r for r, _ in runs) * 1e3:.3f} ms")
            except Exception as e:  # a peer's own failure is an entry, not the end of the run
                self.untimed(name, family, f"error: {type(e).__name__}: {e}".replace("\n", " ")[:500])
            finally:
                if call is not None:
                    call.close()
                del call
                gc.collect()


def run_library(args, library: str, jobs: list[Job], out: Path) -> None:
    variants, peer, unavailable = load(library)
    if args.variants:
        wanted = set(args.variants.split(","))
        if unknown := wanted - {v.backend for v in variants}:
            names = ", ".join(sorted({v.backend for v in variants}))
            raise UsageError(f"--variants {','.join(sorted(unknown))}: {library} has {names}")
        variants = [v for v in variants if v.backend in wanted]
    sweep = Sweep(args, sum(len(j.threads) for j in jobs) * len(variants))
    for family, job in enumerate(jobs):
        s = job.shape
        reasons = {v: (unavailable or peer.declines(v, s)) for v in variants}
        measured = [v for v in variants if reasons[v] is None]
        if measured:
            w, x = inputs.weights(s), inputs.x(s)
            rows = oracle.forward_rows(s, w, x, inputs.sample_rows(s.batch, s.seq_len))
        for v in variants:
            if reasons[v] is not None:
                for n in job.threads:
                    sweep.untimed(bench_name(v, s, n), family, f"declined: {reasons[v]}")
            else:
                sweep.measure(peer, v, job, family, w, x, rows)
        gc.collect()
    context = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host_name": socket.gethostname(),
        "executable": f"{sys.executable} -m mhapy.peers --libraries {library}",
        "num_cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        schema.SCHEMA_VERSION_KEY: str(schema.SCHEMA_VERSION),
        "mha_peers": library,
        "peers_variants": "; ".join(f"{v.backend}/{v.formulation}: {v.what}" for v in variants),
        "peers_inputs": "mha_bench's: weights of mha::weights::random (seed 42), x uniform in [-1, 1) "
        "(std::mt19937, seed 7), decode caches holding past tokens of x = 0 (mhapy.inputs)",
        "peers_check": "before timing, each call's output against the float64 oracle (mhapy.oracle) on "
        "batch elements {0, B-1} x tokens {0, T/3, 2T/3, T-1}: max |y - oracle| / max |oracle| <= "
        f"{FP32_TOLERANCE:g} in fp32 with an fp32 cache, else 2^-9 (5 + 4 S) with S the rows' largest "
        "|score| (the bound of a bf16 module); the error is the entry's check_rel_err counter",
        "peers_worst_error": "; ".join(f"{b} {e:.2g}" for b, e in sorted(sweep.worst.items()))
        or "none timed",
        "min_time": args.min_time,
        "repetitions": args.repetitions,
    }
    if unavailable:
        context["peers_unavailable"] = unavailable
    else:
        context |= peer.context()
    write_atomically(out, {"context": context, "benchmarks": sweep.benchmarks})
    if not args.quiet:
        print(f"mhapy.peers: wrote {out} ({len(sweep.benchmarks)} entries)", file=sys.stderr)


# ---------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m mhapy.peers",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--libraries", default=",".join(LIBRARIES), help=f"comma-separated, of {', '.join(LIBRARIES)}"
    )
    p.add_argument("--shapes", help="JSON list of shapes (mha_bench --dump-shapes)")
    p.add_argument(
        "--shape", action="append", default=[], help="add a shape, e.g. b1/t128/din768/dout768/h12"
    )
    p.add_argument("--threads", help="comma-separated thread counts for every shape (0 = all cores)")
    p.add_argument(
        "--out", required=True, help="output JSON (one library), or the stem of one file per library"
    )
    p.add_argument(
        "--min-time", type=float, default=0.2, help="seconds per repetition, at least (default 0.2)"
    )
    p.add_argument("--repetitions", type=int, default=3, help="repetitions per benchmark (default 3)")
    p.add_argument("--time-budget", type=float, help="seconds per library; later benchmarks are skipped")
    p.add_argument(
        "--variants", help="comma-separated backends of one library to run (e.g. torch_sdpa; default all)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p.parse_args(argv)


def out_path(out: str, library: str, libraries: list[str]) -> Path:
    """--out for one library; FILE-<library>.json for each of several."""
    path = Path(out)
    return path if len(libraries) == 1 else path.with_name(f"{path.stem}-{library}{path.suffix or '.json'}")


def run(args) -> int:
    libraries = [name for name in args.libraries.split(",") if name]
    unknown = [name for name in libraries if name not in LIBRARIES]
    if unknown or not libraries:
        raise UsageError(f"--libraries {args.libraries!r}: expected some of {', '.join(LIBRARIES)}")
    if not args.min_time > 0 or args.repetitions < 1:
        raise UsageError(
            f"--min-time {args.min_time} / --repetitions {args.repetitions}: expected > 0 and >= 1"
        )
    jobs = shapes_from_file(args.shapes) if args.shapes else []
    jobs += [Job(shape_from_text(t), [1]) for t in args.shape]
    if not jobs:
        raise UsageError("no shapes: give --shapes FILE and/or --shape b<B>/t<T>/din<d_in>/dout<d_out>/h<H>")
    if args.threads:
        for job in jobs:
            job.threads = parse_threads(args.threads)
    if len(libraries) == 1:
        run_library(args, libraries[0], jobs, out_path(args.out, libraries[0], libraries))
        return 0
    # One process per library: each keeps its thread pool and allocator to itself.
    status = 0
    for library in libraries:
        command = [sys.executable, "-m", __package__, "--libraries", library]
        command += ["--out", str(out_path(args.out, library, libraries))]
        command += ["--min-time", str(args.min_time), "--repetitions", str(args.repetitions)]
        command += ["--shapes", args.shapes] if args.shapes else []
        command += [f"--shape={text}" for text in args.shape]
        command += ["--threads", args.threads] if args.threads else []
        command += ["--time-budget", str(args.time_budget)] if args.time_budget is not None else []
        command += ["--variants", args.variants] if args.variants else []
        command += ["--quiet"] if args.quiet else []
        status = max(status, subprocess.run(command).returncode)
    return status


def main(argv=None) -> int:
    try:
        return run(parse_args(argv))
    except UsageError as e:
        print(f"mhapy.peers: {e}", file=sys.stderr)
        return 2
