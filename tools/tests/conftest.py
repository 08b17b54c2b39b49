"""Synthetic Google Benchmark 1.7.1 JSON, written the way mha_bench writes it, for the tests.

Times come from simple models chosen by each test (so expected numbers are computed from the
model, not copied from the generator's output); FLOP counts and counter names are mhapy's own
(problem.flops, pinned by test_problem.py; schema). Repetitions are the model time scaled by
REPETITION_SPREAD, whose median is exactly 1: the median time is the model time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from mhapy import schema
from mhapy.problem import Shape, flops

TOOLS = Path(__file__).resolve().parent.parent
ROOT = TOOLS.parent


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(TOOLS))


def run_python(code: str, *args) -> subprocess.CompletedProcess:
    """`python3 -c CODE ARGS` with the package on PYTHONPATH, as the scripts set it."""
    command = [sys.executable, "-c", code, *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=_env())


def run_module(module: str, *args, without_torch: bool = False) -> subprocess.CompletedProcess:
    """`python3 -m MODULE ARGS` as the scripts run it (PYTHONPATH=tools); without_torch: as on a
    machine without python3-torch (`import torch` fails)."""
    if without_torch:
        hide = "import runpy, sys; sys.modules['torch'] = None; "
        return run_python(f"{hide}runpy.run_module({module!r}, run_name='__main__', alter_sys=True)", *args)
    command = [sys.executable, "-m", module, *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=_env())


REPETITION_SPREAD = (0.99, 1.0, 1.01)
HEADS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96)


def bench_name(backend: str, form: str, s: Shape, threads: int) -> str:
    """The name mha_bench gives a benchmark (mha::to_string's order), written here, not by
    Shape.problem_suffix, so the tests compare the reader with an independent writer."""
    flags = "".join(
        f"/{f}"
        for f, on in (("noncausal", not s.causal), ("qkv_bias", s.qkv_bias), ("no_out_proj", not s.out_proj))
        if on
    )
    past = f"/past{s.past}" if s.past else ""
    kvh = f"/kvh{s.n_kv_heads}" if s.n_kv_heads else ""
    kvh += f"/w{s.window}" if s.window else ""
    precision = "" if s.precision == "fp32" else f"/{s.precision}"
    precision += f"/kv_{s.kv_precision}" if s.kv_precision else ""
    return (
        f"mha/{backend}/{form}/b{s.batch}/t{s.seq_len}{past}/din{s.d_in}/dout{s.d_out}/h{s.n_heads}"
        f"{kvh}{flags}{precision}/threads:{threads}/real_time"
    )


def entries(
    backend,
    form,
    s: Shape,
    threads,
    seconds,
    spread=REPETITION_SPREAD,
    unit="ms",
    aggregates=True,
    label="checked",
):
    """The JSON entries of one benchmark: one iteration entry per repetition (+ aggregates)."""
    name = bench_name(backend, form, s, threads)
    scale = {"ns": 1e9, "us": 1e6, "ms": 1e3, "s": 1.0}[unit]
    times = [seconds * f for f in spread]
    out = []
    for i, t in enumerate(times):
        out.append(
            {
                "name": name,
                "family_index": 0,
                "per_family_instance_index": 0,
                "run_name": name,
                "run_type": "iteration",
                "repetitions": len(times),
                "repetition_index": i,
                "threads": 1,
                "iterations": 10,
                "real_time": t * scale,
                "cpu_time": t * scale,
                "time_unit": unit,
                **schema.counters(s, form, threads, t),
                "label": label,
            }
        )
    if aggregates and len(times) > 1:
        mean, median, stdev = statistics.fmean(times), statistics.median(times), statistics.stdev(times)
        for agg, value, agg_unit in (
            ("mean", mean, "time"),
            ("median", median, "time"),
            ("stddev", stdev, "time"),
            ("cv", stdev / mean, "percentage"),
        ):
            out.append(
                {
                    "name": f"{name}_{agg}",
                    "run_name": name,
                    "run_type": "aggregate",
                    "repetitions": len(times),
                    "threads": 1,
                    "aggregate_name": agg,
                    "aggregate_unit": agg_unit,
                    "iterations": len(times),
                    "real_time": value * (1 if agg == "cv" else scale),
                    "cpu_time": value * (1 if agg == "cv" else scale),
                    "time_unit": unit,
                    # As Google Benchmark: each counter is the statistic over the repetitions
                    # (constant shape counters: their mean, median, then 0 for stddev and cv).
                    **{
                        k: v if agg in ("mean", "median") else 0
                        for k, v in schema.shape_counters(s, threads).items()
                    },
                }
            )
    return out


def skipped(backend, form, s: Shape, threads, message="skipped: estimated 412 s exceeds the time budget"):
    name = bench_name(backend, form, s, threads)
    return {
        "name": name,
        "run_name": name,
        "run_type": "iteration",
        "error_occurred": True,
        "error_message": message,
    }


CONTEXT = {
    "date": "2026-11-21T10:00:00+00:00",
    "host_name": "testhost",
    "num_cpus": 2,
    "mhz_per_cpu": 3700,
    "cpu_scaling_enabled": False,
    "caches": [{"type": "Data", "level": 1, "size": 32768, "num_sharing": 1}],
    "load_avg": [0.5, 0.4, 0.3],
    "library_build_type": "debug",
    "mha_preset": "heads",
    "cpu_model": "Synthetic CPU",
    "mha_fma_peak_isa": "avx512",
    "mha_fma_peak_gflops_one_core": "100.0",
    "mha_fma_peak_gflops_all_cores": "200.0",
    "mha_fma_peak_threads": "2",
    "mha_fma_peak_gflops_one_core_avx2": "99.0",
}


def write(path: Path, benchmarks: list, context: dict | None = None) -> Path:
    path.write_text(
        json.dumps({"context": CONTEXT if context is None else context, "benchmarks": benchmarks})
    )
    return path


def d_model_series(d=768, batch=4, seq=256):
    return [Shape(batch, seq, d, d, h) for h in HEADS if d % h == 0]


def head_dim_series(hd=64, batch=1, seq=128):
    return [Shape(batch, seq, hd * h, hd * h, h) for h in HEADS]


# The heads-preset model used by several tests. Rates in GFLOP/s on 1 thread; 2 threads are
# 1.8x faster. split/wrapper speedup = 1 + H/16 for xsimd, 1 for naive, 0.8 for torch.
SPLIT_RATE = {"naive": 2.0, "xsimd": 50.0, "torch": 40.0, "torch_nn_mha": 45.0}


def speedup_model(backend: str, h: int) -> float:
    return {"naive": 1.0, "xsimd": 1 + h / 16, "torch": 0.8}[backend]


def model_seconds(backend: str, form: str, s: Shape, threads: int) -> float:
    t = flops(s) / (SPLIT_RATE[backend] * 1e9)
    if form == "wrapper":
        t *= speedup_model(backend, s.n_heads)
    return t / (1.8 if threads == 2 else 1.0)


def heads_run(backends=("naive", "xsimd"), threads=(1, 2), shapes=None):
    shapes = shapes or d_model_series() + head_dim_series()
    out = []
    for b in backends:
        forms = ("split_weight",) if b == "torch_nn_mha" else ("split_weight", "wrapper")
        for form in forms:
            for s in shapes:
                for n in threads:
                    out += entries(b, form, s, n, model_seconds(b, form, s, n))
    return out


def peak_entries(isa: str, gflops: list[float], threads: int = 1, at: int = 0, aggregates=True) -> list:
    """mha_bench's peak/<isa>/threads:<n>/at:<k> entries: one per repetition (GFLOPS = best of
    the trials, GFLOPS_min = 0.95 of it), plus a mean aggregate carrying a misleading value."""
    name = f"peak/{isa}/threads:{threads}/at:{at}/iterations:1"
    out = [
        {
            "name": name,
            "run_name": name,
            "run_type": "iteration",
            "repetitions": len(gflops),
            "real_time": 100.0,
            "time_unit": "ms",
            "GFLOPS": g,
            "GFLOPS_min": 0.95 * g,
        }
        for g in gflops
    ]
    if aggregates:
        out.append(
            {
                "name": name + "_mean",
                "run_name": name,
                "run_type": "aggregate",
                "aggregate_name": "mean",
                "real_time": 100.0,
                "time_unit": "ms",
                "GFLOPS": 10 * max(gflops),  # ignored: aggregates are not peaks
            }
        )
    return out


# Streaming-read bandwidth, as mha_bench measures it (GB/s): 40 on one thread, 70 on two.
STREAM_CONTEXT = {
    "mha_stream_read_gbps_one_core": "40.00",
    "mha_stream_read_gbps_all_cores": "70.00",
    "mha_stream_read_threads": "2",
    "mha_stream_read_trials_one_core": "40.00,39.10,38.70",
}
BANDWIDTH = {1: 40e9, 2: 70e9}


def decode_shapes(batches=(1, 8), pasts=(128, 512, 2048), d=768, heads=12):
    """The decode preset's shapes: T = 1 after `past` cached tokens."""
    return [Shape(b, 1, d, d, heads, past=p) for b in batches for p in pasts]


def isa_context(dispatch="avx512", overrides="", **peaks) -> dict:
    """A context as mha_bench writes it since issue 12: per-ISA peaks (keyword one_<isa> /
    all_<isa> / trials_<isa>), backends' ISAs (xsimd, onednn: avx512 or avx2 as dispatched;
    naive: portable), dispatch and overrides."""
    context = dict(CONTEXT, mha_cpu_model="Synthetic CPU", mha_hardware_threads="2")
    context.update(mha_dispatch=dispatch, mha_isa_overrides=overrides)
    for backend in ("xsimd", "onednn"):
        context[f"mha_backend_{backend}_isa"] = dispatch
        context[f"mha_backend_{backend}_peak_isa"] = dispatch
    context["mha_backend_naive_isa"] = "scalar"
    context["mha_backend_naive_peak_isa"] = "portable"
    for key, value in peaks.items():
        kind, isa = key.split("_", 1)
        name = {"one": "one_core", "all": "all_cores", "trials": "trials_one_core"}[kind]
        prefix = "mha_fma_peak_trials" if kind == "trials" else "mha_fma_peak_gflops"
        name = name.replace("trials_", "")
        context[f"{prefix}_{name}_{isa}"] = str(value)
    return context
