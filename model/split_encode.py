"""One long prompt tokenized on several cores: cut into pieces where a cut cannot change a token.

HF ``tokenizers``' ``encode_batch`` runs the texts of a batch in parallel (rayon, one thread a
core) but each text on one core, so a lone 100k-token prompt takes ~0.3 s of one core while the
others wait: that is most of what a frontend adds to the first token of a long prompt. Byte-level
BPE (GPT-2, Llama 3, Qwen, SmolLM), Metaspace and WordPiece pre-tokenizers never merge across a
word boundary: a space between two letters starts a new pre-token (`` ?\\p{L}+``), so the text
before it and the text from it on are tokenized exactly as they are inside the whole. A long text
is cut just before such a space (the one nearest each even share of the text) and the pieces go
through one ``encode_batch``; their tokens, joined, are the whole text's.

Each piece after the first is tokenized behind a special token whose id is then dropped (as the
segment cache does, ``model/prompt_cache.py``), so a pre-tokenizer that treats the start of its
input differently sees a position inside the text. Whether this holds for a tokenizer is checked
before it is used: no token of its vocabulary holds a letter then a space (a model that merges
across words), no added token holds a space or swallows one (``lstrip``/``rstrip``), checked by
``ModelTokenizer``, and probe texts cut at every possible place tokenize as whole ones
(``verify_split``); a tokenizer that fails is served whole. Pure and thread-safe.

A cut prompt's pieces fill every core (rayon's pool), so a batch of short prompts that comes
meanwhile waits for a piece to finish: only prompts of 0.1 s of a core or more are cut.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

from model.prompt_cache import EncodeBatch


def _between_letters(text: str, at: int) -> bool:
    return text[at] == " " and text[at - 1].isalpha() and text[at + 1].isalpha()


def cut_points(text: str, pieces: int, search: int = 4096) -> list[int]:
    """Up to ``pieces - 1`` positions, ascending, each a space between two letters, the nearest
    at or after each even share of ``text`` within ``search`` characters (none found: no cut
    there)."""
    cuts: list[int] = []
    for k in range(1, pieces):
        at = max(len(text) * k // pieces, cuts[-1] + 1 if cuts else 1)
        end = min(at + search, len(text) - 1)
        while at < end:
            at = text.find(" ", at, end)
            if at < 0:
                break
            if _between_letters(text, at):
                cuts.append(at)
                break
            at += 1
    return cuts


class SplitEncoder:
    """``encode_batch`` with each text of at least ``2 * min_piece_chars`` cut into up to
    ``pieces`` pieces of at least ``min_piece_chars``; ``glue``: a special token (its text and
    id) put before every piece but the first and dropped again."""

    def __init__(
        self,
        encode_batch: EncodeBatch,
        pieces: int,
        min_piece_chars: int,
        glue: tuple[str, int] | None = None,
    ) -> None:
        self._encode_batch = encode_batch
        self.pieces = pieces
        self.min_piece_chars = min_piece_chars
        self.glue = glue
        self.split_texts = 0  # texts tokenized in pieces (a frontend's metric counts them)
        self._count_lock = threading.Lock()  # (called from several threads)

    def __call__(self, texts: list[str]) -> list[list[int]]:
        spans: list[tuple[int, int]] = []  # per text: its pieces' range in ``parts``
        parts: list[str] = []
        for text in texts:
            n = min(self.pieces, len(text) // self.min_piece_chars) if self.pieces > 1 else 1
            cuts = cut_points(text, n) if n > 1 else []
            bounds = [0, *cuts, len(text)]
            first = len(parts)
            for i, (a, b) in enumerate(itertools.pairwise(bounds)):
                parts.append(text[a:b] if i == 0 or self.glue is None else self.glue[0] + text[a:b])
            spans.append((first, len(parts)))
        if len(parts) == len(texts):
            return self._encode_batch(texts)
        ids = self._encode_batch(parts)
        out: list[list[int]] = []
        split = 0
        whole: list[int] = []  # texts whose glue did not come back first: tokenized whole
        for t, (a, b) in enumerate(spans):
            joined = list(ids[a])
            for piece in ids[a + 1 : b]:
                if self.glue is not None:
                    if not piece or piece[0] != self.glue[1]:
                        whole.append(t)
                        break
                    joined.extend(piece[1:])
                else:
                    joined.extend(piece)
            out.append(joined)
            split += b - a > 1
        with self._count_lock:  # (those whose glue did not come back were tokenized whole)
            self.split_texts += split - len(whole)
        if whole:
            for t, again in zip(whole, self._encode_batch([texts[t] for t in whole]), strict=True):
                out[t] = again
        return out


def verify_split(
    encode_batch: EncodeBatch, glue: tuple[str, int] | None, probes: Sequence[str]
) -> bool:
    """Whether cutting gives token for token what the whole text gives, on ``probes`` cut at
    every space between two letters, one cut at a time, and in many pieces at once."""
    for text in probes:
        whole = encode_batch([text])[0]
        for cut in (i for i in range(1, len(text) - 1) if _between_letters(text, i)):
            pieces = [text[:cut], text[cut:] if glue is None else glue[0] + text[cut:]]
            a, b = encode_batch(pieces)
            if glue is not None:
                if not b or b[0] != glue[1]:
                    return False
                b = b[1:]
            if [*a, *b] != whole:
                return False
        many = SplitEncoder(encode_batch, 8, max(len(text) // 16, 1), glue)
        if many([text])[0] != whole:
            return False
    return True
