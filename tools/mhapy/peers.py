"""PyTorch peers of the mha benchmarks: the same shapes and thread counts, timed in PyTorch,
written as Google Benchmark 1.7.1 JSON so mhapy.report shows them next to mha's backends.

Full forward passes (past = 0): three modules of mhapy.torch_modules, all in eval mode under
torch.no_grad() (inference: dropout off, no autograd):
  mha/torch/wrapper/...         MultiHeadAttentionWrapper: H CausalAttention heads, each with its
                                own (head_dim, d_in) Q/K/V nn.Linear, outputs concatenated, then
                                out_proj (docs/design.md §1; the seeds' wrapper plus the out_proj).
  mha/torch/split_weight/...    MultiHeadAttention: one (d_out, d_in) Q/K/V projection each,
                                view/transpose into heads, masked_fill_ with the causal mask,
                                softmax, merge, out_proj (docs/design.md §1, the seeds' module).
  mha/torch_nn_mha/split_weight/...
                                torch.nn.MultiheadAttention(batch_first=True) with a boolean causal
                                attn_mask; needs d_in == d_out and out_proj (skipped otherwise).
Decode steps (past > 0): one call forward(x, use_cache=True) of T new tokens after `past` cached
ones, through the KV-cache modules of mhapy.torch_modules (docs/design.md §1.4):
  mha/torch/{split_weight,wrapper}/.../past<P>/...
                                the seeds' cache: torch.cat of the cache and the new keys and
                                values (KVCacheMultiHeadAttention, KVCacheMultiHeadAttentionWrapper:
                                each head its own cache)
  mha/torch_prealloc/{split_weight,wrapper}/.../past<P>/...
                                the same modules with a preallocated cache: past + T tokens
                                allocated once, new keys and values written in place by index,
                                attention over the filled slice
The cache is filled by writing random keys and values (standard normal) of `past` tokens into it
directly, not by a forward over `past` tokens (which would build B·H·past² scores: 1.6 TB at B32
past 32768), and each timed step starts from that state again (the cat cache gets its `past`
tokens' tensors back, the preallocated one rewinds its length), so every step attends over past
+ T tokens, as mha_bench's decode benchmarks do (bench/README.md). nn.MultiheadAttention has no
cache: no decode entry.

Every module of a shape gets the same weights (the split module's nn.Linear initialisation from
--seed; sliced per head for the wrapper, packed as in_proj for nn.MultiheadAttention) and, for
decode, the same cache contents, and their outputs are compared on every shape before anything is
timed: a disagreement records the benchmark as failed, never timed. The label of each entry says
what was checked.

Usage (PYTHONPATH=tools, Debian's /usr/bin/python3 with python3-torch):
  python3 -m mhapy.peers --shapes shapes.json --out peers.json [--min-time S] [--repetitions N]
  python3 -m mhapy.peers --shape b1/t128/din64/dout64/h1 --threads 1,2 --out peers.json
--shapes takes the list `mha_bench --dump-shapes` writes: [{batch, seq_len, d_in, d_out, n_heads,
causal, qkv_bias, out_proj, threads: [...], series, name, flops[, n_kv_heads, past, precision]},
...] (or {"shapes": [...]}); a name or FLOP count other than mhapy.problem's is an error, and a
shape with grouped K/V heads or bf16 is not timed (no module of torch_modules computes them yet:
listed on stderr and in the context's peers_not_timed). --shape adds a shape written as in
benchmark names (mhapy.problem's grammar: b<B>/t<T>[/past<P>]/din<d_in>/dout<d_out>/h<H> and the
flags /noncausal /qkv_bias /no_out_proj); --threads replaces every shape's thread counts (0 = all
cores).

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
from dataclasses import dataclass
from pathlib import Path

from . import schema
from .problem import ProblemError, Shape, flops, parse_shape

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
    if not isinstance(s.past, int) or isinstance(s.past, bool) or s.past < 0:
        raise UsageError(f"{where}: past = {s.past!r}, expected an integer >= 0")
    if not threads or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in threads):
        raise UsageError(f"{where}: threads = {threads!r}, expected a non-empty list of integers >= 1")


_SHAPE_FIELDS = {"batch", "seq_len", "d_in", "d_out", "n_heads", "causal", "qkv_bias", "out_proj", "past"}
# The axes mha_bench writes only when not their default (docs/design.md §1.3, §1.5, §1.6 and an
# out_proj without bias), which the peers do not time.
_AXES = {"n_kv_heads": 0, "precision": "fp32", "rope_base": 0.0, "out_proj_bias": True}
_FILE_FIELDS = _SHAPE_FIELDS | set(_AXES) | {"threads", "series", "name", "flops"}


def not_timed_axes(s: Shape) -> dict:
    """The axes of s no PyTorch module here computes (empty: s is timed)."""
    return {k: getattr(s, k) for k, default in _AXES.items() if getattr(s, k) != default}


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
    out = []
    for i, item in enumerate(items):
        where = f"--shapes {path}: shape {i}"
        if not isinstance(item, dict):
            raise UsageError(f"{where}: expected an object, got {type(item).__name__}")
        unknown = set(item) - _FILE_FIELDS
        missing = {"batch", "seq_len", "d_in", "d_out", "n_heads"} - set(item)
        if unknown or missing:
            raise UsageError(f"{where}: unknown fields {sorted(unknown)}, missing {sorted(missing)}")
        fields = {k: v for k, v in item.items() if k in _SHAPE_FIELDS or k in _AXES}
        job = Job(Shape(**fields), item.get("threads", [1]))
        validate(job.shape, job.threads, where)
        check_against_mha_bench(job.shape, item, where)
        out.append(job)
    return split_timed(out)


def split_timed(jobs: list[Job]) -> tuple[list[Job], list[str]]:
    """The jobs a PyTorch module computes, and the others' names with why not."""
    timed, not_timed = [], []
    for job in jobs:
        axes = not_timed_axes(job.shape)
        if axes:
            text = ", ".join(f"{k} {v}" for k, v in axes.items())
            not_timed.append(f"{job.shape.problem_suffix()} ({text})")
        else:
            timed.append(job)
    return timed, not_timed


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


def shape_from_text(text: str) -> Shape:
    try:
        shape = parse_shape(text.split("/"))
    except ProblemError as e:
        raise UsageError(
            f"--shape {text!r}: {e}; expected b<B>/t<T>[/past<P>]/din<d_in>/dout<d_out>/h<H> "
            "optionally followed by /noncausal, /qkv_bias, /no_out_proj"
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
        return agreement({name: m(x) for name, m in modules.items()})


def agreement(outputs: dict[str, torch.Tensor]) -> dict[str, float]:
    """max |y - y_split| / max |y_split| of every output against torch/split_weight's."""
    reference = outputs["torch/split_weight"]
    scale = float(reference.abs().max()) or 1.0
    return {name: float((y - reference).abs().max()) / scale for name, y in outputs.items()}


def time_call(step, min_time: float, repetitions: int):
    """Google Benchmark's scheme for a call step(): grow the iteration count until one
    repetition lasts >= min_time, then run `repetitions` repetitions of that many iterations.
    Returns (iterations, [(real s/iter, thread cpu s/iter)] per repetition)."""
    with torch.no_grad():
        step()  # warm-up: allocator, first-call paths
        iterations = 1
        while True:
            start = time.perf_counter()
            for _ in range(iterations):
                step()
            elapsed = time.perf_counter() - start
            if elapsed >= min_time or iterations >= 10**9:
                break
            grow = min_time * 1.4 / max(elapsed, 1e-9)
            iterations = max(iterations + 1, min(iterations * 10, math.ceil(iterations * grow)))
        runs = []
        for _ in range(repetitions):
            start, cpu = time.perf_counter(), time.thread_time()
            for _ in range(iterations):
                step()
            runs.append(((time.perf_counter() - start) / iterations, (time.thread_time() - cpu) / iterations))
    return iterations, runs


# ---------------------------------------------------------------------------------------------
# Decode steps: the KV-cache modules after `past` cached tokens

# Module name -> (backend, KV cache of torch_modules.KV_CACHES).
DECODE_CACHES = {"torch": "cat", "torch_prealloc": "preallocated"}


def build_decode_modules(s: Shape, seed: int) -> dict[str, torch.nn.Module]:
    """{'torch/split_weight', 'torch/wrapper', 'torch_prealloc/split_weight',
    'torch_prealloc/wrapper'}: the KV-cache modules, caches of past + T tokens, with the weights
    build_modules gives (the split module's nn.Linear initialisation from seed)."""
    kw = dict(qkv_bias=s.qkv_bias, causal=s.causal, out_proj=s.out_proj)
    capacity = s.past + s.seq_len
    modules = {}
    for backend, cache in DECODE_CACHES.items():
        torch.manual_seed(seed)
        split = tm.KVCacheMultiHeadAttention(s.d_in, s.d_out, capacity, s.n_heads, kv_cache=cache, **kw)
        wrapper = tm.KVCacheMultiHeadAttentionWrapper(
            s.d_in, s.d_out, capacity, s.n_heads, kv_cache=cache, **kw
        )
        tm.copy_split_to_wrapper(split, wrapper)
        modules |= {f"{backend}/split_weight": split, f"{backend}/wrapper": wrapper}
    for m in modules.values():
        m.eval()
    return modules


class DecodeStep:
    """One decode step of a KV-cache module: its cache loaded with the same random keys and
    values of `past` tokens (standard normal from seed; each wrapper head its slice), and a
    call that puts the cache back to those `past` tokens, then runs forward(x, use_cache=True).
    close() frees the cache."""

    def __init__(self, module: torch.nn.Module, s: Shape, x: torch.Tensor, seed: int):
        generator = torch.Generator().manual_seed(seed)
        layout = (s.batch, s.past, s.n_heads, s.head_dim)
        keys, values = torch.randn(layout, generator=generator), torch.randn(layout, generator=generator)
        module.load_cache(keys, values)
        del keys, values
        self.module, self.x = module, x
        self.states = [(cache, cache.state()) for cache in module.kv_caches()]

    def __call__(self) -> torch.Tensor:
        for cache, state in self.states:
            cache.restore(state)
        return self.module(self.x, use_cache=True)

    def close(self) -> None:
        self.states = []
        self.module.reset_cache()
        for cache in self.module.kv_caches():
            cache.keys = cache.values = None


DECODE_LABEL = (
    "; cache loaded with the same random K/V of past tokens, restored before each step, then "
    "forward(x, use_cache=True)"
)


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
        "torch_nn_mha/split_weight = torch.nn.MultiheadAttention + causal attn_mask; eval, no_grad; "
        "decode (past > 0): torch/* = KVCacheMultiHeadAttention, KVCacheMultiHeadAttentionWrapper "
        "(the seeds' torch.cat cache), torch_prealloc/* = the same with a preallocated cache",
        "peers_decode": "one forward(x, use_cache=True) of T new tokens after past cached ones; "
        "the cache loaded with random K/V (standard normal) of past tokens, no forward over "
        "them, and put back to those past tokens before each timed step",
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
        "--shape",
        action="append",
        default=[],
        help="add a shape, e.g. b1/t128/din64/dout64/h1[/noncausal] or b1/t1/past512/din768/dout768/h12",
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


class Sweep:
    """The entries written so far, the progress line and the time budget of a run."""

    def __init__(self, args, blas: Blas, total: int):
        self.args, self.blas, self.total = args, blas, total
        self.benchmarks: list[dict] = []
        self.worst, self.done, self.start = 0.0, 0, time.perf_counter()

    def record(self, module: str, s: Shape, family: int, threads: list[int], err: float, step, label: str):
        """Times step() at each thread count, unless the module's output disagreed (err, the
        relative difference from torch/split_weight's) or the time budget is used up."""
        self.worst = max(self.worst, err)
        for n in threads:
            name = bench_name(module, s, n)
            self.done += 1
            if err > RTOL:
                message = f"wrong result: max |y - y_split| / max |y_split| = {err:.2e} > {RTOL:g}"
                self.benchmarks.append(failed(name, family, message))
                continue
            budget = self.args.time_budget
            if budget is not None and time.perf_counter() - self.start > budget:
                self.benchmarks.append(failed(name, family, f"skipped: time budget of {budget:g} s used up"))
                continue
            set_threads(self.blas, n)
            iterations, runs = time_call(step, self.args.min_time, self.args.repetitions)
            text = f"checked: max |y - y_split| / max |y_split| = {err:.1e} {label}"
            self.benchmarks += entries(name, family, s, n, iterations, runs, text)
            if not self.args.quiet:
                median = statistics.median(r for r, _ in runs)
                print(f"[{self.done}/{self.total}] {name}: {median * 1e3:.3f} ms", file=sys.stderr)


def forward_job(sweep: Sweep, family: int, job: Job) -> None:
    """A full forward pass: the three modules, checked against each other, then timed."""
    s, seed = job.shape, sweep.args.seed
    modules = build_modules(s, seed)
    torch.manual_seed(seed + 1)
    x = torch.rand(s.batch, s.seq_len, s.d_in)
    set_threads(sweep.blas, max(job.threads))
    for module_name, err in check(modules, x).items():
        module = modules[module_name]
        sweep.record(module_name, s, family, job.threads, err, lambda: module(x), "(same weights and input)")
    unsupported = nn_mha_unsupported(s)
    if unsupported:
        for n in job.threads:
            name = bench_name("torch_nn_mha/split_weight", s, n)
            sweep.benchmarks.append(failed(name, family, f"skipped: {unsupported}"))


def decode_job(sweep: Sweep, family: int, job: Job) -> None:
    """A decode step: the four KV-cache modules one at a time (one cache alive at once), each
    checked against torch/split_weight's step, then timed."""
    s, seed = job.shape, sweep.args.seed
    modules = build_decode_modules(s, seed)
    torch.manual_seed(seed + 1)
    x = torch.rand(s.batch, s.seq_len, s.d_in)
    reference = None
    for module_name, module in modules.items():
        step = DecodeStep(module, s, x, seed + 2)
        set_threads(sweep.blas, max(job.threads))
        with torch.no_grad():
            y = step()
        reference = y if reference is None else reference
        err = agreement({"torch/split_weight": reference, module_name: y})[module_name]
        label = "(same weights, input and cached tokens)" + DECODE_LABEL
        sweep.record(module_name, s, family, job.threads, err, step, label)
        step.close()
        del step, y
        gc.collect()


def run(args) -> int:
    if not args.min_time > 0 or args.repetitions < 1:
        raise UsageError(
            f"--min-time {args.min_time} / --repetitions {args.repetitions}: expected > 0 and >= 1"
        )
    jobs, not_timed = shapes_from_file(args.shapes) if args.shapes else ([], [])
    more, more_not_timed = split_timed([Job(shape_from_text(t), [1]) for t in args.shape])
    jobs, not_timed = jobs + more, not_timed + more_not_timed
    if not_timed and not args.quiet:
        print(f"mhapy.peers: not timed (no PyTorch module yet): {'; '.join(not_timed)}", file=sys.stderr)
    if not jobs and not_timed:
        raise UsageError("no shape the PyTorch modules compute (grouped K/V heads and bf16 are not timed)")
    if not jobs:
        raise UsageError("no shapes: give --shapes FILE and/or --shape b<B>/t<T>/din<d_in>/dout<d_out>/h<H>")
    if args.threads:
        threads = parse_threads(args.threads)
        for job in jobs:
            job.threads = threads
    blas = Blas()
    if blas.warning() and not args.quiet:
        print(f"mhapy.peers: WARNING: {blas.warning()}", file=sys.stderr)
    modules_per_job = [
        len(DECODE_CACHES) * 2 if j.shape.is_decode else 3 if nn_mha_unsupported(j.shape) is None else 2
        for j in jobs
    ]
    sweep = Sweep(args, blas, sum(len(j.threads) * k for j, k in zip(jobs, modules_per_job)))
    for family, job in enumerate(jobs):
        (decode_job if job.shape.is_decode else forward_job)(sweep, family, job)
        gc.collect()
    summary = (
        "before timing, torch/wrapper and torch_nn_mha/split_weight were run on the same input "
        "with the same weights as torch/split_weight on every shape (decode: torch/wrapper and "
        "the torch_prealloc modules with the same cached tokens too); largest max |diff| / "
        f"max |y| = {sweep.worst:.1e} (tolerance {RTOL:g}); see each entry's label"
    )
    doc = {"context": context(blas, args, summary, not_timed), "benchmarks": sweep.benchmarks}
    write_atomically(Path(args.out), doc)
    if not args.quiet:
        print(f"mhapy.peers: wrote {args.out} ({len(sweep.benchmarks)} entries)", file=sys.stderr)
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
