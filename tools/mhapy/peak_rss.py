"""Peak resident memory of one forward pass, or of decoding, per backend and formulation,
through `mha run`.

    PYTHONPATH=tools python3 -m mhapy.peak_rss --mha build/release/src/cli/mha [--seq 8192]
        [--batch 1] [--d-model 768] [--heads 12] [--backends a,b] [--formulations a,b] [--threads N]
        [--decode [--prefill N] [--chunk S]]

Writes random split-layout weights (safetensors) and a random input (.npy) of the shape into a
temporary folder, then runs `mha run` once per backend x formulation at the asked sequence
length and once at T = 1, reading each child's peak RSS from wait4(). The table's "forward"
column is what the forward pass itself needed:

    forward = peak(T) - peak(T=1) - (input + output bytes at T - at T=1)

i.e. the peak minus everything the process holds at any T (libraries, weights, packed weights)
and minus the input and output tensors the command reads and writes. A kernel that stores the
T x T scores needs B*H*T^2*4 bytes there (3.2 GB at B1 T8192 H12); a streaming one, O(T*d).

--decode runs `mha run --incremental` instead: the input fed through a KV cache of T tokens,
`--prefill` tokens in the first call (default 0: none), then `--chunk` per call (default 1: token
by token, so only decode steps run; T steps, the last over T - 1 cached tokens). Its "decode"
column is the same difference, and "cache" what the cache states it holds for T tokens over 1
(docs/design.md §1.4: 2 * B * capacity * H_kv * head_dim * 4 bytes, H_kv = H here, without the
layout's padding), so "decode - cache" is the rest: the layout's padding and the steps' scratch,
O(tile) per thread for the fused kernels (plus what a prefill call needs, when there is one).
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

from .problem import Shape, cache_bytes
from .tensor_files import write_npy, write_safetensors


def uniform(count: int, bound: float, rng: random.Random) -> array:
    if sys.byteorder != "little":
        raise SystemExit("mhapy.peak_rss: writes little-endian files; this machine is big-endian")
    return array("f", (rng.uniform(-bound, bound) for _ in range(count)))


def reset_peak_rss() -> None:
    """Sets this process's peak RSS (VmHWM) to its current RSS (Linux: 5 to /proc/self/clear_refs),
    so that peak_rss_bytes() then tells the peak of what runs after; nothing where /proc lacks it."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_bytes() -> int:
    """This process's peak RSS in bytes since it started or since reset_peak_rss() (VmHWM; 0
    where /proc/self/status lacks it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_kib(command: list[str]) -> int:
    """Runs command, returns its peak RSS in KiB; raises RuntimeError (with its stderr) on failure."""
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = child.stderr.read() if child.stderr else ""
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {child.returncode}: {stderr.strip()}")
    return usage.ru_maxrss  # Linux: KiB


def write_files(weights: Path, inputs: dict[int, Path], args) -> None:
    """Random split-layout weights and an input of each T, written by a forked child: Linux
    counts the RSS a process had when it forked in its children's ru_maxrss (the forked copy's
    high-water mark survives exec), so the probe itself never holds the tensors; its own RSS
    stays below any `mha run`'s."""
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit("mhapy.peak_rss: writing the weights and inputs failed")
        return
    try:
        rng = random.Random(5)
        d, bound = args.d_model, args.d_model**-0.5
        tensors = {
            f"{n}.weight": ("F32", (d, d), uniform(d * d, bound, rng).tobytes())
            for n in ("W_query", "W_key", "W_value", "out_proj")
        }
        tensors["out_proj.bias"] = ("F32", (d,), uniform(d, bound, rng).tobytes())
        write_safetensors(weights, tensors, {"num_heads": str(args.heads)})
        for t, path in inputs.items():
            write_npy(path, (args.batch, t, d), uniform(args.batch * t * d, 1.0, rng).tobytes())
    except BaseException as e:  # noqa: BLE001 - the child reports and exits, never returns
        print(f"mhapy.peak_rss: {e}", file=sys.stderr)
        os._exit(1)
    os._exit(0)


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
    p.add_argument(
        "--decode", action="store_true", help="feed the input through a KV cache (mha run --incremental)"
    )
    p.add_argument(
        "--prefill", type=int, default=0, help="with --decode: tokens of the first call (default 0)"
    )
    p.add_argument(
        "--chunk", type=positive, default=1, help="with --decode: tokens per later call (default 1)"
    )
    args = p.parse_args()
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} is not divisible by --heads {args.heads}")
    if not args.decode and (args.prefill or args.chunk != 1):
        p.error("--prefill and --chunk apply to --decode")
    if not 0 <= args.prefill <= args.seq:
        p.error(f"--prefill {args.prefill}: expected 0 <= N <= --seq {args.seq}")
    if args.backends:
        backends = args.backends.split(",")
    else:
        listing = subprocess.run([args.mha, "backends"], capture_output=True, text=True, check=True)
        # A backend's line starts in column 0; the feature lines under it are indented.
        backends = [line.split()[0] for line in listing.stdout.splitlines()[1:] if line[:1].strip()]

    d = args.d_model
    shape = Shape(args.batch, args.seq, d, d, args.heads)
    with tempfile.TemporaryDirectory(prefix="mha-peak-rss-") as tmp:
        folder = Path(tmp)
        weights = folder / "w.safetensors"
        inputs = {t: folder / f"x{t}.npy" for t in (1, args.seq)}
        write_files(weights, inputs, args)
        io_bytes = 2 * args.batch * (args.seq - 1) * d * 4  # input + output, T vs T=1

        what = "`mha run`"
        if args.decode:
            what = f"`mha run --incremental` (prefill {args.prefill}, then {args.chunk} per call)"
        print(
            f"peak RSS of {what}, B{args.batch} T{args.seq} d{d} H{args.heads}, "
            f"threads {args.threads}; io = input + output tensors = {io_bytes / 2**20:.1f} MiB"
        )
        if args.decode:
            print(
                "| backend | formulation | peak at T (MiB) | peak at T=1 (MiB) | decode (MiB) | cache (MiB) | decode - cache (MiB) |"
            )
            print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        else:
            print("| backend | formulation | peak at T (MiB) | peak at T=1 (MiB) | forward (MiB) |")
            print("| --- | --- | ---: | ---: | ---: |")
        failed = False
        for backend in backends:
            for form in args.formulations.split(","):
                command = [args.mha, "run", "--backend", backend, "--formulation", form]
                command += ["--weights", str(weights), "--output", str(folder / "y.npy")]
                command += ["--threads", str(args.threads)]
                peaks = {}
                try:
                    for t, x in inputs.items():
                        extra = ["--input", str(x)]
                        if args.decode:
                            extra += ["--incremental", "--prefill", str(min(args.prefill, t))]
                            extra += ["--chunk", str(args.chunk)]
                        peaks[t] = peak_rss_kib(command + extra)
                except RuntimeError as e:
                    print(f"| {backend} | {form} | failed: {e} | | |")
                    failed = True
                    continue
                grown = (peaks[args.seq] - peaks[1]) * 1024 - io_bytes
                cells = [f"{peaks[args.seq] / 1024:.1f}", f"{peaks[1] / 1024:.1f}", mib(grown)]
                if args.decode:
                    cache = cache_bytes(shape, form, args.seq) - cache_bytes(shape, form, 1)
                    cells += [mib(cache), mib(grown - cache)]
                print(f"| {backend} | {form} | " + " | ".join(cells) + " |")
    return 1 if failed else 0


def mib(n: float) -> str:
    """Bytes as MiB with one decimal (never '-0.0')."""
    return f"{round(n / 2**20, 1) + 0.0:.1f}"


if __name__ == "__main__":
    sys.exit(main())
