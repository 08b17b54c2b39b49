"""scripts/peers-env.sh keeps the peers' environment in a per-user cache keyed by what it is made
from, linked from build/, so that a second clone reuses it, and leaves none behind where pip
fails. Each case runs the script on a copy of it, offline: its requirements pin only pip (already
in a new environment: nothing is downloaded), or a package pip cannot reach."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def make_clone(tmp_path):
    if subprocess.run(["/usr/bin/python3", "-c", "import ensurepip, venv"], check=False).returncode:
        pytest.skip("/usr/bin/python3 has no venv (the script would install python3-venv)")

    def clone(name, requirements="pip\n"):
        root = tmp_path / name
        (root / "scripts").mkdir(parents=True)
        (root / "tools").mkdir()
        shutil.copy(ROOT / "scripts" / "peers-env.sh", root / "scripts" / "peers-env.sh")
        (root / "tools" / "peers-requirements.txt").write_text(requirements)
        return root

    return clone


def run_script(root, cache=None, venv=None, status=0):
    """The script of clone `root`, without pip's index or configuration, its environment in the
    cache `cache` or at `venv` (MHA_PEERS_VENV); its exit status `status`. Returns the run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "MHA_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1")
    if cache is not None:
        env["MHA_ENV_CACHE"] = str(cache)
    if venv is not None:
        env["MHA_PEERS_VENV"] = str(venv)
    run = subprocess.run(
        ["bash", str(root / "scripts" / "peers-env.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == status, run.stdout + run.stderr
    return run


def entries(cache):
    return sorted(p.name for p in cache.iterdir() if p.is_dir())


def test_a_second_clone_reuses_the_first_clones_environment(make_clone, tmp_path):
    cache = tmp_path / "cache"
    first = make_clone("first")
    out = run_script(first, cache).stdout
    assert "installing into" in out
    link = first / "build" / "peers-venv"
    assert link.is_symlink()
    [entry] = entries(cache)
    assert entry.startswith("peers-venv-")
    assert link.resolve() == (cache / entry).resolve()
    python = link / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import pip"], check=False).returncode == 0

    second = make_clone("second")
    out = run_script(second, cache).stdout
    assert "installing into" not in out
    assert f"ready: {cache / entry}/bin/python" in out
    assert (second / "build" / "peers-venv").resolve() == (cache / entry).resolve()
    assert entries(cache) == [entry]


def test_other_pins_make_an_entry_of_their_own_and_comments_none(make_clone, tmp_path):
    cache = tmp_path / "cache"
    run_script(make_clone("first"), cache)
    commented = make_clone("commented", requirements="# what the pins are for\npip\n\n")
    assert "installing into" not in run_script(commented, cache).stdout
    other = make_clone("other", requirements="pip\nsetuptools\n")
    out = run_script(other, cache).stdout
    assert "installing into" in out
    assert len(entries(cache)) == 2


def test_an_environment_made_in_build_moves_into_the_cache(make_clone, tmp_path):
    # Made where earlier versions of the script made it (MHA_PEERS_VENV), then found there.
    root = make_clone("old")
    old = root / "build" / "peers-venv"
    run_script(root, venv=old)
    assert old.is_dir() and not old.is_symlink()

    cache = tmp_path / "cache"
    out = run_script(root, cache).stdout
    assert "moving" in out and "installing into" not in out
    [entry] = entries(cache)
    assert old.is_symlink() and old.resolve() == (cache / entry).resolve()
    # Its scripts name where it now lies.
    assert str(cache / entry) in (cache / entry / "bin" / "pip").read_text().splitlines()[0]
    python = old / "bin" / "python"
    assert subprocess.run([str(python), "-m", "pip", "--version"], check=False).returncode == 0


def test_a_place_named_by_mha_peers_venv_is_used_as_it_is(make_clone, tmp_path):
    root = make_clone("named")
    venv = tmp_path / "elsewhere"
    assert f"ready: {venv}/bin/python" in run_script(root, venv=venv).stdout
    assert not (root / "build" / "peers-venv").exists()  # no link, no cache


def test_made_offline_it_leaves_no_environment(make_clone, tmp_path):
    """With no package index, pip fails: the script says so with pip's own error, and leaves no
    environment where the tests look for one (nor a half-made one beside it). The torch pin is
    what the script resolves first."""
    root = make_clone("root", requirements="torch==2.13.0\npytest==9.2.0\n")
    venv = tmp_path / "peers-venv"
    run = run_script(root, venv=venv, status=1)
    assert "cannot make the peers' environment" in run.stderr
    assert "ERROR:" in run.stderr  # pip's own message, shown
    assert not venv.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["root"]
