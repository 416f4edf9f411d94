"""The mocker's synthetic logprobs: a documented distribution, deterministic, consistent. Pure.

At each position the token the mocker emits is the most likely one. Its probability is
``p = 0.40 + 0.59 u`` with ``u`` in [0, 1) hashed from (seed, position), so its logprob lies in
[ln 0.40, ln 0.99]. The alternatives are other tokens drawn from the mocker's vocabulary
(``token_source`` under derived seeds, duplicates skipped) with probabilities
``(1 - p) / 2, (1 - p) / 4, ...``: strictly decreasing, every one below ``p``, the total below 1.
``top`` (``k`` entries) lists the emitted token first, then ``k - 1`` alternatives, so ``top[0]``
is always the token generated (as with greedy sampling). Prompt tokens (``prompt_logprobs``)
get the same model with the seed taken from the preceding token, and the first prompt token
gets none (nothing precedes it), as in vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import xxhash

from schemas.tokens import TokenLogprob

TokenSource = Callable[[int, int], int]  # (seed, position) -> token id
_U64 = 0xFFFFFFFFFFFFFFFF
_ALT_SEED = 0x9E3779B97F4A7C15  # alternative j draws with seed ^ (j * this)


def chosen_probability(seed: int, position: int) -> float:
    u = xxhash.xxh3_64_intdigest(position.to_bytes(8, "little"), (seed ^ 0x5EED) & _U64)
    return 0.40 + 0.59 * (u / 2**64)


def token_logprob(
    source: TokenSource, seed: int, position: int, token: int, k: int
) -> TokenLogprob:
    """The emitted ``token``'s logprob at ``position`` and, when ``k > 0``, the top ``k``."""
    p = chosen_probability(seed, position)
    lp = math.log(p)
    if k <= 0:
        return TokenLogprob(lp)
    ids, lps = [token], [lp]
    seen = {token}
    j = 1
    while len(ids) < k and j <= 8 * (k + 1):  # a tiny vocabulary may run out of new tokens
        alt = source((seed ^ (j * _ALT_SEED)) & _U64, position)
        j += 1
        if alt in seen:
            continue
        seen.add(alt)
        lps.append(math.log((1 - p) / 2 ** len(ids)))
        ids.append(alt)
    return TokenLogprob(lp, tuple(ids), tuple(lps))


def prompt_logprobs(
    source: TokenSource, prompt: Sequence[int], k: int
) -> tuple[TokenLogprob | None, ...]:
    """One entry per prompt token; the first is None."""
    out: list[TokenLogprob | None] = [None]
    for i in range(1, len(prompt)):
        out.append(token_logprob(source, prompt[i - 1], i, prompt[i], k))
    return tuple(out)
