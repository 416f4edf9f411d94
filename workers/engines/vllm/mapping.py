"""Our request and vLLM's outputs, mapped both ways. Pure.

Request -> ``vllm.SamplingParams`` keyword arguments: every field of ``schemas.requests.
SamplingParams`` has a vLLM counterpart of the same name and meaning (``max_tokens``,
``temperature``, ``top_p``, ``top_k``, ``min_p``, ``presence_penalty``, ``frequency_penalty``,
``repetition_penalty``, ``seed``, ``ignore_eos``, ``min_tokens``, ``stop_token_ids``); our
``top_k=0`` (off) is sent as vLLM's ``-1``, which every vLLM version reads as off. Our wire has
no logprobs, so vLLM computes none.
Stop strings are applied by the frontend, and the worker detokenizes, so vLLM is asked not to
(``detokenize=False``). ``kv_transfer_params`` go in ``extra_args["kv_transfer_params"]``, where
vLLM's KV connectors read them (as vLLM's own OpenAI server puts them). The backend adds
``output_kind=RequestOutputKind.DELTA``: each ``RequestOutput`` then carries only new tokens.

vLLM's finish reasons are ``"stop"`` (EOS or a stop token), ``"length"``, ``"abort"`` and, in
newer versions, ``"error"``; they map to the same names. A finished output without a reason, or
with one this adapter does not know, counts as ``"stop"``.
"""

from __future__ import annotations

from typing import Any

from workers.engine import EngineRequest

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}


def sampling_kwargs(request: EngineRequest) -> dict[str, Any]:
    sp = request.sampling
    kwargs: dict[str, Any] = {
        "n": 1,
        "max_tokens": sp.max_tokens,
        "temperature": sp.temperature,
        "top_p": sp.top_p,
        "top_k": sp.top_k if sp.top_k > 0 else -1,
        "min_p": sp.min_p,
        "presence_penalty": sp.presence_penalty,
        "frequency_penalty": sp.frequency_penalty,
        "repetition_penalty": sp.repetition_penalty,
        "seed": sp.seed,
        "ignore_eos": sp.ignore_eos,
        "min_tokens": sp.min_tokens,
        "stop_token_ids": list(sp.stop_token_ids),
        "detokenize": False,
    }
    if request.kv_transfer_params is not None:
        kwargs["extra_args"] = {"kv_transfer_params": dict(request.kv_transfer_params)}
    return kwargs


def finish_reason(raw: object) -> str:
    """vLLM's ``CompletionOutput.finish_reason`` of a finished request -> ours."""
    if raw is None:
        return "stop"
    return FINISH_REASONS.get(str(raw).lower(), "stop")
