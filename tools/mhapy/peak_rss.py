"""Peak resident memory of one forward pass, per backend and formulation, through `mha run`.

    PYTHONPATH=tools python3 -m mhapy.peak_rss --mha build/release/src/cli/mha [--seq 8192]
        [--batch 1] [--d-model 768] [--heads 12] [--backends a,b] [--formulations a,b] [--threads N]

Writes random split-layout weights (safetensors) and a random input (.npy) of the shape into a
temporary folder, then runs `mha run` once per backend x formulation at the asked sequence
length and once at T = 1, reading each child's peak RSS from wait4(). The table's "forward"
column is what the forward pass itself needed:

    forward = peak(T) - peak(T=1) - (input + output bytes at T - at T=1)

i.e. the peak minus everything the process holds at any T (libraries, weights, packed weights)
and minus the input and output tensors the command reads and writes. A kernel that stores the
T x T scores needs B*H*T^2*4 bytes there (3.2 GB at B1 T8192 H12); a streaming one, O(T*d).
Standard library only: runs with any python3. Exit 0 when every run succeeded, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
from array import array
from pathlib import Path

from .tensor_files import write_npy, write_safetensors


def uniform(count: int, bound: float, rng: random.Random) -> array:
    if sys.byteorder != "little":
        raise SystemExit("mhapy.peak_rss: writes little-endian files; this machine is big-endian")
    return array("f", (rng.uniform(-bound, bound) for _ in range(count)))


def peak_rss_kib(command: list[str]) -> int:
    """Runs command, returns its peak RSS in KiB; raises RuntimeError (with its stderr) on failure."""
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = child.stderr.read() if child.stderr else ""
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {child.returncode}: {stderr.strip()}")
    return usage.ru_maxrss  # Linux: KiB


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mha", required=True, help="the mha command (build/release/src/cli/mha)")
    p.add_argument("--seq", type=positive, default=8192)
    p.add_argument("--batch", type=positive, default=1)
    p.add_argument("--d-model", type=positive, default=768)
    p.add_argument("--heads", type=positive, default=12)
    p.add_argument("--threads", type=int, default=1, help="worker threads (0 = all cores)")
    p.add_argument("--backends", help="comma-separated (default: every one `mha backends` lists)")
    p.add_argument("--formulations", default="split_weight,wrapper")
    args = p.parse_args()
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} is not divisible by --heads {args.heads}")
    if args.backends:
        backends = args.backends.split(",")
    else:
        listing = subprocess.run([args.mha, "backends"], capture_output=True, text=True, check=True)
        backends = [line.split()[0] for line in listing.stdout.splitlines()[1:] if line.strip()]

    rng = random.Random(5)
    d, bound = args.d_model, args.d_model**-0.5
    with tempfile.TemporaryDirectory(prefix="mha-peak-rss-") as tmp:
        folder = Path(tmp)
        weights = folder / "w.safetensors"
        tensors = {
            f"{n}.weight": ("F32", (d, d), uniform(d * d, bound, rng).tobytes())
            for n in ("W_query", "W_key", "W_value", "out_proj")
        }
        tensors["out_proj.bias"] = ("F32", (d,), uniform(d, bound, rng).tobytes())
        write_safetensors(weights, tensors, {"num_heads": str(args.heads)})
        inputs = {}
        for t in (1, args.seq):
            inputs[t] = folder / f"x{t}.npy"
            write_npy(inputs[t], (args.batch, t, d), uniform(args.batch * t * d, 1.0, rng).tobytes())
        io_bytes = 2 * args.batch * (args.seq - 1) * d * 4  # input + output, T vs T=1

        print(
            f"peak RSS of `mha run`, B{args.batch} T{args.seq} d{d} H{args.heads}, "
            f"threads {args.threads}; io = input + output tensors = {io_bytes / 2**20:.1f} MiB"
        )
        print("| backend | formulation | peak at T (MiB) | peak at T=1 (MiB) | forward (MiB) |")
        print("| --- | --- | ---: | ---: | ---: |")
        failed = False
        for backend in backends:
            for form in args.formulations.split(","):
                peaks = {}
                try:
                    for t, x in inputs.items():
                        peaks[t] = peak_rss_kib(
                            [
                                args.mha,
                                "run",
                                "--backend",
                                backend,
                                "--formulation",
                                form,
                                "--weights",
                                str(weights),
                                "--input",
                                str(x),
                                "--output",
                                str(folder / "y.npy"),
                                "--threads",
                                str(args.threads),
                            ]
                        )
                except RuntimeError as e:
                    print(f"| {backend} | {form} | failed: {e} | | |")
                    failed = True
                    continue
                forward = (peaks[args.seq] - peaks[1]) * 1024 - io_bytes
                print(
                    f"| {backend} | {form} | {peaks[args.seq] / 1024:.1f} | {peaks[1] / 1024:.1f} "
                    f"| {round(forward / 2**20, 1) + 0.0:.1f} |"
                )  # + 0.0: no "-0.0"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
