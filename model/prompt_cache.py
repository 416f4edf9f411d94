"""Tokens of repeated prompt prefixes, cached by segment so multi-turn chat is not tokenized again.

A chat prompt is the rendered conversation: every message sits between the template's special
tokens (``<|im_start|>user ... <|im_end|>``), and each turn resends all earlier messages. HF
``tokenizers`` splits its input on added (special) tokens before normalizing and pre-tokenizing, so
the text between two special tokens is tokenized on its own. The cache cuts the prompt right after
every special token and keys each segment by a hash chained over everything before it: a prompt
that extends an earlier one finds its earlier segments and tokenizes only the rest.

The rest is tokenized with the special token in front of it (``<|im_end|>`` + rest) and that
token's id dropped again, so the rest is tokenized exactly as it is inside the whole prompt (a
pre-tokenizer that treats the start of the input differently, like Metaspace's "first", sees the
same non-start position). The result is checked: the rest must hold one special id per segment
boundary; if not, the caller tokenizes the whole prompt instead. ``verify`` compares the two paths
on probe conversations when a model is loaded, and a tokenizer that fails is served uncached.

Pure and thread-safe (one lock around the LRU); segments are kept as ``array('I')`` (4 bytes a
token) up to ``max_tokens`` in total.
"""

from __future__ import annotations

import hashlib
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

EncodeBatch = Callable[[list[str]], list[list[int]]]

_ROOT = b"\0" * 16


def _chain(prev: bytes, segment: str) -> bytes:
    return hashlib.blake2b(prev + segment.encode(), digest_size=16).digest()


@dataclass
class Plan:
    """What to tokenize for one prompt, and where its result goes."""

    text: str
    keys: list[bytes]  # one per segment that ends in a special token
    ends: list[int]  # the special id each of those segments ends with
    hit_segments: int  # leading segments found in the cache
    cached: array[int] = field(default_factory=lambda: array("I"))
    rest: str = ""  # what to tokenize ("" only if nothing is left)
    drop_first: bool = False  # the rest starts with a repeated special token to drop

    @property
    def cached_tokens(self) -> int:
        return len(self.cached)


@dataclass
class CacheStats:
    hits: int = 0  # segments served from the cache
    misses: int = 0  # segments tokenized
    cached_tokens: int = 0  # tokens served from the cache
    fallbacks: int = 0  # prompts tokenized whole because the split did not hold


class SegmentCache:
    def __init__(self, special_tokens: dict[str, int], max_tokens: int = 4_000_000) -> None:
        self.special = dict(special_tokens)
        self.special_ids = frozenset(self.special.values())
        self._name_of = {tid: name for name, tid in self.special.items()}
        names = sorted(self.special, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(n) for n in names)) if names else None
        self.max_tokens = max_tokens
        self.stats = CacheStats()
        self._lru: OrderedDict[bytes, array[int]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    @property
    def size_tokens(self) -> int:
        return self._size

    def plan(self, text: str) -> Plan:
        keys: list[bytes] = []
        ends: list[int] = []
        starts: list[int] = [0]
        if self._pattern is not None:
            prev, pos = _ROOT, 0
            for m in self._pattern.finditer(text):
                prev = _chain(prev, text[pos : m.end()])
                keys.append(prev)
                ends.append(self.special[m.group()])
                pos = m.end()
                starts.append(pos)
        cached: array[int] = array("I")
        hit = 0
        with self._lock:
            for key in keys:
                seg = self._lru.get(key)
                if seg is None:
                    break
                self._lru.move_to_end(key)
                cached.extend(seg)
                hit += 1
        if hit == 0:
            return Plan(text, keys, ends, 0, cached, text, False)
        rest = self._name_of[ends[hit - 1]] + text[starts[hit] :]
        return Plan(text, keys, ends, hit, cached, rest, True)

    def complete(self, plan: Plan, rest_ids: Sequence[int]) -> list[int] | None:
        """The prompt's tokens from the plan and the rest's tokens; None if the split did not
        hold (the caller then tokenizes the whole prompt)."""
        ids = list(rest_ids)
        if plan.drop_first:
            if not ids or ids[0] != plan.ends[plan.hit_segments - 1]:
                self._fallback()
                return None
            ids = ids[1:]
        # cut the rest after each special id: those are the remaining segments
        segments: list[array[int]] = []
        start = 0
        want = plan.ends[plan.hit_segments :]
        for i, tid in enumerate(ids):
            if tid in self.special_ids:
                if len(segments) >= len(want) or tid != want[len(segments)]:
                    self._fallback()
                    return None
                segments.append(array("I", ids[start : i + 1]))
                start = i + 1
        if len(segments) != len(want):
            self._fallback()
            return None
        with self._lock:
            self.stats.hits += plan.hit_segments
            self.stats.misses += len(segments)
            self.stats.cached_tokens += len(plan.cached)
            for key, seg in zip(plan.keys[plan.hit_segments :], segments, strict=True):
                self._put(key, seg)
        return plan.cached.tolist() + ids

    def _fallback(self) -> None:
        with self._lock:
            self.stats.fallbacks += 1

    def _put(self, key: bytes, seg: array[int]) -> None:
        if key in self._lru or len(seg) > self.max_tokens:
            return
        self._lru[key] = seg
        self._size += len(seg)
        while self._size > self.max_tokens:
            _, old = self._lru.popitem(last=False)
            self._size -= len(old)

    def encode(self, texts: list[str], encode_batch: EncodeBatch) -> list[list[int]]:
        """Tokens of each text, through the cache (one ``encode_batch`` call for all rests,
        one more for any that fall back)."""
        plans = [self.plan(t) for t in texts]
        rests = encode_batch([p.rest for p in plans])
        out: list[list[int] | None] = [
            self.complete(p, r) for p, r in zip(plans, rests, strict=True)
        ]
        redo = [i for i, ids in enumerate(out) if ids is None]
        if redo:
            for i, ids in zip(redo, encode_batch([texts[i] for i in redo]), strict=True):
                out[i] = ids
        return [ids for ids in out if ids is not None]


def verify(cache: SegmentCache, encode_batch: EncodeBatch, conversations: list[str]) -> bool:
    """Whether cached tokenizing gives token for token what a fresh one gives, on growing
    prefixes of ``conversations`` (each cut after every special token and extended)."""
    probe = SegmentCache(cache.special, cache.max_tokens)
    for text in conversations:
        cuts = [0]
        if probe._pattern is not None:
            cuts += [m.end() for m in probe._pattern.finditer(text)]
        cuts.append(len(text))
        for cut in cuts[1:]:
            prefix = text[:cut]
            fresh = encode_batch([prefix])[0]
            if probe.encode([prefix], encode_batch)[0] != fresh:
                return False
    return probe.stats.fallbacks == 0
