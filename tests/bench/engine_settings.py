"""The settings a vLLM engine actually ran with, read from its own log (so a comparison of
systems that each start vLLM their own way checks what each engine did, not what was asked).

vLLM's engine core logs ``Initializing a V1 LLM engine (vX) with config: ...`` (release, dtype,
context, eager mode, prefix caching, chunked prefill), and ``... KV cache size: N tokens``; at
``VLLM_LOGGING_LEVEL=DEBUG`` also the scheduler limits it settled on when they were left to its
defaults (``Defaulting max_num_seqs to N``, ``Defaulting max_num_batched_tokens to N``: these are
what differ between a library caller and vLLM's own server, by usage context). The block size is
not in vLLM's log: each system passes ``--block-size``. jetfleet's worker logs what vLLM settled
on (``vllm_started``: block size, scheduler limits, threads), given or defaulted.
"""

from __future__ import annotations

import re
from typing import Any

_CONFIG = re.compile(r"Initializing a V1 LLM engine \(v([^)\s]+)\) with config: (.*)")
_KEYS = ("dtype", "max_seq_len", "enforce_eager", "enable_prefix_caching", "enable_chunked_prefill")
_KV = re.compile(r"KV cache size: ([\d,]+) tokens")
_DEFAULTED = re.compile(r"Defaulting (max_num_seqs|max_num_batched_tokens) to (\d+)")
_JETFLEET = re.compile(r'^.*"event": "vllm_started".*$', re.M)


def engine_settings(log: str) -> dict[str, Any]:
    """What one engine's log says about its settings (keys absent when it does not say)."""
    out: dict[str, Any] = {}
    config = _CONFIG.search(log)
    if config:
        out["vllm_version"] = config.group(1)
        for key in _KEYS:
            found = re.search(rf"\b{key}=([^,]+)", config.group(2))
            if found:
                out[key] = found.group(1).removeprefix("torch.")
    kv = _KV.search(log)
    if kv:
        out["kv_cache_tokens"] = int(kv.group(1).replace(",", ""))
    for key, value in _DEFAULTED.findall(log):
        out[key] = int(value)
    started = _JETFLEET.search(log)
    if started:
        for key in ("block_size", "max_num_seqs", "max_num_batched_tokens", "cpu_threads"):
            found = re.search(rf'"{key}": "?(\d+)', started.group(0))
            if found:
                out[key] = int(found.group(1))
    return out


def differences(by_system: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The settings whose values are not the same on every system that reports them."""
    keys = sorted({k for s in by_system.values() for k in s})
    out = {}
    for key in keys:
        values = {name: s[key] for name, s in by_system.items() if key in s}
        if len(set(map(str, values.values()))) > 1:
            out[key] = values
    return out
