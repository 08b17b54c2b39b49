#!/usr/bin/env bash
# The README's two commands as a new user runs them: on a fresh Debian 12 made by
# `debootstrap --variant=minbase bookworm`, in a chroot with /proc, /sys and /dev mounted and no
# cgroup file system (as many containers are), installs git and ca-certificates, clones this
# checkout's HEAD (what is committed, not the working tree) and runs `scripts/test.sh`, then
# `scripts/sweep.sh` with the given flags. Long (about half an hour on 2 cores: every package,
# then every build from nothing), so not part of `.ci/run`.
#
#   scripts/fresh-debian.sh [--dir DIR] [--mirror URL] [--keep] [--no-sweep] [--no-host-pip]
#                           [-- SWEEP_FLAGS...]
#
# --dir: where the new root goes (default build/fresh-debian, under the build tree; replaced on
# every run); --mirror: the Debian archive (default http://deb.debian.org/debian); --keep: leave
# the root there afterwards (default: removed when the run ends); --no-sweep: the tests only.
# pip in the chroot sees the host's pip configuration (/etc/pip.conf, /etc/xdg/pip, root's, PIP_*
# variables), the local folders it names and the host's local CA certificates
# (/usr/local/share/ca-certificates), all read-only: that is how a machine of this kind
# offers its CPU PyTorch wheel, which the peers' environment installs. --no-host-pip: PyPI alone
# (where PyPI's torch is a CUDA build, the peers' environment then leaves PyTorch out and says so).
# Everything after `--` goes to scripts/sweep.sh (`-- --with-peers --preset decode`).
#
# Root only (debootstrap, chroot and mounts): anyone else gets a refusal and exit 2. The mounts
# live in a private mount namespace and every process in a PID namespace of its own, so however
# the run ends (a failure, Ctrl-C, a daemon left running) the kernel ends those processes and
# undoes those mounts, and the host's mounts are never touched. Writes DIR/logs/ (each step's
# output, kept) and DIR/installed.txt (the Debian packages the commands added to the minbase
# system). Prints each step's time and result; exits 0 when every step passed, 1 otherwise.
set -euo pipefail
start=$SECONDS
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
name=fresh-debian

dir=$root/build/fresh-debian
mirror=http://deb.debian.org/debian
keep=0
sweep=1
host_pip=1
sweep_args=()
while (($#)); do
  case $1 in
    --dir) dir=${2:?"--dir needs a folder"}; shift 2 ;;
    --mirror) mirror=${2:?"--mirror needs a URL"}; shift 2 ;;
    --keep) keep=1; shift ;;
    --no-sweep) sweep=0; shift ;;
    --no-host-pip) host_pip=0; shift ;;
    --) shift; sweep_args=("$@"); break ;;
    -h | --help) sed -n '2,26s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "$name: unknown argument '$1' (sweep flags go after --)" >&2; exit 2 ;;
  esac
done

if [[ $(id -u) != 0 ]]; then
  echo "$name: refused: needs root (debootstrap, chroot, mount and unshare); run it as root or with sudo" >&2
  exit 2
fi
"$root/scripts/deps.sh" debootstrap

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
rootfs=$dir/rootfs
logs=$dir/logs

# Never delete through a mount: a root left by an earlier run has none (they died with its
# namespace), but refuse rather than find out with rm.
remove_rootfs() {
  [[ -e $rootfs ]] || return 0
  if findmnt -rn -o TARGET | grep -qF "$rootfs"; then
    echo "$name: refusing to remove $rootfs: something is mounted inside it:" >&2
    findmnt -rn -o TARGET | grep -F "$rootfs" >&2
    return 1
  fi
  rm -rf --one-file-system "$rootfs"
}
cleanup() {
  local status=$?
  if ((keep)); then
    echo "$name: kept the root in $rootfs"
  else
    remove_rootfs || status=1
  fi
  echo "$name: logs in ${logs#"$root"/}/; done in $((SECONDS - start)) s"
  exit "$status"
}
remove_rootfs
rm -rf "$logs"
mkdir -p "$logs"
trap cleanup EXIT

step_start=$SECONDS
echo "$name: debootstrap --variant=minbase bookworm from $mirror (log: ${logs#"$root"/}/debootstrap.log)"
if ! debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$logs/debootstrap.log" 2>&1; then
  tail -n 20 "$logs/debootstrap.log" >&2
  echo "$name: FAILED: debootstrap (see ${logs#"$root"/}/debootstrap.log)" >&2
  exit 1
fi
echo "$name: debootstrap took $((SECONDS - step_start)) s"
chroot "$rootfs" dpkg-query -W -f='${Package}\n' | sort >"$logs/packages-minbase.txt"
commit=$(git -C "$root" rev-parse HEAD)

# The host's pip configuration and the local folders its find-links, index and constraint
# settings name, each bound read-only at the same path in the chroot, and its PIP_* variables
# (--no-host-pip: none of it).
pip_paths=() pip_env=()
if ((host_pip)); then
  # Root's own configuration too (the chroot's HOME is /root, as the host's is under sudo), and
  # the host's local CA certificates, which ca-certificates adds to the chroot's bundle when the
  # first step installs it: where the network reaches PyPI through a proxy of its own, pip needs
  # them as the host's pip does.
  configs=(/etc/pip.conf /etc/xdg/pip /root/.config/pip /root/.pip /usr/local/share/ca-certificates)
  for f in "${configs[@]}"; do [[ -e $f ]] && pip_paths+=("$f"); done
  while read -r path; do
    covered=0
    for p in "${pip_paths[@]}"; do [[ $path == "$p" || $path == "$p"/* ]] && covered=1; done
    ((covered)) || pip_paths+=("$path")
  done < <({ env | grep -E '^PIP_(FIND_LINKS|INDEX_URL|EXTRA_INDEX_URL|CONSTRAINT)=' | cut -d= -f2-
    cat /etc/pip.conf /etc/xdg/pip/*.conf /root/.config/pip/*.conf /root/.pip/*.conf 2>/dev/null |
      grep -E '^[[:space:]]*(find-links|index-url|extra-index-url|constraint)[[:space:]]*='; } |
    grep -oE "(file://)?/[^ \"',]+" | sed 's@^file://@@; s@/simple/\{0,1\}$@@' | sort -u |
    while read -r p; do if [[ -e $p ]]; then echo "$p"; fi; done)
  mapfile -t pip_env < <(env | grep '^PIP_')
  if ((${#pip_paths[@]})); then echo "$name: pip in the chroot sees the host's ${pip_paths[*]}"; fi
fi

# Runs inside the new namespaces: mounts, then the user's steps in the chroot. Each step's
# outcome goes to a line of $logs/steps.txt ("name status seconds"), read back below.
inner=$(
  cat <<'EOF'
set -u
mount -t proc proc "$ROOTFS/proc"
mount -t sysfs sysfs "$ROOTFS/sys"   # its fs/cgroup is empty: no cgroup file system
mount --rbind /dev "$ROOTFS/dev"
mkdir -p "$ROOTFS/mnt/mha-source"
mount --bind -o ro "$SOURCE" "$ROOTFS/mnt/mha-source"
while IFS= read -r path; do  # the host's pip configuration (above), read-only
  [[ -n $path ]] || continue
  if [[ -d $path ]]; then mkdir -p "$ROOTFS$path"; else mkdir -p "$(dirname "$ROOTFS$path")"; touch "$ROOTFS$path"; fi
  mount --bind -o ro "$path" "$ROOTFS$path"
done <<<"$PIP_PATHS"
in_chroot() {
  eval "chroot \"\$ROOTFS\" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=\"\${TERM:-dumb}\" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin $PIP_ENV bash -c \"\$1\""
}
step() { # step NAME COMMAND: runs COMMAND in the chroot, its output to $LOGS/NAME.log
  local t=$SECONDS status=0
  echo "fresh-debian: $1: $2"
  in_chroot "$2" >"$LOGS/$1.log" 2>&1 || status=$?
  echo "$1 $status $((SECONDS - t))" >>"$LOGS/steps.txt"
  if ((status)); then
    tail -n 40 "$LOGS/$1.log"
    echo "fresh-debian: $1 FAILED (exit $status) after $((SECONDS - t)) s"
  else
    echo "fresh-debian: $1 passed in $((SECONDS - t)) s"
  fi
  return "$status"
}
step git "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq git ca-certificates && git clone -q /mnt/mha-source /root/mha && git -C /root/mha checkout -q $COMMIT" &&
  step test "cd /root/mha && scripts/test.sh"; tested=$?
# The sanitizer runs' own logs (test.sh shows only their tails) go with the others: the root is
# removed when the run ends.
for log in "$ROOTFS"/root/mha/build/asan/shard-*.log; do [[ -f $log ]] && cp "$log" "$LOGS/asan-${log##*/}"; done
((tested == 0)) &&
  if ((SWEEP)); then step sweep "cd /root/mha && scripts/sweep.sh $SWEEP_ARGS"; fi
EOF
)
: >"$logs/steps.txt"
sweep_text=  # the sweep's flags, quoted for the inner shell (none: nothing, not an empty word)
if ((${#sweep_args[@]})); then sweep_text=$(printf '%q ' "${sweep_args[@]}"); fi
pip_env_text=  # the PIP_* assignments, quoted for the inner shell
if ((${#pip_env[@]})); then pip_env_text=$(printf '%q ' "${pip_env[@]}"); fi
PIP_PATHS=$(printf '%s\n' "${pip_paths[@]}") PIP_ENV=$pip_env_text \
  ROOTFS=$rootfs SOURCE=$root LOGS=$logs COMMIT=$commit SWEEP=$sweep SWEEP_ARGS=$sweep_text \
  unshare --mount --pid --fork --propagation private bash -c "$inner" || true
chroot "$rootfs" dpkg-query -W -f='${Package}\n' | sort |
  comm -13 "$logs/packages-minbase.txt" - >"$dir/installed.txt"

echo "$name: commit ${commit:0:12} in a fresh Debian 12 chroot (no cgroup file system):"
failed=0
for step in git test sweep; do
  if ((!sweep)) && [[ $step == sweep ]]; then continue; fi
  read -r _ status seconds < <(grep "^$step " "$logs/steps.txt" || echo "$step - -")
  case $status in
    0) echo "  $step: passed in $seconds s" ;;
    -) echo "  $step: not run (an earlier step failed)"; failed=1 ;;
    *) echo "  $step: FAILED (exit $status) after $seconds s; log: ${logs#"$root"/}/$step.log"; failed=1 ;;
  esac
done
grep -h "fleet-slurm-test: \(SKIPPED\|passed\|FAILED\)" "$logs/test.log" 2>/dev/null | sed 's/^/  /' || true
echo "  installed: $(wc -l <"$dir/installed.txt") Debian packages beyond minbase (${dir#"$root"/}/installed.txt)"
# What the peers' environment installed (scripts/peers-env.sh says it once, when it makes it).
grep -h "^peers-env: \(installed\|left out\)" "$logs/test.log" "$logs/sweep.log" 2>/dev/null | sort -u | sed 's/^/  /' || true
exit "$failed"
