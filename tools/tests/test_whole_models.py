"""The report's "Whole models" section (mhapy.report --models): the table, the answer that
says plainly where mha is slower, and malformed files named."""

from __future__ import annotations

import json

import pytest

from mhapy.report import document, whole_models


def record(attention, ttft, rate, **extra):
    r = dict(
        model="gpt2",
        dtype="float32",
        batch=1,
        threads=1,
        prefill=1024,
        decode=128,
        attention=attention,
        cpu="AMD EPYC",
        ttft_s=ttft,
        decode_tokens_per_s=rate,
        prefill_attention_share=0.2,
        decode_attention_share=0.1,
    )
    r.update(extra)
    return r


def test_answer_and_table():
    records = [record("eager", 2.0, 10.0), record("sdpa", 1.0, 20.0), record("mha", 0.8, 16.0)]
    records.append(record("mha", 0, 0, batch=8, error="logits differ from sdpa's by 1 (bound 0.1)"))
    text = document.to_markdown(whole_models.section(records))
    assert "## Whole models: what mha's attention does to them" in text
    assert "time to first token 1.25x sdpa's speed, decode 0.80x (**slower than sdpa**)" in text
    assert "| 1.25x / 0.80x |" in text and "| 0.50x / 0.50x |" in text
    assert "not timed: logits differ from sdpa's" in text


def test_no_slower_said_so():
    text = document.to_markdown(whole_models.section([record("sdpa", 1.0, 20.0), record("mha", 0.99, 20.5)]))
    assert "(no slower than sdpa)" in text


def test_files(tmp_path):
    good = tmp_path / "m.json"
    good.write_text(json.dumps({"models": [record("sdpa", 1.0, 2.0)]}))
    assert whole_models.load([good])[0]["attention"] == "sdpa"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"models": [{"model": "gpt2"}]}))
    with pytest.raises(whole_models.ModelsError, match="lacks dtype, batch"):
        whole_models.load([bad])
    with pytest.raises(whole_models.ModelsError, match="not a models_bench result file"):
        whole_models.load([tmp_path / "missing.json"])


def test_repeated_runs_are_each_against_their_own_sdpa(tmp_path):
    # Two runs of one case on a noisy machine: each mha row against its own run's sdpa, named by file.
    between = [dict(attention="sdpa", threads=2, keys=1024, step_ms=0.5, attention_ms=0.2)]
    paths = []
    for name, sdpa, step in (("run1.json", 20.0, 0.4), ("run2.json", 10.0, 0.25)):
        path = tmp_path / name
        path.write_text(
            json.dumps(
                {
                    "models": [record("sdpa", 1.0, sdpa), record("mha", 1.0, 11.0)],
                    "between_ops": between + [dict(between[0], attention="mha", step_ms=step)],
                }
            )
        )
        paths.append(path)
    text = document.to_markdown(whole_models.section(whole_models.load(paths)))
    assert "1 thread(s) (run1.json): time to first token 1.00x sdpa's speed, decode 0.55x" in text
    assert "1 thread(s) (run2.json): time to first token 1.00x sdpa's speed, decode 1.10x" in text
    assert "| gpt2 (run2.json) | float32 | 1 | 1 | 1024+128 | mha |" in text
    assert "| 2 | 1024 | mha (run1.json) | 0.400 | 0.200 | 1.25x |" in text
    assert "| 2 | 1024 | mha (run2.json) | 0.250 | 0.200 | 2.00x |" in text
    # One file: no file names.
    assert "(run1.json)" not in document.to_markdown(whole_models.section(whole_models.load(paths[:1])))


def test_the_report_takes_models_files(tmp_path):
    from mhapy.report import cli
    from test_report import small_run

    models = tmp_path / "models.json"
    models.write_text(json.dumps({"models": [record("sdpa", 1.0, 20.0), record("mha", 0.9, 21.0)]}))
    out = tmp_path / "report"
    assert cli.main([str(small_run(tmp_path)), "--models", str(models), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert text.index("## Whole models") < text.index("## Appendix")
    assert "time to first token 1.11x sdpa's speed, decode 1.05x (no slower than sdpa)" in text
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert cli.main([str(small_run(tmp_path)), "--models", str(bad), "--out", str(out)]) == 1
    # Whole models alone (a models_bench run without a sweep): notes and the section, no appendix.
    notes = tmp_path / "notes.md"
    notes.write_text("# Read me\n\nOn a lent machine.\n")
    alone = tmp_path / "alone"
    assert cli.main(["--models", str(models), "--notes", str(notes), "--out", str(alone)]) == 0
    text = (alone / "report.md").read_text()
    assert "from `models.json` (whole models only" in text and "On a lent machine." in text
    assert "decode 1.05x (no slower than sdpa)" in text and "## Appendix" not in text
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"models": []}))
    assert cli.main(["--models", str(empty), "--out", str(alone)]) == 1


def test_per_call_times_busy_threads_and_calls_between_torch_ops(tmp_path):
    timed = dict(decode_attention_ms=0.3, decode_busy_threads=2.9, decode_busy_threads_most=3)
    models = [
        record("sdpa", 1.0, 20.0, **timed),
        record("mha", 0.9, 21.0, **dict(timed, decode_attention_ms=0.2)),
    ]
    between = [
        dict(attention="sdpa", threads=2, keys=1024, step_ms=0.5, attention_ms=0.2),
        dict(attention="mha", threads=2, keys=1024, step_ms=0.4, attention_ms=0.1),
    ]
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"models": models, "between_ops": between}))
    text = document.to_markdown(whole_models.section(whole_models.load([path])))
    assert (
        "a decode attention call 0.200 ms (sdpa 0.300), threads busy during decode 2.9 (3) (sdpa 2.9 (3))"
        in text
    )
    assert "### A decode attention call between two torch ops" in text
    assert "| 2 | 1024 | mha | 0.400 | 0.100 | 1.25x |" in text
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"models": models, "between_ops": [{"attention": "mha"}]}))
    with pytest.raises(whole_models.ModelsError, match="lacks threads, keys"):
        whole_models.load([bad])


def test_cache_bytes_and_what_a_cache_does_to_the_logits(tmp_path):
    models = [
        record("sdpa", 1.0, 20.0, cache_bytes=2 * 2**20),
        record(
            "mha_int8",
            0.9,
            23.0,
            cache_bytes=2**20,
            decode_logits_error=3e-3,
            decode_logits_error_median=1e-3,
            top1_agreement=0.984,
            logits_steps=64,
        ),
    ]
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"models": models}))
    text = document.to_markdown(whole_models.section(whole_models.load([path])))
    assert ", mha_int8: time to first token 1.11x sdpa's speed, decode 1.15x (no slower than sdpa)" in text
    assert "| 2.0 |" in text and "| 1.0 |" in text  # cache MiB
    assert "### The KV cache's precision in the model" in text
    assert "| mha_int8 | 3.00e-03 | 1.00e-03 | 98.4% |" in text


def test_openvino_rows_are_said_against_sdpa_and_mhas_caches(tmp_path):
    """OpenVINO's rows (no attention share of their own) in the table, with the precisions it
    reported, and said plainly when it decodes faster than mha's cache."""
    ov = dict(openvino_kv_precision="f16", openvino_inference_precision="f32", peak_rss_bytes=600 * 2**20)
    models = [
        record("sdpa", 1.0, 20.0, peak_rss_bytes=500 * 2**20),
        record("mha_int8", 0.9, 30.0),
        {k: v for k, v in record("openvino", 0.5, 40.0, **ov).items() if not k.endswith("attention_share")},
        record("openvino_u8", 0, 0, error="not run: no optimum-intel environment: x does not exist"),
    ]
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"models": models}))
    text = document.to_markdown(whole_models.section(whole_models.load([path])))
    assert (
        "openvino (OpenVINO through optimum-intel, its KV cache f16, inference f32): decode 2.00x sdpa's rate, "
        "time to first token 2.00x sdpa's speed; mha_int8 decodes at 0.75x its rate (**OpenVINO is faster**)"
    ) in text
    assert "| 600 | 2.00x / 2.00x |" in text  # peak RSS MiB, then vs sdpa
    assert "not timed: not run: no optimum-intel environment" in text


def test_where_a_decode_step_goes_per_op():
    """--profile-steps: a table of ms a step per op and implementation (the longest ops by name,
    the rest summed), and the op where mha's step differs most from sdpa's."""

    def profiled(attention, step, **ms):
        return record(attention, 1.0, 20.0, decode_profile={"steps": 4, "step_ms": step, "ms": ms})

    names = {f"aten::op{i}": 0.01 * i for i in range(1, 15)}  # more than the table names
    sdpa = profiled("sdpa", 3.0, **{"attention function": 0.4, "aten::addmm": 1.2, **names})
    mha = profiled("mha", 3.5, **{"attention function": 0.3, "aten::addmm": 1.8, **names})
    text = document.to_markdown(whole_models.section([sdpa, mha, record("eager", 2.0, 10.0)]))
    assert "### Where a decode step's time goes" in text
    assert (
        "4 steps profiled: mha +0.500 ms a step against sdpa, its largest difference in 'aten::addmm' (+0.600 ms)"
        in text
    )
    assert "| step (profiled) | 3.000 | 3.500 |" in text
    assert "| aten::addmm | 1.200 | 1.800 |" in text and "| attention function | 0.400 | 0.300 |" in text
    # Twelve rows by name: addmm, the attention function and op14..op5; op4..op1 summed.
    assert "| aten::op5 |" in text and "| aten::op4 |" not in text
    assert "| other ops | 0.100 | 0.100 |" in text
