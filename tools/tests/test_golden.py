"""mhapy.golden still writes the committed goldens of tests/golden: weights, inputs and
cases.json byte for byte, outputs up to the last bits the BLAS's summation order decides (the
committed ones come from OpenBLAS's SkylakeX kernels). Skipped without torch."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")
from mhapy import golden  # noqa: E402


def test_the_generator_reproduces_the_committed_goldens(tmp_path):
    golden.main(["--out", str(tmp_path)])
    committed = golden.GOLDEN_DIR
    manifest = json.loads((committed / "cases.json").read_text())
    assert (tmp_path / "cases.json").read_text() == (committed / "cases.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in committed.iterdir() if p.suffix in (".json", ".npy", ".safetensors")
    )
    for case in manifest["cases"]:
        for key in ("weights", "input"):
            name = case[key]
            assert (tmp_path / name).read_bytes() == (committed / name).read_bytes(), name
        y, expected = np.load(tmp_path / case["output"]), np.load(committed / case["output"])
        assert y.dtype == expected.dtype and y.shape == expected.shape
        np.testing.assert_allclose(y, expected, rtol=0, atol=1e-5, err_msg=case["name"])
