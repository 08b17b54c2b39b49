#!/usr/bin/env bash
# When scripts/fleet/test-slurm.sh runs its cluster and when it skips (slurm-conditions.sh), fed
# the conditions rather than found on this machine; and the configuration it starts the daemons
# with. Exits 1 on the first wrong answer.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/fleet/slurm-conditions.sh"

failures=0
expect() { # expect WHAT EXPECTED ACTUAL
  if [[ $2 == "$3" ]]; then
    echo "ok: $1"
  else
    echo "FAILED: $1: expected '$2', got '$3'"
    failures=$((failures + 1))
  fi
}
expect_skip() { # expect_skip WHAT WORD ACTUAL: a skip whose reason names WORD
  if [[ $3 == "skip: "*"$2"* ]]; then
    echo "ok: $1 ($3)"
  else
    echo "FAILED: $1: expected a skip naming '$2', got '$3'"
    failures=$((failures + 1))
  fi
}

# Where the daemons can start, the test runs: never a skip.
expect "root, tools present, loopback up" run "$(slurm_test_verdict 0 0 "" 1)"
# Each condition that stops a daemon is a skip that names it.
expect_skip "turned off" "MHA_TEST_SLURM=0" "$(slurm_test_verdict 1 0 "" 1)"
expect_skip "not root" "not root" "$(slurm_test_verdict 0 1000 "" 1)"
expect_skip "a tool still missing after the install" "slurmd" "$(slurm_test_verdict 0 0 slurmd 1)"
expect_skip "loopback down" "127.0.0.1" "$(slurm_test_verdict 0 0 "" 0)"
# The first condition that fails is the reason given.
expect_skip "off and not root" "MHA_TEST_SLURM=0" "$(slurm_test_verdict 1 1000 munged 0)"
expect_skip "not root, tool missing" "not root" "$(slurm_test_verdict 0 1000 munged 0)"

# The configuration: slurmd's cgroup plugin pinned to one that needs no cgroup file system (a
# chroot, a container), the controller's address given rather than resolved (no /etc/hosts in
# a fresh debootstrap), and every file the daemons write inside the folder.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
slurm_write_config "$dir" 6817 6818 2 1024
expect "cgroup.conf beside slurm.conf pins the plugin" "CgroupPlugin=cgroup/v1" \
  "$(grep -x 'CgroupPlugin=.*' "$dir/cgroup.conf")"
expect "the controller's address is literal" "SlurmctldHost=localhost(127.0.0.1)" \
  "$(grep '^SlurmctldHost=' "$dir/slurm.conf")"
expect "the ports" "SlurmctldPort=6817 SlurmdPort=6818" \
  "$(grep -E '^Slurm(ctld|d)Port=' "$dir/slurm.conf" | tr '\n' ' ' | sed 's/ $//')"
outside=$(grep -E '^[A-Za-z]+(File|Dir|Location)=|^AuthInfo=' "$dir/slurm.conf" | grep -v "=\(socket=\)\?$dir/" || true)
expect "every path under the folder" "" "$outside"

if ((failures)); then
  echo "test_slurm_conditions: $failures failed"
  exit 1
fi
echo "test_slurm_conditions: passed"
