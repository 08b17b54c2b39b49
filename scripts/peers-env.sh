#!/usr/bin/env bash
# Makes, or brings up to date, the peers' Python environment: a virtual environment of Debian's
# python3 in build/peers-venv (git-ignored) with the pinned tools/peers-requirements.txt
# (PyTorch 2.x, OpenVINO, ONNX Runtime), which mhapy.peers, `scripts/sweep.sh --with-peers` and
# the peers' tests use. Installs python3-venv (apt) when missing. Nothing is reinstalled when the
# environment already holds what the requirements pin.
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
# above it). It is made aside (build/peers-venv.partial) and moved into place only once complete,
# so that a failure (pip without network) leaves no environment where the tests look for one:
# they then say SKIPPED, as scripts/test.sh announces.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in
  "")
    venv=${MHA_PEERS_VENV:-$root/build/peers-venv}
    requirements=$root/tools/peers-requirements.txt
    ;;
  optimum)
    venv=${MHA_OPTIMUM_VENV:-$root/build/peers-optimum-venv}
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
# The environment is current when it was made from these exact requirements (and PyTorch's index).
stamp=$venv/mha-peers-requirements.txt
made_for() {
  cat "$requirements"
  if [[ -n $torch_index ]]; then echo "# MHA_TORCH_INDEX_URL=$torch_index"; fi
}
if [[ -x $venv/bin/python && -f $stamp ]] && cmp -s "$stamp" <(made_for); then
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
/usr/bin/python3 -m venv --prompt "$(basename "$venv")" "$partial" || fail "python3 -m venv $partial failed"
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
# Complete: into place. The paths the environment wrote of itself (its scripts' #! lines,
# activate, pyvenv.cfg) name where it was made; they are changed to where it now lies.
/usr/bin/python3 - "$partial" "$venv" <<'EOF' || fail "could not move $partial to $venv"
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
mv "$partial" "$venv"
echo "$name: ready: $venv/bin/python"
