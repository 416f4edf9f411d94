import dataclasses

from schemas import Request, SamplingParams
from workers.engine import EngineOutput, EngineRequest
from workers.request_state import ActiveRequest


def make(detok=None):
    flushes: list[bool] = []
    req = Request("r1", "m", (1, 2, 3), SamplingParams(max_tokens=4), attempt=2)
    ar = ActiveRequest(req, None, "w1", detok, lambda _ar, urgent: flushes.append(urgent), 0.0)
    return ar, flushes


def test_first_tokens_and_end_are_urgent_middle_ones_are_not():
    ar, flushes = make()
    ar.on_output(EngineOutput("r1", (10,), num_prompt_tokens=3, num_cached_tokens=2))
    ar.on_output(EngineOutput("r1", (11,)))
    ar.on_output(EngineOutput("r1", (12, 13), finished=True, finish_reason="length"))
    assert flushes == [True, False, True]


def test_chunks_are_indexed_coalesced_and_final_once():
    ar, _ = make(detok=lambda t: chr(t))
    ar.on_output(EngineOutput("r1", (104,), num_prompt_tokens=3, num_cached_tokens=2))
    c0 = ar.take_chunk()
    ar.on_output(EngineOutput("r1", (105,)))
    ar.on_output(EngineOutput("r1", (33,), finished=True, finish_reason="length"))
    c1 = ar.take_chunk()
    assert (c0.index, c0.token_ids, c0.text, c0.finish_reason) == (0, (104,), "h", None)
    assert (c1.index, c1.token_ids, c1.text, c1.finish_reason) == (1, (105, 33), "i!", "length")
    assert c1.attempt == 2 and c1.worker_id == "w1"
    assert c1.usage is not None
    assert (c1.usage.prompt_tokens, c1.usage.completion_tokens, c1.usage.cached_tokens) == (3, 3, 2)
    assert ar.final_sent and not ar.has_pending()


def test_outputs_after_finish_are_ignored():
    ar, flushes = make()
    ar.on_output(EngineOutput("r1", (), finished=True, finish_reason="abort"))
    ar.on_output(EngineOutput("r1", (5,)))
    assert ar.take_chunk().finish_reason == "abort"
    assert flushes == [True]


def test_flush_window_grows_with_the_batch_within_bounds():
    from pathlib import Path

    from workers.config import WorkerConfig

    cfg = WorkerConfig(
        "nats://x",
        Path("."),
        "m",
        flush_interval_s=0.005,
        max_flush_interval_s=0.02,
        flush_batch_unit=16,
    )
    assert [cfg.flush_window(n) for n in (0, 1, 16, 32, 64, 256)] == [
        0.005,
        0.005,
        0.005,
        0.01,
        0.02,
        0.02,
    ]


def test_kv_transfer_params_ride_the_final_chunk_over_the_wire():
    from schemas.codec import decode, encode
    from schemas.tokens import TokenChunk

    ar, _ = make()
    params = {"do_remote_prefill": True, "remote_block_ids": [4, 5], "remote_engine_id": "e1"}
    ar.on_output(EngineOutput("r1", (7,)))
    first = ar.take_chunk()
    ar.on_output(
        EngineOutput("r1", (), finished=True, finish_reason="length", kv_transfer_params=params)
    )
    final = decode(encode(ar.take_chunk()), TokenChunk)
    assert first.kv_transfer_params is None
    assert final.kv_transfer_params == params and final.v == 1


def test_logprobs_are_coalesced_with_their_tokens_and_the_prompts_go_out_once():
    from schemas import TokenLogprob

    req = Request("r1", "m", (1, 2), SamplingParams(max_tokens=3, logprobs=1, prompt_logprobs=0))
    ar = ActiveRequest(req, None, "w1", None, lambda _ar, urgent: None, 0.0)
    a, b, c = TokenLogprob(-0.1, (10,), (-0.1,)), TokenLogprob(-0.2), TokenLogprob(-0.3)
    prompt = (None, TokenLogprob(-1.0))
    ar.on_output(EngineOutput("r1", (10,), logprobs=(a,), prompt_logprobs=prompt))
    first = ar.take_chunk()
    ar.on_output(EngineOutput("r1", (11,), logprobs=(b,)))
    ar.on_output(EngineOutput("r1", (12,), finished=True, finish_reason="length", logprobs=(c,)))
    second = ar.take_chunk()
    assert (first.token_ids, first.logprobs, first.prompt_logprobs) == ((10,), (a,), prompt)
    assert (second.token_ids, second.logprobs, second.prompt_logprobs) == ((11, 12), (b, c), None)
    plain, _ = make()
    plain.on_output(EngineOutput("r1", (10,), logprobs=(a,)))  # not asked: not sent
    assert plain.take_chunk().logprobs is None


def test_an_engine_request_carries_every_field_it_shares_with_the_wire_request():
    """``EngineRequest.from_request`` is the one copy of a ``Request`` into the engine's view: a
    field added to ``EngineRequest`` and not copied fails here."""
    req = Request(
        "r1", "m", (1, 2, 3), SamplingParams(max_tokens=4, seed=7), attempt=2,
        num_generated_before=1, lora_name="sql", task="embed", dimensions=8,
        prompt_embeds=b"tensor", kv_transfer_params={"do_remote_decode": True},
    )  # fmt: skip
    engine_request = EngineRequest.from_request(req)
    for field in dataclasses.fields(EngineRequest):
        assert getattr(engine_request, field.name) == getattr(req, field.name), field.name


def test_an_output_is_held_for_the_window_only_when_more_may_join_it():
    from pathlib import Path

    from workers.config import WorkerConfig

    cfg = WorkerConfig("nats://x", Path("."), "m", flush_interval_s=0.005)
    assert cfg.flush_delay(4, urgent=True, gap_s=0.0001) == 0.0  # a first token, an end
    assert cfg.flush_delay(4, urgent=False, gap_s=0.0001) == 0.005  # fast steps: coalesce
    assert cfg.flush_delay(4, urgent=False, gap_s=0.0064) == 0.0  # real time: nothing to join
    assert cfg.flush_delay(64, urgent=False, gap_s=0.0064) == 0.02  # a big batch's window
    assert cfg.flush_delay(64, urgent=False, gap_s=0.03) == 0.0


def test_a_migrated_attempt_says_on_its_first_chunk_what_it_continues_from():
    moved = Request(
        "r1", "m", (1, 2, 3, 7, 8), SamplingParams(max_tokens=4), attempt=1, num_generated_before=2
    )
    ar = ActiveRequest(moved, None, "w1", None, lambda _ar, urgent: None, 0.0)
    ar.on_output(EngineOutput("r1", (9,), num_prompt_tokens=5))
    first = ar.take_chunk()
    ar.on_output(EngineOutput("r1", (10,), finished=True, finish_reason="length"))
    second = ar.take_chunk()
    assert (first.generated_before, second.generated_before) == (2, None)
    fresh, _ = make()  # attempt 2 of a request that had generated nothing: 0, stated
    fresh.on_output(EngineOutput("r1", (10,), num_prompt_tokens=3))
    assert fresh.take_chunk().generated_before == 0
    first_try = ActiveRequest(
        Request("r2", "m", (1,), SamplingParams(max_tokens=1)), None, "w1", None,
        lambda _ar, urgent: None, 0.0,
    )  # fmt: skip
    first_try.on_output(EngineOutput("r2", (5,), num_prompt_tokens=1))
    assert first_try.take_chunk().generated_before is None  # attempt 0: nothing to say
