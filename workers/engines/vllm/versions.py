"""What changed in which vLLM release, for the parts of vLLM this adapter touches. Pure.

Every fact below was read off vLLM's published wheels (the release's own source files); the
compatibility tests (``tests/vllm_compat/``) load those files for the oldest supported release,
the last one before 0.26 and the latest, and drive them against this adapter. The engine asks
``features(version)`` whether a reset reports its outcome and whether sleep resets the cache,
instead of guessing from what a call returns. The two wire facts (events as maps, replay replies
with a topic) are not consulted at run time: the decoder reads both forms of each, and the tests
check the table against each release.

==========  ===========================================================================
release     change
==========  ===========================================================================
0.10.0      floor (``vllm>=0.10``): V1 ``AsyncLLM``; ``SchedulerStats.kv_cache_usage``;
            KV events array-encoded (``array_like``), ``BlockStored`` has ``lora_id`` and no
            ``medium``; ``AsyncLLM.sleep`` does not reset the prefix cache (level 1 leaves stale
            entries, no ``AllBlocksCleared``); ``reset_prefix_cache`` returns ``None`` (a refusal
            while blocks are in use is only a warning in vLLM's log)
0.10.1      ``AsyncLLM.sleep`` resets the prefix cache first
0.10.2      ``medium`` on ``BlockStored``/``BlockRemoved``
0.11.0      ``SamplingParams.structured_outputs`` (``StructuredOutputsParams``) replaces
            ``guided_decoding`` (``GuidedDecodingParams``, same fields; removed in 0.12)
0.11.2      ``EngineArgs.kv_offloading_size`` / ``kv_offloading_backend`` (a host-memory KV
            tier; absent in 0.10.1, the release before it that was checked)
0.12.0      ``reset_prefix_cache`` returns ``bool`` (False: blocks in use, nothing reset)
0.14.0      ``lora_name`` on ``BlockStored``
0.17.0      ``extra_keys`` (per-block LoRA name, multimodal ids, cache salt)
0.20.0      ``group_idx``; ``sleep(level, mode)`` pauses the scheduler and clears the cache
0.22.0      ``kv_cache_spec_kind``, ``kv_cache_spec_sliding_window``
0.24.0      events map-encoded (the tag under ``"type"``); the batch stays an array
0.26.0      replay replies carry the topic: ``[b"", topic, seq, payload]``, end marker
            ``[b"", b"", -1, b""]`` (before: ``[b"", seq, payload]`` and ``[b"", -1, b""]``);
            ``locality`` on events
0.29.0      ``ownership``; 0.30.0 ``session_id``; 0.33.0 ``lookahead_token_ids``;
            ``AsyncLLM.get_num_unfinished_requests`` (0.29.0; the worker's health reports it)
==========  ===========================================================================

Unchanged over the whole range: the PUB frames ``[topic, seq (8 B big-endian), payload]``, the
replay request ``[b"", start seq]``, ``AsyncLLM.from_engine_args``, ``generate``, ``abort``,
``check_health``, ``add_lora``/``remove_lora``/``list_loras``, ``wake_up(tags)``,
``collective_rpc("reload_weights")`` (the worker method that reloads weights after a level-2
sleep), ``vllm_config.cache_config.block_size``/``num_gpu_blocks``, ``RequestOutput.
kv_transfer_params`` and ``SamplingParams.extra_args``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Version = tuple[int, int, int]

FLOOR: Version = (0, 10, 0)  # pyproject.toml: vllm>=0.10
SLEEP_RESETS_CACHE: Version = (0, 10, 1)
STRUCTURED_OUTPUTS: Version = (0, 11, 0)
KV_OFFLOADING: Version = (0, 11, 2)
RESET_RETURNS_BOOL: Version = (0, 12, 0)
EVENTS_AS_MAPS: Version = (0, 24, 0)
REPLAY_WITH_TOPIC: Version = (0, 26, 0)
COUNTS_UNFINISHED: Version = (0, 29, 0)

# The compatibility tests run against these releases' own source files.
TESTED_RELEASES = ("0.10.0", "0.25.1", "0.33.0")


def parse_version(text: str) -> Version:
    """``"0.11.2"``, ``"0.10.1.1"``, ``"0.26.0rc1+cu129"``, ``"0.27.0.dev12+g..."`` ->
    ``(major, minor, patch)``. A version that is not ``N.N[.N]...`` raises ``ValueError``."""
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        raise ValueError(f"not a vLLM version: {text!r}")
    return int(m[1]), int(m[2]), int(m[3] or 0)


@dataclass(frozen=True, slots=True)
class VllmFeatures:
    version: Version
    sleep_resets_cache: bool  # AsyncLLM.sleep resets the prefix cache itself
    reset_returns_bool: bool  # reset_prefix_cache says whether it reset anything
    events_as_maps: bool  # event structs map-encoded (the decoder reads both anyway)
    replay_with_topic: bool  # replay replies carry the topic frame
    structured_outputs: bool  # SamplingParams(structured_outputs=...), else guided_decoding=
    counts_unfinished: bool  # AsyncLLM.get_num_unfinished_requests()

    @property
    def label(self) -> str:
        return ".".join(map(str, self.version))


def features(version: str | Version) -> VllmFeatures:
    """The facts above for one release; below the floor raises ``ValueError``."""
    v = parse_version(version) if isinstance(version, str) else version
    if v < FLOOR:
        raise ValueError(
            f"vLLM {'.'.join(map(str, v))} is older than the supported floor "
            f"{'.'.join(map(str, FLOOR))} (pip install 'vllm>=0.10')"
        )
    return VllmFeatures(
        version=v,
        sleep_resets_cache=v >= SLEEP_RESETS_CACHE,
        reset_returns_bool=v >= RESET_RETURNS_BOOL,
        events_as_maps=v >= EVENTS_AS_MAPS,
        replay_with_topic=v >= REPLAY_WITH_TOPIC,
        structured_outputs=v >= STRUCTURED_OUTPUTS,
        counts_unfinished=v >= COUNTS_UNFINISHED,
    )
