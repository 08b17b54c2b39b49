"""The report's verification section on model-built files: each T-token step held against the
same step with one token (mha's fastest backend at each T; a peer against itself), the
break-even acceptance it implies, and T > 1 steps kept out of the decode sections."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import CONTEXT, entries, write

from mhapy.problem import Shape
from mhapy.report import cli, verify
from mhapy.report.loading import load

ONE = Shape(1, 1, 768, 768, 12, past=8192)
INT8 = replace(ONE, kv_precision="int8")
# Seconds per (backend, shape, T): tbb fastest at T = 1 and 8, xsimd at T = 2; the int8 step
# dearer per row; PyTorch's SDPA at 5x its one-token step at T = 8.
MODEL = {
    ("tbb", ONE, 1): 1.0e-3, ("xsimd", ONE, 1): 1.1e-3,
    ("tbb", ONE, 2): 1.3e-3, ("xsimd", ONE, 2): 1.2e-3,
    ("tbb", ONE, 8): 1.5e-3, ("xsimd", ONE, 8): 1.6e-3,
    ("tbb", INT8, 1): 0.5e-3, ("tbb", INT8, 8): 4.5e-3,
    ("torch_sdpa", ONE, 1): 2.0e-3, ("torch_sdpa", ONE, 8): 10.0e-3,
    ("tbb", replace(ONE, past=2048), 4): 0.2e-3,  # no one-token step: the decode sections'
}  # fmt: skip


@pytest.fixture
def files(tmp_path):
    def benchmarks(keep):
        return [
            b
            for (backend, s, t), seconds in MODEL.items()
            if keep(backend)
            for b in entries(backend, "split_weight", replace(s, seq_len=t), 1, seconds)
        ]

    mha = write(tmp_path / "mha.json", benchmarks(lambda b: b in ("tbb", "xsimd")), CONTEXT)
    peers = write(
        tmp_path / "peers-pytorch.json",
        benchmarks(lambda b: b.startswith("torch")),
        {"cpu_model": "Synthetic CPU", "num_cpus": 2, "mha_peers": "pytorch"},
    )
    return [mha, peers]


def test_break_even_solves_the_expected_tokens():
    assert verify.break_even(0.9, 8) == 0.0
    assert verify.break_even(8.0, 8) is None and verify.break_even(9.5, 8) is None
    a = verify.break_even(1.5, 2)  # 1 + a = 1.5
    assert a == pytest.approx(0.5)
    a = verify.break_even(3.0, 8)
    assert verify.expected_tokens(a, 8) == pytest.approx(3.0)
    assert verify.expected_tokens(0.0, 8) == 1.0 and verify.expected_tokens(1.0, 8) == 8.0


def test_costs_hold_each_path_against_its_own_one_token_step(files):
    found = verify.costs(load(files))
    step = verify.Step(ONE, 1)
    assert list(found) == [step]  # the 2k step has no one-token twin
    paths = found[step]
    fp32 = paths["mha (fp32 plan, fp32 cache)"]
    assert fp32.one_s == pytest.approx(1.0e-3)
    assert fp32.ratios == {
        2: pytest.approx(1.2 / 1.0),  # xsimd at T = 2 over tbb at T = 1: the fastest at each T
        8: pytest.approx(1.5 / 1.0),
    }
    assert paths["mha (fp32 plan, int8 cache)"].ratios == {8: pytest.approx(9.0)}
    assert paths["torch_sdpa (fp32 plan)"].ratios == {8: pytest.approx(5.0)}
    assert paths["torch_sdpa (fp32 plan)"].one_s == pytest.approx(2.0e-3)


def test_section_tables_the_costs_and_the_decode_sections_keep_the_rest(files, tmp_path):
    out = tmp_path / "report"
    cli.main([*map(str, files), "--out", str(out)])
    text = (out / "report.md").read_text()
    assert "## Verifying drafted tokens (speculative decoding)" in text
    assert "### B=1, past=8192, 1 thread" in text
    section = text.split("## Verifying drafted tokens")[1].split("\n## ")[0]
    assert "| mha (fp32 plan, int8 cache) | 500 µs | – | 9.00× (never pays) |" in section
    a = verify.break_even(1.5, 8)
    assert f"1.50× (pays above {a:.0%})" in section
    assert (out / "verify_cost.png").is_file()
    decode = verify.others(load(files).decode())
    assert {k.shape.seq_len for k in decode.measurements} == {1, 4}  # T = 4 has no twin
