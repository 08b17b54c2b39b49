"""Smoke test of mha_bench: one tiny shape, every built backend and formulation, through the
real binary. Checks the JSON's names, counters and context, and that the check and the budget
skip what they must. The counters, context keys and FLOP count it expects are mhapy's (schema,
problem): what the report and the PyTorch peers read and write. Standard library only (run by
ctest with /usr/bin/python3 and PYTHONPATH=tools).

usage: bench_smoke.py MHA_BENCH WORK_DIR
"""

import json
import os
import re
import subprocess
import sys

from mhapy import schema
from mhapy.problem import Shape, flops

B, T, D, H = 2, 16, 32, 2
SHAPE = ["--batch", str(B), "--seq", str(T), "--d-model", str(D), "--heads", str(H)]
COUNTERS = (
    schema.GFLOPS,
    schema.TOKENS_PER_S,
    *schema.SHAPE_COUNTERS,
    schema.THREADS_COUNTER,
    *schema.CHECK_COUNTERS,
)
PEAK_ISAS = {"avx512", "avx2", "portable"}


def run(binary, out, *extra):
    """Runs mha_bench on the tiny shape; returns (exit code, stderr, parsed JSON)."""
    args = [
        binary,
        *SHAPE,
        "--benchmark_min_time=0.01",
        f"--benchmark_out={out}",
        "--benchmark_out_format=json",
        *extra,
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    with open(out) as f:
        return done.returncode, done.stderr, json.load(f)


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


def check_measured(result):
    code, stderr, data = result
    expect(code == 0, f"exit code {code}: {stderr}")
    context = data["context"]
    for key in schema.MHA_BENCH_CONTEXT:
        expect(key in context, f"context lacks {key}")
    version = context[schema.SCHEMA_VERSION_KEY]
    expect(
        version == str(schema.SCHEMA_VERSION), f"schema version {version}, mhapy's is {schema.SCHEMA_VERSION}"
    )
    expect(float(context["mha_fma_peak_gflops_one_core"]) > 0, "no one-core peak")
    expect(float(context["mha_fma_peak_gflops_all_cores"]) > 0, "no all-cores peak")
    expect("benchmark 1.7" in context["mha_library_versions"], context["mha_library_versions"])
    backends = context["mha_backends"].split(",")
    expect("naive" in backends, f"naive missing from {backends}")

    peak_isas = set()
    for backend in backends:
        expect(context[f"mha_backend_{backend}_isa"], f"no ISA recorded for {backend}")
        peak_isa = context[f"mha_backend_{backend}_peak_isa"]
        expect(peak_isa in PEAK_ISAS, f"{backend}: peak ISA {peak_isa}")
        expect(float(context[f"mha_fma_peak_gflops_one_core_{peak_isa}"]) > 0, f"no {peak_isa} peak")
        trials = [float(t) for t in context[f"mha_fma_peak_trials_one_core_{peak_isa}"].split(",")]
        expect(
            len(trials) >= 3 and max(trials) == float(context[f"mha_fma_peak_gflops_one_core_{peak_isa}"]),
            f"{peak_isa} trials {trials}",
        )
        peak_isas.add(peak_isa)
    expect(context["mha_backend_naive_isa"] == "scalar", "naive's ISA")

    seen, peak_entries = set(), set()
    for b in data["benchmarks"]:
        name = b["name"]
        expect(not b.get("error_occurred"), f"{name}: {b.get('error_message')}")
        peak = re.fullmatch(r"peak/(\w+)/threads:1/at:([012])(/iterations:1)?", name)
        if peak:
            expect(b["GFLOPS"] >= b["GFLOPS_min"] > 0, f"{name}: {b['GFLOPS']} {b['GFLOPS_min']}")
            peak_entries.add((peak.group(1), int(peak.group(2))))
            continue
        m = re.fullmatch(
            rf"mha/(\w+)/(wrapper|split_weight|fused_qkv)/b{B}/t{T}/din{D}/dout{D}/h{H}"
            r"/threads:(\d+)/real_time",
            name,
        )
        expect(m, f"unexpected name {name}")
        backend, form, threads = m.group(1), m.group(2), int(m.group(3))
        seen.add((backend, form))
        for c in COUNTERS:
            expect(c in b, f"{name} lacks counter {c}")
        expected = schema.shape_counters(Shape(B, T, D, D, H), threads)
        expect({c: b[c] for c in expected} == expected, f"{name}: shape counters")
        max_threads = int(context[f"mha_backend_{backend}_max_threads"])
        expect(1 <= threads <= max_threads, f"{name}: threads")
        expect(b["label"].startswith("series="), f"{name}: label {b.get('label')}")
        expect(b["time_unit"] == "ms", f"{name}: time unit")
        seconds = b["real_time"] * 1e-3
        expect(
            abs(b["GFLOPS"] - flops(Shape(B, T, D, D, H)) * 1e-9 / seconds) <= 1e-6 * b["GFLOPS"],
            f"{name}: GFLOPS {b['GFLOPS']} is not model FLOPs / real_time",
        )
        expect(abs(b["tokens_per_s"] - B * T / seconds) <= 1e-6 * b["tokens_per_s"], f"{name}: tokens_per_s")
        expect(b["check_rows"] == 8, f"{name}: {b['check_rows']} rows checked")
        expect(b["check_rel_err"] <= float(context["mha_check_tolerance"]), f"{name}: check")
    for backend in backends:
        for form in ("wrapper", "split_weight", "fused_qkv"):
            expect((backend, form) in seen, f"no benchmark of {backend} {form}")
    expect(
        peak_entries == {(isa, at) for isa in peak_isas for at in (0, 1, 2)},
        f"peak entries {sorted(peak_entries)} for ISAs {sorted(peak_isas)}",
    )
    expect(re.search(r"\[1/\d+\] mha/\S+  ETA ", stderr), f"no progress line in: {stderr}")


def check_all_skipped(result, code, message):
    got, stderr, data = result
    expect(got == code, f"exit code {got}, expected {code}: {stderr}")
    expect(data["benchmarks"], "no benchmarks")
    for b in data["benchmarks"]:
        if b["name"].startswith("peak/"):
            continue
        expect(
            b.get("error_occurred") and b["error_message"].startswith(message),
            f"{b['name']}: expected '{message}...', got {b.get('error_message')}",
        )


def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    check_measured(run(binary, os.path.join(work, "measured.json")))
    # No float32 result is within 1e-30 of the double oracle: every check must fail, exit 1.
    check_all_skipped(
        run(binary, os.path.join(work, "wrong.json"), "--quiet", "--tolerance=1e-30"), 1, "wrong result"
    )
    check_all_skipped(
        run(binary, os.path.join(work, "budget.json"), "--quiet", "--budget=1e-12"), 0, "over budget"
    )
    print("bench_smoke: passed")


if __name__ == "__main__":
    main()
