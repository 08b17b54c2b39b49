"""mhapy.models.bench (whole models on each attention implementation) on a tiny model: every
implementation checked against sdpa first, then timed; a wrong one is recorded, not timed."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
models_bench = pytest.importorskip("mhapy.models.bench")

import mha.transformers  # noqa: E402

ARGS = ["--models", "tiny", "--dtypes", "float32", "--batches", "2", "--threads", "1"]
ARGS += [
    "--prefill",
    "16",
    "--decode",
    "4",
    "--repetitions",
    "1",
    "--between-ops",
    "3",
    "--logits-steps",
    "3",
]
# PyTorch's and mha's implementations; OpenVINO's (a process of its own environment) have tests
# of their own below.
IN_PROCESS = ["eager", "sdpa", "sdpa_static", "mha", "mha_tbb", "mha_fp32", "mha_int8", "mha_bf16"]
ARGS += ["--attention", ",".join(IN_PROCESS)]


def run(tmp_path, part="models"):
    out = tmp_path / "models.json"
    assert models_bench.main([*ARGS, "--out", str(out)]) == 0
    return json.loads(out.read_text())[part]


def test_every_implementation_is_timed(tmp_path):
    records = run(tmp_path)
    assert [r["attention"] for r in records] == IN_PROCESS
    for r in records:
        assert "error" not in r
        assert r["cache_bytes"] > 0
        # The process's peak over the round holds at least the model's weights and its cache.
        assert r["peak_rss_bytes"] > r["cache_bytes"]
        if r["attention"].startswith("mha"):  # the decode logits against sdpa's
            assert r["logits_steps"] == 3 and 0 <= r["decode_logits_error_median"] <= r["decode_logits_error"]
            assert r["decode_logits_error"] <= (2e-2 if r["attention"] == "mha_int8" else 1e-2)
            assert 0 <= r["top1_agreement"] <= 1
        assert r["ttft_s"] > 0 and r["decode_tokens_per_s"] > 0
        assert r["decode_tokens_per_s_rounds"] == [pytest.approx(r["decode_tokens_per_s"])]
        assert 0 < r["prefill_attention_share"] < 1 and 0 < r["decode_attention_share"] <= 1
        assert r["decode_attention_ms"] > 0
        assert 0 <= r["decode_busy_threads"] <= r["decode_busy_threads_most"]
        assert (r["model"], r["dtype"], r["batch"], r["threads"], r["prefill"], r["decode"]) == (
            "tiny",
            "float32",
            2,
            1,
            16,
            4,
        )


def test_a_wrong_implementation_is_not_timed(tmp_path, monkeypatch):
    def wrong(*args, **kwargs):
        out, weights = mha.transformers.attention_forward(*args, **kwargs)
        return out * 1.5, weights

    monkeypatch.setitem(mha.transformers.AttentionInterface._global_mapping, "mha", wrong)
    records = {r["attention"]: r for r in run(tmp_path)}
    assert "logits differ from sdpa's" in records["mha"]["error"]
    assert "logits differ from sdpa's" in records["mha_int8"]["error"]  # the same function
    assert "ttft_s" not in records["mha"] and "error" not in records["sdpa"]


def test_the_decode_call_between_torch_ops_is_timed(tmp_path):
    records = run(tmp_path, "between_ops")
    assert [r["attention"] for r in records] == ["sdpa", "mha", "mha_tbb"]
    for r in records:
        assert r["threads"] == 1 and r["keys"] == 16
        assert 0 < r["attention_ms"] < r["step_ms"]


def test_a_synthetic_fill_gives_every_cache_the_same_context(tmp_path):
    """--fill synthetic: random keys and values in every implementation's cache (no prefill, no
    time to first token); the decode logits still match sdpa's, which read the same context."""
    out = tmp_path / "models.json"
    argv = [
        *ARGS,
        "--attention",
        "sdpa,sdpa_static,mha,mha_fp32,mha_bf16,mha_int8",
        "--fill",
        "synthetic",
        "--layers",
        "2",
    ]
    assert models_bench.main([*argv, "--out", str(out)]) == 0
    records = json.loads(out.read_text())["models"]
    assert [r["attention"] for r in records] == [
        "sdpa",
        "sdpa_static",
        "mha",
        "mha_fp32",
        "mha_bf16",
        "mha_int8",
    ]
    for r in records:
        assert (r["fill"], r["layers"], r["prefill"]) == ("synthetic", 2, 16)
        assert "ttft_s" not in r and r["decode_tokens_per_s"] > 0
    sdpa, static, fp32, own_fp32, bf16, int8 = records
    # 2 layers of 16 + 4 tokens of 2 K/V heads of 16 per sequence, fp32, keys and values: a
    # DynamicCache's bytes.
    assert sdpa["cache_bytes"] == 2 * (2 * 2 * 20 * 16 * 4 * 2)
    assert static["cache_bytes"] > 0 and int8["cache_bytes"] < bf16["cache_bytes"] < sdpa["cache_bytes"]
    # The same context in every layer of every cache: mha's decode logits are sdpa's (bf16 and
    # int8: within their bounds, the tiny model's logits being small).
    assert fp32["decode_logits_error"] <= 1e-5 and fp32["top1_agreement"] == 1
    assert own_fp32["decode_logits_error"] <= 1e-5 and own_fp32["top1_agreement"] == 1
    assert int8["cache_bytes"] < bf16["cache_bytes"] < sdpa["cache_bytes"] <= own_fp32["cache_bytes"]
    assert bf16["logits_steps"] == int8["logits_steps"] == 3
    assert 0 < bf16["decode_logits_error"] <= 1e-2 and 0 < int8["decode_logits_error"] <= 2e-2


def test_profiled_steps_say_where_a_decode_step_goes(tmp_path):
    """--profile-steps: each in-process implementation's steps under torch.profiler, the attention
    function's whole time apart (sdpa's own ops inside it, not beside it) and the ops outside it."""
    out = tmp_path / "models.json"
    argv = [*ARGS[:-2], "--attention", "sdpa,mha,mha_int8", "--logits-steps", "0", "--profile-steps", "2"]
    assert models_bench.main([*argv, "--out", str(out)]) == 0
    records = json.loads(out.read_text())["models"]
    assert [r["attention"] for r in records] == ["sdpa", "mha", "mha_int8"]
    for r in records:
        profile = r["decode_profile"]
        ms = profile["ms"]
        assert profile["steps"] == 2 and profile["step_ms"] > 0
        assert ms["attention function"] > 0 and ms["aten::mm"] > 0 and min(ms.values()) >= 0
        assert sum(ms.values()) == pytest.approx(profile["step_ms"], rel=1e-6)
        # The attention's own ops are inside its time, never beside it.
        assert not any("scaled_dot_product" in name for name in ms)
    sdpa, mha = (r["decode_profile"]["ms"] for r in records[:2])
    assert set(sdpa) & set(mha) >= {"aten::mm", "aten::embedding"}  # the model's own ops, named alike


def test_a_negative_profile_step_count_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        models_bench.main([*ARGS, "--profile-steps", "-2", "--out", str(tmp_path / "m.json")])
    assert "--profile-steps -2: expected 0 (none) or a positive number of steps" in capsys.readouterr().err


def test_a_negative_layer_count_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        models_bench.main([*ARGS, "--layers", "-1", "--out", str(tmp_path / "m.json")])
    assert "--layers -1: expected 0 (all) or a positive number of layers" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


# -- OpenVINO through optimum-intel, in its own environment --------------------------------------


def openvino_run(tmp_path, *extra):
    out = tmp_path / "models.json"
    argv = [
        *ARGS[:-2],
        "--attention",
        "sdpa,mha_int8,openvino,openvino_u8",
        *extra,
    ]  # ARGS ends with IN_PROCESS
    assert models_bench.main([*argv, "--out", str(out)]) == 0
    return {r["attention"]: r for r in json.loads(out.read_text())["models"]}


def test_openvino_without_its_environment_is_said_not_run(tmp_path):
    records = openvino_run(tmp_path, "--openvino-python", str(tmp_path / "no-such-python"))
    for name in ("openvino", "openvino_u8"):
        assert records[name]["error"].startswith("not run: no optimum-intel environment: ")
        assert "scripts/peers-env.sh optimum makes it" in records[name]["error"]
        assert "decode_tokens_per_s" not in records[name]
    assert "error" not in records["sdpa"] and "error" not in records["mha_int8"]


def test_openvino_whose_process_fails_is_said_not_run(tmp_path):
    # A "Python" that exits at once: the export's request finds the process gone.
    records = openvino_run(tmp_path, "--openvino-python", "/bin/false")
    for name in ("openvino", "openvino_u8"):
        assert records[name]["error"] == "not run: the OpenVINO process exited (1) on load (its stderr above)"
    assert "error" not in records["mha_int8"]


def test_openvino_killed_by_a_signal_is_said_not_run_naming_it(tmp_path):
    # OpenVINO 2026.4's CPU plugin divides by zero compiling a bf16 model on one thread of an AMX
    # Xeon: the process dies of SIGFPE, which the record names.
    python = tmp_path / "dies-of-sigfpe"
    python.write_text("#!/bin/sh\nkill -FPE $$\n")
    python.chmod(0o755)
    records = openvino_run(tmp_path, "--openvino-python", str(python))
    for name in ("openvino", "openvino_u8"):
        assert (
            records[name]["error"]
            == "not run: the OpenVINO process exited (-8, SIGFPE) on load (its stderr above)"
        )


def test_openvino_failing_while_timed_is_said_not_run(tmp_path, monkeypatch):
    # A process that passes its check (sdpa's own logits) and dies on its first timed round: its
    # rows say so, the other implementations are timed, the bench ends.
    class DiesWhenTimed:
        def __init__(self, model, python):
            self.model = model

        def prefill_logits(self, implementation, ids):
            self.model.set_attn_implementation("sdpa")
            return self.model(ids, attention_mask=torch.ones_like(ids)).logits

        def measure(self, implementation, prompt, steps):
            raise RuntimeError("the OpenVINO process exited (-9) on run (its stderr above)")

        def close(self):
            pass

    monkeypatch.setattr(models_bench, "OpenVinoRuns", DiesWhenTimed)
    records = openvino_run(tmp_path)
    for name in ("openvino", "openvino_u8"):
        assert records[name]["error"] == (
            "not run: OpenVINO failed while timed: the OpenVINO process exited (-9) on run (its stderr above)"
        )
        assert "decode_tokens_per_s" not in records[name]
    assert records["mha_int8"]["decode_tokens_per_s"] > 0 and "error" not in records["sdpa"]


def test_openvino_needs_a_prefill(tmp_path):
    records = openvino_run(tmp_path, "--fill", "synthetic")
    assert "filled only by a prefill" in records["openvino"]["error"]
    assert "error" not in records["mha_int8"]


@pytest.mark.skipif(
    not __import__("pathlib").Path(models_bench.DEFAULT_PYTHON).is_file(),
    reason="no optimum-intel environment (scripts/peers-env.sh optimum makes it)",
)
def test_openvino_through_optimum_intel_is_checked_and_timed(tmp_path):
    """The tiny model exported by optimum-intel: its logits checked against sdpa's, timed, the
    precisions it reports recorded, its cache's bytes computed from them (u8: head_dim + 8
    bytes a row against f16's or f32's), the decode logits compared as mha's are."""
    records = openvino_run(tmp_path)
    tiny = models_bench.MODELS["tiny"]
    head_dim = tiny["hidden_size"] // tiny["num_attention_heads"]
    # 2 layers x K and V x batch 2 x 2 K/V heads x 19 tokens (16 + 3 decode steps) rows.
    rows = 2 * 2 * 2 * tiny["num_key_value_heads"] * 19
    for name in ("openvino", "openvino_u8"):
        r = records[name]
        assert "error" not in r, r["error"]
        assert r["ttft_s"] > 0 and r["decode_tokens_per_s"] > 0 and r["peak_rss_bytes"] > 0
        # The model's own precision, pinned (left to it, OpenVINO computes in bf16 where there is AMX).
        assert r["openvino_threads"] == 1 and r["openvino_inference_precision"] == "f32"
        assert r["logits_steps"] == 3 and 0 <= r["top1_agreement"] <= 1
        assert r["decode_logits_error"] <= 5e-2
        assert "decode_attention_share" not in r
    u8 = records["openvino_u8"]
    assert u8["openvino_kv_precision"] == "u8" and u8["cache_bytes"] == rows * (head_dim + 8)
    element = {"f32": 4, "f16": 2, "bf16": 2, "u8": 1}[records["openvino"]["openvino_kv_precision"]]
    assert records["openvino"]["cache_bytes"] == rows * head_dim * element + (8 * rows if element == 1 else 0)


@pytest.mark.parametrize(
    "option, value, said",
    [
        ("--dtypes", "fp32", "argument --dtypes: 'fp32' is not one of float32, bfloat16"),
        ("--models", "gpt2,gpt5", "argument --models: 'gpt5' is not one of gpt2,"),
        ("--attention", "sdpa,flash", "argument --attention: 'flash' is not one of "),
        ("--threads", "1,two", "argument --threads: 'two' is not an integer of at least 0"),
        ("--batches", "0", "argument --batches: '0' is not an integer of at least 1"),
    ],
)
def test_a_list_option_names_the_value_it_refuses(tmp_path, capsys, option, value, said):
    with pytest.raises(SystemExit):
        models_bench.main([*ARGS, option, value, "--out", str(tmp_path / "m.json")])
    assert said in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()
