"""The mocker's timing model: Dynamo's polynomial fits, combined per step as Dynamo's mocker does
(prefill summed per prefilling sequence, plus one decode pass when any sequence samples)."""

from __future__ import annotations

import pytest

from tests.unit.mocker_utils import make_request, make_scheduler, prompt
from workers.engines.mocker.timing import decode_ms, prefill_ms, step_ms


@pytest.mark.parametrize(
    ("tokens", "ms"),
    [
        (0, 0.0),
        (-5, 0.0),
        (1, 4.209989e-07 + 1.518344e-02 + 16.50142),
        (1000, 32.1058589),  # the value Dynamo's own tests pin
        (8192, 4.209989e-07 * 8192**2 + 1.518344e-02 * 8192 + 16.50142),
    ],
)
def test_prefill_ms(tokens: int, ms: float) -> None:
    assert prefill_ms(tokens) == pytest.approx(ms, rel=1e-9)


@pytest.mark.parametrize(
    ("usage", "ms"),
    [
        (0.0, 5.74),
        (0.5, 26.31),
        (1.0, -25.74 + 54.01 + 5.74),
        (-1.0, 5.74),  # clamped to 0..1
        (3.0, -25.74 + 54.01 + 5.74),
    ],
)
def test_decode_ms(usage: float, ms: float) -> None:
    assert decode_ms(usage) == pytest.approx(ms)
    assert decode_ms(usage) >= 1.0


@pytest.mark.parametrize(
    ("chunks", "sampled", "usage", "ms"),
    [
        ([], False, 0.5, 0.0),
        ([], True, 0.5, decode_ms(0.5)),
        ([100], False, 0.2, prefill_ms(100)),
        ([100, 50], True, 0.2, prefill_ms(150) + decode_ms(0.2)),  # one pass: one constant
        ([512] * 15, True, 0.0, prefill_ms(7680) + decode_ms(0.0)),  # Dynamo 1.6.1: ~163 ms
        ([0], True, 0.0, decode_ms(0.0)),
    ],
)
def test_step_ms_prices_the_pass_prefill_once_and_one_decode(
    chunks: list[int], sampled: bool, usage: float, ms: float
) -> None:
    assert step_ms(chunks, sampled, usage) == pytest.approx(ms)


def test_scheduler_step_uses_the_model() -> None:
    sched = make_scheduler(num_gpu_blocks=100, max_num_batched_tokens=64)
    sched.add_request(make_request("a", prompt(39, 0)))
    sched.add_request(make_request("b", prompt(10, 500)))
    first = sched.step()  # both prefill completely, both sample their first token
    usage = (10 + 3) / 100  # ceil(39/4) + ceil(10/4) blocks
    assert first.num_prefill_tokens == 49
    assert first.simulated_ms == pytest.approx(prefill_ms(49) + decode_ms(usage))
    second = sched.step()  # decode only: one token each, no new block needed
    assert second.num_prefill_tokens == 0 and second.num_decode_seqs == 2
    assert second.simulated_ms == pytest.approx(decode_ms(usage))


def test_prefill_chunk_without_a_token_costs_no_decode() -> None:
    sched = make_scheduler(max_num_batched_tokens=16)
    sched.add_request(make_request("a", 40))
    result = sched.step()
    assert result.outputs == []
    assert result.simulated_ms == pytest.approx(prefill_ms(16))


def test_idle_step_costs_nothing() -> None:
    result = make_scheduler().step()
    assert result.simulated_ms == 0.0 and result.outputs == [] and result.preempted == ()
