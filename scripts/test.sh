#!/usr/bin/env bash
# The test command: installs what is missing (the peers' Python environment included:
# scripts/peers-env.sh), builds the test configuration (Release, every backend whose dependency
# is present, the Python package's extension for the peers' Python), runs every test with ctest
# (the Python package's pytest and a `pip install .` among them), runs the suite again under
# AddressSanitizer + UndefinedBehaviorSanitizer and the concurrency tests under
# ThreadSanitizer, runs the fleet scripts on a single-host Slurm cluster (scripts/fleet/test-slurm.sh:
# as root; it says why when it is skipped), then fuzzes each file parser for a few seconds
# (scripts/fuzz.sh; longer runs: scripts/fuzz.sh SECONDS). The formatting check
# (scripts/format.sh --check) and the house's rules (scripts/check-structure.py) run after
# ctest; their failure fails the command at the end. At its end, passed or not, it prints the
# seconds each phase took.
#   MHA_TEST_BUILD_DIR     build directory (default: build/test); the sanitizer builds go next
#                          to it (<dir>/../asan, <dir>/../tsan unless MHA_TEST_ASAN_DIR /
#                          MHA_TEST_TSAN_DIR say otherwise)
#   MHA_TEST_SANITIZERS    0 to skip the sanitizer runs (default: 1)
#   MHA_TEST_FUZZ_SECONDS  seconds per fuzz target (default: 5)
#   MHA_TEST_SLURM         0 to skip the Slurm test (default: 1)
#   MHA_TEST_AARCH64       1 to run scripts/test-aarch64.sh at the end too (default: 0: it took
#                          12.5-21 minutes on a 2-core x86-64 host, most of it the suite under
#                          qemu-user, a fresh machine's toolchain install and cold cross-build
#                          aside: past the quarter hour this command keeps for it within CI's
#                          90 minutes; docs/aarch64.md)
set -euo pipefail
start=$SECONDS
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MHA_TEST_BUILD_DIR:-$root/build/test}
asan=${MHA_TEST_ASAN_DIR:-$(dirname "$build")/asan}
tsan=${MHA_TEST_TSAN_DIR:-$(dirname "$build")/tsan}
jobs=$(nproc)
# Seconds per phase, printed as a table when the command ends (passed or not): where CI's time
# goes.
phases=()
mark=$SECONDS
phase() {
  phases+=("$((SECONDS - mark)) $1")
  mark=$SECONDS
}
phase_table() {
  echo "test.sh: seconds per phase:"
  for p in "${phases[@]}"; do printf '  %6s  %s\n' "${p%% *}" "${p#* }"; done
}
trap phase_table EXIT

"$root/scripts/deps.sh"
phase "install missing packages (deps.sh)"
# The peers' environment (PyTorch, OpenVINO, ONNX Runtime) for their tests; without it those
# tests say SKIPPED and why, and the rest runs.
"$root/scripts/peers-env.sh" || echo "test.sh: the peers' tests will be skipped (above: why)"
# OpenVINO through optimum-intel, the whole-model peer, in its own environment (it needs an older
# transformers); without it, its test in the models bench's says SKIPPED.
"$root/scripts/peers-env.sh" optimum || echo "test.sh: the optimum-intel test will be skipped (above: why)"
phase "the peers' environments (peers-env.sh)"

# The Python package's extension, for the peers' environment's Python, where it has nanobind
# (scripts/peers-env.sh puts an environment there only once complete). Without one, the
# extension is off even where an earlier run of this build turned it on, so that its tests say
# SKIPPED rather than fail on a Python that is gone.
peers_python=${MHA_PEERS_VENV:-$root/build/peers-venv}/bin/python
if [[ -x $peers_python ]] && "$peers_python" -c "import nanobind" 2>/dev/null; then
  python_args=(-DMHA_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$peers_python")
else
  python_args=(-DMHA_BUILD_PYTHON=OFF)
  echo "test.sh: the Python package's tests will be skipped (no peers' environment with nanobind)"
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${python_args[@]}"
cmake --build "$build" --parallel "$jobs"
phase "configure and build ($build)"
ctest --test-dir "$build" --output-on-failure --parallel "$jobs"
phase "ctest"

# The formatting check (clang-format, ruff: scripts/format.sh formats) and the house's rules
# (scripts/check-structure.py: file length, intrinsics only in arch/, one ISA list, includes
# pointing down); a failure fails the command at the end, after the other tests have run.
format_ok=1
"$root/scripts/format.sh" --check || format_ok=0
structure_ok=1
/usr/bin/python3 "$root/scripts/check-structure.py" | tail -n 1 || structure_ok=0
phase "format check and house rules"

# The fleet sweep (scripts/fleet/) as a user submits it, on a real Slurm cluster of this host:
# a two-shard job array and the report job after it. Needs root and Debian's slurm-wlm and
# munge (installed when missing); prints SKIPPED and why otherwise. About 30 s.
if [[ -x $build/bench/mha_bench ]]; then
  "$root/scripts/fleet/test-slurm.sh" --bench "$build/bench/mha_bench"
else
  echo "fleet-slurm-test: SKIPPED: no mha_bench in $build (Google Benchmark not found?)"
fi
phase "fleet scripts on Slurm"

if [[ ${MHA_TEST_SANITIZERS:-1} != 0 ]]; then
  # Both sanitizer builds: line tables only (-g1: a report's frames keep their files and lines)
  # and -O1, but for the ISA kernels, which are built at -O2 in every build type
  # (src/kernels/CMakeLists.txt). -O2 -g's variable tracking over the instrumented kernels made the
  # ASan build most of this command's time. On the 2-vCPU Xeon without ccache: one AMX kernel
  # object 449 s at -O2 -g, 270 s at -O2 -g1 (63 s at -O1 -g1, which the kernels may not take);
  # the whole ASan build 824 s (about 1,690 s at -O2 -g, in a run that shared the CPU), its run
  # 504 s (510 s at -O2 -g). Every ASan check a call instead (--param
  # asan-instrumentation-with-call-threshold=0): that build 512 s, but its run past 1,000 s against
  # 524-581 s, so not taken: with a warm ccache the build is a small part, and the run is paid
  # every time.
  sanitized=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
    -DMHA_BUILD_BENCH=OFF)
  # ASan + UBSan, any finding fatal: the unit, bad-input, io, command and conformance tests (the
  # conformance suite runs every xsimd ISA in-process, so the capped-dispatch reruns, the
  # install test, the benchmark and the Python tests are left to the Release run). As $jobs
  # gtest shards of one process each, not a process per test: an instrumented process takes
  # ~0.5 s of CPU to start and end (leak check included), which made 4000 tests ~30 minutes.
  cmake -S "$root" -B "$asan" "${sanitized[@]}" \
    "-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" >/dev/null
  cmake --build "$asan" --parallel "$jobs" --target mha_tests mha_cli
  shard_pids=()
  for ((shard = 0; shard < jobs; ++shard)); do
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
      OMP_WAIT_POLICY=PASSIVE GTEST_TOTAL_SHARDS=$jobs GTEST_SHARD_INDEX=$shard \
      "$asan/tests/mha_tests" --gtest_brief=1 >"$asan/shard-$shard.log" 2>&1 &
    shard_pids+=($!)
  done
  asan_failed=0
  for ((shard = 0; shard < jobs; ++shard)); do
    if ! wait "${shard_pids[$shard]}"; then
      asan_failed=1
      echo "test.sh: ASan + UBSan shard $((shard + 1))/$jobs failed ($asan/shard-$shard.log):" >&2
      # What failed, wherever it is in the log (a sanitizer's report at exit comes before the
      # last of the tests' buffered output), then the log's end.
      grep -E -A12 '^\[  FAILED  \]|ERROR: (Address|Leak)Sanitizer|runtime error:|^SUMMARY:' \
        "$asan/shard-$shard.log" | head -n 80 >&2 || true
      tail -n 20 "$asan/shard-$shard.log" >&2
    fi
    grep -E '^\[(==========|  PASSED  )\]' "$asan/shard-$shard.log" || true
  done
  ((asan_failed == 0)) || exit 1
  phase "ASan + UBSan build and run"

  # TSan on the tests that share a plan, primitive cache or output file between threads. Not on
  # the tbb backend's: Debian's libtbb is not instrumented, so TSan misses the synchronisation
  # at a task's end and reports every output a TBB worker wrote as a race with the caller's read,
  # in mha's own frames, where no suppression can tell it from a real one (tests/tsan.supp).
  cmake -S "$root" -B "$tsan" "${sanitized[@]}" \
    "-DCMAKE_CXX_FLAGS=-fsanitize=thread" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread" >/dev/null
  cmake --build "$tsan" --parallel "$jobs" --target mha_concurrency_tests
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$root/tests/tsan.supp" \
    "$tsan/tests/mha_concurrency_tests" \
    --gtest_filter='*Concurrent*:*OnednnPlan.*:-*tbb*:*Tbb*' --gtest_brief=1
  phase "TSan build and run"
fi

"$root/scripts/fuzz.sh" "${MHA_TEST_FUZZ_SECONDS:-5}"
phase "fuzzing the parsers"

if [[ ${MHA_TEST_AARCH64:-0} != 0 ]]; then
  "$root/scripts/test-aarch64.sh"
  phase "aarch64 under qemu"
fi

if ((!format_ok)); then
  echo "test.sh: the formatting check failed (above): scripts/format.sh formats the tree" >&2
fi
if ((!structure_ok)); then
  echo "test.sh: the house's rules failed (above: scripts/check-structure.py names each file and rule)" >&2
fi
((format_ok && structure_ok)) || exit 1
echo "test.sh: passed in $((SECONDS - start)) s"
