# What scripts/fleet/test-slurm.sh decides before it starts a daemon, and the configuration it
# starts them with: functions only, sourced by that script and by tests/bench/test_slurm_conditions.sh,
# which feeds them every case. No function here looks at the machine: the caller passes in what
# it found.

# slurm_test_verdict DISABLED UID MISSING_TOOL LOOPBACK
#   DISABLED      1 when MHA_TEST_SLURM=0, else 0
#   UID           the effective user id
#   MISSING_TOOL  the first of munged, slurmctld, slurmd, ... not on PATH after installing
#                 slurm-wlm and munge, or empty
#   LOOPBACK      1 when a TCP connection to 127.0.0.1 succeeds, else 0 (a network namespace
#                 whose lo is down): the daemons talk over the loopback
# Prints "run" when the daemons can start here, else "skip: <the reason>". The cgroup file
# system is not a condition: slurm_write_config pins slurmd's cgroup plugin to one that needs
# none, so a chroot or container without one (or with a read-only one) runs the test.
slurm_test_verdict() {
  local disabled=$1 uid=$2 missing_tool=$3 loopback=$4
  if [[ $disabled == 1 ]]; then
    echo "skip: MHA_TEST_SLURM=0"
  elif [[ $uid != 0 ]]; then
    echo "skip: not root (it installs slurm-wlm and munge and runs munged, slurmctld, slurmd and the jobs as root)"
  elif [[ -n $missing_tool ]]; then
    echo "skip: $missing_tool not found, and installing slurm-wlm and munge did not provide it"
  elif [[ $loopback != 1 ]]; then
    echo "skip: no loopback network (a TCP connection to 127.0.0.1 fails), which the daemons talk over"
  else
    echo "run"
  fi
}

# slurm_write_config DIR CTLD_PORT SLURMD_PORT CPUS MEMORY_MB
# Writes DIR/slurm.conf and DIR/cgroup.conf (Slurm reads cgroup.conf from slurm.conf's folder)
# for one node, localhost, with every state, spool, pid and log file under DIR.
# - slurmd loads a cgroup plugin whatever ProctrackType and TaskPlugin say (Slurm 22.05,
#   slurmd.c: cgroup_g_init() at start). The default, "autodetect", fails where /sys/fs/cgroup
#   holds no cgroup file system ("No filesystem mounted on /sys/fs/cgroup": a chroot, many
#   containers), and cgroup/v2 creates and migrates into its own cgroups, which fails on a
#   read-only mount. cgroup/v1's init only allocates its lists (plugins/cgroup/v1/cgroup_v1.c),
#   and with proctrack/linuxproc, task/none and jobacct_gather/none nothing else calls the
#   plugin, so the test pins it on every host: no cgroup is read or made.
# - The controller's address is given (localhost(127.0.0.1)), not resolved: a fresh
#   debootstrap has no /etc/hosts.
slurm_write_config() {
  local dir=$1 ctld_port=$2 slurmd_port=$3 cpus=$4 memory_mb=$5
  cat >"$dir/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
EOF
  cat >"$dir/slurm.conf" <<EOF
ClusterName=mhatest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MinJobAge=600
NodeName=localhost NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}
