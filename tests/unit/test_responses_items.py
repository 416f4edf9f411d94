"""Stored responses' items (pure): what a response's input is stored as, what a continuation
replays, how input_items pages; what a taken-over request continues with."""

from __future__ import annotations

from router.frontend.responses_api import ResponsesRequest, to_chat_request
from router.frontend.responses_items import conversation, input_items, page, replayed
from router.takeover import next_request
from schemas import Request, SamplingParams, TokenChunk
from schemas.token_reader import TokenReader


def test_a_text_input_is_stored_as_one_user_message_with_an_id() -> None:
    [item] = input_items("Hello", "resp_abc")
    assert item == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Hello"}],
        "id": "msg_inabc_0",
        "status": "completed",
    }


def test_a_continuation_replays_every_earlier_turn_then_the_new_input() -> None:
    first_in = input_items("What is 2+2?", "resp_1")
    first = {
        "output": [
            {"type": "reasoning", "id": "rs_1", "content": [{"type": "reasoning_text"}]},
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "4", "annotations": []}],
            },
        ]
    }
    second_in = input_items(
        [{"type": "function_call", "call_id": "c1", "name": "calc", "arguments": "{}"}], "resp_2"
    )
    second = {"output": []}
    history = conversation([(first_in, first), (second_in, second)])
    assert [i["type"] for i in history] == ["message", "message", "function_call"]
    assert replayed(first["output"]) == [first["output"][1]]  # reasoning is not sent back
    chat = to_chat_request(
        ResponsesRequest(model="m", input="And 3+3?", instructions="Be brief."), history
    )
    roles = [(m.role, m.content) for m in chat.messages]
    assert roles[:3] == [("system", "Be brief."), ("user", "What is 2+2?"), ("assistant", "4")]
    assert chat.messages[3].tool_calls is not None  # the earlier call
    assert roles[-1] == ("user", "And 3+3?")


def test_input_items_page_newest_first_by_default_and_after_a_cursor() -> None:
    items = [{"id": f"i{n}"} for n in range(5)]
    first = page(items, 2, "desc", None)
    assert [i["id"] for i in first["data"]] == ["i4", "i3"] and first["has_more"]
    rest = page(items, 10, "desc", first["last_id"])
    assert [i["id"] for i in rest["data"]] == ["i2", "i1", "i0"] and not rest["has_more"]
    assert [i["id"] for i in page(items, 2, "asc", "i2")["data"]] == ["i3", "i4"]


def _reader(*chunks: TokenChunk) -> TokenReader:
    reader = TokenReader()
    for c in chunks:
        reader.take(c)
    return reader


def test_a_taken_over_request_continues_from_its_answer_so_far() -> None:
    first = Request("r", "m", (1, 2, 3), SamplingParams(10, seed=4))
    so_far = _reader(TokenChunk("r", 0, 0, (7, 8)), TokenChunk("r", 0, 1, (9,)))
    nxt = next_request(first, so_far)
    assert nxt is not None
    assert nxt.token_ids == (1, 2, 3, 7, 8, 9) and nxt.num_generated_before == 3
    assert nxt.attempt == 1 and nxt.sampling.max_tokens == 7 and nxt.sampling.seed == 4
    migrated = _reader(TokenChunk("r", 2, 0, (5,), generated_before=0))
    assert next_request(first, migrated).attempt == 3  # after the newest attempt seen
    whole = _reader(TokenChunk("r", 0, 0, (7,), finish_reason="stop"))
    assert next_request(first, whole) is None
