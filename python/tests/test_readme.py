"""The README's Python example runs as written, against the package on the path (the test
build's, or the one `pip install .` installed: ctest runs it both ways)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def python_section_code() -> str:
    text = README.read_text()
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the README's Python section has no ```python example"
    return "\n".join(blocks)


def test_the_readme_example_runs_as_written(capsys):
    pytest.importorskip("torch")
    exec(compile(python_section_code(), str(README), "exec"), {"__name__": "readme"})
    assert "mha.Plan(" in capsys.readouterr().out
