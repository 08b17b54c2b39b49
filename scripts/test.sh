#!/usr/bin/env bash
# The test command: installs what is missing, builds the test configuration (Release, every
# backend whose dependency is present), runs every test with ctest, then fuzzes each file parser
# for a few seconds (scripts/fuzz.sh; longer runs: scripts/fuzz.sh SECONDS).
#   MHA_TEST_BUILD_DIR     build directory (default: build/test)
#   MHA_TEST_FUZZ_SECONDS  seconds per fuzz target (default: 5)
set -euo pipefail
start=$SECONDS
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MHA_TEST_BUILD_DIR:-$root/build/test}

"$root/scripts/deps.sh"

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" --parallel "$(nproc)"
ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)"
"$root/scripts/fuzz.sh" "${MHA_TEST_FUZZ_SECONDS:-5}"

echo "test.sh: passed in $((SECONDS - start)) s"
