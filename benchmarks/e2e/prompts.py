"""The prompt set of the end-to-end comparison: token ids, deterministic from a seed.

Prompts are token ids, not text, so both servers score exactly the same sequence whatever
the tokenizer does. Lengths cover the attention paths that matter: shorter than the
128-token window, just around it, around the 512-entry top-k of ratio-2 layers (1,024
tokens), around a prefill chunk (8,192) and well beyond 32K tokens, where the indexer's
top-k really selects (32K tokens are 16K compressed positions at ratio 2, 32x the 512
kept). Each prompt repeats earlier spans now and then (a copy task), so attention to far
positions changes the logprobs.
"""

from __future__ import annotations

import hashlib
import json
import random

SHORT_LENGTHS = (5, 9, 17, 33, 64, 127, 128, 129, 200, 255, 257, 511, 513, 700, 1000, 1023, 1025)
MEDIUM_LENGTHS = (2047, 2049, 3000, 4097, 6000, 8191, 8193, 12000, 16385, 20000, 24577)
LONG_LENGTHS = (32768, 33001, 40000, 49153)
GREEDY_TOKENS = 24


def prompt_lengths(max_len: int | None = None) -> list[int]:
    lengths = list(SHORT_LENGTHS + MEDIUM_LENGTHS + LONG_LENGTHS)
    return [n for n in lengths if max_len is None or n <= max_len]


def make_prompt(length: int, token_ids: list[int], rng: random.Random) -> list[int]:
    if length <= 0:
        raise ValueError(f"prompt length must be positive, got {length}")
    out: list[int] = []
    while len(out) < length:
        if len(out) > 64 and rng.random() < 0.3:
            start = rng.randrange(0, len(out) - 32)
            out.extend(out[start : start + rng.randint(8, 32)])
        else:
            out.extend(rng.choice(token_ids) for _ in range(rng.randint(8, 64)))
    return out[:length]


def make_prompts(
    token_ids: list[int], seed: int = 0, max_len: int | None = None
) -> dict[str, list[int]]:
    """``{name: ids}``; the name carries the length, so a report reads without the ids."""
    if len(token_ids) < 2:
        raise ValueError("need at least two ordinary token ids to draw prompts from")
    rng = random.Random(seed)
    return {f"len{n:06d}": make_prompt(n, token_ids, rng) for n in prompt_lengths(max_len)}


def sha256_ids(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def ordinary_token_ids(tokenizer_json: dict, vocab_size: int) -> list[int]:
    """Ids of the tokenizer's vocabulary that are not special/added tokens."""
    special = {t["id"] for t in tokenizer_json.get("added_tokens", [])}
    vocab = (tokenizer_json.get("model") or {}).get("vocab") or {}
    ids = sorted(i for i in vocab.values() if i not in special and 0 <= i < vocab_size)
    if not ids:
        raise ValueError("the tokenizer has no ordinary tokens")
    return ids
