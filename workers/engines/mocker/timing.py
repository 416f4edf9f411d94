"""The mocker's timing model: milliseconds per engine step (before ``speedup``).

The same polynomial fits the reference mocker uses (NVIDIA Dynamo), so results are comparable:

- prefill: ``4.209989e-07 * T**2 + 1.518344e-02 * T + 16.50142`` for ``T`` uncached prompt tokens
  computed in the step;
- decode: ``-25.74 * u**2 + 54.01 * u + 5.74`` (at least 1 ms) for ``u`` the fraction of KV blocks
  in use.

A step that both prefills and decodes (chunked prefill mixes them) costs the sum: the prefill
chunk and the decode batch run in one forward pass whose cost grows with both. A step with no
work costs nothing.
"""

from __future__ import annotations


def prefill_ms(new_tokens: int) -> float:
    if new_tokens <= 0:
        return 0.0
    t = float(new_tokens)
    return 4.209989e-07 * t * t + 1.518344e-02 * t + 16.50142


def decode_ms(kv_usage: float) -> float:
    u = min(max(kv_usage, 0.0), 1.0)
    return max(-25.74 * u * u + 54.01 * u + 5.74, 1.0)


def step_ms(prefill_tokens: int, num_decode_seqs: int, kv_usage: float) -> float:
    total = prefill_ms(prefill_tokens)
    if num_decode_seqs > 0:
        total += decode_ms(kv_usage)
    return total
