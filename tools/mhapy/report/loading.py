"""Reading result files into a ResultSet: the Google Benchmark 1.7.1 JSON files mha_bench and
mhapy.peers write (their contract: mhapy.report.results), plain or gzipped, one machine or
several."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from .. import schema
from ..json_file import read_json
from ..problem import ProblemError, check_formulation, parse_shape
from .results import (
    Failure,
    Key,
    Machine,
    Measurement,
    PeakEntry,
    ReportError,
    ResultSet,
    ShardFile,
    machine_of,
    shard_of,
)

TIME_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}

# Components Google Benchmark itself appends to a benchmark's name (benchmark_register.cc).
_GB_NAME_SUFFIX = re.compile(
    r"^(real_time|manual_time|process_time|(min_time|min_warmup_time|iterations|repeats):.*)$"
)
_AGGREGATE_SUFFIX = re.compile(r"_(mean|median|stddev|cv)$")
# mha_bench's FMA peak probes: peak/<isa>/threads:<n>/at:<k>/... (k = 0, 1, 2: start, middle and
# end of the run), counters GFLOPS (best of its short trials) and GFLOPS_min.
_PEAK_NAME = re.compile(r"^peak/(?P<isa>[A-Za-z0-9_]+)/threads:(?P<threads>\d+)/at:(?P<at>\d+)(/|$)")


def parse_name(name: str) -> Key | None:
    """The Key of an attention benchmark name; None when the name is not 'mha/...'.

    Raises ReportError for an 'mha/' name with a missing, repeated or unknown component."""
    parts = name.split("/")
    if len(parts) < 3 or parts[0] != "mha":
        return None
    backend, formulation = parts[1], parts[2]
    threads = None
    problem = []
    for token in parts[3:]:
        if token.startswith("threads:") and token[8:].isdigit():
            threads = int(token[8:])
        elif not _GB_NAME_SUFFIX.match(token):
            problem.append(token)
    try:
        check_formulation(formulation)
        shape = parse_shape(problem)
    except ProblemError as e:
        if e.missing and threads is None:
            e = f"missing name component(s) {', '.join(e.missing + ['threads:<n>'])}"
        raise ReportError(f"benchmark '{name}': {e}") from None
    if threads is None:
        raise ReportError(f"benchmark '{name}': missing name component(s) threads:<n>")
    return Key(backend, formulation, shape, threads)


def _check_counters(entry: dict, key: Key, where: str) -> None:
    """Plain counters restate the name (schema.shape_counters); a mismatch means the file is
    inconsistent."""
    for counter, expected in schema.shape_counters(key.shape, key.threads).items():
        if counter in entry and round(float(entry[counter])) != expected:
            raise ReportError(f"{where}: counter {counter} = {entry[counter]} but the name says {expected}")


def _seconds(entry: dict, where: str) -> float:
    unit = entry.get("time_unit", "ns")
    if unit not in TIME_UNIT_SECONDS:
        raise ReportError(f"{where}: time_unit '{unit}', expected one of ns, us, ms, s")
    try:
        value = float(entry["real_time"]) * TIME_UNIT_SECONDS[unit]
    except (KeyError, TypeError, ValueError):
        raise ReportError(f"{where}: real_time missing or not a number") from None
    if not value > 0:
        raise ReportError(f"{where}: real_time {entry['real_time']} must be positive")
    return value


def _failure_message(entry: dict) -> str | None:
    if entry.get("error_occurred"):
        return str(entry.get("error_message", "error (no message)"))
    skipped = entry.get("skipped")
    if skipped and skipped not in ("NotSkipped", 0, False):
        return str(entry.get("skip_message", entry.get("error_message", "skipped")))
    return None


def _run_name(entry: dict) -> str:
    if "run_name" in entry:
        return str(entry["run_name"])
    name = str(entry.get("name", ""))
    if entry.get("run_type") == "aggregate":
        name = _AGGREGATE_SUFFIX.sub("", name)
    return name


def _load_document(path: Path) -> dict:
    """A result file, plain or gzip-compressed (name ending in .gz: how committed reports keep
    their inputs small)."""
    doc = read_json(path, ReportError)
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise ReportError(f"{path}: expected a Google Benchmark JSON object with a 'benchmarks' list")
    if not isinstance(doc.get("context", {}), dict):
        raise ReportError(f"{path}: 'context' must be an object")
    return doc


def _read(path: Path) -> tuple[dict, ResultSet]:
    """A result file's context, in the current schema (schema.upgraded_context: older files are
    upgraded there and nowhere else), and its entries."""
    doc = _load_document(path)
    part = _read_entries(doc["benchmarks"], str(path))
    backends = {k.backend for k in part.measurements} | {f.key.backend for f in part.failures if f.key}
    try:
        context = schema.upgraded_context(doc.get("context", {}), backends, str(path))
    except schema.SchemaError as e:
        raise ReportError(str(e)) from None
    return context, part


def load(paths: list[str | Path], best_run: bool = False) -> ResultSet:
    """Reads and merges result files. The same benchmark in two files is an error (compare
    two runs with A/B mode instead) unless best_run: then the files are repeated runs of one
    sweep and each benchmark keeps the run with the lowest median, since interference on a
    shared machine only ever adds time. Any malformed entry is an error."""
    results = ResultSet()
    for raw_path in paths:
        path = Path(raw_path)
        source = str(path)
        context, part = _read(path)
        results.contexts.append((source, context))
        shard = shard_of(context, source)
        _merge(results, part, best_run, shard, results.shards)
        if shard is not None:
            results.shards.append(shard)
    return results


def load_machines(paths: list[str | Path], best_run: bool = False) -> list[ResultSet]:
    """Reads result files and merges them per machine (machine_of the file's context), in the
    order machines first appear. Within a machine as load(); the same benchmark on two machines
    is fine. A file of peers (mhapy.peers writes no dispatch) joins every
    machine with the same CPU model and thread count, e.g. both the native and a forced-AVX2
    run of one CPU; with an mha_dispatch of its own only the machines of that dispatch. A file
    that names no CPU model joins the first machine with its thread count. No match: a machine
    of its own."""
    files = []
    for raw_path in paths:
        path = Path(raw_path)
        context, part = _read(path)
        # mhapy.peers names its library in the context (a library that could not run writes a
        # file of declined entries, or none).
        files.append((str(path), context, part, "mha_peers" in context))
    machines: dict[Machine, ResultSet] = {}

    def add(machine: Machine, source: str, context: dict, part: ResultSet, peers: bool = False) -> None:
        results = machines.setdefault(machine, ResultSet(machine=machine))
        results.contexts.append((source, context))
        shard = None if peers else shard_of(context, source)
        _merge(results, part, best_run, shard, results.shards)
        if shard is not None:
            results.shards.append(shard)

    for source, context, part, peers_only in files:
        if not peers_only:
            add(machine_of(context), source, context, part)
    for source, context, part, peers_only in files:
        if peers_only:
            for machine in _peer_machines(context, list(machines)) or [machine_of(context)]:
                add(machine, source, context, part, peers=True)
    return list(machines.values())


def _peer_machines(context: dict, machines: list[Machine]) -> list[Machine]:
    """The machines a file of peers belongs to (see load_machines)."""
    own = machine_of(context)
    same = [m for m in machines if m.threads == own.threads]
    if not (context.get("mha_cpu_model") or context.get("cpu_model")):
        return same[:1]
    same = [m for m in same if m.cpu_model == own.cpu_model]
    if context.get("mha_dispatch"):
        same = [m for m in same if m.dispatch == own.dispatch]
    return same


def _read_entries(entries: list, source: str) -> ResultSet:
    """One file's benchmarks grouped by run name and reduced to Measurements."""
    groups: dict[str, dict] = {}
    part = ResultSet()
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry:
            raise ReportError(f"{source}: benchmarks[{index}] is not an object with a 'name'")
        run_name = _run_name(entry)
        where = f"{source}: benchmark '{entry['name']}'"
        key = parse_name(run_name)
        message = _failure_message(entry)
        peak = _PEAK_NAME.match(run_name)
        if key is None and peak:
            if message is None and entry.get("run_type", "iteration") != "aggregate" and "GFLOPS" in entry:
                low = entry.get("GFLOPS_min")
                part.peak_entries.append(
                    PeakEntry(
                        peak["isa"],
                        int(peak["threads"]),
                        int(peak["at"]),
                        float(entry["GFLOPS"]),
                        None if low is None else float(low),
                        source,
                    )
                )
            continue
        if key is None:
            if message is None and entry.get("run_type") != "aggregate":
                part.unrecognised.append((run_name, source))
            continue
        if message is not None:
            part.failures.append(Failure(run_name, message, source, key))
            continue
        group = groups.setdefault(run_name, {"key": key, "times": [], "flops": [], "bytes": [], "agg": {}})
        if entry.get("run_type", "iteration") == "aggregate":
            # Counters of aggregates are that statistic (stddev of a shape counter is 0): not
            # checked against the name.
            aggregate = entry.get("aggregate_name", "")
            if aggregate in ("mean", "median"):
                group["agg"][aggregate] = _seconds(entry, where)
            elif aggregate == "cv":
                group["agg"]["cv"] = float(entry["real_time"])
            continue
        _check_counters(entry, key, where)
        seconds = _seconds(entry, where)
        group["times"].append(seconds)
        if schema.GFLOPS in entry:
            group["flops"].append(float(entry[schema.GFLOPS]) * 1e9 * seconds)
        if schema.BYTES_MIN in entry:
            group["bytes"].append(float(entry[schema.BYTES_MIN]))
        if entry.get("label"):
            group["label"] = str(entry["label"])
    for run_name, group in groups.items():
        times = group["times"]
        if times:
            median = statistics.median(times)
            cv = statistics.stdev(times) / statistics.fmean(times) if len(times) > 1 else None
        elif group["agg"].get("median") or group["agg"].get("mean"):
            median = group["agg"].get("median") or group["agg"]["mean"]
            cv = group["agg"].get("cv")
        else:
            raise ReportError(f"{source}: benchmark '{run_name}' has neither repetitions nor a median")
        flops = statistics.median(group["flops"]) if group["flops"] else None
        bytes_min = statistics.median(group["bytes"]) if group["bytes"] else None
        key = group["key"]
        if key in part.measurements:
            raise ReportError(
                f"{source}: benchmarks '{part.measurements[key].key.name()}' and '{run_name}' "
                "measure the same thing"
            )
        part.measurements[key] = Measurement(
            key, source, times, median, flops, cv, group.get("label", ""), bytes_min
        )
    return part


def _merge(
    into: ResultSet,
    part: ResultSet,
    best_run: bool = False,
    shard: ShardFile | None = None,
    shards: list[ShardFile] = (),
) -> None:
    for key, measurement in part.measurements.items():
        kept = into.measurements.get(key)
        if kept is not None and not best_run:
            hint = ""
            other = next((f for f in shards if f.source == kept.source), None)
            if shard is not None and other is not None:
                if other.selection != shard.selection:
                    hint = f" (shards {other.label()} and {shard.label()} of different selections)"
                elif other.count != shard.count:
                    hint = (
                        f" (shards {other.label()} and {shard.label()} of one selection split into "
                        "different numbers of shards)"
                    )
                else:
                    hint = f" (both are shard {shard.label()} of one selection: the same shard twice)"
            raise ReportError(
                f"benchmark '{key.name()}' is in both {kept.source} and {measurement.source}{hint}; "
                "to compare two runs use --ab BEFORE AFTER, to combine repeated runs --best-run"
            )
        if kept is not None:
            into.repeated += 1
            if kept.median_s <= measurement.median_s:
                continue
        into.measurements[key] = measurement
    into.failures.extend(part.failures)
    into.unrecognised.extend(part.unrecognised)
    into.peak_entries.extend(part.peak_entries)
