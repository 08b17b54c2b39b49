"""Without torch the peers script says so plainly and exits 3 (sweeps skip the peers on it)."""

import subprocess
import sys

from conftest import ROOT

SCRIPT = ROOT / "bench" / "peers" / "torch_mha.py"

# Runs the script as __main__ with `import torch` failing, as on a machine without python3-torch.
WITHOUT_TORCH = """
import runpy, sys
sys.modules["torch"] = None
sys.argv = [sys.argv[1], "--shape", "b1/t8/din8/dout8/h1", "--out", sys.argv[2]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_missing_torch_is_said_with_exit_status_3(tmp_path):
    out = tmp_path / "peers.json"
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, str(SCRIPT), str(out)], capture_output=True, text=True
    )
    assert result.returncode == 3
    assert "PyTorch is not installed" in result.stderr and "python3-torch" in result.stderr
    assert not out.exists()
