#!/usr/bin/env bash
# The main job: installs what is missing, builds Release, runs a benchmark preset over every
# built backend and writes results/<host>-<date>-<time>-<preset>.json (bench/README.md: its schema).
#
#   scripts/sweep.sh [--preset quick|heads|seq|threads|decode|full] [--with-pytorch] [mha_bench flags...]
#
# --with-pytorch also times the same shapes in PyTorch (python3 -m mhapy.peers) when
# python3-torch is installed (it says so and goes on without when it is not), making sure torch
# has OpenBLAS rather than the reference BLAS under it. Other flags go to mha_bench as they are
# (--backends, --heads, --threads, --budget, --benchmark_repetitions=3, ...; `mha_bench --help`
# lists them); sweep.sh sets --preset and --benchmark_out itself. The quick preset runs 3
# repetitions unless --benchmark_repetitions says otherwise, so its report can state its own
# run-to-run noise. Ends by writing the report to reports/latest/ (python3 -m mhapy.report).
#   MHA_SWEEP_BUILD_DIR  build directory (default: build/release)
set -euo pipefail
start=$SECONDS
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MHA_SWEEP_BUILD_DIR:-$root/build/release}
# The Python (tools/mhapy) runs with Debian's interpreter, which sees python3-numpy etc.
python=(env "PYTHONPATH=$root/tools" /usr/bin/python3)

preset=quick
with_pytorch=0
bench_args=()
# The peers repeat what mha_bench does: its defaults unless these flags say otherwise.
min_time=0.5
repetitions=
while (($#)); do
  case $1 in
    --with-pytorch) with_pytorch=1; shift ;;
    --benchmark_min_time=*) min_time=${1#*=}; bench_args+=("$1"); shift ;;
    --benchmark_repetitions=*) repetitions=${1#*=}; bench_args+=("$1"); shift ;;
    --preset) preset=${2:?"--preset needs a name: quick, heads, seq, threads, decode or full"}; shift 2 ;;
    --preset=*) preset=${1#*=}; shift ;;
    -h | --help) sed -n '2,15s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    --benchmark_out=* | --benchmark_out_format=*)
      echo "sweep.sh: $1: sweep.sh chooses the output file itself" >&2; exit 2 ;;
    *) bench_args+=("$1"); shift ;;
  esac
done

if [[ -z $repetitions ]]; then
  repetitions=1
  if [[ $preset == quick ]]; then
    repetitions=3
    bench_args+=("--benchmark_repetitions=3")
  fi
fi

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

# ---- PyTorch peers: the same shapes, timed in PyTorch ----
results=("$out")
if ((with_pytorch)); then
  if /usr/bin/python3 -c "import torch" 2>/dev/null; then
    # Debian's torch sends FP32 matmuls to the system BLAS: without OpenBLAS that is the
    # reference BLAS, ~40x slower (tools/README.md), which would misrepresent PyTorch.
    "$root/scripts/deps.sh" libopenblas0-openmp
    shapes=$root/results/.$(basename "$out" .json).shapes.json
    peers=${out%.json}-pytorch.json
    peers_partial=$root/results/.$(basename "$peers" .json).partial
    trap 'rm -f "$partial" "$shapes" "$peers_partial"' EXIT
    "$build/bench/mha_bench" --preset "$preset" --dump-shapes "$shapes" "${bench_args[@]}"
    "${python[@]}" -m mhapy.peers --shapes "$shapes" --out "$peers_partial" \
      --min-time "$min_time" --repetitions "$repetitions"
    mv "$peers_partial" "$peers"
    results+=("$peers")
    echo "sweep.sh: wrote ${peers#"$root"/}"
  else
    echo "sweep.sh: --with-pytorch: PyTorch is not installed, so no PyTorch peers in this run" \
      "(apt-get install python3-torch libopenblas0-openmp adds them)" >&2
  fi
fi

# ---- report ----
# mhapy.report replaces its own files only once the new report is complete.
report=$root/reports/latest
"${python[@]}" -m mhapy.report "${results[@]}" --out "$report"
echo "sweep.sh: report in ${report#"$root"/}/report.md (and report.html)"
echo "sweep.sh: done in $((SECONDS - start)) s"

if ((status == 1)); then
  echo "sweep.sh: some benchmarks failed their check; see error_message in the JSON" >&2
fi
exit "$status"
