#!/usr/bin/env bash
# The fleet scripts on a real Slurm cluster of one host: starts munged, slurmctld and
# slurmd from Debian's packages on localhost, with every file in a temporary folder; submits
# scripts/fleet/sweep.sbatch as a two-task job array of a tiny selection and
# scripts/fleet/report.sbatch after it (--dependency=afterok), exactly as docs/fleet.md says; waits for the report with a bounded timeout; checks the merged report; stops the
# daemons on every exit path and checks that none is left.
#
#   scripts/fleet/test-slurm.sh [--bench FILE] [--timeout SECONDS] [--keep DIR]
#
# --bench: the mha_bench the tasks run (a shared build; default: build/test's, else
# build/release's). --timeout: how long to wait for the jobs (default 300). --keep: copy the
# jobs' output, the daemons' logs, the result files and the report there. Needs root (it
# installs slurm-wlm and munge with scripts/deps.sh when they are missing, and runs the daemons
# and jobs as root); without root, when the packages cannot be installed, without a loopback
# network, or with MHA_TEST_SLURM=0, it says it is skipped and why, and exits 0
# (slurm-conditions.sh decides). A host without a cgroup file system (a chroot, a container)
# runs it: slurmd is pinned to a cgroup plugin that needs none. Exits 1 when a check fails,
# a daemon included that does not start.
set -euo pipefail
start=$SECONDS
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
name=fleet-slurm-test

bench=
timeout=300
keep=
while (($#)); do
  case $1 in
    --bench) bench=${2:?"--bench needs an mha_bench binary"}; shift 2 ;;
    --timeout) timeout=${2:?"--timeout needs seconds"}; shift 2 ;;
    --keep) keep=${2:?"--keep needs a folder"}; shift 2 ;;
    -h | --help) sed -n '2,17s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "$name: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

skip() {
  echo "$name: SKIPPED: $*"
  exit 0
}
fail() {
  echo "$name: FAILED: $*" >&2
  exit 1
}

# ---- can it run here? (slurm-conditions.sh decides, from what is found here) ----
source "$root/scripts/fleet/slurm-conditions.sh"
# Skips with the reason when the verdict is not "run". $1: a tool still missing (or empty);
# $2: 1 when the loopback takes a socket.
skip_unless_runnable() {
  local disabled=0 v
  [[ ${MHA_TEST_SLURM:-1} == 0 ]] && disabled=1
  v=$(slurm_test_verdict "$disabled" "$(id -u)" "$1" "$2")
  [[ $v == run ]] || skip "${v#skip: }"
}
# Turned off, or not root: skipped before anything is installed (tools and loopback not yet known).
skip_unless_runnable "" 1
# Processes of those names (pids); the ones running before anything here are not ours.
pids_of_daemons() {
  grep -lxE 'munged|slurmctld|slurmd|slurmstepd' /proc/[0-9]*/comm 2>/dev/null | cut -d/ -f3 || true
}
before=" $(pids_of_daemons | tr '\n' ' ') "
tools=(munged mungekey slurmctld slurmd sbatch scontrol sinfo scancel)
missing_tool() {
  local t
  for t in "${tools[@]}"; do command -v "$t" >/dev/null || { echo "$t"; return 0; }; done
  return 1
}
if missing=$(missing_tool); then
  echo "$name: $missing not found: installing slurm-wlm and munge (scripts/deps.sh)"
  if ! "$root/scripts/deps.sh" slurm-wlm munge; then
    skip "slurm-wlm and munge are not installed and could not be installed (scripts/deps.sh slurm-wlm munge failed; see above)"
  fi
  # Debian's packages may start their own daemons where services can start: not ours to keep.
  for pid in $(pids_of_daemons); do
    if [[ $before != *" $pid "* ]]; then
      echo "$name: stopping $(cat "/proc/$pid/comm" 2>/dev/null) (pid $pid), started by the package install"
      kill "$pid" 2>/dev/null || true
    fi
  done
  sleep 1
  before=" $(pids_of_daemons | tr '\n' ' ') "
fi
# Two free ports on the loopback for slurmctld and slurmd, and a connection over it (a bind
# alone succeeds in a network namespace whose lo is down); none when it cannot connect.
ports=$(/usr/bin/python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
s[0].listen()
socket.create_connection(s[0].getsockname(), timeout=5).close()
print(*[x.getsockname()[1] for x in s])' 2>/dev/null) || ports=
skip_unless_runnable "$(missing_tool || true)" "$([[ -n $ports ]] && echo 1 || echo 0)"
read -r ctld_port slurmd_port <<<"$ports"

if [[ -z $bench ]]; then
  for candidate in "$root/build/test/bench/mha_bench" "$root/build/release/bench/mha_bench"; do
    if [[ -x $candidate ]]; then bench=$candidate; break; fi
  done
  [[ -n $bench ]] || fail "no mha_bench in build/test or build/release: build first, or give --bench"
fi
bench=$(cd "$(dirname "$bench")" && pwd)/$(basename "$bench")
[[ -x $bench ]] || fail "--bench $bench is not executable"

# ---- the cluster: everything in one temporary folder ----
tmp=$(mktemp -d /tmp/mha-slurm.XXXXXX)
chmod 700 "$tmp"
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/log" "$tmp/out" "$tmp/results"
started=()  # pids of the daemons this script started
jobs_submitted=()
export SLURM_CONF=$tmp/slurm.conf

show_logs() {
  local f
  for f in "$tmp"/log/*.log "$tmp"/out/*.out; do
    [[ -f $f ]] || continue
    echo "---- ${f#"$tmp"/} (last 25 lines) ----" >&2
    tail -n 25 "$f" >&2
  done
}

# Every process this test started, or that Slurm started for it, still running (zombies that
# wait for their parent to reap them are not): the daemons (their pids), the job steps
# (slurmstepd that were not there before) and the jobs' processes (their environment carries
# this test's mark).
running() {
  local state
  state=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]]
}
ours() {
  local pid
  {
    printf '%s\n' "${started[@]}"
    for pid in $(pids_of_daemons); do
      if [[ $before != *" $pid "* ]]; then echo "$pid"; fi
    done
    grep -lzx "MHA_SLURM_TEST_MARK=$tmp" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
  } | sort -u | while read -r pid; do
    if [[ -n $pid ]] && running "$pid"; then echo "$pid"; fi
  done
  return 0
}
# Waits up to $1 tenths of a second for every process of this test but the daemons to end.
jobs_gone() {
  local left pid
  for _ in $(seq "$1"); do
    left=$(ours)
    for pid in "${started[@]}"; do left=$(grep -vx "$pid" <<<"$left"); done
    [[ -z $left ]] && return 0
    sleep 0.1
  done
  return 1
}

cleanup() {
  local status=$? pid left i
  set +e
  trap - EXIT INT TERM
  if ((status != 0)); then show_logs; fi
  # Jobs still queued or running: cancelled while slurmd is there to end their steps.
  if ((${#jobs_submitted[@]})) && running "${started[1]:-0}" && running "${started[2]:-0}"; then
    scancel "${jobs_submitted[@]}" 2>/dev/null
    jobs_gone 150 || echo "$name: job processes still running 15 s after scancel" >&2
  fi
  # slurmd, then slurmctld, then munged: politely, then not.
  for ((i = ${#started[@]} - 1; i >= 0; i--)); do kill -TERM "${started[i]}" 2>/dev/null; done
  for _ in $(seq 100); do
    [[ -z $(ours) ]] && break
    sleep 0.1
  done
  for pid in $(ours); do
    echo "$name: killing leftover $(cat "/proc/$pid/comm" 2>/dev/null) (pid $pid)" >&2
    kill -KILL "$pid" 2>/dev/null
  done
  for pid in "${started[@]}"; do wait "$pid" 2>/dev/null; done
  for _ in $(seq 20); do
    [[ -z $(ours) ]] && break
    sleep 0.1
  done
  left=$(ours | tr '\n' ' ')
  # Whatever of those names still runs now: only what ran before this test may.
  now=$(for pid in $(pids_of_daemons); do if running "$pid"; then echo "$pid"; fi; done | tr '\n' ' ')
  if [[ -n $keep ]]; then
    mkdir -p "$keep" && cp -r "$tmp/out" "$tmp/log" "$tmp/results" "$tmp/slurm.conf" "$tmp/cgroup.conf" "$keep"/ &&
      if [[ -d $tmp/report ]]; then cp -r "$tmp/report" "$keep"/; fi
    echo "$name: kept the jobs' output, logs, results and report in $keep"
  fi
  rm -rf "$tmp"
  if [[ -n $left ]]; then
    echo "$name: FAILED: processes of this test still running: $left" >&2
    status=1
  else
    echo "$name: no daemon left: the ${#started[@]} daemons it started (munged, slurmctld, slurmd)," \
      "the job steps and the jobs' processes have exited; running now:" \
      "${now:+pids ${now}(there before this test, not ours)}${now:-no munged, slurmctld, slurmd or slurmstepd}"
  fi
  if ((status == 0)); then echo "$name: passed in $((SECONDS - start)) s"; fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# munge, with its own key, socket and files.
mungekey --create --keyfile="$tmp/munge/munge.key" >/dev/null
munged --foreground --force --socket="$tmp/munge/munge.socket" --key-file="$tmp/munge/munge.key" \
  --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munged.seed" \
  --log-file="$tmp/log/munged.log" >>"$tmp/log/munged.stderr.log" 2>&1 &
started+=($!)
for _ in $(seq 100); do [[ -S $tmp/munge/munge.socket ]] && break; sleep 0.1; done
[[ -S $tmp/munge/munge.socket ]] || fail "munged did not start (log/munged.log)"

memory_mb=$(($(awk '/^MemTotal/ { print int($2 / 1024) }' /proc/meminfo) / 2))
slurm_write_config "$tmp" "$ctld_port" "$slurmd_port" "$(nproc)" "$memory_mb"
echo "$name: /sys/fs/cgroup holds $(stat -f -c %T /sys/fs/cgroup 2>/dev/null || echo nothing);" \
  "slurmd runs with CgroupPlugin=cgroup/v1, which reads and makes no cgroup (slurm-conditions.sh)"

slurmctld -D -i -f "$SLURM_CONF" >>"$tmp/log/slurmctld.stderr.log" 2>&1 &
started+=($!)
slurmd -D -f "$SLURM_CONF" -N localhost >>"$tmp/log/slurmd.stderr.log" 2>&1 &
started+=($!)
state=
for _ in $(seq 150); do
  state=$(sinfo -h -N -o %T 2>/dev/null | head -n1 || true)
  [[ $state == idle ]] && break
  for pid in "${started[@]}"; do kill -0 "$pid" 2>/dev/null || fail "a daemon exited at start (pid $pid)"; done
  sleep 0.2
done
[[ $state == idle ]] || fail "the node is not idle 30 s after starting slurmctld and slurmd (state '$state')"
echo "$name: single-host cluster up ($(sinfo -h -o '%P %D node(s) %c CPUs %T'); munged, slurmctld, slurmd:" \
  "pids ${started[*]}; state in $tmp)"

# ---- the fleet sweep, as docs/fleet.md submits it ----
# A tiny selection: two head counts of the quick preset at T = 128, both formulations, naive and
# (when built) xsimd; one short repetition each.
tiny=(--preset quick "--benchmark_filter=t128/.*h(1|4)/" --benchmark_min_time=0.01
  --benchmark_repetitions=1 --quiet)
backends=naive,xsimd
"$bench" --backends "$backends" "${tiny[@]}" --dump-shapes "$tmp/shapes.json" >/dev/null 2>&1 || backends=naive
tiny=(--backends "$backends" "${tiny[@]}")

cd "$root"
export MHA_SLURM_TEST_MARK=$tmp
array=$(sbatch --parsable --array=1-2 --output="$tmp/out/sweep-%A_%a.out" \
  scripts/fleet/sweep.sbatch --bench "$bench" --results "$tmp/results" "${tiny[@]}")
array=${array%%;*}
jobs_submitted+=("$array")
report=$(sbatch --parsable --dependency="afterok:$array" --kill-on-invalid-dep=yes \
  --output="$tmp/out/report-%j.out" \
  scripts/fleet/report.sbatch --results "$tmp/results" --out "$tmp/report")
report=${report%%;*}
jobs_submitted+=("$report")
unset MHA_SLURM_TEST_MARK
echo "$name: submitted array job $array (2 shards of $backends) and report job $report (afterok:$array)"

job_state() { scontrol show job -o "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 | sort -u | tr '\n' ' '; }
deadline=$((SECONDS + timeout))
while :; do
  state=$(job_state "$report")
  case $state in
    "COMPLETED ") break ;;
    *FAILED* | *CANCELLED* | *TIMEOUT* | *NODE_FAIL* | *OUT_OF_MEMORY* | *DEADLINE* | *BOOT_FAIL*)
      fail "report job $report ended $state (array job: $(job_state "$array"))" ;;
  esac
  ((SECONDS < deadline)) || fail "timeout: the jobs did not finish in $timeout s (array: $(job_state "$array"), report: $state)"
  sleep 1
done
array_state=$(job_state "$array")
[[ $array_state == "COMPLETED " ]] || fail "array tasks ended $array_state"
echo "$name: the array's tasks and the report job completed in $((SECONDS - start)) s"

# ---- the checks ----
shopt -s nullglob
files=("$tmp"/results/*.json)
((${#files[@]} == 2)) || fail "expected 2 result files, found ${#files[@]}: ${files[*]##*/}"
[[ ${files[0]} == *-quick-shard1of2.json && ${files[1]} == *-quick-shard2of2.json ]] ||
  fail "result files are not shards 1/2 and 2/2: ${files[*]##*/}"
[[ -f $tmp/report/report.md && -f $tmp/report/report.html ]] || fail "no report in $tmp/report"
grep -q "mhapy.report: wrote" "$tmp"/out/report-*.out || fail "the report job's output does not say it wrote the report"
PYTHONPATH=$root/tools /usr/bin/python3 - "$tmp/report/report.md" "${files[@]}" <<'PY' || fail "the merged report is not the selection's"
import json
import sys

from mhapy.report.loading import load_machines
from mhapy.report.results import selections, shard_problems

report, paths = open(sys.argv[1]).read(), sys.argv[2:]
docs = [json.load(open(p)) for p in paths]
names = [{e["run_name"] for e in d["benchmarks"] if e["name"].startswith("mha/")} for d in docs]
contexts = [d["context"] for d in docs]
assert [c["mha_shard"] for c in contexts] == ["1/2", "2/2"], [c["mha_shard"] for c in contexts]
assert contexts[0]["mha_selection"] == contexts[1]["mha_selection"], "two selections"
total = int(contexts[0]["mha_selection_benchmarks"])
assert names[0] and names[1], "an empty shard"
assert not names[0] & names[1], f"both shards ran {names[0] & names[1]}"
assert len(names[0] | names[1]) == total, f"{len(names[0] | names[1])} benchmarks of {total}"
(machine,) = load_machines(paths)
(group,) = selections(machine)
assert group.complete and not shard_problems(machine)
assert len(machine.measurements) == total and not machine.failures
assert "1/2, 2/2 of selection" in report and f"complete, {total} of {total} benchmarks" in report, report
assert "**shards**" not in report and "## Answer: which backend to link" in report
print(f"fleet-slurm-test: merged report: shards 1/2 ({len(names[0])}) + 2/2 ({len(names[1])}) = "
      f"the selection's {total} benchmarks, one machine ({machine.machine.label()}), no shard missing")
PY
