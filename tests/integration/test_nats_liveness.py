"""A NATS server that stops answering (paused, or cut off by a partition: TCP still looks up) is
given up within seconds by every component's client (``base.connect.watch_liveness``), which
then reconnects; nats-py's own stale check takes a minute (ping 20 s x 3 outstanding)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from base.connect import close_nats, connect_nats
from infra.embedded import EmbeddedNats
from tests.support.wait import wait_for


async def test_a_silent_server_is_given_up_within_seconds(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path, port=0)
    server.start()
    nc = await connect_nats(server.url, "test-liveness")
    try:
        await nc.flush()
        os.kill(server.pid, signal.SIGSTOP)  # the process stops; its sockets stay open
        paused_at = time.monotonic()
        try:
            await wait_for(lambda: not nc.is_connected, timeout=20, interval=0.1)
            given_up_s = time.monotonic() - paused_at
        finally:
            os.kill(server.pid, signal.SIGCONT)
        await wait_for(lambda: nc.is_connected, timeout=20, interval=0.1)
        await nc.flush(timeout=5)
        print(f"\nsilent server given up after {given_up_s:.1f} s, then reconnected")
        assert given_up_s < 10
    finally:
        await close_nats(nc)
        server.stop()


async def test_a_ping_lost_with_the_old_connection_does_not_sever_the_new_one(
    tmp_path: Path,
) -> None:
    """The server stops with a PING of the watchdog unanswered, dies and comes back: the client
    reconnects at once, and the PING's timeout, seconds later, must not be taken for silence
    of the new connection (it was: a second, needless reconnect, with its outage)."""
    server = EmbeddedNats(tmp_path, port=0)
    server.start()
    nc = await connect_nats(server.url, "test-liveness")
    try:
        await nc.flush()
        os.kill(server.pid, signal.SIGSTOP)  # the next PING goes unanswered
        await asyncio.sleep(2.0)  # deliberate: a PING is sent into the stopped server
        assert server.proc is not None
        server.proc.kill()
        server.proc.wait()
        server.proc = None
        server.start()  # same port, same store
        await wait_for(lambda: nc.is_connected and nc.stats["reconnects"] == 1, 20, 0.1)
        await asyncio.sleep(8.0)  # deliberate: past the lost PING's timeout (5 s)
        assert nc.is_connected and nc.stats["reconnects"] == 1, nc.stats
    finally:
        await close_nats(nc)
        server.stop()


async def test_a_pong_that_comes_after_its_flush_timed_out_does_not_stop_the_client(
    tmp_path: Path,
) -> None:
    """nats-py 2.16 leaves a timed-out flush's cancelled future among its PONG waiters; the late
    PONG made its read loop stop for good (no reads, no reconnect: a worker paused for a few
    seconds kept a dead connection until it was drained). ``connect_nats`` guards it."""
    server = EmbeddedNats(tmp_path, port=0)
    server.start()
    nc = await connect_nats(server.url, "test-liveness", silent_after_s=None)  # no watchdog
    other = await connect_nats(server.url, "test-liveness-publisher", silent_after_s=None)
    try:
        sub = await nc.subscribe("late.pong")
        await nc.flush()
        await nc.flush()
        os.kill(server.pid, signal.SIGSTOP)  # the next PING is answered only when it resumes
        try:
            stat = Path(f"/proc/{server.pid}/stat")
            await wait_for(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "T", 5, 0.01)
            try:
                await nc.flush(timeout=0.3)  # type: ignore[arg-type]
            except Exception as exc:
                assert type(exc).__name__ == "FlushTimeoutError", exc
            else:
                raise AssertionError("a stopped server answered a PING")
        finally:
            os.kill(server.pid, signal.SIGCONT)  # the late PONG comes now
        await other.publish("late.pong", b"still reading")
        await other.flush()
        msg = await sub.next_msg(timeout=5)  # the read loop is alive: the message is read
        assert msg.data == b"still reading"
        await nc.flush(timeout=5)  # and PINGs are answered again
    finally:
        await close_nats(other)
        await close_nats(nc)
        server.stop()
