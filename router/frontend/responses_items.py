"""The items of a stored response, as OpenAI's API lists and replays them. Pure.

A stored response keeps its own input items (``GET /v1/responses/{id}/input_items``) and its
response object (whose ``output`` holds the answer's items). A request naming a
``previous_response_id`` continues that conversation: its input is every earlier response's input
items and output items, oldest first, then its own (the earlier ``instructions`` are not carried
over, as in OpenAI's API).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

MAX_CHAIN = 256  # responses followed back through previous_response_id at most
FIELDS = {  # what an input item of each type keeps (others: as given)
    "message": ("type", "id", "role", "content", "status"),
    "function_call": ("type", "id", "call_id", "name", "arguments", "status"),
    "function_call_output": ("type", "id", "call_id", "output", "status"),
}


def new_response_id() -> str:
    """A fresh id (the request id the client may give is not unique enough to store under)."""
    return f"resp_{uuid.uuid4().hex}"


def input_items(items: str | Sequence[Any] | None, response_id: str) -> list[dict[str, Any]]:
    """This request's ``input`` as stored items, each with an id (``msg_`` for messages)."""
    if items is None:
        return []
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    base = response_id.removeprefix("resp_")
    for i, raw in enumerate(items):
        item = raw if isinstance(raw, dict) else msgspec.to_builtins(raw)
        keep = FIELDS.get(item["type"])
        if keep is not None:
            item = {k: v for k, v in item.items() if k in keep}
        if item["type"] == "message":
            content = item.get("content", "")
            if isinstance(content, str):
                part = "output_text" if item.get("role") == "assistant" else "input_text"
                content = [{"type": part, "text": content}]
            item["content"] = content
            item.setdefault("status", "completed")
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
        item.setdefault("id", f"{prefix.get(item['type'], 'item')}_in{base}_{i}")
        out.append(item)
    return out


def replayed(output: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the next request's input: its messages and calls (its
    reasoning is not sent back to the model)."""
    return [item for item in output if item.get("type") in ("message", "function_call")]


def conversation(
    chain: Sequence[tuple[Sequence[dict[str, Any]], dict[str, Any]]],
) -> list[dict[str, Any]]:
    """The input items a chain of earlier responses contributes, oldest first: each response's
    input items, then its output."""
    items: list[dict[str, Any]] = []
    for inputs, response in chain:
        items += inputs
        items += replayed(response.get("output") or ())
    return items


def page(
    items: Sequence[dict[str, Any]], limit: int, order: str, after: str | None
) -> dict[str, Any]:
    """``GET .../input_items``: a list object, ``order`` asc or desc (the default, as OpenAI's),
    starting after the item ``after``."""
    ordered = list(items) if order == "asc" else list(reversed(items))
    if after is not None:
        ids = [i.get("id") for i in ordered]
        ordered = ordered[ids.index(after) + 1 :] if after in ids else []
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0].get("id") if data else None,
        "last_id": data[-1].get("id") if data else None,
        "has_more": len(ordered) > limit,
    }
