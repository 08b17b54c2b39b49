"""The extension's type stub (python/mha/_mha.pyi, shipped with py.typed) is what nanobind's
stubgen writes for the extension as built: regenerate it with
  PYTHONPATH=<build>/python python -m nanobind.stubgen -m mha._mha -o python/mha/_mha.pyi"""

from __future__ import annotations

from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mha"


def test_the_committed_stub_is_the_extensions(tmp_path):
    stubgen = pytest.importorskip("nanobind.stubgen")
    out = tmp_path / "_mha.pyi"
    stubgen.main(["-q", "-m", "mha._mha", "-o", str(out)])
    assert out.read_text() == (PACKAGE / "_mha.pyi").read_text(), (
        "python/mha/_mha.pyi is stale: regenerate it"
    )
    assert (PACKAGE / "py.typed").exists()
