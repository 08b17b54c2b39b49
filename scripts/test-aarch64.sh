#!/usr/bin/env bash
# The aarch64 build, cross-compiled on a Debian x86-64 host and tested under emulation: installs
# what is missing (the arm64 architecture in dpkg, Debian's cross compiler g++-aarch64-linux-gnu,
# qemu-user, and the arm64 builds of oneTBB, GoogleTest, Google Benchmark, xsimd and libgomp,
# which mha_tests links), builds with the toolchain file cmake/aarch64-linux-gnu.cmake, then under
# qemu-aarch64 runs the unit suite (mha_tests, as one gtest shard per core), `mha backends`,
# `mha verify`, the per-ISA symbol check, the README's API tour and the benchmark's checks, and
# prints its wall time and the suite's counts (passed, skipped with each reason). Speed under
# emulation is qemu's, not an Arm CPU's: nothing here times anything.
#   MHA_AARCH64_BUILD_DIR  build directory (default: build/aarch64)
# oneDNN is not built for aarch64 here: Debian's libdnnl-dev:arm64 cannot be installed beside the
# host's libdnnl-dev (each ships its own /usr/include/oneapi/dnnl/dnnl_config.h), so the
# cross-build finds no oneDNN and says so; naive, xsimd (NEON) and tbb are built and tested.
set -euo pipefail
start=$SECONDS
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MHA_AARCH64_BUILD_DIR:-$root/build/aarch64}
jobs=$(nproc)

sudo=()
if [[ "$(id -u)" -ne 0 ]]; then sudo=(sudo); fi
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "test-aarch64: adding the arm64 architecture to dpkg"
  "${sudo[@]}" dpkg --add-architecture arm64
  "${sudo[@]}" apt-get update -qq
fi
"$root/scripts/deps.sh" cmake ninja-build ccache nlohmann-json3-dev g++-aarch64-linux-gnu \
  qemu-user libxsimd-dev:arm64 libtbb-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64 \
  libbenchmark-dev:arm64 libgomp1:arm64

echo "test-aarch64: oneDNN is not built for aarch64 here: libdnnl-dev:arm64 cannot be installed" \
  "beside the host's libdnnl-dev (both ship /usr/include/oneapi/dnnl/dnnl_config.h)"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_TOOLCHAIN_FILE=$root/cmake/aarch64-linux-gnu.cmake"
cmake --build "$build" --parallel "$jobs"
build_done=$SECONDS

qemu=$(command -v qemu-aarch64)
export MHA_EMULATION="qemu-aarch64 $("$qemu" --version | head -n 1 | grep -Eo '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1) on $(uname -m)"
# The suite's command-line tests start `mha` under the emulator too (tests/support.hpp).
export MHA_TEST_EMULATOR=$qemu OMP_WAIT_POLICY=PASSIVE

echo "test-aarch64: mha backends, under $MHA_EMULATION"
"$qemu" "$build/src/cli/mha" backends | tee "$build/backends.txt"
grep -q "neon64" "$build/backends.txt" || { echo "test-aarch64: no neon64 build in mha backends" >&2; exit 1; }
echo "test-aarch64: mha verify"
"$qemu" "$build/src/cli/mha" verify | tail -n 1

# The unit suite, one shard of one process per core, each writing its results as XML.
suite_start=$SECONDS
pids=()
for ((shard = 0; shard < jobs; ++shard)); do
  GTEST_TOTAL_SHARDS=$jobs GTEST_SHARD_INDEX=$shard \
    "$qemu" "$build/tests/mha_tests" --gtest_brief=1 "--gtest_output=xml:$build/shard-$shard.xml" \
    >"$build/shard-$shard.log" 2>&1 &
  pids+=($!)
done
failed=0
for ((shard = 0; shard < jobs; ++shard)); do
  if ! wait "${pids[$shard]}"; then
    failed=1
    echo "test-aarch64: mha_tests shard $((shard + 1))/$jobs failed ($build/shard-$shard.log):" >&2
    grep -E -A12 '^\[  FAILED  \]' "$build/shard-$shard.log" | head -n 80 >&2 || true
    tail -n 20 "$build/shard-$shard.log" >&2
  fi
done
suite_seconds=$((SECONDS - suite_start))
# Counts and every skip's reason, from the shards' XML (GoogleTest 1.12: <skipped message=...>).
/usr/bin/python3 - "$build" "$jobs" <<'PY'
import collections, sys, xml.etree.ElementTree as ET
build, jobs = sys.argv[1], int(sys.argv[2])
counts, reasons = collections.Counter(), collections.Counter()
for shard in range(jobs):
    for case in ET.parse(f"{build}/shard-{shard}.xml").iter("testcase"):
        skipped = case.find("skipped")
        if skipped is not None:
            counts["skipped"] += 1
            reasons[(skipped.get("message") or "").split("\n")[-1].strip() or "(no reason)"] += 1
        elif case.find("failure") is not None:
            counts["failed"] += 1
        else:
            counts["passed"] += 1
print(f"test-aarch64: mha_tests: {counts['passed']} passed, {counts['skipped']} skipped, "
      f"{counts['failed']} failed")
for reason, n in reasons.most_common():
    print(f"  skipped {n}: {reason}")
PY
((failed == 0)) || exit 1

# The rest that means something under emulation: no per-ISA symbol shared across builds, the
# README's tour, the benchmarks' pre-timing checks (ctest starts the programs under qemu).
ctest --test-dir "$build" --output-on-failure --parallel "$jobs" \
  -R '^(xsimd_isa_symbols|readme_api_tour|bench_gemm_checks|bench_attention_checks)$'

echo "test-aarch64: passed in $((SECONDS - start)) s (build $((build_done - start)) s, mha_tests" \
  "under qemu $suite_seconds s)"
