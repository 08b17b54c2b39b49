"""mhapy.models_bench (whole models on each attention implementation) on a tiny model: every
implementation checked against sdpa first, then timed; a wrong one is recorded, not timed."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
models_bench = pytest.importorskip("mhapy.models_bench")

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


def run(tmp_path, part="models"):
    out = tmp_path / "models.json"
    assert models_bench.main([*ARGS, "--out", str(out)]) == 0
    return json.loads(out.read_text())[part]


def test_every_implementation_is_timed(tmp_path):
    records = run(tmp_path)
    assert [r["attention"] for r in records] == [
        "eager",
        "sdpa",
        "sdpa_static",
        "mha",
        "mha_tbb",
        "mha_int8",
        "mha_bf16",
    ]
    for r in records:
        assert "error" not in r
        assert r["cache_bytes"] > 0
        if r["attention"].startswith("mha"):  # the decode logits against sdpa's
            assert r["logits_steps"] == 3 and 0 <= r["decode_logits_error_median"] <= r["decode_logits_error"]
            assert r["decode_logits_error"] <= (2e-2 if r["attention"] == "mha_int8" else 1e-2)
            assert 0 <= r["top1_agreement"] <= 1
        assert r["ttft_s"] > 0 and r["decode_tokens_per_s"] > 0
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
        "sdpa,sdpa_static,mha,mha_bf16,mha_int8",
        "--fill",
        "synthetic",
        "--layers",
        "2",
    ]
    assert models_bench.main([*argv, "--out", str(out)]) == 0
    records = json.loads(out.read_text())["models"]
    assert [r["attention"] for r in records] == ["sdpa", "sdpa_static", "mha", "mha_bf16", "mha_int8"]
    for r in records:
        assert (r["fill"], r["layers"], r["prefill"]) == ("synthetic", 2, 16)
        assert "ttft_s" not in r and r["decode_tokens_per_s"] > 0
    sdpa, static, fp32, bf16, int8 = records
    # 2 layers of 16 + 4 tokens of 2 K/V heads of 16 per sequence, fp32, keys and values: a
    # DynamicCache's bytes.
    assert sdpa["cache_bytes"] == 2 * (2 * 2 * 20 * 16 * 4 * 2)
    assert static["cache_bytes"] > 0 and int8["cache_bytes"] < bf16["cache_bytes"] < sdpa["cache_bytes"]
    # The same context in every layer of every cache: mha's decode logits are sdpa's (bf16 and
    # int8: within their bounds, the tiny model's logits being small).
    assert fp32["decode_logits_error"] <= 1e-5 and fp32["top1_agreement"] == 1
    assert bf16["logits_steps"] == int8["logits_steps"] == 3
    assert 0 < bf16["decode_logits_error"] <= 1e-2 and 0 < int8["decode_logits_error"] <= 2e-2


def test_a_negative_layer_count_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        models_bench.main([*ARGS, "--layers", "-1", "--out", str(tmp_path / "m.json")])
    assert "--layers -1: expected 0 (all) or a positive number of layers" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()
