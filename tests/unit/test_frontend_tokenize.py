"""The frontend's tokenizer service: off the event loop, short prompts never behind long ones,
far-too-long prompts refused from a prefix, errors per prompt, cache counters."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from model.card import default_model_dir, load_model_dir
from model.tokenizer import ChatTemplateError, ModelTokenizer
from router.frontend.tokenize import (
    PromptTokenizer,
    PromptTooLong,
    TokenizeConfig,
    TokenizeMetrics,
)
from tests.support.tokenizers import trained_bpe, words_text


class CountingTokenizer(ModelTokenizer):
    """The shipped tokenizer, recording the characters each encode_batch call gets."""

    def __init__(self) -> None:
        m = load_model_dir(default_model_dir())
        super().__init__(m.tokenizer_json, m.chat_template, m.bos_token, m.eos_token)
        self.calls: list[int] = []

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        self.calls.append(sum(len(t) for t in texts))
        return super().encode_batch(texts, add_special_tokens)


@pytest.fixture
async def service():
    registry = CollectorRegistry()
    svc = PromptTokenizer(TokenizeConfig(), TokenizeMetrics(registry))
    svc.start()
    yield svc, registry
    await svc.stop()


async def test_short_prompts_pass_long_ones_and_the_loop_keeps_running(service) -> None:
    svc, _ = service
    tok = CountingTokenizer()
    long_text = "word " * 400_000  # ~400k tokens: about a second of tokenizing
    ticks = 0
    done_order: list[str] = []

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    async def run(name: str, text: str, size: int) -> None:
        await svc.tokenize("m", tok, lambda: text, 10_000_000, size)
        done_order.append(name)

    t = asyncio.create_task(ticker())
    long_job = asyncio.create_task(run("long", long_text, len(long_text)))
    await asyncio.sleep(0)  # the long one is queued first
    await run("short", "hello there", 11)
    ticks_when_short_done = ticks
    await long_job
    t.cancel()
    assert done_order == ["short", "long"]
    assert ticks > ticks_when_short_done + 5  # the loop ran while the long prompt was tokenized


@pytest.mark.parametrize(
    ("overtake_bytes_per_s", "order"),
    [(0.0, "shortest"), (TokenizeConfig().overtake_bytes_per_s, "shortest"), (1e15, "arrival")],
)
async def test_long_prompts_go_one_per_thread_the_shortest_first(
    overtake_bytes_per_s: float, order: str
) -> None:
    """One thread on the long lane, busy: four prompts queue behind it. Each then runs alone
    (not as one batch whose every prompt waits for all), the smallest first: prompts queued
    together (microseconds apart) are ordered by size at the default ageing rate; at a rate that
    makes a microsecond outweigh any size, by arrival."""
    cfg = TokenizeConfig(threads=1, overtake_bytes_per_s=overtake_bytes_per_s)
    svc = PromptTokenizer(cfg, TokenizeMetrics(CollectorRegistry()))
    svc.start()
    tok = CountingTokenizer()
    try:
        busy = "word " * 200_000
        first = asyncio.create_task(svc.tokenize("m", tok, lambda: busy, 10**7, len(busy)))
        await asyncio.sleep(0)  # it is on the thread: the next ones queue
        sizes = [90_000, 30_000, 60_000, 40_000]
        texts = ["x" * n for n in sizes]
        queued = [
            asyncio.create_task(svc.tokenize("m", tok, lambda t=t: t, 10**7, len(t))) for t in texts
        ]
        await asyncio.gather(first, *queued)
    finally:
        await svc.stop()
    expected = sorted(sizes) if order == "shortest" else sizes
    assert tok.calls[-5:] == [len(busy), *expected]  # (after the cache's probe checks)


async def test_a_far_too_long_prompt_is_refused_from_a_prefix(service) -> None:
    svc, _ = service
    tok = CountingTokenizer()
    text = "word " * 1_000_000  # 5 MB
    with pytest.raises(PromptTooLong) as err:
        await svc.tokenize("m", tok, lambda: text, 4096, len(text))
    assert err.value.at_least > 4096
    assert max(tok.calls) <= (4096 + 1) * 8  # never the whole 5 MB


async def test_a_prompt_near_the_context_is_tokenized_once(service) -> None:
    svc, _ = service
    tok = CountingTokenizer()
    text = "word " * 8_000  # 40 kB: past 8 chars a token of a 4096 context, below 16
    tokens = await svc.tokenize("m", tok, lambda: text, 4096, len(text))
    assert tokens == tok.encode(text)  # the caller refuses it with the exact count
    assert [n for n in tok.calls if n > 1000] == [len(text)]  # no probe of a prefix first


async def test_a_failing_render_fails_only_its_own_request(service) -> None:
    svc, _ = service
    tok = CountingTokenizer()

    def broken() -> str:
        raise ChatTemplateError("template says no")

    results = await asyncio.gather(
        svc.tokenize("m", tok, broken, 4096, 10),
        svc.tokenize("m", tok, lambda: "fine", 4096, 10),
        return_exceptions=True,
    )
    assert isinstance(results[0], ChatTemplateError)
    assert results[1] == tok.encode("fine")


async def test_repeated_conversations_count_cache_hits(service) -> None:
    svc, registry = service
    tok = CountingTokenizer()
    head = [{"role": "system", "content": "a long shared system prompt " * 50}]
    for i in range(3):
        msgs = [*head, {"role": "user", "content": f"question {i}"}]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True)
        assert await svc.tokenize("m", tok, lambda t=text: t, 4096, 100) == tok.encode(text)
    hits = registry.get_sample_value(
        "jetfleet_frontend_tokenizer_cache_segments_total", {"model": "m", "result": "hit"}
    )
    cached = registry.get_sample_value(
        "jetfleet_frontend_tokenizer_cached_tokens_total", {"model": "m"}
    )
    assert hits is not None and hits >= 4
    assert cached is not None and cached > 200


class PieceCounting(ModelTokenizer):
    """A BPE trained on words (a cut inside one changes its tokens), recording how many texts
    each encode_batch call gets."""

    def __init__(self) -> None:
        super().__init__(trained_bpe("byte-level").tokenizer.to_str())
        self.texts: list[int] = []

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        self.texts.append(len(texts))
        return super().encode_batch(texts, add_special_tokens)


@pytest.mark.parametrize(("threads", "split_chars", "pieces"), [(2, 32768, 2), (4, 32768, 4),
                         (4, 0, 1), (1, 32768, 1)])  # fmt: skip
async def test_a_long_prompt_is_tokenized_in_pieces_on_several_threads(
    threads: int, split_chars: int, pieces: int
) -> None:
    registry = CollectorRegistry()
    svc = PromptTokenizer(
        TokenizeConfig(threads=threads, split_chars=split_chars), TokenizeMetrics(registry)
    )
    tok = PieceCounting()
    text = words_text(40_000)  # ~260 kB
    try:
        tokens = await svc.tokenize("m", tok, lambda: text, 200_000, len(text))
    finally:
        await svc.stop()
    assert tokens == tok.encode(text)
    assert tok.texts[-1] == pieces  # after the checks on probes, the prompt: in this many pieces
    split = registry.get_sample_value(
        "jetfleet_frontend_tokenizer_split_prompts_total", {"model": "m"}
    )
    assert (split or 0) == (pieces > 1)
