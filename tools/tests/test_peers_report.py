"""The report's answer with the peers, on model-built files: per class, precision and thread
count the fastest path, each library against mha's fastest (the ratios the model gives), every
shape a peer wins with how it computes, the figure, and a library that could not run."""

from __future__ import annotations

import pytest
from conftest import CONTEXT, entries, skipped, write

from mhapy.problem import Shape
from mhapy.report import cli, peer_ranking
from mhapy.report.loading import load

GPT2 = Shape(1, 1024, 768, 768, 12)
NARROW = Shape(4, 256, 768, 768, 96)
DECODE_B1 = Shape(1, 1, 768, 768, 12, past=8192)
DECODE_B32 = Shape(32, 1, 768, 768, 12, past=2048)
# Seconds per (path backend, shape): mha leads the forward passes and decode B1; ONNX Runtime's
# GQA wins decode at B32; OpenVINO's u8 cache is its fastest decode variant.
MODEL = {
    ("tbb", GPT2): 0.020, ("xsimd", GPT2): 0.035, ("torch_sdpa", GPT2): 0.046,
    ("openvino", GPT2): 0.052, ("onnxruntime", GPT2): 0.082,
    ("tbb", NARROW): 0.030, ("torch_sdpa", NARROW): 0.048, ("openvino", NARROW): 0.047,
    ("tbb", DECODE_B1): 0.0021, ("torch_sdpa", DECODE_B1): 0.0024, ("openvino", DECODE_B1): 0.0042,
    ("openvino_u8kv", DECODE_B1): 0.0033, ("onnxruntime_gqa", DECODE_B1): 0.0028,
    ("tbb", DECODE_B32): 0.0416, ("torch_sdpa", DECODE_B32): 0.0419, ("openvino_u8kv", DECODE_B32): 0.0566,
    ("onnxruntime_gqa", DECODE_B32): 0.0307,
}  # fmt: skip
FORM = {"tbb": "split_weight", "xsimd": "split_weight", "torch_sdpa": "split_weight"}
LABEL = "checked: max |y - oracle| / max |oracle| = 1e-07 <= 0.0001 on 8 rows (float64 oracle, mha_bench's inputs); "


@pytest.fixture
def files(tmp_path):
    mha = [
        b
        for (backend, s), t in MODEL.items()
        if not backend.startswith(("torch", "openvino", "onnx"))
        for b in entries(backend, FORM[backend], s, 1, t)
    ]
    paths = [
        write(
            tmp_path / "mha.json", mha, dict(CONTEXT, mha_cpu_model="Synthetic CPU", mha_hardware_threads="2")
        )
    ]
    for library, prefix in (("pytorch", "torch"), ("openvino", "openvino"), ("onnxruntime", "onnxruntime")):
        benchmarks = [
            b
            for (backend, s), t in MODEL.items()
            if backend.startswith(prefix)
            for b in entries(
                backend, FORM.get(backend, "fused_qkv"), s, 1, t, label=LABEL + f"{backend}'s way"
            )
        ]
        if library == "onnxruntime":
            benchmarks.append(
                skipped(
                    "onnxruntime_gqa",
                    "fused_qkv",
                    Shape(1, 1024, 768, 768, 12, precision="bf16"),
                    1,
                    "declined: ONNX Runtime's CPU execution provider has no bf16 attention kernels",
                )
            )
        context = {"cpu_model": "Synthetic CPU", "num_cpus": 2, "mha_peers": library}
        paths.append(write(tmp_path / f"peers-{library}.json", benchmarks, context))
    paths.append(
        write(
            tmp_path / "peers-absent.json",
            [],
            {
                "cpu_model": "Synthetic CPU",
                "num_cpus": 2,
                "mha_peers": "pytorch",
                "peers_unavailable": "PyTorch is not installed in this Python",
            },
        )
    )
    return paths


def test_each_class_ranks_mha_and_every_library(files):
    ranked = {r.shape_class: r for r in peer_ranking.rankings(load(files))}
    assert set(ranked) == {
        "forward, head_dim ≥ 32",
        "forward, head_dim < 32",
        "decode, B = 1",
        "decode, B > 1",
    }
    forward = ranked["forward, head_dim ≥ 32"]
    assert forward.fastest == forward.best_mha == "tbb"
    assert forward.versus_mha["PyTorch"] == (pytest.approx(0.020 / 0.046), 1)
    assert not forward.peer_wins
    b1 = ranked["decode, B = 1"]
    assert b1.fastest == "tbb" and b1.versus_mha["OpenVINO"][0] == pytest.approx(
        0.0021 / 0.0033
    )  # u8, its best
    b32 = ranked["decode, B > 1"]
    assert b32.fastest == "ONNX Runtime" and b32.best_mha == "tbb"
    (win,) = b32.peer_wins
    assert win.peer.key.backend == "onnxruntime_gqa" and win.ratio == pytest.approx(0.0416 / 0.0307)
    assert b32.ratios[DECODE_B32] == {
        "ONNX Runtime": pytest.approx(0.0307 / 0.0416),
        "OpenVINO": pytest.approx(0.0566 / 0.0416),
        "PyTorch": pytest.approx(0.0419 / 0.0416),
    }


def test_the_report_says_where_a_peer_wins_and_how(files, tmp_path):
    out = tmp_path / "report"
    assert cli.main([*map(str, files), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    section = md.split("## Answer: mha and the peers")[1].split("\n## ")[0]
    assert "| decode, B > 1 | fp32 | 1 | 1 | **ONNX Runtime** | tbb | **0.74×** | 1.36× | 1.01× |" in section
    assert (
        "**ONNX Runtime beats mha on decode, B > 1 (fp32, 1 thread) at 1 of 1 shapes**, by up to 1.36× "
        "(B32 T1 d768 H12 (hd 64) past 2048: onnxruntime_gqa 30.7 ms against mha's tbb 41.6 ms); how it "
        "computes: onnxruntime_gqa's way." in section
    )
    assert section.count("beats mha") == 1
    assert (out / "peers.png").exists()
    assert "pytorch: PyTorch is not installed in this Python (`peers-absent.json`)." in md
    assert "declined: ONNX Runtime's CPU execution provider has no bf16 attention kernels" in md
