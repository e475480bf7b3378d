"""Bounded HTTP listeners: the one server shape under the API and the metrics endpoint.

Edge module, standard library only. No number of clients makes numad start more
threads: a listener has its accept thread, one watcher thread and a fixed pool
of workers, and each step drops what it cannot hold instead of growing.

1. The accept thread parks every new connection with the watcher: an open
   connection without a whole request head costs a file descriptor, not a thread.
   At most ``Limits.parked`` are kept; a new one closes the one silent the longest
   (with none silent, the one whose head began first).
2. The watcher reads each parked connection's request head itself, as it comes, so
   a client that trickles one in holds no worker. It closes a connection silent for
   ``Limits.idle`` seconds, and one whose head is not whole ``Limits.deadline``
   seconds after its first byte however steadily the bytes come: a deadline per
   head, not a timeout between bytes. A head over ``HEAD_LIMIT`` bytes is answered
   414 or 431, as http.server answers a line over its limit. A whole head goes with
   its connection to the workers' queue; with ``Limits.queue`` waiting there
   already, it is answered 503 and closed at once.
3. A worker reads the request's body under one deadline, ``Limits.deadline`` seconds
   however slowly it trickles in (not per read), answers under another, and parks a
   keep-alive connection again with what it read of the next request: an idle or
   slow client never holds a worker.

Connections closed for room in 1 or at a full queue in 2 are counted by the
``refused`` callback.
"""

from __future__ import annotations

import contextlib
import io
import queue
import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

# Threads of a listener besides its workers: the accept thread and the watcher.
OTHER_THREADS = 2
HEAD_LIMIT = 64 << 10  # bytes of a request line and its headers


def _refusal(status: bytes, code: bytes, message: bytes, extra: bytes = b"") -> bytes:
    """A whole answer, sent by the watcher before it closes the connection."""
    body = b'{"error": {"code": "%s", "message": "%s"}}\n' % (code, message)
    return (
        b"HTTP/1.1 %s\r\nContent-Type: application/json\r\n%sConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (status, extra, len(body), body)
    )


BUSY_ANSWER = _refusal(
    b"503 Service Unavailable",
    b"busy",
    b"numad: every worker is busy; retry",
    b"Retry-After: 1\r\n",
)
TOO_LONG_ANSWER = _refusal(
    b"414 Request-URI Too Long", b"too_large", b"request: line over %d bytes" % HEAD_LIMIT
)
TOO_LARGE_ANSWER = _refusal(
    b"431 Request Header Fields Too Large",
    b"too_large",
    b"request: head over %d bytes" % HEAD_LIMIT,
)


@dataclass(frozen=True, slots=True)
class Limits:
    workers: int  # threads that read request bodies and answer them
    queue: int = 16  # connections with a whole request head waiting for a worker
    parked: int = 256  # open connections without one (keep-alive ones included)
    idle: float = 30.0  # seconds a parked connection may send nothing
    # Seconds for a request's head from its first byte, then for its body, then for
    # its answer: each whole, however slowly it trickles.
    deadline: float = 10.0


@dataclass(frozen=True, slots=True)
class Arrival:
    """What a worker hands its handler: the connection and the request head the
    watcher read from it (with whatever followed in the same reads)."""

    conn: socket.socket
    head: bytes


def _head_ends(data: bytes | bytearray, start: int = 0) -> bool:
    """Whether ``data`` holds a whole request head: its empty line (CRLF or a bare LF,
    which the standard library's parser takes too) at or after ``start``."""
    start = max(0, start - 2)  # the ending may straddle the previous read
    return data.find(b"\n\r\n", start) >= 0 or data.find(b"\n\n", start) >= 0


class _RequestReader(io.RawIOBase):
    """The connection as a raw stream: first the head the watcher read, then the
    socket's bytes, each read waiting only for what is left of one deadline, so a
    body trickled in byte by byte is cut off. Once ``answered``, it gives nothing
    more: what is buffered then, and what is left of ``head``, is the next request's."""

    def __init__(self, arrival: Arrival, seconds: float) -> None:
        super().__init__()
        self.sock = arrival.conn
        self.head = memoryview(arrival.head)
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.answered = False

    def arm(self) -> None:
        self.deadline = time.monotonic() + self.seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int | None:
        if self.answered:
            return None  # nothing more: BufferedReader.peek answers what it holds
        into = memoryview(buffer).cast("B")
        if self.head:
            size = min(len(into), len(self.head))
            into[:size] = self.head[:size]
            self.head = self.head[size:]
            return size
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"request: not complete within {self.seconds:g} s")
        self.sock.settimeout(left)
        return self.sock.recv_into(into)


class BoundedHandler(BaseHTTPRequestHandler):
    """One request, its body read under one deadline; then the server parks the
    connection with ``rest`` (what was read past the request), or closes it."""

    server: BoundedServer
    protocol_version = "HTTP/1.1"
    rest = b""

    def setup(self) -> None:
        arrival: Arrival = self.request
        self.request = arrival.conn
        super().setup()
        self.connection.settimeout(self.server.limits.deadline)  # parked: it was non-blocking
        self.rfile.close()  # the stdlib's reader, replaced by one under the deadline
        self.reader = _RequestReader(arrival, self.server.limits.deadline)
        self.buffered = io.BufferedReader(self.reader)
        self.rfile = self.buffered

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()
        if not self.close_connection:
            # A pipelined request, already (partly) here: buffered, then not yet taken.
            self.reader.answered = True
            self.rest = self.buffered.peek() + self.reader.head.tobytes()

    def send_response_only(self, code: int, message: str | None = None) -> None:
        if code >= 200:  # the answer gets its own deadline; a 100 Continue does not
            self.reader.arm()
            self.connection.settimeout(self.reader.seconds)
        super().send_response_only(code, message)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        return  # each listener logs what it needs as structured events


@dataclass(slots=True)
class _Waiting:
    address: Any
    head: bytearray
    since: float  # when parked, or when its head's first byte came


class _Parked:
    """The watcher's connections without a whole head: the silent ones by when they
    were parked, the begun ones by when their first byte came; each kind shares one
    timeout, so the first of each (a dict keeps insertion order) expires first."""

    def __init__(self, selector: selectors.BaseSelector, limits: Limits) -> None:
        self.selector = selector
        self.timeouts = (limits.idle, limits.deadline)  # for silent, for begun
        self.silent: dict[socket.socket, _Waiting] = {}
        self.begun: dict[socket.socket, _Waiting] = {}

    def __len__(self) -> int:
        return len(self.silent) + len(self.begun)

    def add(self, conn: socket.socket, address: Any, head: bytes) -> None:
        conn.setblocking(False)  # the watcher reads what has come, never waits
        self.selector.register(conn, selectors.EVENT_READ)
        (self.begun if head else self.silent)[conn] = _Waiting(
            address, bytearray(head), time.monotonic()
        )

    def get(self, conn: socket.socket) -> _Waiting:
        return self.silent.get(conn) or self.begun[conn]

    def begin(self, conn: socket.socket) -> None:
        waiting = self.begun[conn] = self.silent.pop(conn)
        waiting.since = time.monotonic()

    def take(self, conn: socket.socket) -> _Waiting:
        self.selector.unregister(conn)
        return self.silent.pop(conn, None) or self.begun.pop(conn)

    def first(self) -> socket.socket | None:
        """The one to close for room: the one silent the longest, else the first begun."""
        return next(iter(self.silent), None) or next(iter(self.begun), None)

    def expired(self, now: float) -> socket.socket | None:
        return next((conn for conn, end in self._firsts() if end <= now), None)

    def next_expiry(self, now: float) -> float | None:
        """Seconds until the next connection expires; None with none parked."""
        ends = [end for _, end in self._firsts()]
        return max(0.0, min(ends) - now) if ends else None

    def _firsts(self) -> Iterator[tuple[socket.socket, float]]:
        """The first connection of each kind and when it expires."""
        for kind, seconds in zip((self.silent, self.begun), self.timeouts, strict=True):
            if (first := next(iter(kind.items()), None)) is not None:
                yield first[0], first[1].since + seconds


class BoundedServer(socketserver.BaseServer):
    """Mixed in before a socketserver server class, which calls ``start_pool``
    once bound; ``process_request`` parks instead of starting a thread."""

    limits: Limits
    _closing = False
    _threads: tuple[threading.Thread, ...] = ()

    def start_pool(self, limits: Limits, refused: Callable[[], object]) -> None:
        self.limits = limits
        self.refused = refused
        # Unbounded as a queue so that stopping never blocks; the watcher, its only
        # producer, holds it to limits.queue.
        self._work: queue.SimpleQueue[tuple[Arrival, Any] | None] = queue.SimpleQueue()
        self._incoming: list[tuple[socket.socket, Any, bytes]] = []
        self._lock = threading.Lock()
        self._wake, self._waker = socket.socketpair()
        self._waker.setblocking(False)
        name = type(self).__name__
        self._threads = (
            *(
                threading.Thread(target=self._worker, name=f"{name}-worker-{i}", daemon=True)
                for i in range(limits.workers)
            ),
            threading.Thread(target=self._watcher, name=f"{name}-watcher", daemon=True),
        )
        for thread in self._threads:
            thread.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        self._park(request, client_address)

    def server_close(self) -> None:
        """Stop the pool: parked and queued connections are closed; the workers end
        after the request each is answering (waited for briefly)."""
        super().server_close()
        if not self._threads:
            return  # never started: the bind failed
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._wake_watcher()
        until = time.monotonic() + 2.0
        for thread in self._threads:
            thread.join(max(0.0, until - time.monotonic()))

    def _park(self, conn: socket.socket, address: Any, rest: bytes = b"") -> None:
        with self._lock:
            if not self._closing:
                self._incoming.append((conn, address, rest))
                self._wake_watcher()
                return
        self.shutdown_request(conn)

    def _wake_watcher(self) -> None:
        with contextlib.suppress(BlockingIOError):  # already woken: bytes are waiting
            self._waker.send(b"\0")

    def _worker(self: Self) -> None:
        while (item := self._work.get()) is not None:
            arrival, address = item
            conn, keep, rest = arrival.conn, False, b""
            try:
                handler = self.RequestHandlerClass(arrival, address, self)
                keep = not getattr(handler, "close_connection", True)
                rest = getattr(handler, "rest", b"")
            except Exception:  # noqa: BLE001 - reported by handle_error, as socketserver does
                self.handle_error(conn, address)
            if keep:
                self._park(conn, address, rest)
            else:
                self.shutdown_request(conn)

    def _watcher(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake, selectors.EVENT_READ)
            parked = _Parked(selector, self.limits)
            while not self._closing:
                for key, _ in selector.select(parked.next_expiry(time.monotonic())):
                    if key.fileobj is self._wake:
                        self._wake.recv(4096)
                    else:
                        assert isinstance(key.fileobj, socket.socket)
                        self._receive(key.fileobj, parked)
                self._admit_incoming(parked)
                self._close_expired(parked)
            with self._lock:
                self._close_all(parked)

    def _receive(self, conn: socket.socket, parked: _Parked) -> None:
        """What has come on a parked connection: more of its head, or its end."""
        waiting = parked.get(conn)
        try:
            data = conn.recv(65536)
        except BlockingIOError:
            return  # woken for nothing: the data went (a bad checksum, say)
        except OSError:
            data = b""  # reset: closed as if ended
        if not data:
            parked.take(conn)
            self.shutdown_request(conn)
            return
        if not waiting.head:
            parked.begin(conn)
        seen = len(waiting.head)
        waiting.head += data
        if _head_ends(waiting.head, seen):
            parked.take(conn)
            self._hand_over(conn, waiting.address, bytes(waiting.head))
        elif len(waiting.head) > HEAD_LIMIT:
            parked.take(conn)
            self._refuse(conn, TOO_LARGE_ANSWER if b"\n" in waiting.head else TOO_LONG_ANSWER)

    def _hand_over(self, conn: socket.socket, address: Any, head: bytes) -> None:
        if self._work.qsize() < self.limits.queue:
            self._work.put((Arrival(conn, head), address))
            return
        self.refused()
        self._refuse(conn, BUSY_ANSWER)

    def _refuse(self, conn: socket.socket, answer: bytes) -> None:
        with contextlib.suppress(OSError):  # best effort: the client may not read it
            conn.setblocking(False)
            conn.recv(65536)  # what else came of the request, so the close is no reset
        with contextlib.suppress(OSError):
            conn.send(answer)
        self.shutdown_request(conn)

    def _admit_incoming(self, parked: _Parked) -> None:
        with self._lock:
            incoming, self._incoming = self._incoming, []
        for conn, address, rest in incoming:
            if _head_ends(rest):  # a keep-alive client's next request, here already
                self._hand_over(conn, address, rest)
                continue
            if len(parked) >= self.limits.parked and (room := parked.first()) is not None:
                self.refused()
                parked.take(room)
                self.shutdown_request(room)
            try:
                parked.add(conn, address, rest)
            except (OSError, ValueError):  # closed under us: the watcher must go on
                self.shutdown_request(conn)

    def _close_expired(self, parked: _Parked) -> None:
        now = time.monotonic()
        while (conn := parked.expired(now)) is not None:
            parked.take(conn)
            self.shutdown_request(conn)

    def _close_all(self, parked: _Parked) -> None:
        """At stop, under the lock: close every connection not with a worker, then
        tell the workers to end (the watcher was the only one to queue work)."""
        for conn in [*parked.silent, *parked.begun]:
            parked.take(conn)
            self.shutdown_request(conn)
        for conn, _, _ in self._incoming:
            self.shutdown_request(conn)
        self._incoming = []
        with contextlib.suppress(queue.Empty):
            while item := self._work.get_nowait():
                self.shutdown_request(item[0].conn)
        for _ in range(self.limits.workers):
            self._work.put(None)
        self._wake.close()
        self._waker.close()
