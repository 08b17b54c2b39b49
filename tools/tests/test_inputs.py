"""mhapy.inputs and mhapy.oracle against mha_bench itself: the weights, x and checked rows the
peers run on are bit for bit the ones mha_bench times (mha_bench --dump-inputs), and the NumPy
oracle gives mha_bench's oracle values. Needs MHA_BENCH (ctest sets it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mhapy import inputs, oracle
from mhapy.problem import parse_shape
from mhapy.tensor_files import read_safetensors

BENCH = os.environ.get("MHA_BENCH")
pytestmark = pytest.mark.skipif(not BENCH, reason="MHA_BENCH (the mha_bench binary) is not set")


def dumped(tmp_path: Path, *flags: str) -> list[tuple[str, dict, dict]]:
    """(problem, tensors as float32 arrays, metadata) of every file mha_bench --dump-inputs
    writes for the flags."""
    out = tmp_path / "inputs"
    subprocess.run([BENCH, *flags, "--backends", "naive", "--dump-inputs", str(out)], check=True)
    result = []
    for path in sorted(out.glob("*.safetensors")):
        tensors, metadata = read_safetensors(path)
        arrays = {
            name: np.frombuffer(data, dtype="<f4").reshape(shape)
            for name, (dtype, shape, data) in tensors.items()
        }
        assert all(dtype == "F32" for dtype, _, _ in tensors.values())
        result.append((metadata["problem"], arrays, metadata))
    assert result, f"mha_bench wrote nothing for {flags}"
    return result


TINY = ["--preset", "quick", "--heads", "1,2,4", "--seq", "7", "--d-model", "16", "--batch", "1,3"]


@pytest.mark.parametrize(
    "flags",
    [TINY, TINY + ["--kv-heads", "1"], TINY + ["--past", "5", "--seq", "1"], TINY + ["--precision", "bf16"]],
    ids=["mha", "kvh1", "decode", "bf16"],
)
def test_weights_x_and_rows_are_mha_bench_s(tmp_path, flags):
    for problem, t, _ in dumped(tmp_path, *flags):
        s = parse_shape(problem.split("/"))
        w = inputs.weights(s)
        for name, layer in (
            ("W_query", w.query),
            ("W_key", w.key),
            ("W_value", w.value),
            ("out_proj", w.out_proj),
        ):
            np.testing.assert_array_equal(layer.weight, t[f"{name}.weight"], err_msg=f"{problem} {name}")
            if layer.bias is not None:
                np.testing.assert_array_equal(layer.bias, t[f"{name}.bias"], err_msg=f"{problem} {name}.bias")
            else:
                assert f"{name}.bias" not in t
        np.testing.assert_array_equal(inputs.x(s), t["x"], err_msg=problem)
        assert inputs.sample_rows(s.batch, s.seq_len) == [tuple(map(int, r)) for r in t["check.rows"]]


@pytest.mark.parametrize(
    "flags",
    [
        TINY,
        TINY + ["--kv-heads", "1"],
        TINY + ["--past", "5", "--seq", "1,2"],
        TINY + ["--window", "3"],
        TINY + ["--past", "5", "--seq", "1,2", "--window", "2"],
    ],
    ids=["mha", "kvh1", "decode", "window", "decode_window"],
)
def test_oracle_is_mha_bench_s(tmp_path, flags):
    for problem, t, _ in dumped(tmp_path, *flags):
        s = parse_shape(problem.split("/"))
        rows = inputs.sample_rows(s.batch, s.seq_len)
        got = oracle.forward_rows(s, inputs.weights(s), inputs.x(s), rows)
        # mha_bench's values come rounded to float32.
        np.testing.assert_allclose(
            got.values, t["check.reference"], rtol=0, atol=2e-7 * np.abs(got.values).max()
        )
        assert np.all(got.max_score > 0)


def test_philox_matches_the_papers_known_answer():
    # Random123's kat_vectors: philox4x32_10 of counter (0, 0, 0, 0) with key (0, 0), and of
    # the all-ones counter with the all-ones key.
    zeros = inputs.philox4x32_10(np.zeros((4, 1), np.uint32), (0, 0))[:, 0]
    assert [hex(v) for v in zeros] == ["0x6627e8d5", "0xe169c58d", "0xbc57ac4c", "0x9b00dbd8"]
    ones = inputs.philox4x32_10(np.full((4, 1), 0xFFFFFFFF, np.uint32), (0xFFFFFFFF, 0xFFFFFFFF))[:, 0]
    assert [hex(v) for v in ones] == ["0x408f276d", "0x41c83b0e", "0xa20bc7c6", "0x6d5451fd"]


def test_mt19937_matches_the_standard():
    # C++ [rand.predef]: the 10000th output of a default-constructed std::mt19937 (seed 5489).
    assert int(inputs.mt19937_uint32(5489, 10000)[-1]) == 4123659995


def test_relative_error_names_a_wrong_module():
    s = parse_shape("b2/t9/din8/dout8/h2".split("/"))
    w, x = inputs.weights(s), inputs.x(s)
    rows = inputs.sample_rows(s.batch, s.seq_len)
    exact = oracle.forward_rows(s, w, x, rows)
    y = np.zeros((s.batch, s.seq_len, s.d_out))
    for (b, t), v in zip(rows, exact.values):
        y[b, t] = v
    assert oracle.relative_error(y, exact) == 0
    wrong = oracle.forward_rows(parse_shape("b2/t9/din8/dout8/h2/noncausal".split("/")), w, x, rows)
    for (b, t), v in zip(rows, wrong.values):
        y[b, t] = v
    assert oracle.relative_error(y, exact) > 1e-2
