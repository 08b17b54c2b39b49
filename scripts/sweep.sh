#!/usr/bin/env bash
# The main job: installs what is missing, builds Release, runs a benchmark preset over every
# built backend and writes results/<host>-<date>-<time>-<preset>.json (bench/README.md: its schema).
#
#   scripts/sweep.sh [--preset quick|heads|seq|threads|decode|window|cores|full] [--with-peers [--peers LIST]]
#                    [--with-models [--models-args "ARGS"]] [--shard I/N] [--results DIR]
#                    [--no-report] [--bench FILE] [mha_bench flags...]
#
# --with-peers also runs the peers (python -m mhapy.peers: PyTorch, OpenVINO, ONNX Runtime, and
# mha itself from Python, whose extension it builds) on the same shapes and thread counts, in
# their own environment (scripts/peers-env.sh makes it: the first time a minute or two), one
# results/<...>-peers-<library>.json per library; --peers pytorch,openvino,onnxruntime,mha_python
# takes a subset; --with-pytorch is --with-peers --peers pytorch.
# When the environment cannot be made, the sweep says why and goes on without peers.
# --with-models also times whole Hugging Face models (random weights) on attn_implementation
# "eager", "sdpa" and mha's (its own KV cache in int8 and bf16 too: python -m mhapy.models.bench,
# in the peers' environment) and on OpenVINO through optimum-intel (in its own environment,
# scripts/peers-env.sh optimum; without it those rows say why they were not run), writing
# results/<...>-models.json and the report's "Whole models" section; --models-args passes it
# flags (default: GPT-2 small and a Llama-1B shape, prefill 1024 + 128 decoded tokens, batch 1
# and 8, one thread and all, fp32 and bf16: hours on 2 cores; e.g. --models-args "--models gpt2
# --batches 1"). Other
# flags go to mha_bench as they are (--backends, --heads, --threads, --budget,
# --benchmark_repetitions=3, ...; `mha_bench --help` lists them); sweep.sh sets --preset and
# --benchmark_out itself. The quick preset runs 3 repetitions unless --benchmark_repetitions
# says otherwise, so its report can state its own run-to-run noise. Ends by writing the report
# to reports/latest/ (python3 -m mhapy.report). The cores preset also writes
# <...>-cores-trace.json (mha_bench --trace of tbb on one thread): the report's scaling model.
# --shard I/N runs part I of N of the selected benchmarks (mha_bench --shard; the file is named
# ...-<preset>-shard<I>of<N>.json) and writes no report: merge the N files with
# python3 -m mhapy.report (scripts/fleet/ runs the shards as a Slurm job array). --results DIR
# writes the result files there (default results/); --no-report skips the report; --bench FILE
# runs that mha_bench as it is (a shared build: no install, no build; the peers' environment is
# still made). Sweeps that share a build directory build it one at a time (a lock file in it).
#   MHA_SWEEP_BUILD_DIR  build directory (default: build/release)
set -euo pipefail
start=$SECONDS
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MHA_SWEEP_BUILD_DIR:-$root/build/release}
# The Python (tools/mhapy) runs with Debian's interpreter, which sees python3-numpy etc.
python=(env "PYTHONPATH=$root/tools" /usr/bin/python3)

preset=quick
with_peers=0
with_models=0
models_flags=
peers=pytorch,openvino,onnxruntime,mha_python
shard=
results_dir=$root/results
write_report=1
bench=
bench_args=()
# The peers repeat what mha_bench does: its defaults unless these flags say otherwise.
min_time=0.5
repetitions=
while (($#)); do
  case $1 in
    --with-peers) with_peers=1; shift ;;
    --with-pytorch) with_peers=1; peers=pytorch; shift ;;
    --with-models) with_models=1; shift ;;
    --models-args) models_flags=${2?"--models-args needs the flags, quoted"}; shift 2 ;;
    --models-args=*) models_flags=${1#*=}; shift ;;
    --peers) peers=${2:?"--peers needs a list: pytorch,openvino,onnxruntime,mha_python"}; shift 2 ;;
    --peers=*) peers=${1#*=}; shift ;;
    --benchmark_min_time=*) min_time=${1#*=}; bench_args+=("$1"); shift ;;
    --benchmark_repetitions=*) repetitions=${1#*=}; bench_args+=("$1"); shift ;;
    --preset) preset=${2:?"--preset needs a name: quick, heads, seq, threads, decode, window, cores or full"}; shift 2 ;;
    --preset=*) preset=${1#*=}; shift ;;
    --shard) shard=${2:?"--shard needs I/N, e.g. 1/4"}; bench_args+=("--shard=$shard"); shift 2 ;;
    --shard=*) shard=${1#*=}; bench_args+=("$1"); shift ;;
    --results) results_dir=${2:?"--results needs a folder"}; shift 2 ;;
    --results=*) results_dir=${1#*=}; shift ;;
    --no-report) write_report=0; shift ;;
    --bench) bench=${2:?"--bench needs an mha_bench binary"}; shift 2 ;;
    --bench=*) bench=${1#*=}; shift ;;
    -h | --help) sed -n '2,25s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
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

suffix=
if [[ -n $shard ]]; then
  if [[ ! $shard =~ ^([0-9]+)/([0-9]+)$ ]] || ((BASH_REMATCH[1] < 1 || BASH_REMATCH[1] > BASH_REMATCH[2])); then
    echo "sweep.sh: --shard '$shard': expected I/N with 1 <= I <= N, e.g. 2/4" >&2
    exit 2
  fi
  suffix=-shard${BASH_REMATCH[1]}of${BASH_REMATCH[2]}
fi

bench_given=$bench
if [[ -n $bench ]]; then
  if [[ ! -x $bench ]]; then
    echo "sweep.sh: --bench '$bench' is not an executable mha_bench" >&2
    exit 2
  fi
else
  # Tasks of a job array may start together on one node, or share a build folder across nodes:
  # one at a time installs and builds; the others then find the build up to date.
  mkdir -p "$build"
  (
    flock 9
    "$root/scripts/deps.sh"
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMHA_BUILD_TESTS=OFF
    cmake --build "$build" --target mha_bench --parallel "$(nproc)"
  ) 9>"$build/.sweep.lock"
  bench=$build/bench/mha_bench
fi

# Google Benchmark writes the JSON as it goes: write to a hidden partial file and give it its
# final name only once mha_bench has finished, so an interrupted sweep leaves no file that
# looks complete.
mkdir -p "$results_dir"
results_dir=$(cd "$results_dir" && pwd)
out=$results_dir/$(hostname -s)-$(date +%Y%m%d-%H%M%S)-$preset$suffix.json
partial=$results_dir/.$(basename "$out" .json).partial
trap 'rm -f "$partial"' EXIT

status=0
"$bench" --preset "$preset" --benchmark_out="$partial" \
  --benchmark_out_format=json "${bench_args[@]}" || status=$?
# mha_bench exits 1 when it ran to the end but some benchmark failed its check or threw: the
# file is complete and says which (error_message), so it is kept; anything else is a failure.
if ((status != 0 && status != 1)); then
  echo "sweep.sh: mha_bench failed (exit $status); no result file written" >&2
  exit "$status"
fi
mv "$partial" "$out"
echo "sweep.sh: wrote ${out#"$root"/} in $((SECONDS - start)) s"

# ---- the cores preset: a task trace of tbb on one thread, the scaling model's input ----
results=("$out")
trace_args=()
if [[ $preset == cores && -z $shard ]]; then
  trace=${out%.json}-trace.json
  # Last on the line, so they replace the user's --backends and --threads.
  if "$bench" --preset "$preset" "${bench_args[@]}" --backends tbb --threads 1 --quiet \
    --trace "$trace"; then
    trace_args=(--trace "$trace")
    echo "sweep.sh: wrote ${trace#"$root"/}"
  else
    echo "sweep.sh: the task trace failed (above): the report has no scaling model" >&2
  fi
fi

# The Python package's extension for the peers' Python ($1), next to this sweep's mha_bench (with
# --bench, nothing is built: only where that build has it).
build_python_package() {
  if [[ -z $bench_given ]] && "$1" -c "import nanobind" 2>/dev/null; then
    (
      flock 9
      cmake -S "$root" -B "$build" -DMHA_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$1" >/dev/null
      cmake --build "$build" --target _mha --parallel "$(nproc)"
    ) 9>"$build/.sweep.lock"
  fi
}

# ---- peers: the same shapes in PyTorch, OpenVINO and ONNX Runtime ----
if ((with_peers)); then
  if ! env_log=$("$root/scripts/peers-env.sh" 2>&1); then
    echo "$env_log" >&2
    echo "sweep.sh: --with-peers: no peers in this run (their environment could not be made, above)" >&2
  else
    echo "$env_log" | grep -E '^peers-env: (left out|installed|ready)' || true
    peers_python=${env_log##*ready: }
    shapes=$results_dir/.$(basename "$out" .json).shapes.json
    trap 'rm -f "$partial" "$shapes"' EXIT
    # With --shard, the shapes this shard owns: the shards' peer files do not overlap.
    "$bench" --preset "$preset" --dump-shapes "$shapes" "${bench_args[@]}"
    if [[ $(tr -d ' \n' <"$shapes") == "[]" ]]; then
      echo "sweep.sh: --with-peers: this shard owns no shape, so no peers in it" >&2
    else
      # mha from Python (the mha_python peer): the package's extension, built for the peers'
      # Python next to this sweep's mha_bench (with --bench, only where that build has it).
      peers_path=$root/tools
      if [[ ,$peers, == *,mha_python,* ]]; then
        build_python_package "$peers_python" || echo "sweep.sh: --with-peers: the Python package did not build (above)" >&2
        peers_path=$peers_path:$(dirname "$bench")/../python
      fi
      # One file per library, each written only once complete: <stem>-peers-<library>.json.
      PYTHONPATH=$peers_path "$peers_python" -m mhapy.peers --libraries "$peers" --shapes "$shapes" \
        --out "${out%.json}-peers.json" --min-time "$min_time" --repetitions "$repetitions" ||
        echo "sweep.sh: --with-peers: a peer library's run failed (above); its file is missing" >&2
      for library in ${peers//,/ }; do
        file=${out%.json}-peers-$library.json
        if [[ $peers != *,* ]]; then file=${out%.json}-peers.json; fi
        if [[ -f $file ]]; then
          results+=("$file")
          echo "sweep.sh: wrote ${file#"$root"/}"
        fi
      done
    fi
  fi
fi

# ---- whole models: Hugging Face models on eager, sdpa and mha attention ----
models_report=()
if ((with_models)); then
  if ! env_log=$("$root/scripts/peers-env.sh" 2>&1); then
    echo "$env_log" >&2
    echo "sweep.sh: --with-models: no whole models in this run (the peers' environment could not be made, above)" >&2
  elif ! build_python_package "${env_log##*ready: }"; then
    echo "sweep.sh: --with-models: the Python package did not build (above)" >&2
  else
    models_out=${out%.json}-models.json
    # OpenVINO's environment: where it cannot be made (nothing is then there), models_bench
    # records its rows as not run, saying so.
    optimum_log=$("$root/scripts/peers-env.sh" optimum 2>&1) || echo "$optimum_log" >&2
    optimum_python=${MHA_OPTIMUM_VENV:-$root/build/peers-optimum-venv}/bin/python
    # shellcheck disable=SC2086  # --models-args is a list of flags
    if PYTHONPATH=$root/tools:$(dirname "$bench")/../python "${env_log##*ready: }" -m mhapy.models.bench \
      --openvino-python "$optimum_python" --out "$models_out" $models_flags; then
      models_report=(--models "$models_out")
      echo "sweep.sh: wrote ${models_out#"$root"/}"
    else
      echo "sweep.sh: --with-models: the whole-model run failed (above)" >&2
    fi
  fi
fi

# ---- report ----
if [[ -n $shard ]]; then
  echo "sweep.sh: one shard of $shard: no report; merge the shards with" \
    "PYTHONPATH=tools /usr/bin/python3 -m mhapy.report <the shard files> --out <folder>"
elif ((write_report)); then
  # mhapy.report replaces its own files only once the new report is complete.
  report=$root/reports/latest
  "${python[@]}" -m mhapy.report "${results[@]}" "${trace_args[@]}" "${models_report[@]}" --html --out "$report"
  echo "sweep.sh: report in ${report#"$root"/}/report.md (and report.html)"
fi
echo "sweep.sh: done in $((SECONDS - start)) s"

if ((status == 1)); then
  echo "sweep.sh: some benchmarks failed their check; see error_message in the JSON" >&2
fi
exit "$status"
