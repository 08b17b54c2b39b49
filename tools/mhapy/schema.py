"""The names of mha's result files that more than one part of mha's Python writes or reads: the
counters of an attention benchmark, the backends that are peers, and the context keys
mha_bench writes (bench/README.md says what each means). Standard library only.

mha_bench writes these (C++); mhapy.peers writes the same counters for the peers;
mhapy.report reads them and checks the shape counters against the benchmark's name;
tests/bench/bench_smoke.py checks that mha_bench writes every one.
"""

from __future__ import annotations

from .problem import Shape, decode_bytes, flops

# Counters restating the benchmark's shape, with the Shape field each holds. (`past` is 0 on a
# full forward pass; grouped K/V heads and the precision are in the name only.)
SHAPE_COUNTERS = {
    "B": "batch",
    "T": "seq_len",
    "d_in": "d_in",
    "d_out": "d_out",
    "H": "n_heads",
    "head_dim": "head_dim",
    "past": "past",
}
# The run's thread count. Not "threads": that is Google Benchmark's own field (always 1 here,
# each benchmark runs on one Google Benchmark thread).
THREADS_COUNTER = "n_threads"
# Model GFLOP per second of real time (mhapy.problem.flops / 1e9), and B·T per second.
GFLOPS = "GFLOPS"
TOKENS_PER_S = "tokens_per_s"
# Incremental calls (past > 0) only: the least bytes one call reads (problem.decode_bytes), and
# those bytes per second of real time, GB/s.
BYTES_MIN = "bytes_min"
GBPS_MIN = "GBps_min"
# The check against the double oracle before timing: mha_bench writes all three; the peers
# check_rows and check_rel_err, with check_tolerance (their tolerance depends on the precision).
CHECK_COUNTERS = ("check_rows", "check_max_err", "check_rel_err")

# Backends whose names start with one of these are peers (mhapy.peers writes them), by library:
# ranked beside mha's backends, never recommended for linking.
PEER_LIBRARIES = {
    "torch": "PyTorch",
    "openvino": "OpenVINO",
    "onnxruntime": "ONNX Runtime",
    "py_": "mha from Python",  # mha itself through its Python package (peers/mha_python.py)
}
# mha itself called from Python: ranked as a peer library's row (never linkable), but never the
# best peer an mha backend is compared with (it is mha, plus the Python layer).
MHA_FROM_PYTHON_PREFIX = "py_"
PEER_BACKEND_PREFIXES = tuple(PEER_LIBRARIES)

# mha_bench's measured streaming-read bandwidth (GB/s): one thread, and `threads` threads at
# once; every one-thread trial. The bound of a decode step is bytes_min / the figure of its
# thread count.
STREAM_ONE_CORE = "mha_stream_read_gbps_one_core"
STREAM_ALL_CORES = "mha_stream_read_gbps_all_cores"
STREAM_THREADS = "mha_stream_read_threads"
STREAM_TRIALS = "mha_stream_read_trials_one_core"

# Keys every mha_bench result file's context has (per-backend and per-ISA keys aside).
MHA_BENCH_CONTEXT = (
    "mha_version",
    "mha_cpu_model",
    "mha_cpu_isa",
    "mha_hardware_threads",
    "mha_compiler",
    "mha_build_type",
    "mha_cxx_flags",
    "mha_library_versions",
    "mha_fma_peak_isa",
    "mha_fma_peak_threads",
    "mha_preset",
    "mha_series",
    "mha_backends",
    "mha_formulations",
    "mha_budget_s",
    "mha_over_budget",
    "mha_check",
    "mha_check_tolerance",
    "mha_check_tolerance_bf16",
    "mha_command",
    "mha_dispatch",
    "mha_isa_overrides",
    STREAM_ONE_CORE,
    STREAM_ALL_CORES,
    STREAM_THREADS,
    STREAM_TRIALS,
)


def is_peer(backend: str) -> bool:
    """True for a peer library's backend (torch_sdpa, openvino_u8kv, ...), not an mha backend."""
    return backend.startswith(PEER_BACKEND_PREFIXES)


def is_rival(backend: str) -> bool:
    """True for a peer that is another library (not mha from Python): what mha is compared with."""
    return is_peer(backend) and not backend.startswith(MHA_FROM_PYTHON_PREFIX)


def peer_library(backend: str) -> str:
    """The library a peer backend belongs to: "PyTorch", "OpenVINO", "ONNX Runtime"."""
    return next(name for prefix, name in PEER_LIBRARIES.items() if backend.startswith(prefix))


def shape_counters(shape: Shape, threads: int) -> dict[str, int]:
    """The counters that restate a benchmark's name: B, T, d_in, d_out, H, head_dim, past,
    n_threads."""
    counters = {name: getattr(shape, field) for name, field in SHAPE_COUNTERS.items()}
    return counters | {THREADS_COUNTER: threads}


def counters(shape: Shape, formulation: str, threads: int, seconds: float) -> dict[str, float]:
    """Every counter of one repetition that took `seconds`, as mha_bench writes them (without
    its check counters); an incremental call's (past > 0) with bytes_min and GBps_min, which
    depend on the formulation (the wrapper caches every head's keys and values)."""
    rates = {GFLOPS: flops(shape) / seconds * 1e-9, TOKENS_PER_S: shape.batch * shape.seq_len / seconds}
    if shape.is_decode:
        bytes_min = decode_bytes(shape, formulation)
        rates |= {BYTES_MIN: bytes_min, GBPS_MIN: bytes_min / seconds * 1e-9}
    return rates | shape_counters(shape, threads)
