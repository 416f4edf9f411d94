"""What a decoded message must also be before anyone acts on it: one check per wire struct.

Decoding proves the shape (types); these prove the values a consumer relies on: ids that are NATS
subject tokens (a request id names ``fleet.tok.{request_id}``), non-empty prompts, token ids in
range, sampling parameters an engine accepts. Every consumer calls the same function and treats a
problem the same way: terminate the message (no redelivery to the next consumer), dead-letter it
with the reason, and, when the request id is usable, end the waiting client with an error chunk.
Pure; returns the first problem found, or None.
"""

from __future__ import annotations

import re

from schemas.requests import Request, SamplingParams

MAX_ID_LEN = 256
MAX_TOKEN_ID = 2**31 - 1
MAX_LOGPROBS = 20  # as OpenAI's top_logprobs
_SUBJECT_TOKEN = re.compile(r"[A-Za-z0-9_\-:]+")  # no '.', '*', '>', spaces or control chars


def is_subject_token(value: str) -> bool:
    """Whether ``value`` can be one token of a NATS subject (as our ids are used)."""
    return 0 < len(value) <= MAX_ID_LEN and _SUBJECT_TOKEN.fullmatch(value) is not None


def sampling_problem(s: SamplingParams) -> str | None:
    if s.max_tokens < 1:
        return f"max_tokens must be >= 1, got {s.max_tokens}"
    if not 0.0 <= s.temperature <= 100.0:
        return f"temperature out of range: {s.temperature}"
    if not 0.0 < s.top_p <= 1.0:
        return f"top_p must be in (0, 1], got {s.top_p}"
    if s.top_k < 0 or s.min_tokens < 0 or not 0.0 <= s.min_p <= 1.0:
        return "top_k and min_tokens must be >= 0 and min_p in [0, 1]"
    if s.repetition_penalty <= 0.0:
        return f"repetition_penalty must be > 0, got {s.repetition_penalty}"
    if any(t < 0 or t > MAX_TOKEN_ID for t in s.stop_token_ids):
        return "stop_token_ids out of range"
    for name in ("logprobs", "prompt_logprobs"):
        k = getattr(s, name)
        if k is not None and not 0 <= k <= MAX_LOGPROBS:
            return f"{name} must be in [0, {MAX_LOGPROBS}], got {k}"
    if s.structured is not None:
        st = s.structured
        kinds = (st.json_schema, st.regex, st.grammar)
        if sum(k is not None for k in kinds) + st.json_object + bool(st.choice) != 1:
            return "structured must set exactly one constraint"
    return None


def request_problem(req: Request, vocab_size: int | None = None) -> str | None:
    """The first reason ``req`` cannot be served, or None. ``vocab_size``: the model's, when the
    consumer knows it (a worker), so every token id is one the engine can embed."""
    if not is_subject_token(req.request_id):
        return "request_id must be 1-256 characters of [A-Za-z0-9_-:]"
    if not req.model or len(req.model) > MAX_ID_LEN:
        return "model must be a non-empty name"
    if not req.token_ids and not req.prompt_embeds:
        return "token_ids is empty"
    limit = vocab_size if vocab_size is not None else MAX_TOKEN_ID + 1
    if req.token_ids:
        low, high = min(req.token_ids), max(req.token_ids)
        if low < 0 or high >= limit:
            return f"token ids must be in [0, {limit}), got [{low}, {high}]"
    if req.task not in ("generate", "embed"):
        return f"task must be 'generate' or 'embed', got {req.task!r}"
    if req.dimensions is not None and req.dimensions < 1:
        return f"dimensions must be >= 1, got {req.dimensions}"
    if req.attempt < 0 or not 0 <= req.num_generated_before <= len(req.token_ids):
        return "attempt and num_generated_before must be >= 0 (and within token_ids)"
    return sampling_problem(req.sampling)
