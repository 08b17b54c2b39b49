#!/usr/bin/env python3
"""The house's rules, checked over the files git tracks or would add (scripts/test.sh runs it; so
can anyone):

  lines       no source, test, tool, script, CMake, .inl or .def file over 600 lines (a file
              that long holds more than one thing: split it by what it holds);
  intrinsics  no x86 intrinsic (_mm*, _tile_*, __m128/256/512 types, __builtin_ia32_*) and no
              inline assembly (asm, __asm__) outside src/kernels/arch/: kernels above arch/ are
              written in xsimd and arch/'s primitives (ASM_ELSEWHERE: what is not a kernel);
  isa-list    no C++ or CMake file names three or more of mha's ISAs unless it expands their rows
              (include/mha/isas.def: every isa; src/kernels/arch/<arch>/kernel_isas.def: those
              the kernels are built for) or translates another library's names (FOREIGN_ISAS):
              the list is written once;
  layers      includes point down: a file includes files of its own layer or of the layers below
              (LAYERS, bottom first), and a backend's files no other backend's; "x" and <x>
              includes alike, a relative path resolved, a generated header by its template
              (x.in).

The files are those git tracks and those it would add (untracked, not ignored): a new file is
checked before its first commit.

Each finding names the file, the rule and what to do. KNOWN holds the findings the tree had when
a rule came in, each with what removes it: they are reported as known, not failures, and an
entry that no longer occurs fails (remove it from KNOWN: the list only shrinks).

    scripts/check-structure.py        exit status 0 when every rule holds, 1 otherwise
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 600
CHECKED = (".cpp", ".hpp", ".h", ".inl", ".def", ".py", ".sh", ".cmake", "CMakeLists.txt")
# Made by tools (nanobind's stub generator), not written.
GENERATED = ("python/mha/_mha.pyi",)

INTRINSIC = re.compile(
    r"\b(_mm\d*_\w+|_tile_\w+|__m(?:128|256|512)[a-z]*|__builtin_ia32_\w+)\b"
    r"|\b(?:__asm__|__asm|asm)\b(?=\s*(?:volatile|__volatile__|goto)?\s*\()"
)
# Files outside arch/ whose inline assembly is no kernel, with why.
ASM_ELSEWHERE = {
    "bench/machine/machine_cpu_aarch64.cpp": "reads MIDR_EL1 to name the core, which no intrinsic does",
}
ISA_HOME = "src/kernels/arch/"
ISAS = ("sse2", "avx2", "avx512", "avx512bf16", "amx", "neon64")
ISA_NAME = re.compile(r"\b(" + "|".join(ISAS) + r")\b")
# Files whose ISA names are another library's vocabulary, not mha's list, with why.
FOREIGN_ISAS = {
    "src/backends/onednn/onednn_backend.cpp": "oneDNN's cpu_isa names and their map to and from mha::isa",
}
# A file derives from the rows when it expands them: a row file itself, a C++ file including
# one, CMake reading one (naming the file in a comment is not deriving).
ISA_DERIVED = re.compile(
    r'^\s*(?:MHA_(?:KERNEL_)?ISA\(|#\s*include\s+"[^"]*isas\.def"|file\(STRINGS\s.*isas\.def)', re.M
)

# The layers, bottom first: each a list of folders (ending in "/": the folder's whole tree) and
# files. A file belongs to the layer of its own path if listed, else of its longest listed folder.
# Every layer is folders but the front ends' umbrella header (include/mha/mha.hpp, where users
# include it).
LAYERS = [
    ("the public API", ["include/mha/"]),
    # What every layer uses: bf16 and the coded caches' formats, text, checks, dropout's stream.
    ("shared utilities", ["src/base/"]),
    # What the driver, the backends and the kernels all pass: an attention call's arguments,
    # aligned buffers, the kernel set's concept.
    ("common types", ["src/common/"]),
    # What the kernels are called with and through: argument structs, the kernel-set table.
    ("the kernels' interface", ["src/kernels/interface/"]),
    ("arch primitives", ["src/kernels/arch/"]),
    ("micro-kernels", ["src/kernels/micro/"]),
    ("kernels", ["src/kernels/"]),
    ("the driver", ["src/driver/"]),
    ("backends", ["include/mha/backends/", "src/backends/"]),
    ("checkpoint I/O", ["src/io/"]),
    ("the core", ["src/core/"]),
    # include/mha/mha.hpp is the umbrella header: above everything it gathers.
    (
        "front ends",
        [
            "include/mha/mha.hpp",
            "src/python/",
            "src/cli/",
            "src/reference/",
            "src/testing/",
            "bench/",
            "tests/",
        ],
    ),
]
BACKEND = re.compile(r"^(?:src/backends/([a-z0-9_]+)/|include/mha/backends/([a-z0-9_]+)\.hpp$)")
INCLUDE = re.compile(r'^\s*#\s*include\s+["<]([^">]+)[">]', re.M)

# Findings present when each rule came in, with what removes them. Keys: (rule, file[, target]).
KNOWN: dict[tuple[str, ...], str] = {}


def checked_files() -> list[str]:
    """The files git tracks and those it would add (untracked, not ignored), sorted."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sorted({p for p in out.splitlines() if (ROOT / p).is_file()})


def layer_index(path: str) -> int | None:
    """The index in LAYERS of the layer `path` belongs to (None: none, as tools/ and scripts/)."""
    best, depth = None, -1
    for index, (_, places) in enumerate(LAYERS):
        for place in places:
            if place == path:
                return index
            if place.endswith("/") and path.startswith(place) and len(place) > depth:
                best, depth = index, len(place)
    return best


def resolve(including: str, name: str, files: set[str]) -> str | None:
    """The file `#include "name"` (or <name>) in `including` reads (its own folder, then src/,
    include/, tests/, bench/; "../" resolved), or the template a generated header is made from
    (name.in); None for a system header or one found on a target's own include path
    (arch/<arch>/'s arch_simd.hpp, kernel_isas.def), which the layers leave alone."""
    here = os.path.normpath(Path(including).parent / name)
    for candidate in (
        here,
        *(os.path.normpath(f"{top}/{name}") for top in ("src", "include", "tests", "bench")),
    ):
        for made in (candidate, candidate + ".in"):
            if made in files:
                return made
    return None


def backend_of(path: str) -> str | None:
    m = BACKEND.match(path)
    return (m.group(1) or m.group(2)) if m else None


def findings(files: list[str], root: Path = ROOT) -> dict[tuple[str, ...], str]:
    """Every rule's findings over `files` (paths under `root`), by (rule, file[, included file])."""
    found: dict[tuple[str, ...], str] = {}
    names = set(files)
    for path in files:
        if path.startswith("reports/") or path in GENERATED:
            continue
        cpp = path.endswith((".cpp", ".hpp", ".h", ".inl", ".def"))
        text = (root / path).read_text(encoding="utf-8", errors="replace")
        if path.endswith(CHECKED):
            lines = text.count("\n")
            if lines > MAX_LINES:
                found[("lines", path)] = f"{lines} lines, over {MAX_LINES}: split it by what it holds"
        if cpp and not path.startswith(ISA_HOME) and path not in ASM_ELSEWHERE:
            hit = INTRINSIC.search(text)
            if hit:
                line = text.count("\n", 0, hit.start()) + 1
                found[("intrinsics", path)] = (
                    f"line {line}: {hit.group(0)}: intrinsics live in {ISA_HOME} (wrap it in a primitive there)"
                )
        code = cpp or path.endswith((".cmake", "CMakeLists.txt"))
        if (
            code
            and path.startswith(("src/", "include/", "bench/", "cmake/"))
            and not ISA_DERIVED.search(text)
            and path not in FOREIGN_ISAS
        ):
            isas = sorted(set(ISA_NAME.findall(text)))
            if len(isas) >= 3:
                found[("isa-list", path)] = (
                    f"names the ISAs {', '.join(isas)}: derive the list from mha/isas.def (MHA_ISA) or kernel_isas.def "
                    "(MHA_KERNEL_ISA)"
                )
        if cpp:
            mine = layer_index(path)
            for name in INCLUDE.findall(text):
                target = resolve(path, name, names)
                if target is None or mine is None:
                    continue
                theirs = layer_index(target)
                if theirs is not None and theirs > mine:
                    found[("layers", path, target)] = (
                        f'includes "{name}" of {LAYERS[theirs][0]}, above its own layer ({LAYERS[mine][0]}): '
                        "includes point down"
                    )
                elif backend_of(path) and backend_of(target) and backend_of(path) != backend_of(target):
                    found[("layers", path, target)] = (
                        f'includes "{name}", the {backend_of(target)} backend\'s: a backend reaches the kernels '
                        "and the driver, not another backend"
                    )
    return found


def main() -> int:
    found = findings(checked_files())
    failed = False
    for key, why in sorted(found.items()):
        where = f"{key[1]}" + (f" -> {key[2]}" if len(key) > 2 else "")
        if key in KNOWN:
            print(f"check-structure: known: {where}: {key[0]}: {why} (to do: {KNOWN[key]})")
        else:
            failed = True
            print(f"check-structure: FAILED: {where}: {key[0]}: {why}", file=sys.stderr)
    for key in sorted(set(KNOWN) - set(found)):
        failed = True
        print(
            f"check-structure: FAILED: {' -> '.join(key[1:])}: {key[0]} holds now: remove it from KNOWN in "
            "scripts/check-structure.py",
            file=sys.stderr,
        )
    known = len(set(KNOWN) & set(found))
    print(f"check-structure: {'FAILED' if failed else 'passed'} ({known} known findings to remove)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
