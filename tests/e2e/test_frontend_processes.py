"""``jetfleet frontend --processes 2``: one port, both processes serve, /metrics sums them, a
dead process comes back; idle keep-alive connections outlive uvicorn's 5 s default."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import time

import httpx
import pytest

from tests.support.fleet import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"


def _ask(url: str) -> httpx.Response:
    with httpx.Client(timeout=30) as c:  # a new connection per request: the kernel picks
        return c.post(f"{url}/v1/completions", json={"model": M, "prompt": "hi", "max_tokens": 2})


def _children(parent_pid: int) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent_pid:
                out.append(int(pid))
    return out


def _requests_total(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    pattern = (
        r"jetfleet_frontend_requests_total"
        r'\{endpoint="completions",model="[^"]+",status="ok"\} (\S+)'
    )
    return sum(float(v) for v in re.findall(pattern, text))


async def test_two_processes_share_the_port_and_metrics(nats_server, tmp_path) -> None:
    f = Fleet(nats_server.url, tmp_path)
    try:
        f.add_worker()
        url = f.start_frontend("--router", "round-robin", "--processes", "2")
        parent = f.group.children["frontend"].proc.pid
        children = await wait_for(lambda: len(_children(parent)) == 2 and _children(parent), 30)
        for _ in range(20):
            assert _ask(url).status_code == 200
        # any process answers for both; a request is counted just after its response went out
        # (the other process can read the sum before, if this one is descheduled in between)
        await wait_for(lambda: _requests_total(url) == 20, 10)
        os.kill(children[0], signal.SIGKILL)
        await wait_for(lambda: len(set(_children(parent)) - set(children)) == 1, 30)
        await wait_for(lambda: httpx.get(f"{url}/ready", timeout=5).status_code == 200, 30)
        assert all(_ask(url).status_code == 200 for _ in range(10))
        code = f.group.stop("frontend", timeout_s=40)
        assert code == 0
        assert _children(parent) == []
    finally:
        f.stop()


def test_an_idle_keep_alive_connection_outlives_uvicorns_default(fleet) -> None:
    _idle_then_serve(fleet, 6.0)  # uvicorn's default closes at 5 s


@pytest.mark.slow
def test_a_pooled_connection_idle_80_s_serves_its_next_request(fleet) -> None:
    _idle_then_serve(fleet, 80.0)  # longer than an nginx (75 s) or ALB (60 s) idle timeout


def _idle_then_serve(fleet, idle_s: float) -> None:
    host, port = "127.0.0.1", int(fleet.base_url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection(host, port, timeout=30)
    body = '{"model": "jetfleet-tiny", "prompt": "hi", "max_tokens": 2}'
    headers = {"content-type": "application/json"}
    conn.request("POST", "/v1/completions", body, headers)
    assert conn.getresponse().read() and conn.sock is not None
    sock = conn.sock
    time.sleep(idle_s)  # the idle time is what is under test
    conn.request("POST", "/v1/completions", body, headers)
    r = conn.getresponse()
    assert r.status == 200 and r.read()
    assert conn.sock is sock  # the same connection, not a reconnect
    conn.close()


async def test_the_keep_alive_timeout_is_a_flag(nats_server, tmp_path) -> None:
    f = Fleet(nats_server.url, tmp_path)
    try:
        f.add_worker()
        url = f.start_frontend("--router", "round-robin", "--keep-alive", "1")
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(10)
            answer = b""
            while not answer.endswith(b"0\r\n\r\n"):  # the whole chunked response
                answer += s.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200")
            assert s.recv(4096) == b""  # then the server closed the idle connection
    finally:
        f.stop()
