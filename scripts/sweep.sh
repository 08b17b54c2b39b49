#!/usr/bin/env bash
# The main job: installs what is missing, builds Release, runs a benchmark preset over every
# built backend and writes results/<host>-<date>-<preset>.json (bench/README.md: its schema).
#
#   scripts/sweep.sh [--preset quick|heads|seq|threads|full] [mha_bench flags...]
#
# Other flags go to mha_bench as they are (--backends, --heads, --threads, --budget,
# --benchmark_repetitions=3, ...; `mha_bench --help` lists them); sweep.sh sets --preset and
# --benchmark_out itself.
#   MHA_SWEEP_BUILD_DIR  build directory (default: build/release)
set -euo pipefail
start=$SECONDS
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MHA_SWEEP_BUILD_DIR:-$root/build/release}

preset=quick
bench_args=()
while (($#)); do
  case $1 in
    --preset) preset=${2:?"--preset needs a name: quick, heads, seq, threads or full"}; shift 2 ;;
    --preset=*) preset=${1#*=}; shift ;;
    -h | --help) sed -n '2,10s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    --benchmark_out=* | --benchmark_out_format=*)
      echo "sweep.sh: $1: sweep.sh chooses the output file itself" >&2; exit 2 ;;
    *) bench_args+=("$1"); shift ;;
  esac
done

"$root/scripts/deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMHA_BUILD_TESTS=OFF
cmake --build "$build" --target mha_bench --parallel "$(nproc)"

# Google Benchmark writes the JSON as it goes: write to a hidden partial file and give it its
# final name only once mha_bench has finished, so an interrupted sweep leaves no file that
# looks complete.
mkdir -p "$root/results"
out=$root/results/$(hostname -s)-$(date +%Y%m%d-%H%M%S)-$preset.json
partial=$root/results/.$(basename "$out" .json).partial
trap 'rm -f "$partial"' EXIT

status=0
"$build/bench/mha_bench" --preset "$preset" --benchmark_out="$partial" \
  --benchmark_out_format=json "${bench_args[@]}" || status=$?
# mha_bench exits 1 when it ran to the end but some benchmark failed its check or threw: the
# file is complete and says which (error_message), so it is kept; anything else is a failure.
if ((status != 0 && status != 1)); then
  echo "sweep.sh: mha_bench failed (exit $status); no result file written" >&2
  exit "$status"
fi
mv "$partial" "$out"
echo "sweep.sh: wrote ${out#"$root"/} in $((SECONDS - start)) s"

# ---- report ----
# The report generator (tools/mha_report, issue 4) will turn "$out" into reports/latest/ here.
# Until it lands, the JSON file is the result.
echo "sweep.sh: no report generator yet (tools/mha_report, issue 4); bench/README.md describes the JSON"

if ((status == 1)); then
  echo "sweep.sh: some benchmarks failed their check; see error_message in the JSON" >&2
fi
exit "$status"
