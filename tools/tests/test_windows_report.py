"""The report's sliding-window section on model-built files: each windowed shape on mha's
fastest backend against its causal twin on the same backend, the pairs law, the peers' masked
calls beside it (a peer faster said plainly), and windowed shapes kept off the causal series."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import CONTEXT, entries, write

from mhapy.problem import Shape
from mhapy.report import cli, windows
from mhapy.report.loading import load
from mhapy.report.series import seq_series

CAUSAL = Shape(1, 8192, 768, 768, 12)
W512 = replace(CAUSAL, window=512)
STEP = Shape(1, 1, 768, 768, 12, past=32768)
STEP_W512 = replace(STEP, window=512)
# Seconds per (backend, shape): tbb fastest everywhere but the windowed step, where PyTorch's
# SDPA over the window's keys is faster.
MODEL = {
    ("tbb", CAUSAL): 0.60, ("xsimd", CAUSAL): 0.62, ("tbb", W512): 0.15, ("xsimd", W512): 0.16,
    ("tbb", STEP): 0.0040, ("tbb", STEP_W512): 0.00025,
    ("torch_sdpa", W512): 0.45, ("torch_sdpa", STEP_W512): 0.00020, ("onnxruntime_gqa", W512): 0.30,
}  # fmt: skip


@pytest.fixture
def files(tmp_path):
    def benchmarks(keep):
        return [
            b
            for (backend, s), t in MODEL.items()
            if keep(backend)
            for b in entries(backend, "fused_qkv" if "onnx" in backend else "split_weight", s, 1, t)
        ]

    mha = write(tmp_path / "mha.json", benchmarks(lambda b: b in ("tbb", "xsimd")), CONTEXT)
    peers = [
        write(
            tmp_path / f"peers-{lib}.json",
            benchmarks(lambda b, prefix=prefix: b.startswith(prefix)),
            {"cpu_model": "Synthetic CPU", "num_cpus": 2, "mha_peers": lib},
        )
        for lib, prefix in (("pytorch", "torch"), ("onnxruntime", "onnxruntime"))
    ]
    return [mha, *peers]


def test_rows_read_each_window_against_its_causal_twin_and_the_peers(files):
    rows = {(r.shape, r.threads): r for r in windows.window_rows(load(files))}
    assert set(rows) == {(W512, 1), (STEP_W512, 1)}
    forward = rows[W512, 1]
    assert (forward.mha.key.backend, forward.causal.key.backend) == ("tbb", "tbb")
    assert forward.speedup == pytest.approx(0.60 / 0.15)
    # Causal: 8192·8193/2 pairs; the window: 512·513/2 for the first rows, 512 for each after.
    assert forward.law == pytest.approx((8192 * 8193 / 2) / (512 * 513 / 2 + 512 * (8192 - 512)))
    assert forward.versus("PyTorch") == pytest.approx(0.45 / 0.15)
    assert forward.versus("ONNX Runtime") == pytest.approx(0.30 / 0.15)
    step = rows[STEP_W512, 1]
    assert step.law == pytest.approx(32769 / 512)
    assert step.versus("PyTorch") == pytest.approx(0.8)
    assert step.versus("ONNX Runtime") is None


def test_section_tables_both_kinds_and_says_where_a_peer_wins(files, tmp_path):
    out = tmp_path / "report"
    cli.main([*map(str, files), "--out", str(out)])
    text = (out / "report.md").read_text()
    assert "## Sliding windows" in text
    assert "### Forward passes with a sliding window" in text
    assert "### Decode steps (T = 1) with a sliding window" in text
    assert "4.00×" in text  # the forward pass's speed-up over its causal twin
    assert "**PyTorch is faster at 1 of them**, by up to 1.25× (past 32768, window 512, 1 thread)" in text


def test_windowed_shapes_are_not_on_the_causal_seq_series():
    series = seq_series([CAUSAL, replace(CAUSAL, seq_len=4096), W512, replace(W512, seq_len=4096)])
    assert sorted(s.shapes[0].window for s in series) == [0, 512]
    assert all(len({s.window for s in line.shapes}) == 1 for line in series)
