"""The byte-level tokenizer: every UTF-8 string round-trips, ids are fixed."""

import random

import pytest

from deepinfer_sm80.smoke_model import tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    directory = tmp_path_factory.mktemp("tok")
    tokenizer.write(directory)
    return AutoTokenizer.from_pretrained(str(directory))


def _random_text(rng, n):
    chars = []
    for _ in range(n):
        cp = rng.choice(
            [
                rng.randrange(0x20, 0x7F),
                rng.randrange(0xA0, 0x800),
                rng.randrange(0x800, 0xD800),
                rng.randrange(0xE000, 0x110000),
            ]
        )
        chars.append(chr(cp))
    return "".join(chars)


def test_arbitrary_utf8_round_trips(tok):
    rng = random.Random(7)
    samples = ["", " ", "\n\t \r", "héllo wörld", "日本語テキスト", "🙂👍🏽", "\x00\x01", "a" * 300]
    samples += [_random_text(rng, rng.randrange(1, 80)) for _ in range(200)]
    for text in samples:
        ids = tok.encode(text, add_special_tokens=False)
        assert len(ids) == len(text.encode("utf-8"))
        assert tok.decode(ids) == text


def test_ids_are_fixed(tok):
    assert len(tok) == 384
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)
    assert tok.encode("a", add_special_tokens=False) == [3 + ord("a")]
    assert tok.encode("é", add_special_tokens=False) == [3 + 0xC3, 3 + 0xA9]
    assert tok.encode("hi") == [0, 3 + ord("h"), 3 + ord("i")]  # one BOS for plain prompts
    user = tokenizer.vocabulary().index(tokenizer._special("User"))
    assert tok.encode("<｜User｜>x", add_special_tokens=False) == [user, 3 + ord("x")]  # noqa: RUF001


def test_compressed_vocab_folds_case_and_whitespace(tok):
    size = tokenizer.compressed_vocab_size(tokenizer.build())
    # 26 upper-case letters fold onto lower case; the other ids stay distinct
    assert size < 384 - 20
    assert size == tokenizer.write.__globals__["compressed_vocab_size"](tokenizer.build())
