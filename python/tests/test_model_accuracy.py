"""mhapy.models.accuracy on a tiny randomly initialised Gemma 3 (4 layers, sliding window 8 and full
layers mixed, head_dim 16, 320 tokens; seconds, no download): the measures are right where the
answer is known (sdpa against itself is 0, eager against sdpa tiny, the perplexity the model's own
loss), a wrong cache is caught, and a case that fails is recorded, not fatal. Needs torch and
transformers (the peers' environment): skipped, saying so, without them.

    PYTHONPATH=<build>/python:tools build/peers-venv/bin/python -m pytest -q python/tests/test_model_accuracy.py
"""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch", reason="needs torch (the peers' environment: build/peers-venv)")
transformers = pytest.importorskip("transformers", reason="needs transformers (the peers' environment)")

from mhapy.models import accuracy as ma
from mhapy.models import passkey
from tiny_gemma3 import tiny_gemma3  # noqa: E402

VOCAB = 320
WINDOW = 8
PROMPT = 24  # past the window: the sliding layers' caches drop keys
POSITIONS = 16


@pytest.fixture(scope="module")
def model():
    return tiny_gemma3(VOCAB, WINDOW)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, VOCAB, (PROMPT + POSITIONS + 8,), generator=torch.Generator().manual_seed(3))


def kl_of(model, ids, caches, **kwargs):
    records = ma.evaluate(model, ids, caches=caches, prefill=PROMPT, positions=POSITIONS, **kwargs)
    return {r["cache"]: r for r in records if r["measure"] == "kl"}


def test_sdpa_against_itself_is_zero_and_eager_is_close(model, ids):
    got = kl_of(model, ids, ["sdpa", "eager"])
    assert set(got) == {"reference", "sdpa", "eager"}
    for name in ("reference", "sdpa"):
        assert got[name]["kl_mean"] == 0.0 and got[name]["kl_max"] == 0.0, got[name]
        assert got[name]["top1_agreement"] == 1.0
    eager = got["eager"]
    assert "error" not in eager, eager
    assert 0.0 <= eager["kl_max"] < 1e-9 and eager["top1_agreement"] == 1.0, eager
    assert eager["perplexity"] == pytest.approx(got["reference"]["perplexity"], rel=1e-5)
    # Teacher forcing feeds the true tokens: its perplexity is a full forward pass's over them.
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        logits = model(ids[None, : PROMPT + POSITIONS]).logits[0, PROMPT - 1 : -1].double()
    nll = -torch.log_softmax(logits, -1).gather(1, ids[PROMPT : PROMPT + POSITIONS, None]).mean()
    assert got["reference"]["perplexity"] == pytest.approx(math.exp(nll.item()), rel=1e-5)
    # The distributions are not flat: a cache that moved them would show.
    logits = ma.teacher_forced(model, ma.case("sdpa"), ids, PROMPT, POSITIONS)
    assert torch.softmax(logits, -1).amax(-1).mean() > 5 / VOCAB


class NoisyCache(transformers.DynamicCache):
    """A wrong cache: transformers' own, but every key it stores moved by noise."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        noise = torch.randn(key_states.shape, generator=torch.Generator().manual_seed(layer_idx))
        return super().update(key_states + 2 * noise, value_states, layer_idx, *args, **kwargs)


def test_a_wrong_cache_is_caught(model, ids):
    wrong = ma.Case("noisy", "sdpa", lambda m, capacity: NoisyCache(config=m.config))
    got = kl_of(model, ids, ["eager", wrong])
    assert "error" not in got["noisy"], got["noisy"]
    assert got["noisy"]["kl_mean"] > 1e-3 > 1e6 * got["eager"]["kl_mean"], (got["noisy"], got["eager"])
    assert got["noisy"]["kl_max"] >= got["noisy"]["kl_median"] > 0


def test_perplexity_is_the_models_loss_and_equal_on_sdpa_and_eager(model, ids):
    records = ma.evaluate(model, ids, tokens=[32, len(ids)], perplexity_on=["sdpa", "eager"])
    got = {(r["tokens"], r["attention"]): r for r in records}
    assert len(got) == 4 and not any("error" in r for r in records), records
    for n in (32, len(ids)):
        sdpa, eager = got[n, "sdpa"]["perplexity"], got[n, "eager"]["perplexity"]
        assert math.isfinite(sdpa) and sdpa > 1  # random weights on random tokens: far above VOCAB
        assert eager == pytest.approx(sdpa, rel=1e-4)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        loss = model(ids[None], labels=ids[None]).loss.item()
    assert got[len(ids), "sdpa"]["perplexity"] == pytest.approx(math.exp(loss), rel=1e-5)
    # Logits made a few rows at a time: the same figure.
    assert ma.perplexity(model, ids, "sdpa", rows=5)["perplexity"] == pytest.approx(math.exp(loss), rel=1e-5)


def test_greedy_tokens_and_their_agreement(model, ids):
    wrong = ma.Case("noisy", "sdpa", lambda m, capacity: NoisyCache(config=m.config))
    records = ma.evaluate(model, ids, caches=["eager", wrong], prefill=PROMPT, greedy_steps=12)
    got = {r["cache"]: r for r in records}
    assert [r["measure"] for r in records] == ["greedy"] * 3
    assert len(got["reference"]["generated"]) == 12
    assert got["eager"]["generated"] == got["reference"]["generated"]
    assert got["eager"]["greedy_agree"] == 12 and got["eager"]["greedy_first_divergence"] is None
    assert ma.agreement([1, 2, 3, 4], [1, 2, 5, 4]) == dict(greedy_agree=3, greedy_first_divergence=2)
    # The same tokens as generate() picks.
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        out = model.generate(ids[None, :PROMPT], max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert out[0, PROMPT:].tolist() == got["reference"]["generated"]


class ByteTokenizer:
    """One token a byte of the text (a BOS of its own first unless told not to), as the tiny
    model's vocabulary holds them."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([VOCAB - 1] if add_special_tokens else []) + list(text.encode())}

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode(errors="replace")


def test_passkey_prompts_plant_the_key_at_each_depth():
    tokenizer = ByteTokenizer()
    text = tokenizer("x" * 400)["input_ids"]
    planted = passkey.passkey_prompts(tokenizer, text, 300, [0.0, 0.5, 1.0])
    assert [p["depth"] for p in planted] == [0.0, 0.5, 1.0]
    for p in planted:
        assert len(p["ids"]) == 300 and p["ids"][0] == VOCAB - 1
        prompt = bytes(i for i in p["ids"] if i < 256).decode()
        assert len(p["key"]) == 5 and prompt.count(p["key"]) == 2
        assert prompt.endswith("What is the pass key? The pass key is")
    starts = [bytes(i for i in p["ids"] if i < 256).decode().index("The pass key is") for p in planted]
    assert starts[0] == 2 and starts[0] < starts[1] < starts[2]  # after the sentence's "\n\n"
    assert len({p["key"] for p in planted}) == 3  # a key of its own per depth, the same each run
    assert planted[1]["key"] == passkey.passkey_prompts(tokenizer, text, 300, [0.2, 0.5])[1]["key"]
    with pytest.raises(ValueError, match="depth 1.5"):
        passkey.passkey_prompts(tokenizer, text, 300, [1.5])
    with pytest.raises(ValueError, match="cannot hold"):
        passkey.passkey_prompts(tokenizer, text, 60, [0.5])


def test_retrieval_answers_per_depth_against_the_reference(model, ids):
    tokenizer = ByteTokenizer()
    planted = passkey.passkey_prompts(tokenizer, [VOCAB - 1] + [65] * 200, 140, [0.25, 0.75])
    wrong = ma.Case("noisy", "sdpa", lambda m, capacity: NoisyCache(config=m.config))
    records = ma.evaluate(model, ids, caches=["eager", wrong], retrieval=planted, decode=tokenizer.decode)
    assert [(r["depth"], r["cache"]) for r in records] == [
        (d, c) for d in (0.25, 0.75) for c in ("reference", "eager", "noisy")
    ]
    for r in records:
        assert r["prefill"] == 140 and len(r["answer"]) == passkey.ANSWER_TOKENS
        assert r["found"] == (next(p["key"] for p in planted if p["depth"] == r["depth"]) in r["text"])
    by = {(r["depth"], r["cache"]): r for r in records}
    assert by[0.25, "eager"]["same"] and by[0.75, "eager"]["same"]
    assert "same" not in by[0.25, "reference"]
    assert not all(by[d, "noisy"]["same"] for d in (0.25, 0.75))  # a wrong cache answers otherwise
    text = ma.markdown(records)
    assert "| eager | eager | 140 (25%) |" in text and "| same |" in text


def test_a_failing_case_is_recorded_and_the_rest_go_on(model, ids):
    def broken(m, capacity):
        raise RuntimeError("this cache cannot be made")

    records = ma.evaluate(
        model,
        ids,
        tokens=[16],
        perplexity_on=["mha", "sdpa"],
        caches=[ma.Case("broken", "sdpa", broken), "mha_int8", "sdpa"],
        prefill=PROMPT,
        positions=4,
        unavailable={"mha": "not run: mha is not importable (test)"},
    )
    by = {(r["measure"], r.get("cache"), r["attention"]): r for r in records}
    assert by["perplexity", None, "mha"]["error"] == "not run: mha is not importable (test)"
    assert "perplexity" in by["perplexity", None, "sdpa"]
    assert by["kl", "broken", "sdpa"]["error"] == "error: RuntimeError: this cache cannot be made"
    assert by["kl", "mha_int8", "mha"]["error"].startswith("not run:")
    assert by["kl", "sdpa", "sdpa"]["kl_mean"] == 0.0
    json.dumps(records)  # every record is JSON


def test_mha_caches_are_measured_past_the_window(model, ids):
    """With mha importable: mha on transformers' cache and mha's own caches (whose sliding layers
    keep their window's ring) are measured, fp32 as the reference, int8 within its codes'
    error, k8v4 (4-bit values: the random model's peaked distributions move more) further."""
    pytest.importorskip("mha.transformers", reason="needs mha's Python package (build/<build>/python)")
    got = kl_of(model, ids, ["mha", "mha_fp32", "mha_int8", "mha_k8v4"])
    for name, bound in (("mha", 1e-6), ("mha_fp32", 1e-6), ("mha_int8", 5e-2), ("mha_k8v4", 5e-1)):
        r = got[name]
        assert "error" not in r and r["kl_mean"] < bound, r
    assert got["mha"]["top1_agreement"] == got["mha_fp32"]["top1_agreement"] == 1.0


def test_text_and_tokens():
    sources = ma.text_sources()
    if not sources:
        pytest.skip("no licences or pydoc_data on this machine")
    if sources[0].name == "GPL-3":
        assert sources[0].read_text().startswith("                    GNU GENERAL PUBLIC LICENSE")

    def by_byte(text):  # a tokenizer of one token a byte, with a BOS of its own
        return {"input_ids": [VOCAB - 1] + list(text.encode())}

    ids, used = ma.real_tokens(by_byte, 100)
    assert len(ids) == 100 and ids[0] == VOCAB - 1 and used == [str(sources[0])]
    total = sum(len(p.read_bytes()) for p in sources[:2])
    ids, used = ma.real_tokens(by_byte, total)  # past the first file: a second joined by "\n\n"
    assert len(used) >= 2 and bytes(ids[1 : 1 + 4]) == sources[0].read_bytes()[:4]
    with pytest.raises(ValueError, match="fewer than"):
        ma.real_tokens(by_byte, 10**9, sources[:1])


def test_markdown_and_file(tmp_path):
    records = [
        dict(measure="perplexity", attention="sdpa", tokens=1024, perplexity=14.41, nll=2.668, seconds=3.0),
        dict(measure="kl", cache="mha_int8", attention="mha", prefill=1024, positions=256, seconds=1.0,
             error="refused: mha.transformers.MhaCache: this attention mask is not left padding"),
        dict(measure="kl", cache="mha", attention="mha", prefill=1024, positions=256, seconds=9.0,
             kl_mean=1e-9, kl_median=5e-10, kl_max=3e-8, top1_agreement=1.0, perplexity=14.2),
        dict(measure="greedy", cache="mha", attention="mha", prefill=1024, steps=64, seconds=4.0,
             generated=[1] * 64, greedy_agree=60, greedy_first_divergence=41),
    ]  # fmt: skip
    text = ma.markdown(records)
    assert "| 1024 | sdpa | 14.4100 | 3.0 |" in text
    assert "| mha_int8 | mha | 1024+256 | refused: mha.transformers.MhaCache" in text
    assert "| mha | mha | 1024+256 | 1e-09 | 5e-10 | 3e-08 | 100.00% | 14.2000 | 9.0 |" in text
    assert "| mha | mha | 1024 | 60/64 | 41 | 4.0 |" in text
    path = tmp_path / "a.json"
    path.write_text(json.dumps(dict(context=dict(kind=ma.KIND), records=records)))
    assert ma.load(path)["records"] == records
    path.write_text(json.dumps(dict(context={}, records=[])))
    with pytest.raises(ValueError, match="not a model_accuracy result file"):
        ma.load(path)


def test_the_command_line(model, tmp_path, capsys):
    """The whole tool on a saved folder: a byte-level tokenizer of its own (no download), a text
    file, the JSON file and the tables."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    vocab |= {name: len(vocab) + i for i, name in enumerate(("<pad>", "<eos>", "<bos>"))}
    byte_level = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte_level.decoder = decoders.ByteLevel()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=byte_level, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )
    folder = tmp_path / "tiny-gemma3"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    text = tmp_path / "text.txt"
    text.write_text(
        "It is not the critic who counts; not the man who points out how the strong man stumbles."
    )
    out = tmp_path / "out" / "accuracy.json"
    argv = f"--model {folder} --text {text} --tokens 32,40 --perplexity sdpa,eager --caches sdpa,eager"
    argv += f" --prefill 24 --positions 8 --greedy-steps 4 --threads 1 --out {out}"
    assert ma.main(argv.split()) == 0
    data = ma.load(out)
    context = data["context"]
    assert context["model_type"] == "gemma3_text" and context["sliding_window"] == WINDOW
    assert context["threads"] == 1 and context["text"] == [str(text)] and context["tokens"] == 40
    assert context["torch"] == torch.__version__ and context["transformers"] == transformers.__version__
    records = data["records"]
    assert [(r["measure"], r.get("cache")) for r in records] == [
        ("perplexity", None),
        ("perplexity", None),
        ("perplexity", None),
        ("perplexity", None),
        ("kl", "reference"),
        ("kl", "sdpa"),
        ("kl", "eager"),
        ("greedy", "reference"),
        ("greedy", "sdpa"),
        ("greedy", "eager"),
    ]
    assert not any("error" in r for r in records), records
    assert isinstance(records[-1]["text"], str) and records[-1]["greedy_agree"] == 4
    printed = capsys.readouterr().out
    assert "| 40 | eager |" in printed and "| eager | eager | 24+8 |" in printed
    assert not (out.parent / "accuracy.json.partial").exists()
    # Too little text: said, and no file.
    assert ma.main(argv.replace("32,40", "4000").split()) == 1
    assert "fewer than 4000" in capsys.readouterr().err
    # A pass key's prompt too short for the key and the question: said, and no file.
    assert ma.main([*argv.split(), "--retrieval-tokens", "30"]) == 1
    assert "retrieval: 30 tokens cannot hold the text, the key and the question" in capsys.readouterr().err
