"""What this machine can still hold: the guard of the tools that would otherwise materialise
more than fits (eager's scores in the accuracy harness; the seeds' modules and ONNX Runtime's
kernels among the peers)."""

from __future__ import annotations

from pathlib import Path


def available_bytes() -> int | None:
    """/proc/meminfo's MemAvailable in bytes, or None where it cannot be read."""
    try:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return int(meminfo["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def too_big(need: int, what: str) -> str | None:
    """Why `need` bytes would not fit, or None: past half of MemAvailable a run is killed rather
    than measured (None too where MemAvailable cannot be read). `what` names what holds them."""
    available = available_bytes()
    if available is None or need <= available // 2:
        return None
    return f"{what}: ~{need / 2**30:.1f} GiB at this shape, over half of the {available / 2**30:.1f} GiB available"
