"""The scaling model (mhapy.scaling_model): scheduling, the bandwidth curve, calibration on its own
input, the trace file's checks, and its section of the report beside measured times."""

import json
import os
import subprocess

import pytest
from conftest import CONTEXT, entries, run_module, write

from mhapy import scaling_model as model
from mhapy.problem import Shape

MS = 1e-3


def trace_of(phases, run_s, threads=1, problem="fused_qkv/b1/t1/past8192/din768/dout768/h12"):
    return model.Trace("mha/tbb/" + problem + f"/threads:{threads}", problem, threads, run_s, tuple(phases))


def test_makespan_is_greedy_list_scheduling_in_order():
    # 3 on one worker; the three 1s on the other end at 3: the makespan is 3.
    assert model.makespan((3.0, 1.0, 1.0, 1.0), 2) == 3.0
    # In order, not longest first: 1, 1 fill both workers, 3 then lands on one of them.
    assert model.makespan((1.0, 1.0, 3.0), 2) == 4.0
    assert model.makespan((1.0,) * 10, 4) == 3.0
    assert model.makespan((2.0, 5.0), 8) == 5.0
    assert model.makespan((), 4) == 0.0
    with pytest.raises(ValueError, match="workers 0"):
        model.makespan((1.0,), 0)


def test_bandwidth_grows_per_core_between_measured_points_then_up_to_the_socket():
    bw = model.Bandwidth({1: 10.0, 4: 32.0}, socket_gbps=50.0)
    assert bw.gbps(1) == 10.0
    assert bw.gbps(2) == 20.0  # the 1-thread figure per core, below the 4-thread total
    assert model.Bandwidth({1: 10.0, 4: 20.0}).gbps(3) == 20.0  # ... up to that total
    assert model.Bandwidth({1: 10.0, 4: 46.0}).gbps(3) == 34.0  # the straight line above it
    assert bw.gbps(4) == 32.0
    assert bw.gbps(8) == 50.0  # 8 x 8 GB/s per core, capped by the socket
    assert model.Bandwidth({1: 10.0, 4: 32.0}, socket_gbps=1000.0).gbps(16) == 128.0
    # A socket figure below what was measured never lowers a measured count's share.
    assert model.Bandwidth({1: 10.0, 4: 32.0}, socket_gbps=20.0).gbps(8) == 32.0
    with pytest.raises(model.TraceError, match="socket bandwidth -1"):
        model.Bandwidth({1: 10.0}, socket_gbps=-1.0)
    with pytest.raises(model.TraceError, match="positive GB/s"):
        model.Bandwidth({1: 0.0})


def test_one_thread_gives_the_traced_run_and_tasks_spread_over_workers():
    compute = model.Phase("gemm", 0, 8.5 * MS, (1 * MS,) * 8)  # 0.5 ms of loop overhead
    trace = trace_of([compute], 9.5 * MS)  # 1 ms serial
    bw = model.Bandwidth({1: 10.0})
    assert model.predict(trace, 1, bw).time_s == pytest.approx(9.5 * MS)
    # 8 threads: serial 1 + overhead 0.5 + one task 1.
    assert model.predict(trace, 8, bw).time_s == pytest.approx(2.5 * MS)
    assert model.predict(trace, 3, bw).time_s == pytest.approx(1.5 * MS + 3 * MS)
    with pytest.raises(model.TraceError, match="one-thread trace"):
        model.predict(trace_of([compute], 10 * MS, threads=2), 4, bw)


def test_a_phase_is_never_faster_than_its_bytes_over_the_bandwidth():
    # 100 MB read in 10 ms on one thread: exactly the 10 GB/s the probe measured there.
    memory = model.Phase("attention", 100_000_000, 10 * MS, (1 * MS,) * 10)
    trace = trace_of([memory], 10 * MS)
    bw = model.Bandwidth({1: 10.0, 2: 15.0}, socket_gbps=20.0)
    two = model.predict(trace, 2, bw)
    assert two.time_s == pytest.approx(100e6 / 15e9)  # not the 5 ms of the tasks
    assert two.bandwidth_bound_s == pytest.approx(two.time_s)
    assert two.memory_bound_s == pytest.approx(100e6 / 15e9)
    # Beyond the measured 2 threads: 7.5 GB/s per core up to the assumed 20 GB/s.
    assert model.predict(trace, 8, bw).time_s == pytest.approx(100e6 / 20e9)


def test_a_phase_that_beat_the_probe_keeps_its_factor():
    # 100 MB in 5 ms on one thread: twice the 10 GB/s probe (part of it from cache).
    cached = model.Phase("attention", 100_000_000, 5 * MS, (0.5 * MS,) * 10)
    trace = trace_of([cached], 5 * MS)
    bw = model.Bandwidth({1: 10.0, 2: 15.0})
    assert model.predict(trace, 1, bw).time_s == pytest.approx(5 * MS)
    assert model.predict(trace, 2, bw).time_s == pytest.approx(100e6 / (2 * 15e9))


TRACE_FILE = {
    "context": {
        "mha_cpu_model": "Synthetic CPU",
        "mha_hardware_threads": 2,
        "mha_tbb_isa": "avx2",
        "mha_runs": 5,
        "mha_bandwidth_gbps": {"1": 10.0, "2": 18.0},
        "mha_command": "--trace t.json",
    },
    "traces": [
        {
            "name": "mha/tbb/fused_qkv/b1/t64/din32/dout32/h2/threads:1",
            "problem": "fused_qkv/b1/t64/din32/dout32/h2",
            "threads": 1,
            "run_ns": 10_000_000,
            "phases": [
                {"kind": "gemm", "bytes": 1000, "span_ns": 4_000_000, "tasks_ns": [1_000_000] * 4},
                {"kind": "attention", "bytes": 0, "span_ns": 6_000_000, "tasks_ns": [1_500_000] * 4},
            ],
        }
    ],
}


def test_a_trace_file_loads_and_bad_ones_say_what_is_wrong(tmp_path):
    good = tmp_path / "trace.json"
    good.write_text(json.dumps(TRACE_FILE))
    f = model.load(good)
    assert (f.cpu_model, f.hardware_threads, f.isa, f.bandwidth) == (
        "Synthetic CPU",
        2,
        "avx2",
        {1: 10.0, 2: 18.0},
    )
    (t,) = f.traces
    assert t.run_s == pytest.approx(10 * MS) and t.serial_s == pytest.approx(0.0)
    assert [p.kind for p in t.phases] == ["gemm", "attention"]
    assert t.phases[1].tasks_s == (1.5 * MS,) * 4
    for mutate, message in (
        (lambda d: d.pop("traces"), "'context' and 'traces'"),
        (lambda d: d["context"].pop("mha_bandwidth_gbps"), "no mha_bandwidth_gbps"),
        (lambda d: d["traces"][0]["phases"][0].update(tasks_ns=[-1]), "a task of phase 0 is -1"),
        (lambda d: d["traces"][0].update(threads=0), "threads is 0"),
        (
            lambda d: d["traces"][0]["phases"][1].pop("tasks_ns"),
            "phase 1: expected an object with 'tasks_ns'",
        ),
    ):
        data = json.loads(json.dumps(TRACE_FILE))
        mutate(data)
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(data))
        with pytest.raises(model.TraceError, match=message):
            model.load(bad)
    with pytest.raises(model.TraceError, match="junk.json: not valid JSON"):
        (tmp_path / "junk.json").write_text("{")
        model.load(tmp_path / "junk.json")


def test_the_command_prints_the_models_times(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(TRACE_FILE))
    result = run_module("mhapy.scaling_model", path, "--max-threads", "4")
    assert result.returncode == 0, result.stderr
    row = result.stdout.splitlines()[-1].split("\t")
    # 1 thread: 10 ms; 2: gemm 2 ms (its 1000 bytes are nothing), attention 3 ms; 4: 1 + 1.5.
    assert row == ["fused_qkv/b1/t64/din32/dout32/h2", "10 (1.00)", "5 (1.00)", "2.5 (1.00)"]
    assert run_module("mhapy.scaling_model", tmp_path / "absent.json").returncode == 1


def test_the_report_sets_the_model_beside_the_measurements_and_says_where_they_part(tmp_path):
    shape = Shape(1, 64, 32, 32, 2)
    # Measured: 10 ms on 1 thread and 8 ms on 2, where the model says 5 ms: 37% apart.
    results = write(
        tmp_path / "tbb.json",
        entries("tbb", "fused_qkv", shape, 1, 10 * MS) + entries("tbb", "fused_qkv", shape, 2, 8 * MS),
        dict(CONTEXT, mha_cpu_model="Synthetic CPU"),
    )
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(TRACE_FILE))
    out = tmp_path / "report"
    result = run_module("mhapy.report", results, "--trace", trace, "--out", out)
    assert result.returncode == 0, result.stderr
    text = (out / "report.md").read_text()
    section = text[text.index("## Scaling model (tbb)") :]
    assert "1 differ by more than 15%" in section
    assert "| fused_qkv | B1 T64" in section and "| 2 | 8 ms | 5 ms | 0.62 |" in section
    assert "wake-up, chunking or shared-resource costs" in section
    assert "up to 200 GB/s for all cores (an assumed socket bandwidth" in section
    assert (out / "scaling_model.png").exists()
    # A trace of another machine is said, not applied.
    other = json.loads(json.dumps(TRACE_FILE))
    other["context"]["mha_cpu_model"] = "Another CPU"
    trace.write_text(json.dumps(other))
    result = run_module("mhapy.report", results, "--trace", trace, "--out", out)
    assert result.returncode == 0, result.stderr
    text = (out / "report.md").read_text()
    assert "## Scaling model" not in text
    assert "describe other machines" in text


MHA_BENCH = os.environ.get("MHA_BENCH")


@pytest.mark.skipif(not MHA_BENCH, reason="MHA_BENCH (the mha_bench binary) not given; ctest gives it")
def test_mha_bench_writes_a_trace_the_model_reads(tmp_path):
    path = tmp_path / "trace.json"
    flags = ["--preset", "quick", "--backends", "tbb,xsimd", "--formulations", "fused_qkv"]
    flags += ["--batch", "2", "--seq", "40", "--heads", "2", "--d-model", "32", "--threads", "1"]
    done = subprocess.run(
        [MHA_BENCH, *flags, "--quiet", "--trace", str(path), "--trace-runs", "3"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    f = model.load(path)
    assert f.hardware_threads >= 1 and set(f.bandwidth) >= {1, f.hardware_threads}
    (t,) = f.traces  # xsimd's case is not traced
    assert t.problem == "fused_qkv/b2/t40/din32/dout32/h2" and t.threads == 1
    assert [p.kind for p in t.phases] == ["gemm", "attention", "gemm"]
    assert t.phases[0].bytes == 4 * (32 * (80 + 96) + 80 * 96)  # x, the fused weight, QKV
    assert all(p.tasks_s and p.work_s <= p.span_s <= t.run_s for p in t.phases)
    assert model.predict(t, 1, f.bandwidth_curve()).time_s == pytest.approx(t.run_s)
    # Bad input is refused with its reason, before anything runs.
    done = subprocess.run(
        [MHA_BENCH, *flags, "--trace", str(path), "--trace-runs", "0"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--trace-runs" in done.stderr and "'0'" in done.stderr
    done = subprocess.run(
        [MHA_BENCH, *flags[:2], "--backends", "xsimd", "--trace", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 2 and "no selected case runs on tbb" in done.stderr
