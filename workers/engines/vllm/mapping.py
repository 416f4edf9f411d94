"""Our request and vLLM's outputs, mapped both ways. Pure.

Request -> ``vllm.SamplingParams`` keyword arguments: every field of ``schemas.requests.
SamplingParams`` has a vLLM counterpart of the same name and meaning (``max_tokens``,
``temperature``, ``top_p``, ``top_k``, ``min_p``, ``presence_penalty``, ``frequency_penalty``,
``repetition_penalty``, ``seed``, ``ignore_eos``, ``min_tokens``, ``stop_token_ids``); our
``top_k=0`` (off) is sent as vLLM's ``-1``, which every vLLM version reads as off.
``logprobs`` / ``prompt_logprobs`` (top-k counts) go through under the same names; vLLM returns,
per position, a map token id -> ``Logprob(logprob, rank, decoded_token)`` holding the top k and
the sampled token (``logprobs_of`` turns it into our ``TokenLogprob``: the sampled token's
logprob, the top k by rank). A structured-output constraint becomes vLLM's
``StructuredOutputsParams`` (``structured_outputs=``, vLLM 0.11+) or, before, its
``GuidedDecodingParams`` (``guided_decoding=``), with the same field names (``json``,
``json_object``, ``regex``, ``choice``, ``grammar``); ``sampling_kwargs`` leaves the value a
plain dict and the backend builds the release's class.
Stop strings are applied by the frontend, and the worker detokenizes, so vLLM is asked not to
(``detokenize=False``). ``kv_transfer_params`` go in ``extra_args["kv_transfer_params"]``, where
vLLM's KV connectors read them (as vLLM's own OpenAI server puts them). The backend adds
``output_kind=RequestOutputKind.DELTA``: each ``RequestOutput`` then carries only new tokens.

vLLM's finish reasons are ``"stop"`` (EOS or a stop token), ``"length"``, ``"abort"`` and, in
newer versions, ``"error"``; they map to the same names. A finished output without a reason, or
with one this adapter does not know, counts as ``"stop"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from schemas.requests import StructuredOutput
from schemas.tokens import TokenLogprob
from workers.engine import EngineRequest

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}


def sampling_kwargs(request: EngineRequest, structured_outputs: bool = True) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keyword arguments. ``structured_outputs``: the release names the
    constraint ``structured_outputs`` (0.11+), else ``guided_decoding``."""
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
    if sp.logprobs is not None:
        kwargs["logprobs"] = sp.logprobs
    if sp.prompt_logprobs is not None:
        kwargs["prompt_logprobs"] = sp.prompt_logprobs
    if sp.structured is not None:
        key = "structured_outputs" if structured_outputs else "guided_decoding"
        kwargs[key] = structured_fields(sp.structured)
    return kwargs


def structured_fields(st: StructuredOutput) -> dict[str, Any]:
    """Our constraint as the keyword arguments of vLLM's ``StructuredOutputsParams``."""
    if st.json_schema is not None:
        return {"json": st.json_schema}
    if st.regex is not None:
        return {"regex": st.regex}
    if st.grammar is not None:
        return {"grammar": st.grammar}
    if st.choice:
        return {"choice": list(st.choice)}
    return {"json_object": True}


def logprobs_of(
    token_ids: Sequence[int], positions: Iterable[Mapping[int, Any] | None], k: int
) -> tuple[TokenLogprob | None, ...]:
    """vLLM's per-position logprob maps for ``token_ids`` -> ours (None where vLLM has none,
    as for the first prompt token)."""
    out: list[TokenLogprob | None] = []
    for token, pos in zip(token_ids, positions, strict=False):
        if not pos:
            out.append(None)
            continue
        chosen = pos.get(token)
        top = sorted(pos.items(), key=lambda item: _rank(item[1]))[:k]
        out.append(
            TokenLogprob(
                float(chosen.logprob) if chosen is not None else float("-inf"),
                tuple(int(t) for t, _ in top),
                tuple(float(lp.logprob) for _, lp in top),
            )
        )
    return tuple(out)


def _rank(lp: Any) -> float:
    rank = getattr(lp, "rank", None)
    return float(rank) if rank is not None else -float(lp.logprob)


def finish_reason(raw: object) -> str:
    """vLLM's ``CompletionOutput.finish_reason`` of a finished request -> ours."""
    if raw is None:
        return "stop"
    return FINISH_REASONS.get(str(raw).lower(), "stop")
