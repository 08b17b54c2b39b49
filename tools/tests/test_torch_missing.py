"""Without torch the peers say so plainly and exit 3 (sweeps skip the peers on it)."""

from conftest import run_module


def test_missing_torch_is_said_with_exit_status_3(tmp_path):
    out = tmp_path / "peers.json"
    # As on a machine without python3-torch: `import torch` fails.
    result = run_module("mhapy.peers", "--shape", "b1/t8/din8/dout8/h1", "--out", out, without_torch=True)
    assert result.returncode == 3
    assert "PyTorch is not installed" in result.stderr and "python3-torch" in result.stderr
    assert not out.exists()
