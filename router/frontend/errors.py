"""The frontend's errors: ``OpenAIError`` (an HTTP status and OpenAI's error object), the rules
written once that several endpoints raise (a prompt over the context length), and decoding a
JSON body into a typed request, every failure a 400 naming the field. Pure.

Decoding is typed (msgspec): a wrong type names the field (``$.temperature`` -> param
``temperature``, ``$.messages[0].role`` -> ``messages[0].role``); a missing required field is
"Missing required parameter"; a body that is empty, not JSON, not UTF-8 or nested too deeply is a
400 without a param.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

_json_encode = msgspec.json.Encoder().encode
_AT_PATH = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_MISSING = re.compile(r"missing required field `(?P<field>\w+)`")
T = TypeVar("T")


class OpenAIError(Exception):
    """A failed request: HTTP ``status`` plus OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type  # invalid_request_error | not_found_error | server_error | ...
        self.param = param  # the offending field, e.g. "temperature" or "messages[0].role"
        self.code = code  # e.g. "context_length_exceeded"

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return _json_encode({"error": error})


def bad(param: str | None, message: str) -> OpenAIError:
    """A 400 about ``param``."""
    return OpenAIError(400, message, param=param)


def context_length_exceeded(context: int, however: str, reduce: str, param: str) -> OpenAIError:
    """A prompt (and budget) over the model's context: one wording for every endpoint, as vLLM
    and OpenAI say it. ``however``: what the request came to; ``reduce``: what to shorten."""
    return OpenAIError(
        400,
        f"This model's maximum context length is {context} tokens. However, {however}. "
        f"Please reduce the length of the {reduce}.",
        param=param,
        code="context_length_exceeded",
    )


def decode_body(body: bytes, decoder: msgspec.json.Decoder[T], path_style: str = "openai") -> T:
    """``body`` decoded by ``decoder``; every failure an ``OpenAIError`` naming the field
    (``path_style`` ``anthropic``: ``messages.0.role`` rather than ``messages[0].role``)."""
    if not body.strip():
        raise bad(None, "Request body is empty; expected a JSON object.")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc), path_style) from None
    except msgspec.DecodeError as exc:
        raise bad(None, f"Request body is not valid JSON: {exc}") from None
    except UnicodeDecodeError:
        raise bad(None, "Request body is not valid UTF-8.") from None
    except RecursionError:
        raise bad(None, "Request body nests too deeply.") from None


def _validation_error(text: str, path_style: str) -> OpenAIError:
    """msgspec's ``Expected `int`, got `str` - at `$.n``` -> 400 with param ``n``."""
    at = _AT_PATH.search(text)
    path = at.group("path") if at else ""
    if path_style == "anthropic":
        path = re.sub(r"\[(\d+)\]", r".\1", path)
    detail = text[: at.start()] if at else text
    missing = _MISSING.search(detail)
    if missing:
        param = f"{path}.{missing.group('field')}" if path else missing.group("field")
        return bad(param, f"Missing required parameter: '{param}'.")
    if not path:
        if detail.startswith("Expected `object`"):
            return bad(None, "Request body must be a JSON object.")
        return bad(None, f"Invalid request body: {detail}")
    return bad(path, f"Invalid value for '{path}': {detail}.")


def refuse(req: Any, allowed: dict[str, tuple[Any, ...]]) -> None:
    """400 "not supported" for each field of ``req`` set to something outside its allowed
    values."""
    for name, values in allowed.items():
        value = getattr(req, name)
        if not any(value == v and type(value) is type(v) for v in values):
            raise bad(name, f"{name} is not supported by this server")
