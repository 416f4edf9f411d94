"""``POST /v1/embeddings``: the request (OpenAI's shape), its run, and the response.

``input`` is a text, a list of texts, a list of token ids, or a list of those lists (at most
``MAX_INPUTS``); each becomes one ``Request`` with ``task="embed"``, routed like any request.
``encoding_format`` is ``float`` (lists) or ``base64`` (little-endian float32, what the official
client asks for by default); ``dimensions`` shortens the vector where the model allows it.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time
from typing import Any, Literal

import msgspec

from router.frontend import asgi
from router.frontend.errors import OpenAIError, decode_body
from router.frontend.serving import Serving
from router.frontend.shapes import encode
from schemas import Request, SamplingParams
from schemas.discovery import ModelCard

MAX_INPUTS = 2048


class EmbeddingRequest(msgspec.Struct):
    model: str
    input: str | list[Any]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = None
    user: str | None = None

    def inputs(self) -> list[str | list[int]]:
        """Each input, texts and token-id lists alike (``OpenAIError`` when malformed)."""
        value = self.input
        items: list[Any]
        if isinstance(value, str) or (value and all(type(t) is int for t in value)):
            items = [value]
        else:
            items = list(value)
        if not items:
            raise _bad("input must not be empty")
        if len(items) > MAX_INPUTS:
            raise _bad(f"input may hold at most {MAX_INPUTS} items, got {len(items)}")
        for i, item in enumerate(items):
            text = isinstance(item, str)
            ids = isinstance(item, list) and all(type(t) is int and t >= 0 for t in item)
            if not (text or ids) or not item:
                raise _bad(f"input[{i}] must be a non-empty string or list of token ids")
        return items


def _bad(message: str, param: str = "input") -> OpenAIError:
    return OpenAIError(400, message, param=param)


_decoder = msgspec.json.Decoder(EmbeddingRequest)


def parse_embedding_request(body: bytes) -> EmbeddingRequest:
    req = decode_body(body, _decoder)
    if not req.model:
        raise _bad("model must be a non-empty string", "model")
    if req.dimensions is not None and req.dimensions < 1:
        raise _bad(f"dimensions must be at least 1, got {req.dimensions}", "dimensions")
    req.inputs()
    return req


def embedding_dimensions_check(card: ModelCard, model: str, dimensions: int) -> None:
    """``dimensions`` as vLLM allows it: only for a Matryoshka model (its ``config.json`` says
    ``is_matryoshka`` or lists ``matryoshka_dimensions``), at most its hidden size, and one of
    the listed sizes when there is a list."""
    dims = card.matryoshka_dimensions
    if dims is None:
        raise _bad(
            f"The model `{model}` does not support dimensions: it is not a Matryoshka model "
            "(its config.json sets neither is_matryoshka nor matryoshka_dimensions)",
            "dimensions",
        )
    if card.hidden_size and dimensions > card.hidden_size:
        raise _bad(f"dimensions must be at most {card.hidden_size} for this model", "dimensions")
    if dims and dimensions not in dims:
        sizes = ", ".join(map(str, dims))
        raise _bad(f"dimensions must be one of {sizes} for this model", "dimensions")


def _vector(values: tuple[float, ...], fmt: str | None) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
    return list(values)


def response_body(
    model: str, vectors: list[tuple[float, ...]], fmt: str | None, prompt_tokens: int
) -> bytes:
    data = [
        {"object": "embedding", "index": i, "embedding": _vector(v, fmt)}
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return encode({"object": "list", "data": data, "model": model, "usage": usage})


async def serve(call: asgi.Call, serving: Serving) -> None:
    accepted = time.monotonic()
    body = await call.body()
    req = parse_embedding_request(body)
    served = serving.served(req.model)
    card = served.card
    call.ctx["model"] = req.model
    if "embed" not in card.tasks:
        raise _bad(
            f"The model `{req.model}` does not serve embeddings (its workers serve "
            f"{', '.join(card.tasks)}).",
            "model",
        )
    if req.dimensions is not None:
        embedding_dimensions_check(card, req.model, req.dimensions)
    prompts = await asyncio.gather(
        *(serving.prompts.embedding_input(served, item, len(body)) for item in req.inputs())
    )
    rid = f"embd-{call.ctx['request_id']}"
    now = time.time()
    requests = [
        Request(
            request_id=rid if len(prompts) == 1 else f"{rid}-{i}",
            model=req.model,
            token_ids=tuple(prompt),
            sampling=SamplingParams(max_tokens=1),
            created_at_s=now,
            detokenize=False,
            task="embed",
            dimensions=req.dimensions,
        )
        for i, prompt in enumerate(prompts)
    ]
    total = sum(len(p) for p in prompts)
    call.ctx.update(request_id=rid, prompt_tokens=total)
    gens = await serving.submit(req.model, rid, requests, card.block_size, call.traceparent)
    status = "ok"
    vectors: list[tuple[float, ...]] = []
    error: str | None = None
    try:
        async with asgi.DisconnectWatcher(call.receive):
            for gen in gens:
                async for chunk in gen:
                    if chunk.finish_reason is None:
                        continue
                    if chunk.embedding is None:
                        error = (
                            chunk.error
                            or f"the worker returned no embedding ({chunk.finish_reason})"
                        )
                    else:
                        vectors.append(chunk.embedding)
                if error:
                    break
    except asyncio.CancelledError:
        status = "cancelled"
        for g in gens:
            await g.cancel()
        asgi.settle_cancellation()
    finally:
        status = "error" if error and status == "ok" else status
        serving.metrics.requests.labels(req.model, "embeddings", status).inc()
        call.ctx.update(outcome=status, worker_id=",".join(g.worker_id for g in gens))
        await serving.observer.embedded(req.model, gens, accepted, status, error)
    if status == "cancelled":
        return
    if error:
        raise OpenAIError(500, error, type="server_error")
    await asgi.send_json(
        call.send, 200, response_body(req.model, vectors, req.encoding_format, total)
    )
