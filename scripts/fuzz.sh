#!/usr/bin/env bash
# Fuzzes the file parsers: builds the libFuzzer targets (clang-14, ASan + UBSan) in a separate
# build directory and runs each for SECONDS seconds (default 60) on a corpus seeded from the
# PyTorch goldens (tests/golden) and from inputs that once failed (tests/fuzz/regressions/<target>).
# Prints one line per target: executions, corpus size, result. Exits non-zero on a crash, leak or
# violated property; the input is kept in <build>/artifacts (add it to the regressions).
#   MHA_FUZZ_BUILD_DIR  build directory (default: build/fuzz); its corpus/ grows across runs
#   MHA_FUZZ_MAX_LEN    largest input in bytes (default 1048576)
# Time per input: the parsers are linear, so the budget grows with the largest input: 2 s plus
# 1 s per 256 KiB (6 s at 1 MiB). Under ASan a linear parser takes ~0.1 s for 1 MiB; a
# quadratic one (a safetensors header of 40,000 entries once took 26 s) exceeds it, and a
# large-input seed (a header of as many entries as fit, a .npy of max_len bytes) starts the
# corpus there.
set -euo pipefail
seconds=${1:-60}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MHA_FUZZ_BUILD_DIR:-$root/build/fuzz}
targets=(safetensors npy state_dict model_folder)

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++-14 -DMHA_FUZZ=ON -DMHA_BUILD_TESTS=OFF -DMHA_BUILD_BENCH=OFF \
  -DMHA_BACKEND_XSIMD=OFF -DMHA_BACKEND_ONEDNN=OFF -DMHA_BACKEND_TBB=OFF >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]/#/fuzz_}"

max_len=${MHA_FUZZ_MAX_LEN:-1048576}
timeout=$((2 + max_len / 262144))

mkdir -p "$build/artifacts" "$build/logs" "$build/seeds"
# The large-input seeds, sized to max_len.
/usr/bin/python3 - "$build/seeds" "$max_len" <<'PY'
import json, struct, sys
out, max_len = sys.argv[1], int(sys.argv[2])
entry = '"t%06d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}'
count = max(1, (max_len - 64) // (len(entry % 0) + 1))
header = "{" + ",".join(entry % i for i in range(count)) + "}"
header += " " * ((8 - len(header) % 8) % 8)
with open(f"{out}/large_header.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header.encode())
floats = max(1, (max_len - 128) // 4)
d = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % floats
d += " " * (63 - (10 + len(d)) % 64) + "\n"
with open(f"{out}/large_data.npy", "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + bytes(4 * floats))
PY
failed=0
for target in "${targets[@]}"; do
  corpus=$build/corpus/$target
  mkdir -p "$corpus"
  if [[ $target == npy ]]; then
    cp "$root"/tests/golden/*.npy "$build/seeds/large_data.npy" "$corpus"/
    dict=$root/tests/fuzz/npy.dict
  elif [[ $target == model_folder ]]; then
    # Seeds: its regressions (a config, and a config + NUL + index), below.
    dict=$root/tests/fuzz/model_folder.dict
  else
    cp "$root"/tests/golden/*.safetensors "$build/seeds/large_header.safetensors" "$corpus"/
    dict=$root/tests/fuzz/safetensors.dict
  fi
  if [[ -d $root/tests/fuzz/regressions/$target ]]; then
    cp "$root"/tests/fuzz/regressions/"$target"/* "$corpus"/
  fi
  log=$build/logs/$target.log
  status=0
  "$build/tests/fuzz/fuzz_$target" "$corpus" -dict="$dict" -max_total_time="$seconds" \
    -max_len="$max_len" -timeout="$timeout" -rss_limit_mb=2048 -print_final_stats=1 \
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
