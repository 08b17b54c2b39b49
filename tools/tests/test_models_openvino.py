"""mhapy.models.openvino's side that needs no OpenVINO: the KV cache bytes it states from the
precision OpenVINO reports, and a server request that fails answered, not fatal."""

from __future__ import annotations

import io
import json

import pytest

from mhapy.models import openvino

GPT2 = dict(n_layer=12, n_head=12, n_embd=768)
LLAMA = dict(num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, hidden_size=2048)


def test_cache_bytes_per_precision():
    # GPT-2 small, B1, 4096 tokens: 2 x 12 layers x 12 heads x 4096 rows of 64.
    rows = 2 * 12 * 12 * 4096
    assert openvino.cache_bytes(GPT2, 1, 4096, [("f32", 0)] * 2) == rows * 64 * 4
    assert openvino.cache_bytes(GPT2, 1, 4096, [("f16", 0)] * 2) == rows * 64 * 2
    # u8: a scale and a zero point (f32) per row, or per group of a row.
    assert openvino.cache_bytes(GPT2, 1, 4096, [("u8", 0)] * 2) == rows * (64 + 8)
    assert openvino.cache_bytes(GPT2, 1, 4096, [("u8", 32)] * 2) == rows * (64 + 16)
    # K and V in precisions of their own: each half its own rows.
    assert openvino.cache_bytes(GPT2, 1, 4096, [("u8", 0), ("f16", 0)]) == rows // 2 * (64 + 8 + 64 * 2)
    # Llama-1B's shape: grouped heads, 8 K/V heads of 64, B8.
    assert openvino.cache_bytes(LLAMA, 8, 100, [("bf16", 0)] * 2) == 2 * 16 * 8 * 8 * 100 * 64 * 2
    with pytest.raises(ValueError, match="KV cache precision 'f64': expected one of f32, f16"):
        openvino.cache_bytes(GPT2, 1, 1, [("f64", 0)] * 2)


def test_a_failed_request_is_answered_and_the_server_goes_on():
    requests = io.StringIO(
        "\n".join(
            json.dumps(r)
            for r in (
                {"op": "dance"},
                {"op": "compile", "threads": 1, "kv": "", "precision": "f32"},
                {"op": "run", "ids": "x", "steps": 1},
            )
        )
        + "\n"
    )
    replies = io.StringIO()
    openvino.serve(requests, replies)
    answers = [json.loads(line) for line in replies.getvalue().splitlines()]
    assert answers == [
        {"error": "ValueError: op 'dance': expected one of load, compile, run"},
        {"error": "RuntimeError: compile before load: no model"},
        {"error": "RuntimeError: run before compile: no compiled model"},
    ]


def test_a_missing_environment_is_named(tmp_path):
    with pytest.raises(
        RuntimeError, match="no optimum-intel environment: .*scripts/peers-env.sh optimum makes it"
    ):
        openvino.OpenVinoRuns(None, python=str(tmp_path / "python"))
