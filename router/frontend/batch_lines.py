"""The Batch API's files and lines, as OpenAI's API shapes them. Pure.

An input file is JSONL, one request per line: ``{"custom_id": ..., "method": "POST", "url":
<the batch's endpoint>, "body": {...}}``. ``validate`` checks every line before anything runs and
names the first bad ones (``invalid_json_line``, ``missing_custom_id``, ``duplicate_custom_id``,
``mismatched_url``, ...), as OpenAI's validation does. A line's answer is a line of the output
file (a 2xx) or of the error file (any other status: the body is the API's error object), both
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
MAX_ERRORS = 20  # validation errors listed at most
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, as OpenAI's errors count
    custom_id: str
    body: dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def _error(code: str, line: int | None, message: str) -> dict[str, Any]:
    return {"code": code, "line": line, "message": message, "param": None}


def validate(content: bytes, endpoint: str) -> tuple[list[Line], list[dict[str, Any]]]:
    """The requests of an input file, or the reasons it is refused (``errors.data``)."""
    lines: list[Line] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    try:
        text = content.decode()
    except UnicodeDecodeError:
        return [], [_error("invalid_file", None, "the file is not UTF-8 text")]
    for number, raw in enumerate(text.splitlines(), 1):
        if len(errors) >= MAX_ERRORS:
            break
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as exc:
            errors.append(_error("invalid_json_line", number, f"line {number} is not JSON: {exc}"))
            continue
        problem = _line_problem(item, endpoint)
        if problem is not None:
            errors.append(_error(problem[0], number, problem[1]))
            continue
        if item["custom_id"] in seen:
            errors.append(
                _error(
                    "duplicate_custom_id",
                    number,
                    f"custom_id {item['custom_id']!r} is used by an earlier line",
                )
            )
            continue
        seen.add(item["custom_id"])
        lines.append(Line(number, item["custom_id"], item["body"]))
    if not lines and not errors:
        errors.append(_error("empty_file", None, "the input file holds no request"))
    return lines, errors


def _line_problem(item: Any, endpoint: str) -> tuple[str, str] | None:
    if not isinstance(item, dict):
        return "invalid_request", "a line must be a JSON object"
    if not isinstance(item.get("custom_id"), str) or not item["custom_id"]:
        return "missing_custom_id", "custom_id must be a non-empty string"
    if item.get("method", "POST") != "POST":
        return "invalid_method", "method must be POST"
    if item.get("url") != endpoint:
        return "mismatched_url", f"url must be the batch's endpoint, {endpoint}"
    if not isinstance(item.get("body"), dict):
        return "invalid_body", "body must be a JSON object"
    return None


def result_line(custom_id: str, status: int, body: Any, request_id: str) -> dict[str, Any]:
    """One line of the output file (2xx) or the error file."""
    return {
        "id": new_id("batch_req_"),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }


EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


def expired_line(custom_id: str) -> dict[str, Any]:
    """The error file's line for a request the batch did not run before it expired."""
    return {
        "id": new_id("batch_req_"),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": "batch_expired", "message": EXPIRED_MESSAGE},
    }


def first_answers(results: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each ``custom_id``'s first answer, in order."""
    seen: set[str] = set()
    firsts = []
    for r in results:
        if r["custom_id"] not in seen:
            seen.add(r["custom_id"])
            firsts.append(r)
    return firsts


def answered_ok(result: dict[str, Any]) -> bool:
    """A line of the output file (2xx), not of the error file."""
    return result["response"] is not None and 200 <= result["response"]["status_code"] < 300


def split_results(results: Iterable[dict[str, Any]]) -> tuple[bytes, bytes, int, int]:
    """The output file and the error file (JSONL), each ``custom_id`` once (the first answer
    kept), and how many lines each holds."""
    out: list[str] = []
    err: list[str] = []
    for r in first_answers(results):
        (out if answered_ok(r) else err).append(json.dumps(r, separators=(",", ":")))
    return _jsonl(out), _jsonl(err), len(out), len(err)


def _jsonl(lines: Sequence[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode() if lines else b""


def batch_object(
    batch_id: str,
    endpoint: str,
    input_file_id: str,
    completion_window: str,
    metadata: dict[str, Any] | None,
    total: int,
    window_s: int = 24 * 3600,
) -> dict[str, Any]:
    now = int(time.time())
    return {
        "id": batch_id,
        "object": "batch",
        "endpoint": endpoint,
        "errors": None,
        "input_file_id": input_file_id,
        "completion_window": completion_window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + window_s,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": total, "completed": 0, "failed": 0},
        "metadata": metadata or {},
    }


def file_object(file_id: str, filename: str, size: int, purpose: str) -> dict[str, Any]:
    return {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": int(time.time()),
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def multipart_form(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """A ``multipart/form-data`` body: field -> (filename, bytes)."""
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart():
        return {}
    out: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            out[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return out
