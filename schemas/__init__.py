"""The wire contract of a jetfleet: structs, subjects, streams, block hashing.

Nothing here does I/O or imports a transport client.
"""

from schemas.codec import WireDecodeError, decode, encode, to_builtins, to_json
from schemas.control import ControlReply, ControlRequest, DeadLetter
from schemas.discovery import ModelCard, WorkerRegistration, WorkerRole, WorkerStatus
from schemas.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlocksSnapshot,
    BlockStored,
    IndexSnapshot,
    KvEventBatch,
    ShapeChanged,
    SlotTableSnapshot,
)
from schemas.metrics import HeldRequests, RequestObservation, WorkerLoad
from schemas.requests import (
    CancelRequested,
    Request,
    RouteCandidate,
    RouteDecision,
    SamplingParams,
    StructuredOutput,
)
from schemas.scaling import ScalingDecided, ScalingDecision, ScalingStatus
from schemas.subjects import DEFAULT_PREFIX, Subjects, model_token
from schemas.tokens import TokenChunk, TokenLogprob, Usage

__all__ = [
    "DEFAULT_PREFIX",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "BlocksSnapshot",
    "CancelRequested",
    "ControlReply",
    "ControlRequest",
    "DeadLetter",
    "HeldRequests",
    "IndexSnapshot",
    "KvEventBatch",
    "ModelCard",
    "Request",
    "RequestObservation",
    "RouteCandidate",
    "RouteDecision",
    "SamplingParams",
    "ScalingDecided",
    "ScalingDecision",
    "ScalingStatus",
    "ShapeChanged",
    "SlotTableSnapshot",
    "StructuredOutput",
    "Subjects",
    "TokenChunk",
    "TokenLogprob",
    "Usage",
    "WireDecodeError",
    "WorkerLoad",
    "WorkerRegistration",
    "WorkerRole",
    "WorkerStatus",
    "decode",
    "encode",
    "model_token",
    "to_builtins",
    "to_json",
]
