#!/usr/bin/env bash
# Fuzzes the file parsers: builds the libFuzzer targets (clang-14, ASan + UBSan) in a separate
# build directory and runs each for SECONDS seconds (default 60) on a corpus seeded from the
# PyTorch goldens (tests/golden) and from inputs that once failed (tests/fuzz/regressions/<target>).
# Prints one line per target: executions, corpus size, result. Exits non-zero on a crash, leak or
# violated property; the input is kept in <build>/artifacts (add it to the regressions).
#   MHA_FUZZ_BUILD_DIR  build directory (default: build/fuzz); its corpus/ grows across runs
set -euo pipefail
seconds=${1:-60}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MHA_FUZZ_BUILD_DIR:-$root/build/fuzz}
targets=(safetensors npy state_dict)

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++-14 -DMHA_FUZZ=ON -DMHA_BUILD_TESTS=OFF -DMHA_BUILD_BENCH=OFF \
  -DMHA_BACKEND_XSIMD=OFF -DMHA_BACKEND_ONEDNN=OFF -DMHA_BACKEND_TBB=OFF >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]/#/fuzz_}"

mkdir -p "$build/artifacts" "$build/logs"
failed=0
for target in "${targets[@]}"; do
  corpus=$build/corpus/$target
  mkdir -p "$corpus"
  if [[ $target == npy ]]; then
    cp "$root"/tests/golden/*.npy "$corpus"/
    dict=$root/tests/fuzz/npy.dict
  else
    cp "$root"/tests/golden/*.safetensors "$corpus"/
    dict=$root/tests/fuzz/safetensors.dict
  fi
  if [[ -d $root/tests/fuzz/regressions/$target ]]; then
    cp "$root"/tests/fuzz/regressions/"$target"/* "$corpus"/
  fi
  log=$build/logs/$target.log
  status=0
  "$build/tests/fuzz/fuzz_$target" "$corpus" -dict="$dict" -max_total_time="$seconds" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$target-" >"$log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  files=$(find "$corpus" -type f | wc -l)
  if ((status == 0)); then
    echo "fuzz_$target: ${runs:-?} executions in ${seconds} s, corpus $files inputs, no failure"
  else
    echo "fuzz_$target: FAILED (exit $status) after ${runs:-?} executions; see $log" >&2
    grep -E "^(==[0-9]+==ERROR|SUMMARY|property violated)|runtime error" "$log" | head -5 >&2 || true
    failed=1
  fi
done
exit "$failed"
