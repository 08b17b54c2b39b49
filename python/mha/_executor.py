"""Which executor runs a call's parallel work on the tbb backend (include/mha/executor.hpp,
docs/python.md "Threads"): "tbb" (its own oneTBB workers), "openmp" (the process's OpenMP
runtime) or "serial". Chosen per call: the caller's choice, else automatically, where PyTorch is
loaded, its own OpenMP pool (a second pool would spin against PyTorch's workers for the cores),
else oneTBB. Other backends ignore it."""

from __future__ import annotations

import os
import sys
from typing import Any

from . import _mha
from ._mha import InvalidArgument

EXECUTORS = ("tbb", "openmp", "serial")
_RUNTIMES = ("libgomp", "libiomp", "libomp")

# Whether the automatic choice may take OpenMP, and why (or why not): decided once, on the first
# call made with PyTorch loaded.
_openmp: tuple[bool, str] | None = None


def openmp_runtimes() -> list[str] | None:
    """The OpenMP runtimes this process has loaded (their files), None where it cannot tell."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "/" in line}
    except OSError:
        return None
    found = set()
    for path in paths:
        name = os.path.basename(path)
        if name.startswith(_RUNTIMES) and ".so" in name:
            found.add(os.path.realpath(path))
    return sorted(found)


def _decide_openmp(torch: Any) -> tuple[bool, str]:
    if not _mha.openmp_executor:
        return False, "this build of mha has no OpenMP executor"
    if not torch.backends.openmp.is_available():
        return False, "PyTorch is built without OpenMP"
    runtimes = openmp_runtimes()
    if runtimes is None:
        return False, "the process's libraries cannot be listed (no /proc/self/maps)"
    if len(runtimes) != 1:
        return False, (
            f"{len(runtimes)} OpenMP runtimes are loaded ({', '.join(runtimes)}): PyTorch's is not "
            "the one mha runs on, and a second pool would compete with PyTorch's workers"
        )
    return True, f"PyTorch's OpenMP runtime ({runtimes[0]}), torch.get_num_threads() threads"


def default() -> str:
    """What a call that names no executor runs on now, and why: "openmp: PyTorch's OpenMP
    runtime (...)", or "tbb: ..." naming why not OpenMP."""
    torch = sys.modules.get("torch")
    if torch is None:
        return "tbb: PyTorch is not loaded (mha's own oneTBB workers)"
    global _openmp
    if _openmp is None:
        _openmp = _decide_openmp(torch)
    usable, why = _openmp
    return f"openmp: {why}" if usable else f"tbb: {why} (mha's own oneTBB workers)"


def resolve(executor: Any, threads: int) -> tuple[str | None, int]:
    """(the executor's name for the binding, None for oneTBB; the call's threads) of a call that
    asks for `executor` (None: automatic) with `threads` (0: all: with PyTorch's pool, its
    torch.get_num_threads())."""
    if executor is not None:
        if executor not in EXECUTORS:
            raise InvalidArgument(f"mha: executor {executor!r} is not one of {', '.join(EXECUTORS)}, or None")
        return (None if executor == "tbb" else executor), threads
    torch = sys.modules.get("torch")
    if torch is None:
        return None, threads
    if _openmp is None:
        default()
    if not _openmp[0]:
        return None, threads
    return "openmp", threads or min(torch.get_num_threads(), _mha.max_run_threads)
