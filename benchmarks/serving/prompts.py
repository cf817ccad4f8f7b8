"""Prompt material shipped in ``prompts/`` and the deterministic rules that cut prompts from it.

Material (``prompts/README.md``): eight original English prose pieces (``prose/*.txt``) and a
frozen snapshot of this repository's Python source (``code/repository_python.txt``, built by
``build_code_corpus``). Natural text and code rather than random tokens, because random
tokens make a drafter's guesses meaningless and distort speculative acceptance.

Rules:
- Corpus order: the prose files sorted by name, then the code files in snapshot order.
  Every document is rendered as ``[<kind>: <name>]\\n<text>`` and documents are joined with a
  blank line. ``corpus_from(name)`` is that sequence starting at one document and wrapping
  around; it repeats (with a ``[repeat k]`` marker) until long enough.
- A prompt of T tokens is the longest prefix of its text, cut at a boundary (whitespace for
  prefill, end of line for continuations), whose token count is <= T. Counts come from the
  server's ``/tokenize`` (the server's own tokenizer, BOS included, as in a completion), or,
  without that endpoint, from ``len(text) / 3.5`` (marked in the results).
- Cold prefill: ``Request <nonce>. ...`` + corpus from the first document. The nonce is 16
  random hex digits, new for every request of every run, at the very start of the prompt:
  vLLM's prefix-cache block hashes chain from the first block, so a different first block
  makes every block of the prompt a miss. The metrics delta of
  ``vllm:prefix_cache_hits_total`` proves it per run.
- Decode prompts are the same for every run (no nonce): a continuation of one named document,
  so A/B runs ask the drafter the same questions.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
PROSE_DIR = PROMPTS_DIR / "prose"
CODE_CORPUS = PROMPTS_DIR / "code" / "repository_python.txt"
MANIFEST = PROMPTS_DIR / "manifest.json"
FILE_MARKER = "# ==== file: "
CHARS_PER_TOKEN_ESTIMATE = 3.5

TokenCounter = Callable[[str], int]

# Decode workloads: which document each stream continues (names as in the corpus).
CODE_DECODE_DOC = "overlay/deepinfer_sm80/ops/topk_swa/triton_kernel.py"
LONG_GENERATION_DOC = "08_chess_club"
STREAM_DOCS = (
    "benchmarks/runner.py",
    "01_night_train",
    "overlay/deepinfer_sm80/ops/kv_cache/triton_kernel.py",
    "06_timekeeping",
)
# NLL text set: every prose piece, plus the first NLL_CODE_CHARS of these files.
NLL_CODE_DOCS = (
    "overlay/deepinfer_sm80/arch.py",
    "overlay/deepinfer_sm80/ops/kv_cache/ref.py",
    "overlay/deepinfer_sm80/vllm_plugin/apply.py",
    "benchmarks/runner.py",
)
NLL_CODE_CHARS = 6000


@dataclass(frozen=True)
class Document:
    name: str
    kind: str  # "prose" | "code"
    text: str

    def render(self) -> str:
        return f"[{self.kind}: {self.name}]\n{self.text}"


def material_files() -> list[Path]:
    return [*sorted(PROSE_DIR.glob("*.txt")), CODE_CORPUS]


def load_documents() -> list[Document]:
    docs = [
        Document(p.stem, "prose", p.read_text().strip()) for p in sorted(PROSE_DIR.glob("*.txt"))
    ]
    docs += split_code_corpus(CODE_CORPUS.read_text())
    return docs


def split_code_corpus(text: str) -> list[Document]:
    docs, name, lines = [], None, []
    for line in text.splitlines():
        if line.startswith(FILE_MARKER):
            if name is not None:
                docs.append(Document(name, "code", "\n".join(lines).strip("\n")))
            name, lines = line[len(FILE_MARKER) :].removesuffix(" ===="), []
        elif name is not None:
            lines.append(line)
    if name is not None:
        docs.append(Document(name, "code", "\n".join(lines).strip("\n")))
    return docs


def material_sha256() -> str:
    """One hash over all material, in corpus order: equal hashes = equal prompts."""
    h = hashlib.sha256()
    for p in material_files():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def write_manifest() -> None:
    files = {str(p.relative_to(PROMPTS_DIR)): _sha(p) for p in material_files()}
    MANIFEST.write_text(json.dumps({"files": files, "all": material_sha256()}, indent=1) + "\n")


def verify_manifest() -> list[str]:
    """Names of material files whose bytes differ from the manifest (empty = intact)."""
    recorded = json.loads(MANIFEST.read_text())["files"]
    current = {str(p.relative_to(PROMPTS_DIR)): _sha(p) for p in material_files()}
    return sorted(k for k in recorded.keys() | current.keys() if recorded.get(k) != current.get(k))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def corpus_from(docs: list[Document], start: str | None, min_chars: int) -> str:
    """Documents from ``start`` on (wrapping), repeated until at least ``min_chars`` long."""
    names = [d.name for d in docs]
    if start is not None and start not in names:
        raise ValueError(f"prompt document {start!r} is not in the corpus; known: {names[:8]}...")
    i0 = names.index(start) if start is not None else 0
    ring = [d.render() for d in docs[i0:] + docs[:i0]]
    one = "\n\n".join(ring)
    parts, k = [one], 1
    while sum(map(len, parts)) < min_chars:
        k += 1
        parts.append(f"[repeat {k}]\n{one}")
    return "\n\n".join(parts)


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN_ESTIMATE)


def fit(text: str, target: int, count: TokenCounter, *, keep: int = 0, at: str = "space") -> str:
    """Longest prefix of ``text`` (never shorter than ``keep`` chars) ending at a boundary
    with ``count(prefix) <= target``; ``at`` is "space" (before any whitespace) or "line"
    (after a newline). Binary search, so about log2(len(text)) counts."""
    if count(text) <= target:
        return text
    if at == "line":
        cuts = [i + 1 for i, c in enumerate(text) if c == "\n" and i + 1 >= keep]
    else:
        cuts = [i for i, c in enumerate(text) if c.isspace() and i >= keep and i > 0]
    lo, hi, best = 0, len(cuts) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if count(text[: cuts[mid]]) <= target:
            best, lo = cuts[mid], mid + 1
        else:
            hi = mid - 1
    if best is None:
        raise ValueError(
            f"no prefix of the prompt fits in {target} tokens; raise the target or shorten the "
            "fixed head"
        )
    return text[:best]


def new_nonce() -> str:
    return secrets.token_hex(8)


def cold_prefill_prompt(docs: list[Document], nonce: str, target: int, count: TokenCounter) -> str:
    head = (
        f"Request {nonce}. The documents below are reference material: prose pieces and the "
        "Python source of a software project. Read them; a question follows at the end.\n\n"
    )
    text = _long_enough(docs, None, target, count, head)
    return fit(text, target, count, keep=len(head) + 1, at="space")


def continuation_prompt(docs: list[Document], start: str, target: int, count: TokenCounter) -> str:
    return fit(_long_enough(docs, start, target, count), target, count, at="line")


def _long_enough(
    docs: list[Document], start: str | None, target: int, count: TokenCounter, head: str = ""
) -> str:
    """head + corpus text holding more than ``target`` tokens (doubling until it does)."""
    min_chars = int(target * CHARS_PER_TOKEN_ESTIMATE * 1.3)
    while True:
        text = head + corpus_from(docs, start, min_chars)
        if count(text) > target:
            return text
        min_chars *= 2


def nll_texts(docs: list[Document]) -> list[tuple[str, str]]:
    """The fixed NLL text set as (name, text); cut by characters so it does not depend on
    any tokenizer."""
    by_name = {d.name: d for d in docs}
    out = [(d.name, d.text) for d in docs if d.kind == "prose"]
    for name in NLL_CODE_DOCS:
        if name not in by_name:
            raise ValueError(f"NLL code document {name!r} is not in the code corpus")
        text = by_name[name].text
        if len(text) > NLL_CODE_CHARS:
            text = text[: text.rfind("\n", 0, NLL_CODE_CHARS) + 1]
        out.append((name, text))
    return out
