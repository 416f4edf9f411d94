import pytest

from router.frontend.stops import StopMatcher


def run(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    m = StopMatcher(stops)
    out = []
    for p in pieces:
        out.append(m.feed(p))
        if m.stopped:
            break
    if not m.stopped:
        out.append(m.flush())
    return "".join(out), m.stopped


@pytest.mark.parametrize(
    ("stops", "pieces", "text", "stopped"),
    [
        ([], ["hello", " world"], "hello world", False),
        (["STOP"], ["abc", "dSTOPxyz"], "abcd", True),
        (["STOP"], ["abcST", "OPxyz"], "abc", True),  # stop string split across chunks
        (["STOP"], ["abcST", "x"], "abcSTx", False),  # a held partial match turns out plain
        (["STOP"], ["abcST"], "abcST", False),  # stream ends while holding: flushed
        (["\n\n", "END"], ["a\n", "\nb"], "a", True),
        (["ab", "b"], ["xab"], "x", True),  # earliest match wins
        (["S"], ["S"], "", True),
    ],
)
def test_stop_strings(stops, pieces, text, stopped):
    assert run(stops, pieces) == (text, stopped)


def test_holds_back_only_possible_prefixes():
    m = StopMatcher(["<end>"])
    assert m.feed("hello <e") == "hello "
    assert m.feed("x") == "<ex"
    assert not m.stopped
