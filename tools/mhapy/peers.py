"""PyTorch peers of the mha benchmarks: the same shapes and thread counts, timed in PyTorch,
written as Google Benchmark 1.7.1 JSON so mhapy.report shows them next to mha's backends.

Three modules of mhapy.torch_modules, all in eval mode under torch.no_grad() (inference:
dropout off, no autograd):
  mha/torch/wrapper/...         MultiHeadAttentionWrapper: H CausalAttention heads, each with its
                                own (head_dim, d_in) Q/K/V nn.Linear, outputs concatenated, then
                                out_proj (docs/design.md §1; the seeds' wrapper plus the out_proj).
  mha/torch/split_weight/...    MultiHeadAttention: one (d_out, d_in) Q/K/V projection each,
                                view/transpose into heads, masked_fill_ with the causal mask,
                                softmax, merge, out_proj (docs/design.md §1, the seeds' module).
  mha/torch_nn_mha/split_weight/...
                                torch.nn.MultiheadAttention(batch_first=True) with a boolean causal
                                attn_mask; needs d_in == d_out and out_proj (skipped otherwise).
All three get the same weights (the split module's nn.Linear initialisation from --seed), and
their outputs are compared on every shape before anything is timed: a disagreement records the
benchmark as failed, never timed. The label of each entry says what was checked.

Usage (PYTHONPATH=tools, Debian's /usr/bin/python3 with python3-torch):
  python3 -m mhapy.peers --shapes shapes.json --out peers.json [--min-time S] [--repetitions N]
  python3 -m mhapy.peers --shape b1/t128/din64/dout64/h1 --threads 1,2 --out peers.json
--shapes takes the list `mha_bench --dump-shapes` writes: [{batch, seq_len, d_in, d_out, n_heads,
causal, qkv_bias, out_proj, threads: [...], series, name, flops[, n_kv_heads, past, precision]},
...] (or {"shapes": [...]}); a name or FLOP count other than mhapy.problem's is an error, and a
shape with grouped K/V heads, past tokens or bf16 is not timed (no module of torch_modules
computes them yet: listed on stderr and in the context's peers_not_timed). --shape adds a
shape written as in benchmark names (flags: /noncausal /qkv_bias /no_out_proj); --threads
replaces every shape's thread counts (0 = all cores).

Threads: torch.set_num_threads(n) per benchmark, and openblas_set_num_threads(n) when the BLAS
torch loaded is OpenBLAS (Debian's torch sends FP32 matmuls to the system libblas.so.3: with the
reference BLAS they are ~40x slower than with libopenblas0-openmp, and the pthread OpenBLAS
ignores torch's thread count unless told). The context records torch's and the BLAS's settings.
Exit status: 0 on success (skipped and failed benchmarks are recorded in the JSON), 2 on bad
arguments, 3 when torch is not installed, 1 on other errors; the output file appears only when
complete.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import math
import os
import platform
import re
import socket
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from . import schema
from .problem import Shape, flops

try:
    import torch
except ImportError:  # main() says so, with its own exit status, so a sweep can skip the peers
    torch = None
else:
    from . import torch_modules as tm

# Relative tolerance of the agreement check: max |y - y_split| <= RTOL * max |y_split|.
# FP32 sums over d_in <= 6144 terms differ between the three modules' orders by ~1e-6.
RTOL = 1e-4


# ---------------------------------------------------------------------------------------------
# Shapes


class UsageError(Exception):
    """Bad command-line input; the message names the value and what was expected."""


@dataclass
class Job:
    """One shape and the thread counts to time it at."""

    shape: Shape
    threads: list[int]


def validate(s: Shape, threads: list, where: str) -> None:
    for name in ("batch", "seq_len", "d_in", "d_out", "n_heads"):
        value = getattr(s, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{where}: {name} = {value!r}, expected an integer >= 1")
    if s.d_out % s.n_heads:
        raise UsageError(f"{where}: d_out ({s.d_out}) must be divisible by n_heads ({s.n_heads})")
    if not threads or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in threads):
        raise UsageError(f"{where}: threads = {threads!r}, expected a non-empty list of integers >= 1")


_SHAPE_FIELDS = {"batch", "seq_len", "d_in", "d_out", "n_heads", "causal", "qkv_bias", "out_proj"}
# The axes mha_bench writes only when not their default (docs/design.md §1.3-1.5), which no
# module of torch_modules computes yet.
_AXES = {"n_kv_heads": 0, "past": 0, "precision": "fp32"}
_FILE_FIELDS = _SHAPE_FIELDS | set(_AXES) | {"threads", "series", "name", "flops"}


def shapes_from_file(path: str) -> tuple[list[Job], list[str]]:
    """The jobs of a --shapes file, and the shapes not timed (name and why)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"--shapes {path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"--shapes {path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    items = doc.get("shapes") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise UsageError(f'--shapes {path}: expected a list of shapes (or {{"shapes": [...]}})')
    out, not_timed = [], []
    for i, item in enumerate(items):
        where = f"--shapes {path}: shape {i}"
        if not isinstance(item, dict):
            raise UsageError(f"{where}: expected an object, got {type(item).__name__}")
        unknown = set(item) - _FILE_FIELDS
        missing = {"batch", "seq_len", "d_in", "d_out", "n_heads"} - set(item)
        if unknown or missing:
            raise UsageError(f"{where}: unknown fields {sorted(unknown)}, missing {sorted(missing)}")
        job = Job(Shape(**{k: v for k, v in item.items() if k in _SHAPE_FIELDS}), item.get("threads", [1]))
        validate(job.shape, job.threads, where)
        axes = {k: item[k] for k, default in _AXES.items() if item.get(k, default) != default}
        check_against_mha_bench(job.shape, item, axes, where)
        if axes:
            name = item.get("name", job.shape.problem_suffix())
            not_timed.append(f"{name} ({', '.join(f'{k} {v}' for k, v in axes.items())})")
            continue
        out.append(job)
    return out, not_timed


def check_against_mha_bench(s: Shape, item: dict, axes: dict, where: str) -> None:
    """The name and FLOP count mha_bench wrote for a shape must be mhapy.problem's: the report
    parses these names, and these counts divide the peers' times."""
    if "flops" in item:
        ours = flops(replace(s, past=axes.get("past", 0), n_kv_heads=axes.get("n_kv_heads", 0)))
        if not math.isclose(float(item["flops"]), ours, rel_tol=1e-12):
            raise UsageError(
                f"{where}: mha_bench counts {item['flops']} FLOPs, mhapy.problem.flops {ours}: "
                "the two statements of docs/design.md §3 disagree"
            )
    if "name" in item and not axes and item["name"] != s.problem_suffix():
        raise UsageError(f"{where}: name {item['name']!r}, but the fields spell {s.problem_suffix()!r}")


_SHAPE_TEXT = re.compile(
    r"^b(\d+)/t(\d+)/din(\d+)/dout(\d+)/h(\d+)((?:/(?:noncausal|qkv_bias|no_out_proj))*)$"
)


def shape_from_text(text: str) -> Shape:
    match = _SHAPE_TEXT.match(text)
    if not match:
        raise UsageError(
            f"--shape {text!r}: expected b<B>/t<T>/din<d_in>/dout<d_out>/h<H> optionally followed by "
            "/noncausal, /qkv_bias, /no_out_proj"
        )
    b, t, d_in, d_out, h = (int(g) for g in match.groups()[:5])
    flags = match.group(6).split("/")
    shape = Shape(
        b, t, d_in, d_out, h, "noncausal" not in flags, "qkv_bias" in flags, "no_out_proj" not in flags
    )
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
# Threads and BLAS


class Blas:
    """The BLAS library torch's FP32 matmuls went to, found in /proc/self/maps after one."""

    def __init__(self):
        a = torch.ones(64, 64)
        _ = a @ a
        libs = set()
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                parts = line.split()
                if len(parts) >= 6 and re.search(r"blas|blis|mkl_rt|atlas", Path(parts[5]).name):
                    libs.add(parts[5])
        self.paths = sorted(libs)
        self.openblas = None
        for path in self.paths:
            if "openblas" in path:
                lib = ctypes.CDLL(path)
                if hasattr(lib, "openblas_set_num_threads"):
                    self.openblas = lib
                    self.openblas.openblas_get_config.restype = ctypes.c_char_p
                    break

    def describe(self) -> str:
        if self.openblas is not None:
            parallel = {0: "sequential", 1: "pthreads", 2: "OpenMP"}.get(
                self.openblas.openblas_get_parallel(), "?"
            )
            return f"OpenBLAS ({self.openblas.openblas_get_config().decode()}; threading: {parallel})"
        if any(re.search(r"/blas/libblas\.so", p) for p in self.paths):
            return "reference BLAS (netlib libblas3)"
        return "unknown (" + (", ".join(self.paths) or "no BLAS library mapped") + ")"

    def warning(self) -> str | None:
        if self.openblas is None and any("/blas/libblas.so" in p for p in self.paths):
            return (
                "torch's FP32 matmuls run on the reference (netlib) BLAS, ~40x slower than "
                "OpenBLAS: these PyTorch times are not representative. Install "
                "libopenblas0-openmp (apt) and rerun."
            )
        return None

    def set_threads(self, n: int) -> None:
        if self.openblas is not None:
            self.openblas.openblas_set_num_threads(n)


def set_threads(blas: Blas, n: int) -> None:
    torch.set_num_threads(n)
    blas.set_threads(n)


def _config_line(prefix: str) -> str:
    for line in torch.__config__.show().splitlines():
        if prefix in line:
            return line.split(":", 1)[1].strip()
    return "?"


def _parallel_backend() -> str:
    for line in torch.__config__.parallel_info().splitlines():
        if line.startswith("ATen parallel backend"):
            return line.split(":", 1)[1].strip()
    return "?"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


# ---------------------------------------------------------------------------------------------
# Building, checking and timing


def build_modules(s: Shape, seed: int) -> dict[str, torch.nn.Module]:
    """{'torch/wrapper', 'torch/split_weight', 'torch_nn_mha/split_weight'} with the same
    weights: the split module's nn.Linear initialisation, sliced per head for the wrapper and
    packed as in_proj for nn.MultiheadAttention (absent when it cannot express the shape)."""
    torch.manual_seed(seed)
    kw = dict(qkv_bias=s.qkv_bias, causal=s.causal, out_proj=s.out_proj)
    split = tm.MultiHeadAttention(s.d_in, s.d_out, s.seq_len, s.n_heads, **kw)
    wrapper = tm.MultiHeadAttentionWrapper(s.d_in, s.d_out, s.seq_len, s.n_heads, **kw)
    tm.copy_split_to_wrapper(split, wrapper)
    modules = {"torch/wrapper": wrapper, "torch/split_weight": split}
    if nn_mha_unsupported(s) is None:
        nn_mha = tm.TorchNNMultiheadAttention(s.d_out, s.n_heads, s.seq_len, s.causal)
        tm.copy_split_to_nn_mha(split, nn_mha)
        modules["torch_nn_mha/split_weight"] = nn_mha
    for m in modules.values():
        m.eval()
    return modules


def nn_mha_unsupported(s: Shape) -> str | None:
    if s.d_in != s.d_out:
        return f"nn.MultiheadAttention needs d_in == d_out (got {s.d_in}, {s.d_out})"
    if not s.out_proj:
        return "nn.MultiheadAttention always applies out_proj (shape has no_out_proj)"
    return None


def check(modules: dict[str, torch.nn.Module], x: torch.Tensor) -> dict[str, float]:
    """max |y - y_split| / max |y_split| of every module (0 for split_weight itself)."""
    with torch.no_grad():
        reference = modules["torch/split_weight"](x)
        scale = float(reference.abs().max()) or 1.0
        return {name: float((m(x) - reference).abs().max()) / scale for name, m in modules.items()}


def time_module(module: torch.nn.Module, x: torch.Tensor, min_time: float, repetitions: int):
    """Google Benchmark's scheme: grow the iteration count until one repetition lasts >=
    min_time, then run `repetitions` repetitions of that many iterations. Returns
    (iterations, [(real s/iter, thread cpu s/iter)] per repetition)."""
    with torch.no_grad():
        module(x)  # warm-up: allocator, first-call paths
        iterations = 1
        while True:
            start = time.perf_counter()
            for _ in range(iterations):
                module(x)
            elapsed = time.perf_counter() - start
            if elapsed >= min_time or iterations >= 10**9:
                break
            grow = min_time * 1.4 / max(elapsed, 1e-9)
            iterations = max(iterations + 1, min(iterations * 10, math.ceil(iterations * grow)))
        runs = []
        for _ in range(repetitions):
            start, cpu = time.perf_counter(), time.thread_time()
            for _ in range(iterations):
                module(x)
            runs.append(((time.perf_counter() - start) / iterations, (time.thread_time() - cpu) / iterations))
    return iterations, runs


# ---------------------------------------------------------------------------------------------
# Google Benchmark JSON


def bench_name(module: str, s: Shape, threads: int) -> str:
    backend, formulation = module.split("/")
    return f"mha/{backend}/{formulation}/{s.problem_suffix()}/threads:{threads}/real_time"


def entries(name: str, family: int, s: Shape, threads: int, iterations: int, runs, label: str) -> list[dict]:
    """Iteration entries (one per repetition) and mean/median/stddev/cv aggregates, in ms."""
    base = {"name": name, "family_index": family, "per_family_instance_index": 0, "run_name": name}
    out = []
    for i, (real, cpu) in enumerate(runs):
        out.append(
            base
            | {
                "run_type": "iteration",
                "repetitions": len(runs),
                "repetition_index": i,
                "iterations": iterations,
            }
            | {"real_time": real * 1e3, "cpu_time": cpu * 1e3, "time_unit": "ms"}
            | {"threads": 1}  # Google Benchmark's own field; the run's count is n_threads
            | schema.counters(s, name.split("/")[2], threads, real)
            | {"label": label}
        )
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


def failed(name: str, family: int, message: str) -> dict:
    return {
        "name": name,
        "family_index": family,
        "per_family_instance_index": 0,
        "run_name": name,
        "run_type": "iteration",
        "error_occurred": True,
        "error_message": message,
    }


def context(blas: Blas, args, check_summary: str, not_timed: list[str]) -> dict:
    ctx = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host_name": socket.gethostname(),
        "executable": f"{sys.executable} -m mhapy.peers ({Path(__file__).resolve()})",
        "num_cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mha_peers": "pytorch",
        "peers_modules": "torch/wrapper = MultiHeadAttentionWrapper of CausalAttention heads + out_proj; "
        "torch/split_weight = MultiHeadAttention (split weights); "
        "torch_nn_mha/split_weight = torch.nn.MultiheadAttention + causal attn_mask; eval, no_grad",
        "torch_version": torch.__version__,
        "torch_parallel_backend": _parallel_backend(),
        "torch_cpu_capability": _config_line("CPU capability usage"),
        "torch_blas_info": _config_line("BLAS_INFO").split(",")[0],
        "torch_mkldnn_available": str(torch.backends.mkldnn.is_available()),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        "torch_threads": "torch.set_num_threads(threads) per benchmark"
        + ("; openblas_set_num_threads(threads) too" if blas.openblas is not None else ""),
        "blas": blas.describe(),
        "blas_library": ", ".join(blas.paths),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "(unset)"),
        "python": platform.python_version(),
        "min_time": args.min_time,
        "repetitions": args.repetitions,
        "seed": args.seed,
        "peers_check": check_summary,
    }
    if not_timed:
        ctx["peers_not_timed"] = "; ".join(not_timed)
    warning = blas.warning()
    if warning:
        ctx["blas_warning"] = warning
    return ctx


def write_atomically(path: Path, doc: dict) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shapes", help="JSON list of shapes (mha_bench --dump-shapes)")
    p.add_argument(
        "--shape", action="append", default=[], help="add a shape, e.g. b1/t128/din64/dout64/h1[/noncausal]"
    )
    p.add_argument("--threads", help="comma-separated thread counts for every shape (0 = all cores)")
    p.add_argument("--out", required=True, help="output JSON file (written only when complete)")
    p.add_argument(
        "--min-time", type=float, default=0.2, help="seconds per repetition, at least (default 0.2)"
    )
    p.add_argument("--repetitions", type=int, default=3, help="repetitions per benchmark (default 3)")
    p.add_argument(
        "--time-budget", type=float, help="seconds; benchmarks after it runs out are recorded as skipped"
    )
    p.add_argument("--seed", type=int, default=123, help="weight and input seed (default 123)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p.parse_args(argv)


def run(args) -> int:
    if not args.min_time > 0 or args.repetitions < 1:
        raise UsageError(
            f"--min-time {args.min_time} / --repetitions {args.repetitions}: expected > 0 and >= 1"
        )
    jobs, not_timed = shapes_from_file(args.shapes) if args.shapes else ([], [])
    jobs += [Job(shape_from_text(t), [1]) for t in args.shape]
    if not_timed and not args.quiet:
        print(f"mhapy.peers: not timed (no PyTorch module yet): {'; '.join(not_timed)}", file=sys.stderr)
    if not jobs and not_timed:
        raise UsageError(
            "no shape the PyTorch modules compute (grouped K/V heads, past and bf16 are not timed)"
        )
    if not jobs:
        raise UsageError("no shapes: give --shapes FILE and/or --shape b<B>/t<T>/din<d_in>/dout<d_out>/h<H>")
    if args.threads:
        threads = parse_threads(args.threads)
        for job in jobs:
            job.threads = threads
    blas = Blas()
    if blas.warning() and not args.quiet:
        print(f"mhapy.peers: WARNING: {blas.warning()}", file=sys.stderr)
    total = sum(len(j.threads) * (3 if nn_mha_unsupported(j.shape) is None else 2) for j in jobs)
    benchmarks, worst, done, start = [], 0.0, 0, time.perf_counter()
    for family, job in enumerate(jobs):
        s = job.shape
        modules = build_modules(s, args.seed)
        torch.manual_seed(args.seed + 1)
        x = torch.rand(s.batch, s.seq_len, s.d_in)
        set_threads(blas, max(job.threads))
        errors = check(modules, x)
        worst = max([worst] + list(errors.values()))
        unsupported = nn_mha_unsupported(s)
        if unsupported:
            errors["torch_nn_mha/split_weight"] = None
        for module_name, err in errors.items():
            for n in job.threads:
                name = bench_name(module_name, s, n)
                if err is None:
                    benchmarks.append(failed(name, family, f"skipped: {unsupported}"))
                    continue
                done += 1
                if err > RTOL:
                    benchmarks.append(
                        failed(
                            name,
                            family,
                            f"wrong result: max |y - y_split| / max |y_split| = {err:.2e} > {RTOL:g}",
                        )
                    )
                    continue
                if args.time_budget is not None and time.perf_counter() - start > args.time_budget:
                    benchmarks.append(
                        failed(name, family, f"skipped: time budget of {args.time_budget:g} s used up")
                    )
                    continue
                set_threads(blas, n)
                iterations, runs = time_module(modules[module_name], x, args.min_time, args.repetitions)
                label = f"checked: max |y - y_split| / max |y_split| = {err:.1e} (same weights and input)"
                benchmarks += entries(name, family, s, n, iterations, runs, label)
                if not args.quiet:
                    median = statistics.median(r for r, _ in runs)
                    print(f"[{done}/{total}] {name}: {median * 1e3:.3f} ms", file=sys.stderr)
        del modules, x
        gc.collect()
    summary = (
        "before timing, torch/wrapper and torch_nn_mha/split_weight were run on the same input "
        f"with the same weights as torch/split_weight on every shape; largest max |diff| / "
        f"max |y| = {worst:.1e} (tolerance {RTOL:g}); see each entry's label"
    )
    doc = {"context": context(blas, args, summary, not_timed), "benchmarks": benchmarks}
    write_atomically(Path(args.out), doc)
    if not args.quiet:
        print(f"mhapy.peers: wrote {args.out} ({len(benchmarks)} entries)", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    if torch is None:
        print(
            f"mhapy.peers: PyTorch is not installed for {sys.executable} "
            "(apt-get install python3-torch libopenblas0-openmp); no PyTorch peers measured",
            file=sys.stderr,
        )
        return 3
    try:
        return run(parse_args(argv))
    except UsageError as e:
        print(f"mhapy.peers: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
