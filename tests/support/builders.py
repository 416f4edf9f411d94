"""Wire structs for tests, built one way: worker registrations and the fleet state a router makes
of them; poison (requests no worker or router may run)."""

from __future__ import annotations

from typing import Any

import msgspec

from router.fleet_state import FleetState
from schemas import Request, SamplingParams, WorkerRegistration


def registration(
    worker_id: str,
    model: str = "m",
    role: str = "agg",
    *,
    max_num_seqs: int = 8,
    num_gpu_blocks: int = 100,
    block_size: int = 16,
    **fields: Any,
) -> WorkerRegistration:
    """A mocker worker's registration; ``fields``: any other ``WorkerRegistration`` field."""
    return WorkerRegistration(
        worker_id, model, role, "mocker", max_num_seqs, num_gpu_blocks, block_size, **fields
    )


def fleet_state(*registrations: WorkerRegistration) -> FleetState:
    """What a router knows of a fleet of these workers."""
    state = FleetState()
    for reg in registrations:
        state.upsert(reg)
    return state


def poison_requests(
    request_id: str, model: str, out_of_vocab: int = 10**6
) -> list[tuple[str, Request]]:
    """Decodable requests that must be refused, each after a word of its refusal's reason: no
    tokens to generate, an empty prompt, a token id out of the vocabulary (``out_of_vocab``), an
    id that cannot name a subject. The first three (ids ``request_id``, ``-e``, ``-v``) can be
    answered on their token subjects; the last cannot."""
    ok = Request(request_id, model, tuple(b"hello"), SamplingParams(max_tokens=4))
    replace = msgspec.structs.replace
    return [
        ("max_tokens", replace(ok, sampling=SamplingParams(max_tokens=0))),
        ("empty", replace(ok, request_id=request_id + "-e", token_ids=())),
        ("token ids", replace(ok, request_id=request_id + "-v", token_ids=(1, out_of_vocab))),
        ("request_id", replace(ok, request_id="bad.id with space")),
    ]
