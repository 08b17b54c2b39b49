"""The command end to end: report folder, figures, tables, absent sections, A/B, bad input."""

import re
from pathlib import Path

import pytest
from conftest import CONTEXT, HEADS, entries, heads_run, run_module, skipped, write

from mhapy.problem import Shape, flops
from mhapy.report import cli, document


def run_tool(*args):
    """The command exactly as scripts and users run it: python3 -m mhapy.report ..."""
    return run_module("mhapy.report", *args)


def table_after(markdown: str, heading: str) -> list[list[str]]:
    """Rows (cells) of the first table after a heading line."""
    lines = markdown[markdown.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("| "):
            break
        rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


@pytest.fixture(scope="module")
def heads_report(tmp_path_factory):
    """The heads model of conftest (naive, xsimd + torch peers, 1 and 2 threads), reported once
    through the command line."""
    folder = tmp_path_factory.mktemp("heads")
    mha = write(folder / "mha.json", heads_run(("naive", "xsimd")))
    peers = write(
        folder / "peers.json",
        heads_run(("torch", "torch_nn_mha")),
        {"num_cpus": 2, "torch_version": "1.13.1"},
    )
    out = folder / "report"
    result = run_tool(mha, peers, "--html", "--out", out)
    assert result.returncode == 0, result.stderr
    return out


def small_run(tmp_path):
    """Two shapes differing in H, one backend, both formulations: every H figure, quickly."""
    data = []
    for h in (1, 2):
        s = Shape(1, 8, 16, 16, h)
        data += entries("naive", "split_weight", s, 1, 1.0) + entries("naive", "wrapper", s, 1, 1.0 + h)
    return write(tmp_path / "small.json", data)


def test_heads_report_with_peers_has_every_section_figure_and_number(heads_report):
    out = heads_report
    for stem in ("speedup_vs_heads", "gflops_vs_heads", "thread_scaling", "link_choice"):
        for suffix in (".png", ".svg"):
            assert (out / f"{stem}{suffix}").stat().st_size > 1000, stem + suffix
    assert not list(out.glob("gflops_vs_seq*"))  # no T series in a heads run
    md = (out / "report.md").read_text()

    # Split/wrapper speedup table, fixed d_model, 1 thread: xsimd follows 1 + H/16, torch 0.8.
    rows = table_after(md, "### fixed d_model = 768 (B=4, T=256), 1 thread")
    assert [r[0] for r in rows] == [str(h) for h in HEADS if 768 % h == 0]
    for h, naive, xsimd, torch in rows:
        assert (naive, torch) == ("1.00×", "0.80×")
        assert xsimd == f"{1 + int(h) / 16:.2f}×"

    # GFLOP/s table, fixed head_dim, 2 threads: xsimd split = 50 * 1.8 = 90 GFLOP/s = 45% of
    # the 2-thread peak (200 all cores * 2/2).
    rows = table_after(
        md.split("## GFLOP/s and % of peak against H")[1],
        "### fixed head_dim = 64, d_model = 64·H (B=1, T=128), 2 threads",
    )
    header = md.split("## GFLOP/s and % of peak against H")[1]
    assert len(rows) == len(HEADS)
    assert all(r[3] == "90.0 (45%)" for r in rows), rows[0]  # column 3: xsimd split_weight
    assert "| H (heads) | naive split_weight | naive wrapper | xsimd split_weight |" in header

    # Which backend: xsimd split everywhere; runner-up naive split, 25x slower; torch wrapper as
    # the PyTorch reference (50/40 * 0.8 = 1.00x the fastest time).
    rows = table_after(md.split("## Which backend to link")[1], "### 1 thread")
    assert len(rows) == len(
        set(
            Shape(*s)
            for s in [(4, 256, 768, 768, h) for h in HEADS if 768 % h == 0]
            + [(1, 128, 64 * h, 64 * h, h) for h in HEADS]
        )
    )
    for shape, fastest, _, runner_up, _, margin, peer, text in rows:
        assert (fastest, runner_up, margin) == ("xsimd split_weight", "naive split_weight", "2400%")
        assert peer.startswith("torch wrapper") and peer.endswith("(1.00×)")
        assert text.startswith("link xsimd, run split_weight") and text.endswith("25.00× faster than naive")
    assert "1 thread: fastest on the most shapes: xsimd split_weight: 26 of 26" in md

    # Context and peak, thread scaling (1.8x by construction), absent sections said.
    assert "1 core: **100.0 GFLOP/s**, all cores: **200.0 GFLOP/s**" in md
    assert "| `torch_version` | 1.13.1 |" in md
    assert "| `library_build_type` | debug (Google Benchmark library's build, not the timed code's" in md
    scaling = table_after(md, "## Thread scaling")
    assert {r[3] for r in scaling} == {"1.80×"} and {r[4] for r in scaling} == {"90%"}
    assert "GFLOP/s against T: no shapes that differ only in T" in md
    assert "Skipped and failed" not in md


def test_html_is_self_contained_with_every_figure_embedded(heads_report):
    out = heads_report
    html = (out / "report.html").read_text()
    figures = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,[A-Za-z0-9+/=]+">', html)
    # speedup, GFLOP/s, scaling, link choice, and the peers against mha.
    assert len(figures) == len(list(out.glob("*.png"))) == 5 and (out / "peers.png").exists()
    assert not re.search(r'(src|href)="(?!data:)', html)  # nothing loaded from elsewhere
    assert "<table>" in html and '<td class="num">1.00×</td>' in html


def test_a_report_is_markdown_and_png_unless_html_is_asked_for(tmp_path):
    # What a committed report keeps: report.md and PNG figures, no SVG link, no HTML. A folder
    # that held an HTML report loses it (the report's own files are replaced).
    out = tmp_path / "r"
    assert cli.main([str(small_run(tmp_path)), "--html", "--out", str(out)]) == 0
    assert (out / "report.html").exists() and list(out.glob("*.svg"))
    assert "([SVG](" in (out / "report.md").read_text()
    assert cli.main([str(small_run(tmp_path)), "--out", str(out)]) == 0
    assert not (out / "report.html").exists() and not list(out.glob("*.svg"))
    assert list(out.glob("*.png")) and "SVG" not in (out / "report.md").read_text()


def test_absent_data_is_said_not_faked(tmp_path):
    # One backend, one shape, one thread count, no GFLOPS counter, no peak, a skipped entry.
    s = Shape(1, 64, 32, 32, 2)
    data = [
        {k: v for k, v in e.items() if k != "GFLOPS"} for e in entries("naive", "split_weight", s, 1, 0.001)
    ]
    data.append(skipped("naive", "wrapper", s, 1))
    path = write(tmp_path / "one.json", data, {"num_cpus": 2, "blas_warning": "reference BLAS"})
    out = tmp_path / "r"
    assert cli.main([str(path), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    # The one figure a single-shape run gets: its time per backend and formulation.
    assert [p.name for p in out.glob("*.png")] == ["time_bars.png"]
    for said in (
        "split/wrapper speedup and GFLOP/s against H: no shapes that differ only in H",
        "thread scaling: no shape was measured at 1 thread and at more.",
        "GFLOP/s and % of peak: no GFLOPS counter in the inputs.",
        "peers: not in the inputs",
        "No measured FP32 FMA peak in the inputs",
        "only naive measured: run split_weight",
        "skipped: estimated 412 s exceeds the time budget",
        "## Warnings\n\n- **blas_warning** (`one.json`): reference BLAS",
    ):
        assert said in md, said
    for absent in ("## Split-weight vs wrapper", "## GFLOP/s", "## Thread scaling"):
        assert absent not in md


def test_seq_series_gets_its_figure(tmp_path):
    data = []
    for t in (64, 128, 256):
        s = Shape(1, t, 768, 768, 12)
        data += entries("naive", "split_weight", s, 1, t * 1e-4) + entries("naive", "wrapper", s, 1, t * 2e-4)
    out = tmp_path / "r"
    assert cli.main([str(write(tmp_path / "seq.json", data)), "--out", str(out)]) == 0
    assert (out / "gflops_vs_seq.png").exists() and not (out / "gflops_vs_seq.svg").exists()
    rows = table_after((out / "report.md").read_text(), "### d_model = 768, H = 12 (B=1), 1 thread")
    assert [r[0] for r in rows] == ["64", "128", "256"]


def test_ab_mode_writes_ratios_verdicts_and_figure(tmp_path):
    s = Shape(4, 256, 768, 768, 12)
    before = write(
        tmp_path / "before.json", entries("xsimd", "split_weight", s, 1, 0.010, spread=(0.99, 1.0, 1.01))
    )
    after_context = dict(CONTEXT, cpu_model="Other CPU")
    after = write(
        tmp_path / "after.json",
        entries("xsimd", "split_weight", s, 1, 0.008, spread=(0.99, 1.0, 1.01)),
        after_context,
    )
    out = tmp_path / "ab"
    result = run_tool("--ab", before, after, "--out", out)
    assert result.returncode == 0, result.stderr
    assert (out / "ab_ratios.png").exists() and not (out / "ab_ratios.svg").exists()
    md = (out / "report.md").read_text()
    (row,) = table_after(md, "## Per benchmark")
    assert row[1:] == ["10 ms", "8 ms", "0.80×", "-20.0%", "–", "faster (ranges)"]
    assert "| `cpu_model` | Synthetic CPU | Other CPU |" in md
    assert "1 benchmarks in both: 1 faster, 0 slower, 0 within noise" in md


def test_failure_leaves_the_previous_report_and_says_why(tmp_path):
    out = tmp_path / "r"
    assert run_tool(small_run(tmp_path), "--out", out).returncode == 0
    before = (out / "report.md").read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"benchmarks": [{"name": "mha/naive/wrapper/b1/t1/din1/dout1/h1/zz/threads:1", "real_time": 1}]}'
    )
    result = run_tool(bad, "--out", out)
    assert result.returncode == 1
    assert "unknown name component 'zz'" in result.stderr
    assert (out / "report.md").read_text() == before
    assert not list(tmp_path.glob(".mha_report-*"))  # staging folder removed


def test_rerun_removes_figures_the_new_data_no_longer_has(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert cli.main([str(small_run(tmp_path)), "--out", str(out)]) == 0
    assert (out / "speedup_vs_heads.png").exists()
    one = write(tmp_path / "one.json", entries("naive", "split_weight", Shape(1, 8, 8, 8, 1), 1, 1.0))
    assert cli.main([str(one), "--out", str(out)]) == 0
    assert not (out / "speedup_vs_heads.png").exists()
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--out", "x"], "give result files, --models files, or --ab BEFORE AFTER"),
        (["--ab", "a", "b", "c.json", "--out", "x"], "no other result or --models files"),
        (["--models", "m.json", "--trace", "t.json", "--out", "x"], "--trace goes with result files"),
        (["a.json", "--peak-1core", "-3", "--out", "x"], "--peak-1core -3.0: expected a positive"),
        (["--ab", "a", "b", "--alpha", "2", "--out", "x"], "--alpha 2.0: expected a value in"),
    ],
)
def test_bad_arguments_are_refused(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_inputs_without_attention_benchmarks_are_an_error(tmp_path, capsys):
    path = write(tmp_path / "other.json", [{"name": "BM_Other", "real_time": 1, "time_unit": "ns"}])
    assert cli.main([str(path), "--out", str(tmp_path / "r")]) == 1
    assert "no attention benchmarks" in capsys.readouterr().err


def test_noisy_repetitions_and_rates_above_the_peak_are_said(tmp_path):
    data = []
    for h in (1, 2):
        s = Shape(1, 64, 64, 64, h)
        count = flops(s)
        # 150 GFLOP/s against a 100 GFLOP/s 1-core peak; the wrapper's repetitions spread 20%.
        data += entries("xsimd", "split_weight", s, 1, count / 150e9)
        data += entries("xsimd", "wrapper", s, 1, count / 50e9, spread=(0.8, 1.0, 1.2))
    out = tmp_path / "r"
    assert cli.main([str(write(tmp_path / "n.json", data)), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "**2 value(s) exceed 100% of the measured peak** (up to 150%: xsimd split_weight at H=2" in md
    assert (
        "2 benchmark(s) vary by more than 5% (coefficient of variation) between repetitions; worst 20%" in md
    )


def test_notes_appear_after_the_summary_in_both_renderings(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text(
        "Why split is not faster everywhere.\n\n"
        "# oneDNN\n"
        "- narrow GEMMs run at **96%** of peak,\n"
        "  as fast as wide ones\n"
        "- the head split costs `1.4 ms`\n"
    )
    out = tmp_path / "report"
    result = run_tool(small_run(tmp_path), "--html", "--out", out, "--notes", notes)
    assert result.returncode == 0, result.stderr
    md = (out / "report.md").read_text()
    assert (
        md.index("## Answer: which backend to link")
        < md.index("## Summary")
        < md.index("## Notes on this run")
        < md.index("## Appendix: machine and build")
    )
    assert "Why split is not faster everywhere." in md
    assert "### oneDNN\n\n- narrow GEMMs run at **96%** of peak, as fast as wide ones\n" in md
    assert "- the head split costs `1.4 ms`" in md
    html_text = (out / "report.html").read_text()
    assert "<strong>96%</strong>" in html_text and "<code>1.4 ms</code>" in html_text


def test_notes_keep_a_list_under_a_paragraph_line_and_a_table():
    blocks = document.parse_notes(
        "Two runs:\n"
        "- one,\n"
        "  wrapped\n"
        "- two\n"
        "\n"
        "# Figures\n"
        "| shape | 1 | 2 threads |\n"
        "|---|---:|---:|\n"
        "| B1 | 67.9 | 33.6 |\n",
        3,
    )
    assert blocks == [
        document.Para("Two runs:"),
        document.Bullets(["one, wrapped", "two"]),
        document.Heading(3, "Figures"),
        document.Table(["shape", "1", "2 threads"], [["B1", "67.9", "33.6"]], {1, 2}),
    ]


def test_notes_keep_fenced_code_line_for_line():
    text = "Run:\n\n```\npython -m x --a 1 \\\n    --b 2\n\nsecond\n```\nAfter it.\n"
    blocks = document.parse_notes(text, 3)
    assert blocks == [
        document.Para("Run:"),
        document.Code("python -m x --a 1 \\\n    --b 2\n\nsecond"),
        document.Para("After it."),
    ]
    assert "```\npython -m x --a 1 \\\n    --b 2\n\nsecond\n```" in document.to_markdown(blocks)
    assert "<pre><code>python -m x --a 1 \\\n    --b 2" in document.to_html(blocks, "t", Path("."))
    # Indented by 4 spaces after a blank line: the same.
    indented = document.parse_notes("Run:\n\n    python -m x \\\n        --b 2\n\n    second\n\nAfter it.", 3)
    assert indented == [
        document.Para("Run:"),
        document.Code("python -m x \\\n    --b 2\n\nsecond"),
        document.Para("After it."),
    ]


def test_missing_notes_file_is_an_error_naming_it(tmp_path, capsys):
    assert (
        cli.main(
            [str(small_run(tmp_path)), "--out", str(tmp_path / "r"), "--notes", str(tmp_path / "nope.md")]
        )
        == 1
    )
    assert "nope.md" in capsys.readouterr().err


def test_a_run_under_an_emulator_says_its_timings_are_not_the_cpus(tmp_path):
    # mha_bench fills in mha_emulation under qemu-user (an aarch64 build on an x86 host); a
    # native run leaves it empty and the report says nothing of it.
    s = Shape(1, 8, 16, 16, 1)
    data = entries("naive", "split_weight", s, 1, 1.0) + entries("naive", "wrapper", s, 1, 2.0)
    emulated = {
        **CONTEXT,
        "mha_cpu_model": "Arm Neoverse V1 (emulated on an x86 host)",
        "mha_emulation": "qemu-aarch64",
    }
    for context, said in ((emulated, True), ({**CONTEXT, "mha_emulation": ""}, False)):
        out = tmp_path / f"r{said}"
        assert cli.main([str(write(tmp_path / f"{said}.json", data, context)), "--out", str(out)]) == 0
        md = (out / "report.md").read_text()
        assert (
            "these timings are the emulator's, not this CPU's (mha_emulation: qemu-aarch64)" in md
        ) == said
