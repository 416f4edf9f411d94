"""The real-engine benchmark reads each engine's settings from its own log."""

from __future__ import annotations

from tests.bench.engine_settings import differences, engine_settings

VLLM_LOG = """
(EngineCore pid=1) INFO 11-28 20:01:02 [core.py:134] Initializing a V1 LLM engine (v0.31.0) with \
config: model='/m', speculative_config=None, tokenizer='/m', dtype=torch.float32, \
max_seq_len=4096, enforce_eager=True, kv_cache_dtype=auto, enable_prefix_caching=True, \
enable_chunked_prefill=True, pooler_config=None
(EngineCore pid=1) DEBUG 11-28 20:01:01 [arg_utils.py:3172] Defaulting max_num_batched_tokens to \
4096 for openai-api-server usage context.
(EngineCore pid=1) DEBUG [arg_utils.py:3182] Defaulting max_num_seqs to 256 for None usage context.
(EngineCore pid=1) INFO [kv_cache_utils.py:2327] CPU KV cache size: 58,240 tokens, Maximum \
concurrency for 4,096 tokens per request: 14.22x
"""
JETFLEET_LINE = (
    '{"model": "/m", "vllm": "0.32.0", "num_gpu_blocks": 1820, "block_size": 32, '
    '"max_num_seqs": 256, "max_num_batched_tokens": 2048, "cpu_threads": "2", '
    '"event": "vllm_started", "level": "info"}'
)


def test_an_engines_log_gives_its_settings() -> None:
    assert engine_settings(VLLM_LOG) == {
        "vllm_version": "0.31.0",
        "dtype": "float32",
        "max_seq_len": "4096",
        "enforce_eager": "True",
        "enable_prefix_caching": "True",
        "enable_chunked_prefill": "True",
        "kv_cache_tokens": 58240,
        "max_num_batched_tokens": 4096,
        "max_num_seqs": 256,
    }
    assert engine_settings(JETFLEET_LINE) == {
        "block_size": 32,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 2048,
        "cpu_threads": 2,
    }
    assert engine_settings("nothing here") == {}


def test_only_the_settings_that_differ_are_reported() -> None:
    found = differences(
        {
            "vllm": {"dtype": "float32", "max_num_seqs": 256},
            "dynamo": {"dtype": "float32", "max_num_seqs": 1024},
            "jetfleet": {"dtype": "float32"},
        }
    )
    assert found == {"max_num_seqs": {"vllm": 256, "dynamo": 1024}}
