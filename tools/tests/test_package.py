"""The package's promise about its dependencies: everything but torch_modules and golden imports
without torch (the report runs without it, the peers say it is missing), and the memory probe
needs the standard library only."""

from conftest import run_python


def test_everything_but_the_torch_modules_imports_without_torch():
    result = run_python(
        "import sys; sys.modules['torch'] = None\n"
        "import mhapy, mhapy.problem, mhapy.schema, mhapy.tensor_files, mhapy.peers, mhapy.peak_rss\n"
        "import mhapy.report.cli"
    )
    assert result.returncode == 0, result.stderr


def test_the_memory_probe_imports_only_the_standard_library():
    result = run_python(
        "import sys, mhapy.peak_rss\n"
        "third = sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'matplotlib', 'torch'})\n"
        "assert not third, third"
    )
    assert result.returncode == 0, result.stderr
