"""mhapy.models.speculative on a tiny randomly initialised Gemma 3 (4 layers, sliding window 8 and full
layers mixed; seconds, no download): prompt-lookup decoding and assisted generation through
mha's caches (every format) give greedy decoding's tokens while verifying several drafted tokens
a step and rolling back the rejected ones, past the sliding window; the counts of steps, drafted
and accepted tokens add up; a case that fails is recorded. Needs torch and transformers (the
peers' environment): skipped, saying so, without them.

    PYTHONPATH=<build>/python:tools build/peers-venv/bin/python -m pytest -q python/tests/test_speculative.py
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs torch (the peers' environment: build/peers-venv)")
transformers = pytest.importorskip("transformers", reason="needs transformers (the peers' environment)")

pytest.importorskip("mha.transformers", reason="needs mha's Python package (build/<build>/python)")
from mhapy.models import speculative as sp  # noqa: E402
from tiny_gemma3 import tiny_gemma3  # noqa: E402

VOCAB = 96
WINDOW = 8
NEW = 24


@pytest.fixture(scope="module")
def model():
    return tiny_gemma3(VOCAB, WINDOW)


@pytest.fixture(scope="module")
def prompt():
    # A phrase said three times: the n-grams prompt lookup copies its candidates from.
    phrase = torch.randint(1, VOCAB, (16,), generator=torch.Generator().manual_seed(5))
    return torch.cat([phrase, phrase, phrase])[None]


def options(model, **extra):
    return dict(lookup=4, new_tokens=NEW, rounds=1, draft=sp.draft_of(model, 2), **extra)


@pytest.mark.parametrize("cache", ["sdpa", "mha_fp32", "mha_bf16", "mha_int8", "mha_k8v4", "mha_int4"])
def test_speculation_gives_greedy_tokens_through_every_cache(model, prompt, cache):
    records = sp.evaluate(
        model,
        {"phrase": prompt},
        [cache],
        ["greedy", "lookup", "assisted"],
        options(model),
        log=lambda _: None,
    )
    by_way = {r["way"]: r for r in records}
    assert all("failure" not in r for r in records), records
    greedy = by_way["greedy"]
    assert len(greedy["tokens"]) == NEW and greedy["calls"] == NEW and greedy["drafted"] == 0
    assert greedy["acceptance"] is None and greedy["same_as_greedy"] is True
    for way in ("lookup", "assisted"):
        r = by_way[way]
        assert r["tokens"] == greedy["tokens"], way
        assert r["same_as_greedy"] is True
        # Calls verified drafted tokens, fewer calls than tokens (the rejected ones were rolled
        # back: the same tokens).
        assert r["drafted"] > 0 and r["calls"] < NEW
        assert r["accepted"] == NEW - r["calls"] and 0 < r["accepted"] <= r["drafted"]
        assert r["tokens_per_s"] > 0 and r["decode_s"] > 0


def test_the_draft_is_the_models_first_layers(model):
    draft = sp.draft_of(model, 2)
    assert draft.config.num_hidden_layers == 2 and len(draft.model.layers) == 2
    assert draft.config.layer_types == model.config.layer_types[:2]
    # Its weights are the model's own (shared, not copied).
    assert draft.model.layers[1].self_attn.q_proj.weight.data_ptr() == (
        model.model.layers[1].self_attn.q_proj.weight.data_ptr()
    )
    assert draft.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()
    with pytest.raises(ValueError, match="--draft-layers 4: expected 1 to 3"):
        sp.draft_of(model, 4)


def test_the_quoting_prompt():
    class Words:
        """Splits on spaces, one id per word (its length), a BOS of 0 when asked."""

        def __call__(self, text, add_special_tokens=True):
            ids = [len(w) for w in text.split(" ")]
            return {"input_ids": ([0] if add_special_tokens else []) + ids}

    ids = sp.quoting_prompt(Words(), "first line here\nmore text " * 20, 30)
    tail = Words()(sp.REQUEST + "first line here", add_special_tokens=False)["input_ids"]
    assert len(ids) == 30 and ids[0] == 0 and ids[-len(tail) :] == tail
    with pytest.raises(ValueError, match="--prompt-tokens 5: the request alone takes"):
        sp.quoting_prompt(Words(), "text", 5)


def test_a_failing_case_is_recorded_and_the_rest_run(model, prompt):
    records = sp.evaluate(
        model, {"phrase": prompt}, ["sdpa", "no_such_cache"], ["greedy"], options(model), log=lambda _: None
    )
    assert "failure" not in records[0] and records[0]["tokens"]
    assert records[1]["failure"].startswith("error:")
    table = sp.markdown(records)
    assert "| phrase | sdpa | greedy |" in table and "no_such_cache" in table


def test_main_refuses_bad_arguments_and_a_missing_model(tmp_path, capsys):
    out = str(tmp_path / "out.json")
    with pytest.raises(SystemExit):
        sp.main(["--ways", "lookup", "--out", out])
    assert "greedy is the reference" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sp.main(["--ways", "greedy,assisted", "--out", out])
    assert "--ways assisted needs --draft-layers N" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sp.main(["--caches", "sdpa,mha_int9", "--out", out])
    assert "--caches mha_int9: expected" in capsys.readouterr().err
    assert sp.main(["--model", str(tmp_path / "absent"), "--out", out]) == 1
    assert f"speculative: cannot load {tmp_path / 'absent'}" in capsys.readouterr().err
