#!/usr/bin/env bash
# Makes, or brings up to date, the peers' Python environment: a virtual environment of Debian's
# python3 with the pinned tools/peers-requirements.txt (PyTorch 2.x, OpenVINO, ONNX Runtime),
# which mhapy.peers, `scripts/sweep.sh --with-peers` and the peers' tests use, at build/peers-venv
# (git-ignored). Installs python3-venv (apt) when missing. Nothing is reinstalled when the
# environment already holds what the requirements pin.
#
# The environment itself lies outside the clone, in a per-user cache keyed by what it is made
# from (the requirements' pins, PyTorch's index, Debian's Python):
# ${MHA_ENV_CACHE:-${XDG_CACHE_HOME:-~/.cache}/mha}/peers-venv-<key>, and build/peers-venv is a
# link to it, so that a fresh clone (CI's) reuses what an earlier one made rather than downloading
# PyTorch again. One made in build/ by an earlier version of this script moves there when it is
# current. Entries of other keys unused for 30 days are removed. Where the cache cannot be
# written, the environment is made in build/ as before. MHA_PEERS_VENV (MHA_OPTIMUM_VENV) names
# another place, used as it is (no cache, no link).
#
#   scripts/peers-env.sh          prints what it installed, then "peers-env: ready: <python>"
#   scripts/peers-env.sh optimum  the same for the whole-model peer's own environment:
#                                 tools/peers-optimum-requirements.txt in build/peers-optimum-venv
#                                 (MHA_OPTIMUM_VENV), OpenVINO through optimum-intel, whose
#                                 releases require an older transformers than the peers pin
#
# PyTorch: `pip install torch==2.13.0` takes a CPU build where one lies on the machine (this
# kind of machine has one); elsewhere PyPI's torch is the CUDA build, gigabytes of nvidia-*
# packages. pip's dry run (--dry-run --report) tells which: with CUDA packages in it, PyTorch is
# left out, said here and recorded in the environment (build/peers-venv/mha-peers-left-out),
# and its peers are declined with that reason. To have the CPU build there, name the index that
# serves it:
#
#   MHA_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/peers-env.sh
#
# pip then looks there beside its own index (--extra-index-url) and takes the CPU build, whose
# local version (2.13.0+cpu) ranks above PyPI's 2.13.0; the environment is remade when the
# variable changes. Exit status: 0 when the environment is usable
# (perhaps without PyTorch), 1 when it cannot be made (the reason is printed, pip's own error
# above it). It is made aside (<its place>.partial) and moved into place only once complete,
# so that a failure (pip without network) leaves no environment where the tests look for one:
# they then say SKIPPED, as scripts/test.sh announces.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in
  "")
    venv=${MHA_PEERS_VENV:-}
    link=$root/build/peers-venv
    requirements=$root/tools/peers-requirements.txt
    ;;
  optimum)
    venv=${MHA_OPTIMUM_VENV:-}
    link=$root/build/peers-optimum-venv
    requirements=$root/tools/peers-optimum-requirements.txt
    ;;
  *)
    echo "peers-env: unknown environment '$1': expected none (the peers') or 'optimum'" >&2
    exit 2
    ;;
esac
name=peers-env

fail() {
  echo "$name: cannot make the peers' environment: $*" >&2
  exit 1
}

torch_index=${MHA_TORCH_INDEX_URL:-}
# The environment is current when it was made from these exact pins (and PyTorch's index).
made_for() {
  grep -vE '^\s*(#|$)' "$requirements"  # the pins, not the comments: editing one remakes nothing
  if [[ -n $torch_index ]]; then echo "# MHA_TORCH_INDEX_URL=$torch_index"; fi
}
current() {
  [[ -x $1/bin/python && -f $1/mha-peers-requirements.txt ]] &&
    cmp -s "$1/mha-peers-requirements.txt" <(made_for)
}

# The environment made in $1 moved to $2: the paths it wrote of itself (its scripts' #! lines,
# activate, pyvenv.cfg) name where it was made; they are changed to where it now lies.
relocate() {
  /usr/bin/python3 - "$1" "$2" <<'EOF' || fail "could not move $1 to $2"
import pathlib, sys
made, final = (s.encode() for s in sys.argv[1:])
root = pathlib.Path(sys.argv[1])
for f in [*(root / "bin").iterdir(), root / "pyvenv.cfg"]:
    if f.is_file() and not f.is_symlink():
        data = f.read_bytes()
        text = data.startswith(b"#!") or f.name.lower().startswith("activate") or f.name == "pyvenv.cfg"
        if text and made in data:
            f.write_bytes(data.replace(made, final))
EOF
  mv "$1" "$2"
}

# Where the environment lies: MHA_PEERS_VENV's place; else the cache's entry for this key, linked
# from build/ (one current in build/ from before moves there); else build/ itself.
cached=0
if [[ -z $venv ]]; then
  if [[ -n ${MHA_ENV_CACHE:-} ]]; then
    cache=$MHA_ENV_CACHE
  elif [[ -n ${XDG_CACHE_HOME:-} || -n ${HOME:-} ]]; then
    cache=${XDG_CACHE_HOME:-$HOME/.cache}/mha
  else
    cache=  # nowhere: build/
  fi
  key=$({ made_for; /usr/bin/python3 -VV; } | sha256sum | cut -c1-16)
  if [[ -n $cache ]] && mkdir -p "$cache" 2>/dev/null && [[ -w $cache ]]; then
    venv=$cache/$(basename "$link")-$key
    cached=1
    # One maker per entry: another clone making the same one is waited for.
    exec 9>"$venv.lock"
    flock 9
    if [[ -d $link && ! -L $link ]]; then
      if current "$link" && [[ ! -e $venv ]]; then
        echo "$name: moving $link into the cache: $venv"
        relocate "$link" "$venv"
      else
        rm -rf "$link"
      fi
    fi
    touch "$venv.used"
    # Entries of other keys (other pins) unused for 30 days.
    find "$cache" -maxdepth 1 -name "$(basename "$link")-*.used" -mtime +30 -print |
      while read -r used; do rm -rf "${used%.used}" "$used" "${used%.used}.lock"; done
  else
    echo "$name: cannot write the cache ${cache:-(no HOME)}: the environment goes in $link"
    venv=$link
  fi
fi
# build/ names the cache's environment by its link.
link_it() {
  if ((cached)); then
    mkdir -p "$(dirname "$link")"
    ln -sfn "$venv" "$link"
  fi
}

if current "$venv"; then
  link_it
  left_out=$(cat "$venv/mha-peers-left-out" 2>/dev/null || true)
  [[ -z $left_out ]] || echo "$name: left out: $left_out"
  echo "$name: ready: $venv/bin/python"
  exit 0
fi

if ! /usr/bin/python3 -c "import ensurepip, venv" 2>/dev/null; then
  "$root/scripts/deps.sh" python3-venv || fail "python3-venv is missing and could not be installed"
fi
# A stale environment goes first (an environment counts only as made from these requirements),
# and so does what a killed run left aside.
partial=$venv.partial
rm -rf "$venv" "$partial"
mkdir -p "$(dirname "$venv")"
report=
trap 'rm -rf "$partial" ${report:+"$report"}' EXIT
/usr/bin/python3 -m venv --prompt "$(basename "$link")" "$partial" || fail "python3 -m venv $partial failed"
pip=("$partial/bin/python" -m pip --disable-pip-version-check)
index=()
[[ -z $torch_index ]] || index=(--extra-index-url "$torch_index")

# PyTorch: which build would pip take? Leave it out rather than download a CUDA build.
packages=$(grep -vE '^\s*(#|$)' "$requirements")
torch_spec=$(grep -E '^torch[=<>~! ]' <<<"$packages" || true)
left_out=
if [[ -n $torch_spec ]]; then
  report=$(mktemp)
  if ! resolve_errors=$("${pip[@]}" install "${index[@]}" -q --dry-run --ignore-installed --report "$report" "$torch_spec" 2>&1 >/dev/null); then
    grep -v '^WARNING: Location' <<<"$resolve_errors" >&2 || true
    fail "pip cannot resolve $torch_spec${torch_index:+ with MHA_TORCH_INDEX_URL=$torch_index} (above: no network, or no such release for this Python)"
  fi
  cuda=$(/usr/bin/python3 -c '
import json, sys
items = json.load(open(sys.argv[1]))["install"]
names = sorted(i["metadata"]["name"] for i in items if i["metadata"]["name"].lower().startswith(("nvidia-", "triton", "cuda")))
print(" ".join(names))' "$report")
  if [[ -n $cuda ]]; then
    left_out="PyTorch ($torch_spec): pip would install the CUDA build here ($(wc -w <<<"$cuda") CUDA packages: ${cuda:0:120}...), gigabytes, not the CPU build; its peers are declined (MHA_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu names PyTorch's CPU index)"
    packages=$(grep -vE '^torch[=<>~! ]' <<<"$packages")
    echo "$name: left out: $left_out"
  fi
fi

echo "$name: installing into $venv: $(tr '\n' ' ' <<<"$packages")"
# This machine's pip configuration may name index folders that lack a package: pip warns about
# each ("Location ... is ignored"), which says nothing about the install.
# shellcheck disable=SC2086
"${pip[@]}" install "${index[@]}" -q $packages 2> >(grep -v '^WARNING: Location' >&2) || fail "pip install failed (above)"
# PyPI's torchvision (which optimum-intel requires) is built for PyPI's torch: beside the CPU
# build its operators fail to register ("operator torchvision::nms does not exist") and every
# transformers import that touches it fails. Nothing measured here uses it: it goes.
if [[ $packages == *torch==* ]] && "${pip[@]}" show -q torchvision >/dev/null 2>&1; then
  "${pip[@]}" uninstall -y -q torchvision || fail "could not remove PyPI's torchvision (above)"
fi
echo "$name: installed: $("${pip[@]}" list --format=freeze 2>/dev/null | grep -iE "^($(tr '\n' '|' <<<"$packages" | sed -E 's/==[^|]*//g; s/\|$//'))==" | tr '\n' ' ')"
printf '%s' "$left_out" >"$partial/mha-peers-left-out"
made_for >"$partial/mha-peers-requirements.txt"
# Complete: into place.
relocate "$partial" "$venv"
link_it
echo "$name: ready: $venv/bin/python"
