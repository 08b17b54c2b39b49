"""A long-context retrieval test for mhapy.models.accuracy: a pass key (five digits) planted at a
depth of real text and asked for at its end, the way long-context KV cache formats are judged
beside their KL divergence (a format may keep the distribution close on average and still lose
one far token)."""

from __future__ import annotations

import random
from typing import Any

# The pass key's sentence, planted in the text, and the question after it.
PASS_KEY = "\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"
QUESTION = "\n\nWhat is the pass key? The pass key is"
# Tokens the answer is generated over: five digits take at most this many with Gemma's tokenizer
# (one a digit) and a space before them.
ANSWER_TOKENS = 8


def passkey_prompts(tokenizer: Any, ids: list[int], tokens: int, depths: list[float]) -> list[dict]:
    """One prompt per depth (a share of the text, 0 to 1): the first tokens of `ids` (the real
    text) with the pass key's sentence inserted at that depth and the question at the end, about
    `tokens` tokens in all; each {"depth", "key", "ids"}. The key is fixed per depth (seeded), so
    that every run asks the same."""
    planted = []
    for i, depth in enumerate(depths):
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"retrieval depth {depth}: expected a share of the text in [0, 1]")
        key = str(random.Random(1000 + i).randrange(10000, 100000))
        needle = list(tokenizer(PASS_KEY.format(key=key), add_special_tokens=False)["input_ids"])
        question = list(tokenizer(QUESTION, add_special_tokens=False)["input_ids"])
        body = tokens - len(needle) - len(question)
        if body < 2 or len(ids) < body:
            raise ValueError(f"retrieval: {tokens} tokens cannot hold the text, the key and the question")
        at = 1 + round(depth * (body - 1))  # after the BOS
        planted.append(dict(depth=depth, key=key, ids=ids[:at] + needle + ids[at:body] + question))
    return planted
