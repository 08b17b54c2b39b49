"""Command line: the report of one or more result files, or an A/B comparison of two."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from .. import scaling_model
from . import ab, loading, report, results, whole_models
from .peaks import find_peaks
from .results import ReportError

# Files this tool writes into an output folder: replaced as a whole on every run, so a figure
# that a new run no longer has does not linger from an old one. Nothing else there is touched.
_OWNED_SUFFIXES = (".png", ".svg")
_OWNED_NAMES = ("report.md", "report.html")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m mhapy.report",
        description="Write report.md and its figures (PNG) from mha_bench and peer JSON results "
        "(Google Benchmark format), or compare two runs with --ab; --html adds report.html and "
        "SVG figures.",
    )
    p.add_argument("results", nargs="*", help="result files, merged by benchmark name")
    p.add_argument("--ab", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two result files instead")
    p.add_argument("--out", required=True, help="output folder (created; its report files are replaced)")
    p.add_argument("--title", default="mha performance report", help="report title")
    p.add_argument(
        "--html",
        action="store_true",
        help="also write report.html (self-contained, figures inlined) and each figure as SVG "
        "(committed reports keep report.md and PNGs only)",
    )
    p.add_argument(
        "--notes",
        type=Path,
        help="Markdown file with the run's written analysis, shown after the summary "
        "(paragraphs, '- ' lists, '#' headings)",
    )
    p.add_argument(
        "--peak-1core", type=float, help="FP32 FMA peak of one core, GFLOP/s (overrides the context)"
    )
    p.add_argument(
        "--peak-all", type=float, help="FP32 FMA peak of all cores, GFLOP/s (overrides the context)"
    )
    p.add_argument(
        "--best-run",
        action="store_true",
        help="the result files are repeated runs of one sweep: per benchmark, keep the run with "
        "the lowest median (interference on a shared machine only adds time)",
    )
    p.add_argument(
        "--trace",
        action="append",
        default=[],
        metavar="FILE",
        help="a task trace of the machine's tbb runs on one thread (mha_bench --trace FILE --threads 1): "
        "adds the scaling model's section, predicted to 128 threads; repeat for several machines",
    )
    p.add_argument(
        "--socket-bandwidth",
        type=float,
        default=scaling_model.DEFAULT_SOCKET_GBPS,
        metavar="GBPS",
        help="the scaling model's bandwidth of all cores beyond the thread counts a trace measured, GB/s "
        f"(default {scaling_model.DEFAULT_SOCKET_GBPS:g}, an assumption the report states)",
    )
    p.add_argument(
        "--models",
        action="append",
        default=[],
        metavar="FILE",
        help="whole models on each attention implementation (python -m mhapy.models.bench --out FILE): "
        "adds the 'Whole models' section; repeat for several files",
    )
    p.add_argument("--alpha", type=float, default=ab.ALPHA, help="A/B significance level (default 0.05)")
    p.add_argument(
        "--no-scipy", action="store_true", help="A/B: use the range rule even when scipy is present"
    )
    return p


def _replace_outputs(staging: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        if old.is_file() and (old.name in _OWNED_NAMES or old.suffix in _OWNED_SUFFIXES):
            old.unlink()
    for new in staging.iterdir():
        shutil.move(str(new), out / new.name)


def _notes(args: argparse.Namespace) -> str:
    try:
        return args.notes.read_text(encoding="utf-8") if args.notes else ""
    except OSError as e:
        raise ReportError(f"--notes {args.notes}: {e.strerror}") from e


def _models(args: argparse.Namespace) -> list[dict]:
    try:
        return whole_models.load(args.models)
    except whole_models.ModelsError as e:
        raise ReportError(f"--models {e}") from e


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.ab and (args.results or args.models):
        _parser().error("--ab BEFORE AFTER compares two result files: no other result or --models files")
    if not (args.ab or args.results or args.models):
        _parser().error("give result files, --models files, or --ab BEFORE AFTER")
    if args.trace and not args.results:
        _parser().error("--trace goes with result files")
    for value, flag in ((args.peak_1core, "--peak-1core"), (args.peak_all, "--peak-all")):
        if value is not None and not value > 0:
            _parser().error(f"{flag} {value}: expected a positive GFLOP/s figure")
    if not args.socket_bandwidth > 0:
        _parser().error(f"--socket-bandwidth {args.socket_bandwidth}: expected a positive GB/s figure")
    if not 0 < args.alpha < 1:
        _parser().error(f"--alpha {args.alpha}: expected a value in (0, 1)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Everything is written to a staging folder first: a failure leaves the old report intact.
    staging = Path(tempfile.mkdtemp(prefix=".mha_report-", dir=out.parent))
    try:
        if args.ab:
            before, after = (loading.load([path]) for path in args.ab)
            ab.generate(before, after, tuple(args.ab), staging, args.alpha, not args.no_scipy, args.html)
        elif not args.results:  # whole models only: a run of mhapy.models.bench without a sweep
            report.generate_models(_models(args), args.models, staging, args.title, _notes(args), args.html)
        else:
            machines = loading.load_machines(args.results, args.best_run)
            if not any(r.measurements or r.failures for r in machines):
                raise ReportError("the inputs hold no attention benchmarks (names 'mha/...')")
            machines = [r for r in machines if r.measurements or r.failures]
            for r in machines:
                for problem in results.shard_problems(r):
                    print(f"mhapy.report: warning: {r.machine_label()}: {problem}", file=sys.stderr)
            peaks = [find_peaks(r, args.peak_1core, args.peak_all) for r in machines]
            notes = _notes(args)
            try:
                traces = tuple(scaling_model.load(path) for path in args.trace)
            except scaling_model.TraceError as e:
                raise ReportError(f"--trace {e}") from e
            model = report.ModelInputs(traces, args.socket_bandwidth)
            report.generate(machines, peaks, staging, args.title, notes, model, args.html, _models(args))
        _replace_outputs(staging, out)
    except ReportError as e:
        print(f"mhapy.report: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"mhapy.report: wrote {out / 'report.md'}" + (f" and {out / 'report.html'}" if args.html else ""))
    return 0
