"""A byte-level tokenizer with DeepSeek-V4.1's special tokens.

Every UTF-8 string encodes (one token per byte, no merges), ids are fixed by
construction, and the file loads offline through ``tokenizers`` /
transformers' ``TokenizersBackend``, which vLLM's ``deepseek_v41`` tokenizer
mode wraps. The vocabulary is filled with placeholder tokens up to a multiple
of 128 so that every id the model can emit is a tokenizer id (the Engram hash
maps token ids through a table sized by the tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path

# DeepSeek's special tokens are fenced by FULLWIDTH VERTICAL LINE and use
# LOWER ONE EIGHTH BLOCK for spaces.
BAR = "\uff5c"
SPACE = "\u2581"


def _special(name: str) -> str:
    return f"<{BAR}{name.replace(' ', SPACE)}{BAR}>"


BOS = _special("begin of sentence")
EOS = _special("end of sentence")
PAD = _special(" pad ")
BYTE_BASE = 3  # ids 0..2 are BOS, EOS, PAD; bytes follow
# The chat encoder (vllm/tokenizers/deepseek_v41_encoding.py) emits these as
# single tokens; the image placeholder is listed so processor lookups find it.
NAMED_SPECIALS = (
    _special("User"),
    _special("Assistant"),
    _special("System"),
    _special("latest_reminder"),
    "<think>",
    "</think>",
    _special("deepseek_image"),
    _special("action"),
    _special("query"),
    _special("authority"),
    _special("domain"),
    _special("title"),
    _special("read_url"),
    _special("dspark_noise"),
)
VOCAB_MULTIPLE = 128


def byte_symbols() -> list[str]:
    """The printable stand-in for each byte value, in byte order.

    Byte-level BPE keeps printable Latin-1 bytes as themselves and shifts the
    rest to code points from 256 up, so every byte is one visible character.
    """
    kept = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    kept_set = set(kept)
    symbols = []
    shifted = 0
    for b in range(256):
        if b in kept_set:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


def vocabulary() -> list[str]:
    """Token strings in id order."""
    tokens = [BOS, EOS, PAD, *byte_symbols(), *NAMED_SPECIALS]
    size = -(-len(tokens) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    tokens += [_special(f"place holder no {i}") for i in range(size - len(tokens))]
    return tokens


def special_tokens() -> list[str]:
    tokens = vocabulary()
    return [t for i, t in enumerate(tokens) if not (BYTE_BASE <= i < BYTE_BASE + 256)]


def build():
    """The ``tokenizers.Tokenizer``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens = vocabulary()
    model = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[])
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in special_tokens()]
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]
    )
    return tok


def ids() -> dict:
    tokens = vocabulary()
    return {
        "vocab_size": len(tokens),
        "bos_token_id": tokens.index(BOS),
        "eos_token_id": tokens.index(EOS),
        "pad_token_id": tokens.index(PAD),
        "dspark_noise_token_id": tokens.index(_special("dspark_noise")),
    }


def compressed_vocab_size(tok) -> int:
    """How many ids remain after Engram's token normalization.

    Engram hashes n-grams over token ids collapsed by NFKC + accent stripping +
    lowercasing + whitespace folding (vLLM ``build_compressed_token_map``); the
    config must state the resulting count or vLLM refuses to start.
    """
    from tokenizers import Regex, normalizers

    sentinel = "\ue000"  # keeps a lone-space token distinct after Strip()
    normalizer = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), sentinel),
            normalizers.Strip(),
            normalizers.Replace(sentinel, " "),
        ]
    )
    keys = set()
    for token_id in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([token_id], skip_special_tokens=False)
        if "\ufffd" in text:
            keys.add(tok.id_to_token(token_id))
        else:
            normalized = normalizer.normalize_str(text)
            keys.add(normalized if normalized else text)
    return len(keys)


def write(directory: Path) -> dict:
    """Write tokenizer.json + tokenizer_config.json; return the ids config.json needs."""
    tok = build()
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1048576,
    }
    (directory / "tokenizer_config.json").write_text(
        json.dumps(config, indent=1, ensure_ascii=False)
    )
    return {**ids(), "engram_compressed_vocab_size": compressed_vocab_size(tok)}
