"""Tool-call and reasoning parsers over captured model outputs: whole, and split at every character.

The outputs are in each family's own syntax, as the models write them (Qwen 2.5 / Hermes, Llama
3.1 JSON, Mistral's two forms, Qwen3-Coder, Llama 3.2 / 4 pythonic). A parser's answer must not
depend on how the text was cut into chunks: every case is fed whole, then cut in two at every
position, then one character at a time, and the content and calls must always be the same.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from model.card import REASONING_PARSERS, TOOL_CALL_PARSERS
from router.frontend.output import ChoiceOutput, Delta
from router.frontend.reasoning import ReasoningStream
from router.frontend.tool_parsers import PARSERS, ToolStream, tool_parser
from router.frontend.tools import plan_tools

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
}
TOOLS = [{"name": "get_weather", "parameters": WEATHER}, {"name": "search", "parameters": {}}]

# (parser, output text, expected content, expected [(name, arguments as a dict)])
CASES: list[tuple[str, str, str, list[tuple[str, dict[str, Any]]]]] = [
    # hermes (Qwen 2.5, Hermes 2 Pro)
    ("hermes", "Plain answer, no tools.", "Plain answer, no tools.", []),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
        "</tool_call>",
        "",
        [("get_weather", {"city": "Paris", "days": 2})],
    ),
    (
        "hermes",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "search", "arguments": {"q": "<tool_call>"}}\n'
        "</tool_call>",
        "Let me check.\n",
        [("get_weather", {"city": "Oslo"}), ("search", {"q": "<tool_call>"})],
    ),
    (  # cut off by max_tokens mid-call: an unterminated last call still parses when complete
        "hermes",
        '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}',
        "",
        [("search", {"q": "x"})],
    ),
    (  # not JSON: the text comes back as content, nothing lost
        "hermes",
        "Sure <tool_call>{not json</tool_call> done",
        "Sure <tool_call>{not json</tool_call> done",
        [],
    ),
    ("hermes", "a < b and <tool", "a < b and <tool", []),
    # llama3_json (Llama 3.1 / 3.2 JSON tool calling)
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Rome"}}',
        "",
        [("get_weather", {"city": "Rome"})],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "search", "parameters": {"q": "a"}}; '
        '{"name": "get_weather", "parameters": {"city": "Bern"}}',
        "",
        [("search", {"q": "a"}), ("get_weather", {"city": "Bern"})],
    ),
    ("llama3_json", "  The answer is 4.", "  The answer is 4.", []),
    ("llama3_json", '{"not": "a call"}', '{"not": "a call"}', []),
    # mistral: the array form and the v11 tokenizer form
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon"}}, '
        '{"name": "search", "arguments": {"q": "b"}}]',
        "",
        [("get_weather", {"city": "Lyon"}), ("search", {"q": "b"})],
    ),
    (
        "mistral",
        'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}[TOOL_CALLS]search[ARGS]{"q": 1}',
        "Checking.",
        [("get_weather", {"city": "Nice"}), ("search", {"q": 1})],
    ),
    ("mistral", "No call [TOOL_CALL", "No call [TOOL_CALL", []),
    # qwen3_coder: XML-ish, values typed by the tool's schema
    (
        "qwen3_coder",
        "I will look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "I will look.\n",
        [("get_weather", {"city": "San Jose", "days": 3})],
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=search>\n<parameter=q>\n[1, 2]\n</parameter>\n</function>\n"
        "</tool_call>",
        "",
        [("search", {"q": [1, 2]})],
    ),
    # pythonic (Llama 3.2 / 4)
    (
        "pythonic",
        '[get_weather(city="Kyiv", days=2), search(q="x y", opts={"a": [1, None, True]})]',
        "",
        [
            ("get_weather", {"city": "Kyiv", "days": 2}),
            ("search", {"q": "x y", "opts": {"a": [1, None, True]}}),
        ],
    ),
    (
        "pythonic",
        '<|python_start|>[search(q="z")]<|python_end|>',
        "",
        [("search", {"q": "z"})],
    ),
    ("pythonic", "[1, 2, 3] is a list", "[1, 2, 3] is a list", []),
    ("pythonic", "[os.system('rm -rf /')]", "[os.system('rm -rf /')]", []),  # never evaluated
]


def _cuts(text: str) -> list[list[str]]:
    """The text whole, in two at every position, and one character at a time."""
    return [[text], *([text[:i], text[i:]] for i in range(1, len(text))), list(text)]


def _run(parser: str, pieces: list[str]) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    stream = ToolStream(tool_parser(parser, TOOLS))
    content = "".join(stream.feed(p) for p in pieces)
    rest, calls = stream.finish()
    return content + rest, [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CASES)
def test_tool_calls_parse_the_same_however_the_text_is_cut(parser, text, content, calls):
    for pieces in _cuts(text):
        assert _run(parser, pieces) == (content, calls), pieces


def test_content_streams_out_before_the_marker_and_is_never_held_long():
    stream = ToolStream(tool_parser("hermes"))
    assert stream.feed("Hello wor") == "Hello wor"
    assert stream.feed("ld <tool") == "ld "  # "<tool" may start a marker: held
    assert stream.feed("s are fun") == "<tools are fun"  # it did not
    assert stream.feed(" <tool_call>{") == " "
    assert stream.feed('"name": "f"}</tool_call>') == ""
    assert stream.finish()[1][0].name == "f"


def test_every_parser_the_card_may_name_exists():
    assert set(PARSERS) == set(TOOL_CALL_PARSERS)
    with pytest.raises(ValueError, match="known: hermes"):
        tool_parser("nope")


# ------------------------------------------------------------------------------- reasoning
REASONING = [
    (
        "deepseek_r1",
        "<think>\nLet me see.\n</think>\n\nIt is 4.",
        "\nLet me see.\n",
        "\n\nIt is 4.",
    ),
    ("deepseek_r1", "Let me see.</think>It is 4.", "Let me see.", "It is 4."),  # template opened it
    ("deepseek_r1", "Still thinking when cut", "Still thinking when cut", ""),
    ("qwen3", "<think>a < b</think>Yes.", "a < b", "Yes."),
    ("qwen3", "No reasoning here.", "", "No reasoning here."),
    ("qwen3", "<thin", "", "<thin"),
    ("qwen3", "  <think>x</think>", "x", ""),
    ("qwen3", "<think>unclosed", "unclosed", ""),
]


@pytest.mark.parametrize(("parser", "text", "reasoning", "content"), REASONING)
def test_reasoning_splits_the_same_however_the_text_is_cut(parser, text, reasoning, content):
    for pieces in _cuts(text):
        stream = ReasoningStream(parser)
        fed = [stream.feed(p) for p in pieces] + [stream.finish()]
        assert ("".join(r for r, _ in fed), "".join(c for _, c in fed)) == (reasoning, content)


def test_every_reasoning_parser_the_card_may_name_exists():
    for name in REASONING_PARSERS:
        ReasoningStream(name)
    with pytest.raises(ValueError, match="known"):
        ReasoningStream("nope")


# --------------------------------------------------------------------- the whole pipeline
def test_reasoning_then_tool_calls_then_finish_reason():
    plan = plan_tools([{"type": "function", "function": t} for t in TOOLS], "auto", None)
    call = '<tool_call>{"name": "search", "arguments": {}}</tool_call>'
    text = f"<think>need weather</think>On it.{call}"
    for pieces in _cuts(text):
        out = ChoiceOutput(plan, "hermes", "qwen3")
        deltas = [out.feed(p) for p in pieces]
        tail, reason = out.finish("stop")
        deltas.append(tail)
        assert "".join(d.reasoning for d in deltas) == "need weather"
        assert "".join(d.content for d in deltas) == "On it."
        calls = [c for d in deltas for c in d.tool_calls]
        assert [(c.index, c.name, c.arguments) for c in calls] == [(0, "search", "{}")]
        assert reason == "tool_calls"


def test_parallel_tool_calls_false_keeps_the_first_parsed_call():
    tools = [{"type": "function", "function": t} for t in TOOLS]
    two = (
        '<tool_call>{"name": "search", "arguments": {"q": 1}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": {"q": 2}}</tool_call>'
    )
    for parallel, expected in ((None, 2), (True, 2), (False, 1)):
        out = ChoiceOutput(plan_tools(tools, "auto", parallel), "hermes")
        out.feed(two)
        tail, reason = out.finish("stop")
        assert [c.arguments for c in tail.tool_calls] == ['{"q": 1}', '{"q": 2}'][:expected]
        assert reason == "tool_calls"


@pytest.mark.parametrize("parser", REASONING_PARSERS)
def test_a_constrained_answer_is_content_unless_it_opens_a_think_block(parser):
    """A schema or a forced call is grammar from the first token: deepseek_r1's implicit
    reasoning start does not apply (else the whole JSON would be unfinished reasoning)."""
    named = plan_tools(
        [{"type": "function", "function": t} for t in TOOLS],
        {"type": "function", "function": {"name": "get_weather"}},
        None,
    )
    out = ChoiceOutput(named, None, parser, constrained=True)
    assert out.feed('{"city": "Paris"}') == Delta()
    tail, reason = out.finish("stop")
    assert (tail.reasoning, [c.name for c in tail.tool_calls], reason) == (
        "",
        ["get_weather"],
        "tool_calls",
    )
    schema = ChoiceOutput(None, None, parser, constrained=True)
    deltas = [schema.feed('{"a": 1}'), schema.finish("stop")[0]]
    assert "".join(d.content for d in deltas) == '{"a": 1}'
    assert "".join(d.reasoning for d in deltas) == ""
    thought = ChoiceOutput(None, None, parser, constrained=True)
    deltas = [thought.feed("<think>hm</think>yes"), thought.finish("stop")[0]]
    assert [("".join(d.reasoning for d in deltas)), "".join(d.content for d in deltas)] == [
        "hm",
        "yes",
    ]


def test_a_constrained_call_cut_by_length_is_content_not_a_call():
    plan = plan_tools(
        [{"type": "function", "function": t} for t in TOOLS],
        {"type": "function", "function": {"name": "get_weather"}},
        None,
    )
    out = ChoiceOutput(plan)
    assert not out.feed('{"city": "Par')
    tail, reason = out.finish("length")
    assert (tail.content, tail.tool_calls, reason) == ('{"city": "Par', [], "length")
    done = ChoiceOutput(plan)
    done.feed('{"city": "Paris"}')
    tail, reason = done.finish("stop")
    assert [(c.name, c.arguments) for c in tail.tool_calls] == [
        ("get_weather", '{"city": "Paris"}')
    ]
    assert reason == "tool_calls"


# ------------------------------------------------------------ what the cut tests leave open
def _one(parser: str, text: str, tools: list[dict[str, Any]] | None = None) -> Any:
    stream = ToolStream(tool_parser(parser, tools if tools is not None else TOOLS))
    content = stream.feed(text)
    rest, calls = stream.finish()
    return content + rest, [(c.name, c.arguments) for c in calls]


def test_qwen3_coder_types_values_by_the_schema_and_keeps_them_verbatim() -> None:
    tools = [
        {
            "name": "f",
            "parameters": {
                "properties": {
                    "zip": {"type": "string"},
                    "n": {"type": "integer"},
                    "note": {"type": "string"},
                }
            },
        }
    ]
    text = (
        "<tool_call>\n<function=f>\n<parameter=zip>\n01234\n</parameter>\n"
        "<parameter=n>\n7\n</parameter>\n<parameter=note>\n  Zürich, twice  \n</parameter>\n"
        "</function>\n</tool_call> after"
    )
    content, [(name, args)] = _one("qwen3_coder", text, tools)
    assert name == "f" and content == "after"
    # a string parameter that looks like a number stays a string; spaces and ü are kept
    assert args == '{"zip": "01234", "n": 7, "note": "  Zürich, twice  "}'


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', [("f", '{"a": 1}')]),
        (
            '<tool_call>{"name": "f", "arguments": {"city": "Zürich"}}</tool_call>',
            [("f", '{"city": "Zürich"}')],
        ),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', []),
        ('<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>', []),
        ('<tool_call>{"arguments": {}}</tool_call>', []),
    ],
)
def test_hermes_arguments_as_models_write_them(text: str, calls: list[Any]) -> None:
    content, got = _one("hermes", text)
    assert got == calls
    assert content == ("" if calls else text)  # a call that does not parse stays content


def test_reasoning_streams_content_at_once_and_only_the_first_end_closes_it() -> None:
    qwen = ReasoningStream("qwen3")
    assert qwen.feed("Hi") == ("", "Hi")  # not held: it cannot start "<think>"
    assert qwen.feed(" <think>") == ("", " <think>")  # once content, always content
    r1 = ReasoningStream("deepseek_r1")
    assert r1.feed("a</think>b</think>c") == ("a", "b</think>c")
    cut = ReasoningStream("deepseek_r1")
    assert cut.feed("<thi") == ("", "") and cut.finish() == ("<thi", "")


def test_the_smallest_valid_disagg_settings() -> None:
    from router.disagg import DisaggConfig

    cfg = DisaggConfig(isl_threshold=0, prefill_queue_limit=1, prefill_timeout_s=0.5)
    assert (cfg.isl_threshold, cfg.prefill_queue_limit, cfg.prefill_timeout_s) == (0, 1, 0.5)
