"""The names of mha's result files that more than one part of mha's Python writes or reads: the
counters of an attention benchmark, the backends that are peers, and the context keys
mha_bench writes (bench/README.md says what each means). Standard library only.

mha_bench writes these (C++); mhapy.peers writes the same counters for the peers;
mhapy.report reads them and checks the shape counters against the benchmark's name;
tests/bench/bench_smoke.py checks that mha_bench writes every one.
"""

from __future__ import annotations

from .problem import INT8_SCALE_BYTES, Shape, decode_bytes, flops

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

# The version of the result files' schema (the context's keys and what they mean), which
# mha_bench and mhapy.peers write as the context's SCHEMA_VERSION_KEY; bump it with a change a
# reader must know of, and teach upgraded_context the step from the version before.
#   1  (files without the key) written before it: an mha_bench file may lack mha_dispatch and
#      the per-ISA peak keys (its plain peak keys were measured at mha_fma_peak_isa); a peers'
#      file may lack mha_peers.
#   2  every mha_bench file has mha_dispatch and mha_fma_peak_gflops_{one_core,all_cores}_<isa>
#      for mha_fma_peak_isa; every peers' file mha_peers.
#   3  bytes_min of a step over an int8 cache counts mha's rows as head_dim + 4 bytes (a bf16
#      scale and an int16 zero; head_dim + 8 before, when mha kept two fp32) and OpenVINO's u8
#      rows as head_dim + 8. Each file's counters stand for the cache it measured, so a file of
#      version 2 reads as it is.
SCHEMA_VERSION = 3
SCHEMA_VERSION_KEY = "mha_schema_version"

# Keys every mha_bench result file's context has (per-backend and per-ISA keys aside).
MHA_BENCH_CONTEXT = (
    SCHEMA_VERSION_KEY,
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


def counters(
    shape: Shape, formulation: str, threads: int, seconds: float, scale_bytes: int = INT8_SCALE_BYTES
) -> dict[str, float]:
    """Every counter of one repetition that took `seconds`, as mha_bench writes them (without
    its check counters); an incremental call's (past > 0) with bytes_min and GBps_min, which
    depend on the formulation (the wrapper caches every head's keys and values) and, with an
    int8 cache, on the bytes its rows keep beyond their codes (problem.INT8_SCALE_BYTES for mha's)."""
    rates = {GFLOPS: flops(shape) / seconds * 1e-9, TOKENS_PER_S: shape.batch * shape.seq_len / seconds}
    if shape.is_decode:
        bytes_min = decode_bytes(shape, formulation, scale_bytes)
        rates |= {BYTES_MIN: bytes_min, GBPS_MIN: bytes_min / seconds * 1e-9}
    return rates | shape_counters(shape, threads)


class SchemaError(ValueError):
    """A result file whose schema version this mhapy cannot read."""


def upgraded_context(context: dict, backends: set[str], source: str) -> dict:
    """`context` (of the result file `source`, whose benchmarks ran `backends`) in the current
    schema: a file of SCHEMA_VERSION as it is, an older one upgraded step by step (the one place
    that knows older files), a newer one or a version that is not a number refused naming it."""
    raw = context.get(SCHEMA_VERSION_KEY, 1)
    try:
        version = int(raw)
    except (TypeError, ValueError):
        raise SchemaError(f"{source}: context {SCHEMA_VERSION_KEY} {raw!r} is not a version number") from None
    if version > SCHEMA_VERSION or version < 1:
        raise SchemaError(
            f"{source}: schema version {version}; this mhapy reads versions 1 to {SCHEMA_VERSION} (a newer "
            "mha wrote it: read it with that mha's tools/mhapy)"
        )
    context = dict(context)
    if version == 1:
        _upgrade_from_1(context, backends)
    context[SCHEMA_VERSION_KEY] = SCHEMA_VERSION
    return context


def _upgrade_from_1(context: dict, backends: set[str]) -> None:
    peers = "mha_peers" in context or (bool(backends) and all(map(is_peer, backends)))
    if "mha_peers" not in context and peers:
        context["mha_peers"] = ",".join(sorted({peer_library(b) for b in backends}))
    if not peers and not context.get("mha_dispatch"):
        # The xsimd backend's description named the ISA it dispatched to ("avx512bw", ...).
        described = " ".join(
            str(v)
            for k, v in sorted(context.items())
            if k.startswith("mha_backend_") and k.endswith("_description")
        ).lower()
        found = next((isa for isa in ("avx512", "avx2", "sse2", "neon") if isa in described), None)
        context["mha_dispatch"] = found or str(context.get("mha_fma_peak_isa") or "native")
    isa = context.get("mha_fma_peak_isa")
    for key in ("mha_fma_peak_gflops_one_core", "mha_fma_peak_gflops_all_cores"):
        if isa and key in context and f"{key}_{isa}" not in context:
            context[f"{key}_{isa}"] = context[key]
