"""mhapy.problem: the FLOP count of docs/design.md §3 by hand on small shapes, and against the
counts and names mha_bench itself writes (`--dump-shapes`, when ctest gives its path in
MHA_BENCH), which the PyTorch peers read."""

import json
import os
import subprocess

import pytest

from mhapy import peers
from mhapy.problem import Shape, flops

# B1 T2 d_in 3 d_out 4 H2 (head_dim 2), counted term by term:
#   Q, K, V: 2·B·T·d_in·(d_out + 2·d_kv) = 2·1·2·3·(4 + 8) = 144 (d_kv = 4; n_kv_heads 1: 2, so 96)
#   out_proj: 2·B·T·d_out² = 64
#   scores and context: 4·B·H·head_dim·pairs = 16·pairs, pairs = T(T+1)/2 = 3 causal, T² = 4
#   not, T·past + 3 = 9 with past 3 (causal), T·(past + T) = 10 (not causal)
SMALL = Shape(1, 2, 3, 4, 2)


@pytest.mark.parametrize(
    "shape, past, n_kv_heads, expected",
    [
        (SMALL, 0, 0, 144 + 64 + 48),
        (Shape(1, 2, 3, 4, 2, causal=False), 0, 0, 144 + 64 + 64),
        (Shape(1, 2, 3, 4, 2, out_proj=False), 0, 0, 144 + 48),
        (Shape(1, 2, 3, 4, 2, qkv_bias=True), 0, 0, 144 + 64 + 48),  # biases are not counted
        (SMALL, 3, 0, 144 + 64 + 144),
        (Shape(1, 2, 3, 4, 2, causal=False), 3, 0, 144 + 64 + 160),
        (SMALL, 0, 1, 96 + 64 + 48),
        (SMALL, 0, 2, 144 + 64 + 48),  # n_kv_heads = H is multi-head attention
        (Shape(3, 2, 3, 4, 2), 0, 0, 3 * (144 + 64 + 48)),
        # GPT-2 small's attention, B1 T128: the count mha_bench reports for it.
        (Shape(1, 128, 768, 768, 12), 0, 0, 629342208),
    ],
)
def test_flops_term_by_term(shape, past, n_kv_heads, expected):
    assert flops(shape, past=past, n_kv_heads=n_kv_heads) == expected


def test_flops_do_not_depend_on_how_d_out_is_split_into_heads():
    assert {flops(Shape(2, 16, 64, 64, h)) for h in (1, 2, 4, 8, 16, 32, 64)} == {
        flops(Shape(2, 16, 64, 64, 1))
    }


MHA_BENCH = os.environ.get("MHA_BENCH")
FIELDS = ("batch", "seq_len", "d_in", "d_out", "n_heads", "causal", "qkv_bias", "out_proj")


@pytest.mark.skipif(not MHA_BENCH, reason="MHA_BENCH (the mha_bench binary) not given; ctest gives it")
def test_counts_and_names_are_the_ones_mha_bench_writes(tmp_path):
    path = tmp_path / "shapes.json"
    axes = ["--batch", "1,3", "--seq", "1,7", "--heads", "1,4", "--d-model", "16,24", "--kv-heads", "0,2"]
    axes += ["--past", "0,5", "--backends", "naive", "--quiet"]
    for preset in ("quick", "heads"):
        done = subprocess.run(
            [MHA_BENCH, "--preset", preset, *axes, "--dump-shapes", str(path)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        items = json.loads(path.read_text())
        assert any(i.get("past") for i in items) and any(i.get("n_kv_heads") for i in items)
        for item in items:
            s = Shape(**{k: item[k] for k in FIELDS})
            count = flops(s, past=item.get("past", 0), n_kv_heads=item.get("n_kv_heads", 0))
            assert count == item["flops"], item
            if not (item.get("past") or item.get("n_kv_heads")):
                assert s.problem_suffix() == item["name"], item
        # The PyTorch peers read the file as it is (and check the same), timing the plain shapes.
        jobs, not_timed = peers.shapes_from_file(str(path))
        assert len(jobs) + len(not_timed) == len(items) and jobs and not_timed
