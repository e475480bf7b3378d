"""Slow clients against the listeners' watcher (numad.daemon.listener; issue 24 item 10).

Before, a worker read each request head: 30 connections trickling a byte at a time
held the metrics listener's 4 workers and filled its queue of 8 until their deadline,
and a scrape meanwhile was answered 503. Now the watcher reads heads itself and cuts
one off ``deadline`` seconds after its first byte however steadily it trickles: the
workers stay free. The metrics listener runs in this process on loopback TCP with its
production workers and queue; times are checked against the limits it is given.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pytest

from numad.daemon.listener import HEAD_LIMIT, Limits
from numad.daemon.metrics import METRICS_LIMITS, Metrics, MetricsServer

TRICKLERS = 30
# The production shape (4 workers, 8 queued); a short deadline keeps the test short.
LIMITS = replace(METRICS_LIMITS, deadline=3.0)
EVERY = LIMITS.deadline / 6  # each trickler sends a byte this often: never idle that long
SLACK = 1.0  # seconds a loaded machine may take to notice a close
SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


@contextmanager
def _metrics(limits: Limits) -> Iterator[tuple[MetricsServer, Metrics]]:
    metrics = Metrics()
    server, accept = metrics.serve("127.0.0.1", 0, limits)
    try:
        yield server, metrics
    finally:
        server.shutdown()
        accept.join(5)


def _scrape(port: int) -> tuple[int, float]:
    """The status of one scrape on its own connection, and the seconds it took."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(SCRAPE)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ")[1]), time.monotonic() - start


@dataclass
class _Trickler:
    sock: socket.socket
    first: float = 0.0  # when its first byte went
    closed: float = 0.0  # seconds from its first byte to the server's close
    answer: bytes = b""  # what the server answered, if anything (before: a 503)


def _send(trickler: _Trickler, byte: int) -> None:
    try:
        trickler.sock.send(bytes([byte]))
    except OSError:  # reset or broken pipe: closed
        trickler.closed = time.monotonic() - trickler.first
    else:
        trickler.first = trickler.first or time.monotonic()


def _notice_closes(tricklers: list[_Trickler], wait: float) -> None:
    """Wait up to ``wait`` seconds for the server to close or answer open tricklers."""
    open_ = {t.sock: t for t in tricklers if not t.closed}
    readable, _, _ = select.select(list(open_), [], [], wait)
    for sock in readable:
        trickler = open_[sock]
        with contextlib.suppress(OSError):
            if data := sock.recv(65536):
                trickler.answer += data
                continue
        trickler.closed = time.monotonic() - trickler.first


def test_thirty_tricklers_neither_starve_a_scrape_nor_outlive_the_deadline() -> None:
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * HEAD_LIMIT
    latencies: list[float] = []
    with _metrics(LIMITS) as (server, metrics):
        port = server.server_port
        tricklers = [
            _Trickler(socket.create_connection(("127.0.0.1", port), timeout=5))
            for _ in range(TRICKLERS)
        ]
        try:
            until = time.monotonic() + LIMITS.deadline + EVERY + SLACK
            for byte in head:
                if time.monotonic() > until or all(t.closed for t in tricklers):
                    break
                for trickler in tricklers:
                    if not trickler.closed:
                        _send(trickler, byte)
                _notice_closes(tricklers, EVERY / 2)
                if any(not t.closed for t in tricklers):
                    status, took = _scrape(port)  # while every trickler is mid-head
                    assert status == 200, f"a scrape got {status} beside {TRICKLERS} tricklers"
                    latencies.append(took)
                _notice_closes(tricklers, EVERY / 2)
        finally:
            for trickler in tricklers:
                trickler.sock.close()
        refused = metrics.registry.get_sample_value(
            "numad_connections_refused_total", {"listener": "metrics"}
        )
    assert refused == 0
    assert [t.answer for t in tricklers] == [b""] * TRICKLERS  # no 503, no answer at all
    closed = sorted(t.closed for t in tricklers)
    # Cut off at the deadline from the first byte, though no gap reached EVERY.
    assert LIMITS.deadline * 0.9 <= closed[0], closed
    assert closed[-1] <= LIMITS.deadline + EVERY + SLACK, closed
    # A scrape waits for no trickler: well within the deadline a held worker would take.
    assert len(latencies) >= 3
    assert max(latencies) < LIMITS.deadline / 4, latencies
    print(
        f"{TRICKLERS} tricklers cut off after {closed[0]:.2f}-{closed[-1]:.2f} s"
        f" (deadline {LIMITS.deadline:g} s); {len(latencies)} scrapes beside them:"
        f" {min(latencies) * 1000:.1f}-{max(latencies) * 1000:.1f} ms"
    )


@pytest.mark.parametrize(
    ("head", "status"),
    [
        pytest.param(b"GET /" + b"a" * HEAD_LIMIT, b"414", id="request-line"),
        pytest.param(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * HEAD_LIMIT, b"431", id="header"),
    ],
)
def test_a_head_over_the_limit_is_refused_as_http_server_would(head: bytes, status: bytes) -> None:
    with _metrics(LIMITS) as (server, _):
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as sock:
            with contextlib.suppress(OSError):  # answered before the last bytes went
                sock.sendall(head)
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 %s " % status), answer[:80]
        assert _scrape(server.server_port)[0] == 200


def test_pipelined_requests_are_each_answered() -> None:
    """What a worker read past one request goes back to the watcher with the connection:
    both what it buffered and what it had not taken yet of the watcher's reads (each
    request here is longer than the handler's buffer)."""
    pad = b"a" * (HEAD_LIMIT // 3)
    first = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: %s\r\n\r\n" % pad
    last = b"GET /metrics HTTP/1.1\r\nX-Pad: %s\r\nConnection: close\r\n\r\n" % pad
    with (
        _metrics(LIMITS) as (server, _),
        socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as sock,
    ):
        sock.sendall(first + last)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.count(b"HTTP/1.1 200 ") == 2
