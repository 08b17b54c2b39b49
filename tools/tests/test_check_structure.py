"""scripts/check-structure.py, the house's rules: each rule finds its violation in a small tree
and passes the same tree without it (scripts/test.sh runs the script over the real tree)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check-structure.py"
spec = importlib.util.spec_from_file_location("check_structure", SCRIPT)
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def tree(tmp_path: Path, files: dict[str, str]) -> dict[tuple[str, ...], str]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return check.findings(sorted(files), tmp_path)


def test_a_long_file_is_found(tmp_path):
    found = tree(tmp_path, {"src/core/long.cpp": "int x;\n" * 601, "src/core/short.cpp": "int x;\n" * 600})
    assert list(found) == [("lines", "src/core/long.cpp")]
    assert "601 lines, over 600" in found[("lines", "src/core/long.cpp")]


@pytest.mark.parametrize("intrinsic", ["_mm256_fmadd_ps(a, b, c)", "__m512 x;", "_tile_zero(0);"])
def test_an_intrinsic_outside_arch_is_found(tmp_path, intrinsic):
    found = tree(
        tmp_path,
        {
            "src/kernels/micro/k.hpp": f"void f() {{\n  {intrinsic}\n}}\n",
            "src/kernels/arch/x86_64/a.hpp": f"void g() {{ {intrinsic} }}\n",
            "src/kernels/micro/names.hpp": "int gemm_tile_rows = 48; // not an intrinsic\n",
        },
    )
    assert list(found) == [("intrinsics", "src/kernels/micro/k.hpp")]
    assert found[("intrinsics", "src/kernels/micro/k.hpp")].startswith("line 2: ")


def test_an_isa_list_outside_the_derived_files_is_found(tmp_path):
    found = tree(
        tmp_path,
        {
            "src/core/list.cpp": 'const char* isas[] = {"sse2", "avx2", "avx512"};\n',
            "src/core/derived.cpp": '#define MHA_KERNEL_ISA(n) #n,\nconst char* all[] = {\n#include "kernel_isas.def"\n};'
            "\n// sse2 avx2 avx512\n",
            "src/core/two.cpp": 'bool wide(const char* i) { return i == "avx2" || i == "avx512"; }\n',
            "include/mha/public.hpp": '#define MHA_ISA(n, p, b) n,\nenum class isa {\n#include "mha/isas.def"\n};'
            "\n// sse2 avx2 avx512\n",
            "src/core/mentions.cpp": "// the rows of kernel_isas.def: sse2, avx2, avx512\n",
            "src/backends/onednn/onednn_backend.cpp": "// oneDNN's avx2, avx512 and amx\n",
        },
    )
    # Naming the row file in a comment is not deriving from it.
    assert sorted(found) == [("isa-list", "src/core/list.cpp"), ("isa-list", "src/core/mentions.cpp")]


def test_an_include_that_points_up_or_sideways_is_found(tmp_path):
    found = tree(
        tmp_path,
        {
            "include/mha/error.hpp": "",
            "src/driver/args.hpp": '#include "mha/error.hpp"\n',  # down: fine
            "src/kernels/micro/k.hpp": '#include "driver/args.hpp"\n',  # up
            "src/backends/tbb/t.cpp": '#include "mha/backends/xsimd.hpp"\n#include "driver/args.hpp"\n',
            "include/mha/backends/xsimd.hpp": '#include "mha/error.hpp"\n',
            "src/core/plan.cpp": '#include "mha/backends/xsimd.hpp"\n#include "generated.hpp"\n',
        },
    )
    assert sorted(found) == [
        ("layers", "src/backends/tbb/t.cpp", "include/mha/backends/xsimd.hpp"),  # another backend's
        ("layers", "src/kernels/micro/k.hpp", "src/driver/args.hpp"),
    ]
    assert (
        "of the driver, above its own layer (micro-kernels)"
        in found[("layers", "src/kernels/micro/k.hpp", "src/driver/args.hpp")]
    )


@pytest.mark.parametrize(
    "leak",
    ["__builtin_ia32_vfmaddps512_mask(a, b, c, -1, 4);", 'asm volatile("vzeroupper");', '__asm__("nop");'],
)
def test_a_builtin_or_inline_assembly_outside_arch_is_found(tmp_path, leak):
    found = tree(
        tmp_path,
        {
            "src/kernels/micro/softmax_kernel.hpp": f"void f() {{\n  {leak}\n}}\n",
            "src/kernels/arch/x86_64/a.hpp": f"void g() {{ {leak} }}\n",
            "bench/machine/machine_cpu_aarch64.cpp": f"#include <asm/hwcap.h>\nvoid h() {{ {leak} }}\n",
            "src/core/words.cpp": "// an asm listing; int plasma(int);\n#include <asm/hwcap.h>\n",
        },
    )
    assert list(found) == [("intrinsics", "src/kernels/micro/softmax_kernel.hpp")]


@pytest.mark.parametrize("name", ["long.inl", "rows.def", "CMakeLists.txt"])
def test_a_long_inl_def_or_cmake_file_is_found(tmp_path, name):
    found = tree(tmp_path, {f"src/kernels/{name}": "x\n" * 700})
    assert list(found) == [("lines", f"src/kernels/{name}")]


@pytest.mark.parametrize(
    "include",
    [
        '#include "../core/plan_parts.hpp"',  # a relative path
        "#include <core/plan_parts.hpp>",  # angle brackets
        '#include "core/build_info.hpp"',  # a generated header: its template's layer
    ],
)
def test_an_include_up_is_found_however_it_is_spelled(tmp_path, include):
    found = tree(
        tmp_path,
        {
            "src/core/plan_parts.hpp": "",
            "src/core/build_info.hpp.in": "",
            "src/kernels/gemm.cpp": f"{include}\n#include <vector>\n",
        },
    )
    target = "src/core/build_info.hpp.in" if "build_info" in include else "src/core/plan_parts.hpp"
    assert list(found) == [("layers", "src/kernels/gemm.cpp", target)]


def test_every_header_of_the_core_is_above_the_kernels(tmp_path):
    # The core's headers were once the bottom layer by name (bf16.hpp, int8.hpp, ...), so any
    # other header there was legal from the kernels; the bottom layer is now a folder of its own.
    found = tree(
        tmp_path,
        {
            "src/core/bf16.hpp": "",
            "src/base/bf16.hpp": "",
            "src/kernels/micro/k.hpp": '#include "core/bf16.hpp"\n#include "base/bf16.hpp"\n',
        },
    )
    assert list(found) == [("layers", "src/kernels/micro/k.hpp", "src/core/bf16.hpp")]


def test_every_layer_is_folders_but_the_umbrella_header():
    places = [place for _, layer in check.LAYERS for place in layer]
    assert [p for p in places if not p.endswith("/")] == ["include/mha/mha.hpp"]


def test_files_not_yet_added_to_git_are_checked(tmp_path, monkeypatch):
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("build/\n")
    (tmp_path / "src" / "core").mkdir(parents=True)
    (tmp_path / "src" / "core" / "new.cpp").write_text("int x;\n" * 601)
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "made.cpp").write_text("int x;\n" * 601)
    monkeypatch.setattr(check, "ROOT", tmp_path)
    files = check.checked_files()
    assert "src/core/new.cpp" in files and "build/made.cpp" not in files
    assert list(check.findings(files, tmp_path)) == [("lines", "src/core/new.cpp")]
