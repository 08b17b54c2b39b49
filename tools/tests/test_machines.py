"""Issue 12: per-ISA peaks, peak warnings, several machines in one report, a figure for any
run, the answer first. Fixtures are model-built: expected numbers follow from the model."""

from pathlib import Path

from conftest import CONTEXT, entries, isa_context, peak_entries, write
from test_report import run_tool, table_after

from mhapy.problem import Shape, flops
from mhapy.report import cross_machine
from mhapy.report.appendix import peak_warning_text
from mhapy.report.peaks import find_peaks, peak_warnings
from mhapy.report.loading import load_machines

S1 = Shape(1, 64, 64, 64, 2)
S2 = Shape(1, 64, 128, 128, 2)


def warnings_of(all_peaks):
    """The peak warnings as the report words them."""
    return [peak_warning_text(w) for w in peak_warnings(all_peaks)]


def rate_entries(backend, form, s, threads, gflops):
    """A benchmark running at exactly `gflops` model GFLOP/s (median time)."""
    return entries(backend, form, s, threads, flops(s) / (gflops * 1e9))


def test_percent_of_peak_uses_the_backends_peak_isa(tmp_path):
    # avx2 dispatch: xsimd reads against the avx2 peak (100), naive against portable (40),
    # not against the best (avx512, 200).
    context = isa_context("avx2", one_avx512=200, one_avx2=100, one_portable=40, all_avx2=180)
    data = rate_entries("xsimd", "split_weight", S1, 1, 50.0) + rate_entries(
        "naive", "split_weight", S1, 1, 2.0
    )
    data += rate_entries("xsimd", "split_weight", S1, 2, 90.0)
    (results,) = load_machines([write(tmp_path / "a.json", data, context)])
    peaks = find_peaks(results)
    xsimd = results.get("xsimd", "split_weight", S1, 1)
    naive = results.get("naive", "split_weight", S1, 1)
    assert peaks.isa_of(xsimd) == "avx2" and peaks.isa_of(naive) == "portable"
    assert peaks.percent(xsimd) == pytest_approx(50.0)
    assert peaks.percent(naive) == pytest_approx(5.0)
    # 2 threads: the avx2 all-core peak, 180 on 2 threads: 90 / 180 = 50%.
    assert peaks.percent(results.get("xsimd", "split_weight", S1, 2)) == pytest_approx(50.0)
    # The best peak stays the fallback (PyTorch peers, backends without a peak ISA).
    assert peaks.fallback.one_core == 200.0
    overridden = find_peaks(results, one_core=25.0)
    assert overridden.percent(xsimd) == pytest_approx(200.0)


def pytest_approx(value):
    import pytest

    return pytest.approx(value, rel=1e-9)


def test_peak_entries_raise_the_peak_and_are_not_listed(tmp_path):
    context = isa_context("avx512", one_avx512=200, one_portable=40)
    data = rate_entries("xsimd", "split_weight", S1, 1, 110.0)
    data += peak_entries("avx512", [210.0, 220.0, 215.0], at=0) + peak_entries("avx512", [205.0], at=2)
    path = write(tmp_path / "p.json", data, context)
    (results,) = load_machines([path])
    assert len(results.peak_entries) == 4  # iterations only, the aggregate is not a peak
    assert not results.unrecognised
    peaks = find_peaks(results)
    assert peaks.files[str(path)].per_isa["avx512"].one_core == 220.0
    assert peaks.percent(results.get("xsimd", "split_weight", S1, 1)) == pytest_approx(50.0)
    out = tmp_path / "r"
    assert run_tool(path, "--out", out).returncode == 0
    md = (out / "report.md").read_text()
    assert "Other benchmarks" not in md and "peak/avx512" not in md.split("## Appendix")[0]
    assert "| `p.json` | avx512 | 220.0 |" in md


def test_low_and_spread_peaks_are_warned_about(tmp_path):
    good = isa_context("avx512", one_avx512=200, trials_avx512="195,198,200")
    # Same CPU model, avx2 dispatch forced: its avx512 peak 150 is 25% below 200, and its
    # trials spread 150 vs 120: 20%.
    low = isa_context("avx2", "MHA_XSIMD_ISA=avx2", one_avx512=150, one_avx2=100, trials_avx512="120,150")
    a = write(tmp_path / "good.json", rate_entries("xsimd", "split_weight", S1, 1, 100.0), good)
    b = write(tmp_path / "low.json", rate_entries("xsimd", "split_weight", S1, 1, 60.0), low)
    machines = load_machines([a, b])
    warnings = warnings_of([find_peaks(r) for r in machines])
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("`low.json`: its avx512 1-core FMA peak, 150.0 GFLOP/s, is 25% below")
    assert "flattered" in warnings[0] and "`good.json`" in warnings[0]
    assert "spread 20% (120.0 to 150.0 GFLOP/s over 2 figures)" in warnings[1]
    out = tmp_path / "r"
    assert run_tool(a, b, "--out", out).returncode == 0
    md = (out / "report.md").read_text()
    assert md.index("## Warnings") < md.index("## Answer") and "is 25% below the 200.0" in md


def test_older_files_are_warned_about_from_their_plain_peak_keys(tmp_path):
    # Before per-ISA all-core keys: the plain all-core peak was measured at mha_fma_peak_isa.
    # The reference report's two sweeps: 205.8 vs 231.1 GFLOP/s on 2 threads (11% below).
    # A file of the same CPU model whose all-core peak is on 8 threads is not compared.
    def old(all_cores, threads):
        context = {k: v for k, v in CONTEXT.items() if not k.startswith("mha_fma_peak_gflops_one_core_")}
        return dict(
            context,
            mha_fma_peak_isa="avx2",
            mha_fma_peak_gflops_all_cores=str(all_cores),
            mha_fma_peak_threads=str(threads),
            num_cpus=threads,
        )

    data = rate_entries("xsimd", "split_weight", S1, 2, 100.0)
    low = write(tmp_path / "low.json", data, old(205.8, 2))
    high = write(tmp_path / "high.json", data, old(231.1, 2))
    wide = write(tmp_path / "wide.json", data, old(800.0, 8))
    machines = load_machines([low, high, wide], best_run=True)
    assert [r.machine.threads for r in machines] == [2, 8]
    peaks = [find_peaks(r) for r in machines]
    assert peaks[0].files[str(low)].per_isa["avx2"].all_cores == 205.8
    (warning,) = warnings_of(peaks)
    assert warning.startswith(
        "`low.json`: its avx2 all-core FMA peak, 205.8 GFLOP/s on 2 threads, is 11% below the "
        "231.1 GFLOP/s measured in `high.json`"
    )


def test_all_core_peak_entries_spreading_are_warned_about(tmp_path):
    # The start-up all-core peak 200, a peak entry later in the run 170: 15% apart.
    context = isa_context("avx512", one_avx512=100, all_avx512=200)
    data = rate_entries("xsimd", "split_weight", S1, 2, 100.0)
    data += peak_entries("avx512", [170.0], threads=2, at=1) + peak_entries("avx512", [99.0], at=1)
    (results,) = load_machines([write(tmp_path / "s.json", data, context)])
    peaks = find_peaks(results)
    assert peaks.percent(results.get("xsimd", "split_weight", S1, 2)) == pytest_approx(50.0)
    (warning,) = warnings_of([peaks])
    assert (
        "its avx512 all-core FMA peak trials and peak entries spread 15% (170.0 to 200.0 GFLOP/s" in warning
    )


def two_machines(tmp_path):
    """One CPU, two dispatches, same benchmark names. avx512: xsimd fastest on both shapes;
    forced avx2: xsimd twice as slow, so onednn wins S2 (S1: xsimd still wins)."""
    native = isa_context("avx512", one_avx512=200, one_avx2=100, one_portable=40)
    forced = isa_context("avx2", "MHA_XSIMD_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2", one_avx512=200, one_avx2=100)
    rates = {
        "native": {("xsimd", S1): 100, ("xsimd", S2): 100, ("onednn", S1): 60, ("onednn", S2): 80},
        "forced": {("xsimd", S1): 50, ("xsimd", S2): 50, ("onednn", S1): 30, ("onednn", S2): 70},
    }
    paths = []
    for name, context in (("native", native), ("forced", forced)):
        data = []
        for (backend, s), rate in rates[name].items():
            for n in (1, 2):
                data += rate_entries(backend, "split_weight", s, n, rate * n)
                data += rate_entries(backend, "wrapper", s, n, rate * n / 2)
        paths.append(write(tmp_path / f"{name}.json", data, context))
    return paths


def test_two_machines_two_sections_and_a_cross_machine_table(tmp_path):
    out = tmp_path / "r"
    result = run_tool(*two_machines(tmp_path), "--out", out)
    assert result.returncode == 0, result.stderr  # same names on two machines: accepted
    md = (out / "report.md").read_text()
    native, forced = "Synthetic CPU, 2 threads, AVX-512", "AVX2 dispatch on Synthetic CPU, 2 threads"
    assert f"## Machine: {native}" in md and f"## Machine: {forced}" in md
    assert (
        md.index("## Answer") < md.index(f"## Machine: {native}") < md.index("## Appendix: machine and build")
    )
    rows = table_after(md, "## Answer: which backend to link")
    assert len(rows) == 4  # 2 shapes x (1, all)
    by_shape = {(r[0], r[1]): r[2:] for r in rows}
    assert by_shape[(S1.label(), "1")] == ["xsimd·split_weight", "xsimd·split_weight", ""]
    assert by_shape[(S2.label(), "1")] == ["xsimd·split_weight", "onednn·split_weight", "**backend differs**"]
    assert by_shape[(S2.label(), "all")][2] == "**backend differs**"
    assert "**2 of 4 rows differ** between machines, **2 beyond noise**" in md
    # Figures of each machine under their own names; % of peak per machine's ISA:
    # forced xsimd S1 at 50 GFLOP/s against the avx2 peak 100 = 50%.
    assert len(list(out.glob("*time_bars.png"))) == 2
    forced_part = md.split(f"## Machine: {forced}")[1].split("## Appendix")[0]
    assert "**1 thread: link xsimd**" in forced_part and "fastest mha backend on 1 of 2 shapes" in forced_part
    assert "`MHA_XSIMD_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2`" not in forced_part  # context: appendix only
    machines = load_machines(two_machines(tmp_path))
    assert [r.machine.label() for r in machines] == [native, forced]
    peaks = find_peaks(machines[1])
    assert peaks.percent(machines[1].get("xsimd", "split_weight", S1, 1)) == pytest_approx(50.0)


def test_peer_files_attach_by_cpu_model_and_threads(tmp_path):
    native, forced = two_machines(tmp_path)
    torch = {"num_cpus": 2, "cpu_model": "Synthetic CPU", "torch_version": "1.13.1"}
    other = {"num_cpus": 8, "cpu_model": "Synthetic CPU"}
    peers = write(tmp_path / "peers.json", rate_entries("torch", "split_weight", S1, 1, 40.0), torch)
    lone = write(tmp_path / "lone.json", rate_entries("torch", "wrapper", S1, 8, 40.0), other)
    machines = load_machines([peers, native, lone])
    assert [len(r.contexts) for r in machines] == [2, 1]
    assert machines[0].get("torch", "split_weight", S1, 1) is not None
    assert machines[1].machine.threads == 8


def test_peer_files_without_dispatch_join_every_machine_of_their_cpu(tmp_path):
    native, forced = two_machines(tmp_path)
    torch = {"num_cpus": 2, "cpu_model": "Synthetic CPU", "torch_version": "1.13.1"}
    peers = write(tmp_path / "peers.json", rate_entries("torch", "split_weight", S1, 1, 40.0), torch)
    pinned = write(
        tmp_path / "pinned.json",
        rate_entries("torch", "wrapper", S1, 1, 40.0),
        dict(torch, mha_cpu_model="Synthetic CPU", mha_hardware_threads="2", mha_dispatch="avx2"),
    )
    machines = load_machines([native, forced, peers, pinned])
    assert [r.machine.dispatch for r in machines] == ["avx512", "avx2"]
    # No dispatch: both machines of that CPU; dispatch avx2: only the forced-AVX2 machine.
    assert [[Path(p).name for p, _ in r.contexts] for r in machines] == [
        ["native.json", "peers.json"],
        ["forced.json", "peers.json", "pinned.json"],
    ]
    assert [r.get("torch", "wrapper", S1, 1) is not None for r in machines] == [False, True]
    out = tmp_path / "r"
    assert run_tool(native, forced, peers, pinned, "--out", out).returncode == 0
    md = (out / "report.md").read_text()
    head = md.split("## Answer")[0]
    assert head.count("`peers.json`") == 1  # listed once among the inputs
    assert md.split("## Appendix")[1].count("peers: `peers.json`") == 2


def test_single_shape_run_gets_a_time_figure_and_answer_first(tmp_path):
    data = rate_entries("xsimd", "split_weight", S1, 1, 100.0) + rate_entries("xsimd", "wrapper", S1, 1, 50.0)
    data += rate_entries("onednn", "split_weight", S1, 1, 80.0)
    out = tmp_path / "r"
    assert (
        run_tool(
            write(tmp_path / "one.json", data, isa_context(one_avx512=200)), "--html", "--out", out
        ).returncode
        == 0
    )
    assert (out / "time_bars.png").stat().st_size > 1000 and (out / "time_bars.svg").exists()
    md = (out / "report.md").read_text()
    assert md.index("## Answer: which backend to link") < md.index("## Appendix: machine and build")
    assert md.index("## Answer") < md.index("## Summary")
    # onednn at 80 vs xsimd at 100 GFLOP/s: 25% slower, with 3 repetitions: measured noise.
    assert "**1 thread: link xsimd**" in md and "runner-up onednn, 25.0% slower" in md
    assert "not within noise" in md and "noise is not known" not in md
    html = (out / "report.html").read_text()
    assert html.index("Answer: which backend to link") < html.index("Appendix: machine and build")


def test_cross_machine_rows_tell_backend_from_formulation_differences(tmp_path):
    # Machine b: xsimd's wrapper is the faster formulation on S1 (same backend, other form).
    a = write(tmp_path / "a.json", rate_entries("xsimd", "split_weight", S1, 1, 100.0), isa_context("avx512"))
    b = write(
        tmp_path / "b.json",
        rate_entries("xsimd", "split_weight", S1, 1, 40.0) + rate_entries("xsimd", "wrapper", S1, 1, 50.0),
        isa_context("avx2"),
    )
    (row,) = cross_machine.cross_machine(load_machines([a, b]))
    assert (row.threads, row.differs, row.backend_differs) == ("1", True, False)
    assert [m.key.formulation for m in row.cells] == ["split_weight", "wrapper"]
    # a never measured the wrapper: cannot be called noise.
    assert not row.within_noise


def test_cross_machine_differences_within_noise_are_said(tmp_path):
    # a: xsimd 100, onednn 98 GFLOP/s (2% apart); b: onednn 100, xsimd 98: the picks differ,
    # but on each machine the other's pick is within 5%.
    rows = []
    for name, (x, o) in (("a", (100.0, 98.0)), ("b", (98.0, 100.0))):
        data = rate_entries("xsimd", "split_weight", S1, 1, x) + rate_entries(
            "onednn", "split_weight", S1, 1, o
        )
        rows.append(write(tmp_path / f"{name}.json", data, isa_context("avx512" if name == "a" else "avx2")))
    (row,) = cross_machine.cross_machine(load_machines(rows))
    assert row.backend_differs and row.within_noise
    out = tmp_path / "r"
    assert run_tool(*rows, "--out", out).returncode == 0
    (line,) = table_after((out / "report.md").read_text(), "## Answer: which backend to link")
    assert line[2:] == ["xsimd·split_weight", "onednn·split_weight", "backend differs (within noise)"]


def test_a_series_without_any_other_figure_gets_time_bars(tmp_path):
    # One backend and formulation along H, no GFLOPS counter: no speedup, GFLOP/s or
    # link-choice figure could be drawn, so the time bars show every shape.
    shapes = [Shape(1, 64, 64, 64, h) for h in (1, 2, 4)]
    data = [
        {k: v for k, v in e.items() if k != "GFLOPS"}
        for s in shapes
        for e in entries("naive", "split_weight", s, 1, 0.001 * s.n_heads)
    ]
    out = tmp_path / "r"
    assert run_tool(write(tmp_path / "h.json", data), "--out", out).returncode == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["time_bars.png"]
    md = (out / "report.md").read_text()
    assert "Median time per forward pass (lower is faster; hatched: wrapper)." in md


def test_all_core_peak_entries_without_a_peak_thread_count_in_the_context(tmp_path):
    # No mha_fma_peak_threads / num_cpus: the threads:4 entries give the all-core peak (4
    # threads), against which 2 threads get half: 100 / (400 * 2/4) = 50%.
    context = {k: v for k, v in isa_context("avx512", one_avx512=100).items()}
    for key in ("mha_fma_peak_threads", "num_cpus", "mha_fma_peak_gflops_all_cores"):
        del context[key]
    data = rate_entries("xsimd", "split_weight", S1, 2, 100.0)
    data += peak_entries("avx512", [380.0, 400.0], threads=4, at=0)
    (results,) = load_machines([write(tmp_path / "t.json", data, context)])
    peaks = find_peaks(results)
    peak = peaks.files[str(tmp_path / "t.json")].per_isa["avx512"]
    assert (peak.all_cores, peak.all_core_threads) == (400.0, 4)
    assert peaks.percent(results.get("xsimd", "split_weight", S1, 2)) == pytest_approx(50.0)
