"""A lean streaming load client: keep-alive HTTP/1.1 over asyncio streams, SSE parsing, timings.

Lean on purpose: the client shares two cores with the fleet it measures, so every microsecond it
spends is taken from the fleet. One connection per concurrency slot, reused for every request.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import string
import time
from dataclasses import dataclass, field


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""
    start_index: int = -1  # order in which the request was sent (0 = first)
    # per-token gaps (ms): each streamed event's gap since the previous one, spread over its
    # characters (one token each on the shipped byte-level card)
    token_gaps_ms: list[float] = field(default_factory=list)

    @property
    def itl_s(self) -> float:
        return (
            (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else 0
        )


@dataclass
class LevelResult:
    concurrency: int
    results: list[RequestResult] = field(default_factory=list)
    wall_s: float = 0.0


def random_prompt(rng: random.Random, n_chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < n_chars:
        w = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:n_chars]


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def stream_completion(self, path: str, body: dict[str, object]) -> RequestResult:
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        t0 = time.perf_counter()
        self.writer.write(head + payload)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        chunked = False
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode().partition(":")
            if k.lower() == "transfer-encoding" and "chunked" in v.lower():
                chunked = True
            elif k.lower() == "content-length":
                length = int(v)
        if status != 200:
            data = await self.reader.readexactly(length) if length else b""
            return RequestResult(False, error=f"{status} {data[:200]!r}")
        res = RequestResult(True)
        buf = b""
        last = t0
        while chunked:
            size = int((await self.reader.readline()).strip(), 16)
            if size == 0:
                await self.reader.readline()
                break
            buf += await self.reader.readexactly(size)
            await self.reader.readexactly(2)
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                msg = json.loads(event[6:])
                if "error" in msg:
                    res.ok, res.error = False, str(msg["error"])
                    continue
                usage = msg.get("usage")
                if usage:
                    res.output_tokens = usage["completion_tokens"]
                    res.prompt_tokens = usage["prompt_tokens"]
                    details = usage.get("prompt_tokens_details") or {}
                    res.cached_tokens = details.get("cached_tokens", 0)
                for choice in msg.get("choices", ()):
                    delta = choice.get("delta") or {}
                    text = choice.get("text") or delta.get("content")
                    if not text:
                        continue
                    now = time.perf_counter()
                    if not res.ttft_s:
                        res.ttft_s = now - t0
                    else:
                        gap = (now - last) * 1000 / len(text)
                        res.token_gaps_ms.extend([gap] * len(text))
                    last = now
        res.e2e_s = time.perf_counter() - t0
        return res

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def stream_once(host: str, port: int, body: dict[str, object]) -> RequestResult:
    """One streamed completion on a connection of its own; a failed result when the connection
    fails."""
    conn = Connection(host, port)
    try:
        return await conn.stream_completion("/v1/completions", body)
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        return RequestResult(False, error=repr(exc))
    finally:
        conn.close()


async def run_level(
    url: str,
    model: str,
    concurrency: int,
    num_requests: int,
    prompt_chars: int,
    output_tokens: int,
    seed: int = 0,
    prompts: list[str] | list[list[dict[str, str]]] | None = None,
) -> LevelResult:
    """Closed loop: ``concurrency`` connections send ``prompts`` (strings to /v1/completions,
    message lists to /v1/chat/completions) until none is left."""
    host_port = url.split("://", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    rng = random.Random(seed)
    if prompts is None:
        prompts = [random_prompt(rng, prompt_chars) for _ in range(num_requests)]
    queue: asyncio.Queue[str | list[dict[str, str]]] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    level = LevelResult(concurrency)
    sent = itertools.count()

    async def slot() -> None:
        conn = Connection(host, int(port))
        try:
            while not queue.empty():
                prompt = queue.get_nowait()
                body: dict[str, object] = {
                    "model": model,
                    "max_tokens": output_tokens,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                if isinstance(prompt, str):
                    body["prompt"] = prompt
                    path = "/v1/completions"
                else:
                    body["messages"] = prompt
                    path = "/v1/chat/completions"
                index = next(sent)
                try:
                    res = await conn.stream_completion(path, body)
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    res = RequestResult(False, error=repr(exc))
                    conn.close()  # the connection's state is unknown: start a new one
                    conn = Connection(host, int(port))
                res.start_index = index
                level.results.append(res)
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(slot() for _ in range(concurrency)))
    level.wall_s = time.perf_counter() - t0
    return level


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def summarize(level: LevelResult) -> dict[str, float | int]:
    ok = [r for r in level.results if r.ok]
    ttft = [r.ttft_s * 1000 for r in ok]
    itl = [r.itl_s * 1000 for r in ok if r.output_tokens > 1]
    tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    return {
        "concurrency": level.concurrency,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": sum(r.cached_tokens for r in ok),
        "requests": len(level.results),
        "errors": len(level.results) - len(ok),
        "wall_s": round(level.wall_s, 3),
        "requests_per_s": round(len(ok) / level.wall_s, 1) if level.wall_s else 0.0,
        "output_tokens_per_s": round(tokens / level.wall_s, 1) if level.wall_s else 0.0,
        "ttft_ms_p50": round(percentile(ttft, 50), 2),
        "ttft_ms_p90": round(percentile(ttft, 90), 2),
        "ttft_ms_p99": round(percentile(ttft, 99), 2),
        "itl_ms_p50": round(percentile(itl, 50), 3),
        "itl_ms_p99": round(percentile(itl, 99), 3),
    }
