"""msgpack encoding of every wire struct (msgspec), and JSON for the human tools.

Decoders are built once per type. ``decode`` raises ``WireDecodeError`` for anything that is not a
valid message of the expected type or has an unknown schema version; consumers move such messages
to the dead-letter subject and go on.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import msgspec

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_json_encoder = msgspec.json.Encoder()
_decoders: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {}

# Highest schema version each decoder understands: the version this code writes (the default of
# the struct's ``v``); a newer message is refused, not misread.
MAX_VERSION = 1  # of structs without a ``v`` default
_max_versions: dict[type[Any], int] = {}


def max_version(typ: type[Any]) -> int:
    found = _max_versions.get(typ)
    if found is None:
        is_struct = isinstance(typ, type) and issubclass(typ, msgspec.Struct)
        fields = {f.name: f.default for f in msgspec.structs.fields(typ)} if is_struct else {}
        default = fields.get("v", MAX_VERSION)
        found = _max_versions[typ] = default if isinstance(default, int) else MAX_VERSION
    return found


class WireDecodeError(ValueError):
    """The payload is not a message this version of the fleet understands."""


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes, typ: type[T]) -> T:
    dec = _decoders.get(typ)
    if dec is None:
        dec = _decoders[typ] = msgspec.msgpack.Decoder(typ)
    try:
        msg = dec.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireDecodeError(f"{typ.__name__}: {exc}") from exc
    version = getattr(msg, "v", 1)
    if version > max_version(typ):
        raise WireDecodeError(f"{typ.__name__}: schema version {version} > {max_version(typ)}")
    return cast(T, msg)


def to_json(msg: object) -> bytes:
    return _json_encoder.encode(msg)


def to_builtins(msg: object) -> Any:
    return msgspec.to_builtins(msg)
