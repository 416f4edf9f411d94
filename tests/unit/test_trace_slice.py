"""A Mooncake trace scaled down to a short-context model keeps its shape: shared blocks stay
shared word for word, lengths shrink by the block ratio, a slice starts where it is asked."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.trace_replay import load_trace

ROWS = [
    {"timestamp": 0, "input_length": 1500, "output_length": 320, "hash_ids": [0, 1, 2]},
    {"timestamp": 2000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 3]},
    {"timestamp": 9000, "input_length": 600, "output_length": 64, "hash_ids": [0, 4]},
]
WORDS = [f"w{i}" for i in range(100)]


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_the_trace_as_recorded(tmp_path: Path) -> None:
    full = load_trace(_trace(tmp_path), 60, WORDS, 1.0)
    assert [len(r.prompt.split()) for r in full] == [1500, 1100, 600]
    assert [r.output_tokens for r in full] == [320, 5, 64]


def test_scaled_to_blocks_of_32_the_shared_blocks_stay_shared(tmp_path: Path) -> None:
    reqs = load_trace(_trace(tmp_path), 60, WORDS, 0.5, block_tokens=32, max_prompt_tokens=60)
    words = [r.prompt.split() for r in reqs]
    assert [len(w) for w in words] == [60, 60, 38]  # 1500/16 = 94 and 1100/16 = 69: cut to 60
    assert words[0] == words[1]  # blocks 0 and 1, as far as they go
    assert words[2][:32] == words[0][:32] and words[2][32:] != words[0][32:38]  # 0, then 4
    assert [r.output_tokens for r in reqs] == [20, 1, 4]
    assert [r.at_s for r in reqs] == [0.0, 4.0, 18.0]  # at half speed


def test_a_later_slice(tmp_path: Path) -> None:
    reqs = load_trace(_trace(tmp_path), 5, WORDS, 1.0, start_s=1.5, max_output_tokens=3)
    assert [(r.at_s, r.output_tokens) for r in reqs] == [(0.5, 3)]


def test_one_conversation_in_n_keeps_all_its_turns(tmp_path: Path) -> None:
    turns = [(0, [0, 6, 7]), (1000, [0, 5]), (3000, [0, 6, 7, 8]), (4000, [0, 9])]
    path = tmp_path / "turns.jsonl"
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 512 * len(h), "output_length": 1,
                        "hash_ids": h}) + "\n"
            for t, h in turns
        )
    )  # fmt: skip
    reqs = load_trace(path, 60, WORDS, 1.0, keep_one_in=3)
    assert [r.at_s for r in reqs] == [0.0, 3.0, 4.0]  # both turns of block 6's, and block 9's
    assert reqs[1].prompt.startswith(reqs[0].prompt)
