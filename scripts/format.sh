#!/usr/bin/env bash
# The tree's formatting, in one place: C++ by Debian's clang-format-14 (.clang-format), Python by
# ruff (tools/pyproject.toml's [tool.ruff]), pinned in tools/format-requirements.txt and
# installed in a git-ignored virtual environment (build/format-venv) the first time.
#   scripts/format.sh          formats every tracked C++ and Python file in place (reports/ aside:
#                              its files are records of a run)
#   scripts/format.sh --check  changes nothing: lists the files that differ and exits 1 if any
# The test command runs --check. Where ruff cannot be installed (no PyPI), the Python half says
# SKIPPED and why; the C++ half always runs.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${MHA_FORMAT_VENV:-$root/build/format-venv}
requirements=$root/tools/format-requirements.txt
check=0
case ${1:-} in
  --check) check=1 ;;
  "") ;;
  *) echo "format.sh: unknown argument '$1', expected --check or nothing" >&2; exit 2 ;;
esac

command -v clang-format-14 >/dev/null || "$root/scripts/deps.sh" clang-format-14
cd "$root"
mapfile -t cxx < <(git ls-files '*.cpp' '*.hpp' ':!reports')
mapfile -t python < <(git ls-files '*.py' ':!reports')

status=0
if ((check)); then
  unformatted=()
  for f in "${cxx[@]}"; do
    clang-format-14 --style=file "$f" | cmp -s - "$f" || unformatted+=("$f")
  done
  if ((${#unformatted[@]})); then
    printf 'format: not clang-formatted: %s\n' "${unformatted[@]}"
    status=1
  fi
else
  clang-format-14 --style=file -i "${cxx[@]}"
fi
echo "format: C++: ${#cxx[@]} files checked by clang-format-14"

# ruff, in its environment: made when missing or made from other requirements.
stamp=$venv/mha-format-requirements.txt
if ! [[ -x $venv/bin/ruff && -f $stamp ]] || ! cmp -s "$stamp" "$requirements"; then
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -c "import ensurepip, venv" 2>/dev/null || "$root/scripts/deps.sh" python3-venv
  if /usr/bin/python3 -m venv "$venv" >/dev/null 2>&1 &&
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements" >"$venv.log" 2>&1; then
    cp "$requirements" "$stamp"
  else
    echo "format: Python: SKIPPED: ruff could not be installed from $requirements" \
      "($(tail -n 1 "$venv.log" 2>/dev/null || echo 'python3 -m venv failed'))"
    exit $status
  fi
fi
if ((check)); then
  "$venv/bin/ruff" format --config tools/pyproject.toml --check --output-format concise "${python[@]}" || status=1
else
  "$venv/bin/ruff" format --config tools/pyproject.toml "${python[@]}"
fi
echo "format: Python: ${#python[@]} files checked by $("$venv/bin/ruff" --version)"
exit $status
