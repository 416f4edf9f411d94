"""The mocker's timing model: simulated milliseconds per engine step (before ``speedup``).

The polynomial fits are the reference mocker's (NVIDIA Dynamo, ``PerfModel::Polynomial``), so
results are comparable:

- prefill: ``4.209989e-07 * T**2 + 1.518344e-02 * T + 16.50142`` for ``T`` uncached prompt tokens
  of one pass;
- decode: ``max(1, -25.74 * u**2 + 54.01 * u + 5.74)`` for ``u`` the fraction of KV blocks in use.

How one step combines them follows Dynamo's mocker (``lib/mocker/src/scheduler/vllm/core.rs``,
``predict_prefill_duration``; its live loop prices a whole pass, then sleeps for it):

- **prefill** is charged once for the step, on the new prompt tokens of every sequence that
  prefills in it (a chunk under chunked prefill), summed: the GPU computes them in one forward
  pass, so the constant term is paid once per pass, not once per sequence. (Dynamo's older
  ``scheduler.rs`` charged each request its own ``PrefillCost``; this mocker did so until
  2026-11-26, see docs/benchmarks.md, "Measurements behind design choices". Dynamo averages
  the tokens per sequence in integers, which can differ from this sum by fewer tokens than
  there are sequences.);
- **decode** is charged once for the step when at least one sequence samples a token, including a
  sequence whose prefill completes in the step (in Dynamo it joins the decode batch and gets its
  first token in the same pass); ``u`` is measured after the step's block allocations;
- the step lasts **prefill + decode**. A step with no work costs nothing.

Pure functions; the async engine divides the result by ``MockerConfig.speedup``.
"""

from __future__ import annotations

from collections.abc import Iterable

PREFILL_A = 4.209989e-07  # ms / token^2
PREFILL_B = 1.518344e-02  # ms / token
PREFILL_C = 16.50142  # ms
DECODE_A = -25.74  # ms (coefficient of u^2)
DECODE_B = 54.01  # ms (coefficient of u)
DECODE_C = 5.74  # ms
DECODE_FLOOR_MS = 1.0


def prefill_ms(new_tokens: int) -> float:
    """Time to prefill ``new_tokens`` uncached tokens of one sequence (0 for none)."""
    if new_tokens <= 0:
        return 0.0
    t = float(new_tokens)
    return PREFILL_A * t * t + PREFILL_B * t + PREFILL_C


def decode_ms(kv_usage: float) -> float:
    """Time of one decode pass at KV usage ``kv_usage`` (clamped to 0..1), at least 1 ms."""
    u = min(max(kv_usage, 0.0), 1.0)
    return max(DECODE_A * u * u + DECODE_B * u + DECODE_C, DECODE_FLOOR_MS)


def step_ms(prefill_chunks: Iterable[int], sampled: bool, kv_usage: float) -> float:
    """One step: ``prefill_ms`` of the prefill chunks' tokens together (tokens per sequence),
    plus ``decode_ms(kv_usage)`` if any sequence sampled a token."""
    total = prefill_ms(sum(prefill_chunks))
    if sampled:
        total += decode_ms(kv_usage)
    return total
