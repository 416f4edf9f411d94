"""The engine contract: what every engine does through the worker's ``workers.engine.Engine``,
one suite run unchanged against each (as ``kv_contract.py`` is for the prefix indexes).

A backend test module subclasses ``EngineContract`` and provides a ``started`` fixture: a
``Started`` (``Started.run``: the engine started with ``EngineHooks`` that record its KV events,
stopped at the end), usually shared by the class, since a real engine takes a while to start.
The tests keep out of each other's way on a shared engine: each uses its own request ids and
prompts (no prefix in common), and waits for its requests to end.

What every engine does:
- ``add_request``: outputs for that request, in order, the last one and only it ``finished``,
  carrying the prompt's length; nothing after it;
- ``max_tokens`` (with ``ignore_eos``): exactly that many tokens, ``"length"``;
- a ``seed`` repeats its tokens; another seed gives others;
- ``stop_token_ids``: the first one generated ends the request, itself included, ``"stop"``;
- ``abort``: True for a running request, whose sink gets one final ``"abort"`` output at once
  and nothing more; False for a request it does not hold;
- ``load()``: its engine step counter moves while it works, prompt tokens are counted, the
  sizes match the engine's attributes, nothing runs once all ended;
- ``lora_names()`` lists no adapter when none was loaded; ``control("health")`` is ok, an
  unknown op is not;
- KV events reach ``hooks.kv_events``: the prompt's full blocks as ``BlockStored`` (tokens as
  sent), and after ``clear_kv`` their removal (``AllBlocksCleared`` or ``BlockRemoved``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvCacheEvent
from schemas.requests import SamplingParams
from tests.support.engines import Sink
from tests.support.wait import wait_for
from workers.engine import Engine, EngineHooks, EngineRequest


@dataclass
class Started:
    """A started engine and what its hooks heard."""

    engine: Engine
    token_ids: tuple[int, ...]  # ids a prompt may use (the model's ordinary tokens)
    timeout_s: float = 60.0  # the longest a short request may take
    kv_events: list[KvCacheEvent] = field(default_factory=list)

    @classmethod
    @contextlib.asynccontextmanager
    async def run(
        cls, engine: Engine, token_ids: Sequence[int], timeout_s: float = 60.0
    ) -> AsyncIterator[Started]:
        started = cls(engine, tuple(token_ids), timeout_s)
        await engine.start(EngineHooks(started.kv_events.extend))
        try:
            yield started
        finally:
            await engine.stop()

    def prompt(self, n: int, salt: str) -> tuple[int, ...]:
        """``n`` token ids, the same for the same ``salt``, sharing no prefix with another's."""
        rng = random.Random(salt)
        return tuple(rng.choice(self.token_ids) for _ in range(n))

    def send(self, request_id: str, prompt: Sequence[int], **sampling: Any) -> Sink:
        sink = Sink()
        sp = SamplingParams(**({"max_tokens": 8, "ignore_eos": True} | sampling))
        self.engine.add_request(EngineRequest(request_id, tuple(prompt), sp), sink)
        return sink

    async def generate(self, request_id: str, prompt: Sequence[int], **sampling: Any) -> Sink:
        """One request to its end (``sampling``: over ``max_tokens=8, ignore_eos=True``)."""
        sink = self.send(request_id, prompt, **sampling)
        await asyncio.wait_for(sink.done.wait(), self.timeout_s)
        return sink


async def _settled(started: Started, sink: Sink) -> list[Any]:
    """``sink``'s outputs once the engine had time to send more (it must not)."""
    seen = len(sink.outputs)
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert len(sink.outputs) == seen, sink.outputs[seen:]
    return sink.outputs


def _blocks(events: Sequence[KvCacheEvent]) -> set[tuple[int, ...]]:
    """The token ids of every block the ``BlockStored`` events among ``events`` stored."""
    out = set()
    for e in events:
        if isinstance(e, BlockStored):
            bs = e.block_size
            out |= {tuple(e.token_ids[i * bs : (i + 1) * bs]) for i in range(len(e.block_hashes))}
    return out


class EngineContract:
    async def test_outputs_come_in_order_and_end_with_one_finished_output(
        self, started: Started
    ) -> None:
        prompt = started.prompt(2 * started.engine.block_size + 3, "order")
        sink = await started.generate("order-1", prompt, max_tokens=8)
        outputs = await _settled(started, sink)
        assert {o.request_id for o in outputs} == {"order-1"}
        assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]
        final = outputs[-1]
        assert final.finish_reason in ("length", "stop") and final.error is None
        assert final.num_prompt_tokens == len(prompt)
        assert 0 < len(sink.tokens) <= 8

    async def test_max_tokens_ends_the_request_with_length(self, started: Started) -> None:
        for max_tokens in (1, 5):
            sink = await started.generate(f"length-{max_tokens}", started.prompt(9, "length"),
                                          max_tokens=max_tokens)  # fmt: skip
            assert len(sink.tokens) == max_tokens
            assert sink.final is not None and sink.final.finish_reason == "length"

    async def test_a_seed_repeats_its_tokens(self, started: Started) -> None:
        prompt = started.prompt(11, "seed")
        runs = [
            (await started.generate(f"seed-{i}", prompt, max_tokens=12, seed=seed)).tokens
            for i, seed in enumerate((7, 7, 8))
        ]
        assert runs[0] == runs[1] and len(runs[0]) == 12
        assert runs[2] != runs[0]

    async def test_the_first_stop_token_generated_ends_the_request(self, started: Started) -> None:
        prompt = started.prompt(10, "stop")
        reference = (await started.generate("stop-ref", prompt, max_tokens=16, seed=11)).tokens
        token = reference[3]
        first = reference.index(token)
        sink = await started.generate(
            "stop-1", prompt, max_tokens=16, seed=11, stop_token_ids=(token,)
        )
        assert sink.tokens == reference[: first + 1]  # the stop token itself included
        assert sink.final is not None and sink.final.finish_reason == "stop"

    async def test_abort_ends_a_running_request_with_one_abort_output(
        self, started: Started
    ) -> None:
        engine = started.engine
        loop = asyncio.get_running_loop()
        aborted: list[bool] = []

        class AbortAtFirstToken(Sink):
            """Asks for the abort as a cancel would: from outside the engine's own call."""

            def on_output(self, output: Any) -> None:
                super().on_output(output)
                if len(self.outputs) == 1:
                    loop.call_soon(lambda: aborted.append(engine.abort("abort-1")))

        sink = AbortAtFirstToken()
        sp = SamplingParams(max_tokens=512, ignore_eos=True)
        engine.add_request(EngineRequest("abort-1", started.prompt(7, "abort"), sp), sink)
        await asyncio.wait_for(sink.done.wait(), started.timeout_s)
        outputs = await _settled(started, sink)
        assert aborted == [True]
        assert [o.finished for o in outputs].count(True) == 1
        assert outputs[-1].finish_reason == "abort" and len(sink.tokens) < 512
        assert engine.abort("abort-1") is False  # ended: nothing to abort
        assert engine.abort("never-added") is False

    async def test_load_counters_move_while_it_works(self, started: Started) -> None:
        engine = started.engine
        before = engine.load()
        prompt = started.prompt(engine.block_size + 5, "load")
        await started.generate("load-1", prompt, max_tokens=4)

        def moved() -> bool:
            now = engine.load()
            return (
                now.steps_total > before.steps_total
                and now.prompt_tokens_total >= before.prompt_tokens_total + len(prompt)
            )

        await wait_for(moved, timeout=started.timeout_s)
        load = engine.load()
        assert (load.max_num_seqs, load.block_size) == (engine.max_num_seqs, engine.block_size)
        assert load.num_gpu_blocks == engine.num_gpu_blocks > 0
        assert load.num_running == 0 and 0.0 <= load.kv_usage <= 1.0

    async def test_lora_names_health_and_an_unknown_op(self, started: Started) -> None:
        engine = started.engine
        assert engine.lora_names() == ()
        assert (await engine.control("health", {})).ok
        assert not (await engine.control("no_such_op", {})).ok

    async def test_kv_events_store_the_prompts_blocks_and_remove_them_on_clear_kv(
        self, started: Started
    ) -> None:
        bs = started.engine.block_size
        prompt = started.prompt(3 * bs + 1, "kv")
        blocks = {prompt[i * bs : (i + 1) * bs] for i in range(3)}
        await started.generate("kv-1", prompt, max_tokens=2)
        await wait_for(lambda: blocks <= _blocks(started.kv_events), timeout=started.timeout_s)
        stored = {
            h for e in started.kv_events if isinstance(e, BlockStored) for h in e.block_hashes
        }
        mark = len(started.kv_events)

        async def cleared() -> bool:  # refused while a block is still in use: try again
            return (await started.engine.control("clear_kv", {})).ok

        await wait_for(cleared, timeout=started.timeout_s, interval=0.2)

        def removed() -> bool:
            return any(
                isinstance(e, AllBlocksCleared)
                or (isinstance(e, BlockRemoved) and stored & set(e.block_hashes))
                for e in started.kv_events[mark:]
            )

        await wait_for(removed, timeout=started.timeout_s)
