"""Bounded HTTP listeners: the one server shape under the API and the metrics endpoint.

Edge module, standard library only. No number of clients makes numad start more
threads: a listener has its accept thread, one watcher thread and a fixed pool
of workers, and each step drops what it cannot hold instead of growing.

1. The accept thread parks every new connection with the watcher: an open
   connection that sends nothing costs a file descriptor, not a thread. At most
   ``Limits.parked`` are kept; a new one closes the one idle the longest.
2. The watcher closes a connection idle for ``Limits.idle`` seconds, and hands one
   that has sent something to the workers' queue. With ``Limits.queue`` waiting
   there already, the connection is answered 503 and closed at once.
3. A worker reads each request under one deadline, ``Limits.deadline`` seconds for
   the whole request however slowly it trickles in (not per read), answers, and
   parks a keep-alive connection again: an idle client never holds a worker.

Connections closed by 1 or 2 are counted by the ``refused`` callback.
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
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

# Threads of a listener besides its workers: the accept thread and the watcher.
OTHER_THREADS = 2

_BUSY_BODY = b'{"error": {"code": "busy", "message": "numad: every worker is busy; retry"}}\n'
BUSY_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_BUSY_BODY), _BUSY_BODY)
)


@dataclass(frozen=True, slots=True)
class Limits:
    workers: int  # threads that read requests and answer them
    queue: int = 16  # connections with a request waiting for a worker
    parked: int = 256  # idle open connections (keep-alive ones included)
    idle: float = 30.0  # seconds a parked connection may send nothing
    deadline: float = 10.0  # seconds to read one whole request, and to write its answer


class _RequestReader(io.RawIOBase):
    """The connection as a raw stream whose reads share one deadline: each read waits
    only for the time left, so a request trickled in byte by byte is cut off."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        super().__init__()
        self.sock = sock
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.polling = False  # read only what has arrived, never wait

    def arm(self) -> None:
        self.deadline = time.monotonic() + self.seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int | None:
        if self.polling:
            self.sock.setblocking(False)
            try:
                return self.sock.recv_into(buffer)
            except BlockingIOError:
                return None  # nothing yet: BufferedReader.peek answers b""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"request: not complete within {self.seconds:g} s")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class BoundedHandler(BaseHTTPRequestHandler):
    """The requests of one connection while they keep coming, each read under one
    deadline; then the server parks the connection, or closes it."""

    server: BoundedServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the stdlib's reader, replaced by one under the deadline
        self.reader = _RequestReader(self.connection, self.server.limits.deadline)
        self.buffered = io.BufferedReader(self.reader)
        self.rfile = self.buffered

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection and self._pending():
            self.handle_one_request()  # a pipelined request, already (partly) here

    def handle_one_request(self) -> None:
        self.reader.arm()
        super().handle_one_request()

    def send_response_only(self, code: int, message: str | None = None) -> None:
        if code >= 200:  # the answer gets its own deadline; a 100 Continue does not
            self.reader.arm()
            self.connection.settimeout(self.reader.seconds)
        super().send_response_only(code, message)

    def _pending(self) -> bool:
        """Whether the next request has begun to arrive, without waiting for it."""
        self.reader.polling = True
        try:
            return bool(self.buffered.peek(1))
        except OSError:
            self.close_connection = True
            return False
        finally:
            self.reader.polling = False

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        return  # each listener logs what it needs as structured events


class _Parked:
    """The watcher's idle connections, oldest first (a dict keeps insertion order)."""

    def __init__(self, selector: selectors.BaseSelector) -> None:
        self.selector = selector
        self.since: dict[socket.socket, float] = {}

    def add(self, conn: socket.socket, address: Any) -> None:
        self.selector.register(conn, selectors.EVENT_READ, address)
        self.since[conn] = time.monotonic()

    def take(self, conn: socket.socket) -> Any:
        del self.since[conn]
        return self.selector.unregister(conn).data

    def oldest(self) -> tuple[socket.socket, float] | None:
        return next(iter(self.since.items()), None)


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
        self._work: queue.SimpleQueue[tuple[socket.socket, Any] | None] = queue.SimpleQueue()
        self._incoming: list[tuple[socket.socket, Any]] = []
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

    def _park(self, conn: socket.socket, address: Any) -> None:
        with self._lock:
            if not self._closing:
                self._incoming.append((conn, address))
                self._wake_watcher()
                return
        self.shutdown_request(conn)

    def _wake_watcher(self) -> None:
        with contextlib.suppress(BlockingIOError):  # already woken: bytes are waiting
            self._waker.send(b"\0")

    def _worker(self: Self) -> None:
        while (item := self._work.get()) is not None:
            conn, address = item
            keep = False
            try:
                handler = self.RequestHandlerClass(conn, address, self)
                keep = not getattr(handler, "close_connection", True)
            except Exception:  # noqa: BLE001 - reported by handle_error, as socketserver does
                self.handle_error(conn, address)
            if keep:
                self._park(conn, address)
            else:
                self.shutdown_request(conn)

    def _watcher(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake, selectors.EVENT_READ)
            parked = _Parked(selector)
            while not self._closing:
                for key, _ in selector.select(self._next_expiry(parked)):
                    if key.fileobj is self._wake:
                        self._wake.recv(4096)
                    else:
                        conn = key.fileobj
                        assert isinstance(conn, socket.socket)
                        self._hand_over(conn, parked.take(conn))
                self._admit_incoming(parked)
                self._close_idle(parked)
            with self._lock:
                self._close_all(parked)

    def _next_expiry(self, parked: _Parked) -> float | None:
        oldest = parked.oldest()
        if oldest is None:
            return None
        return max(0.0, oldest[1] + self.limits.idle - time.monotonic())

    def _hand_over(self, conn: socket.socket, address: Any) -> None:
        if self._work.qsize() < self.limits.queue:
            self._work.put((conn, address))
            return
        self.refused()
        with contextlib.suppress(OSError):  # best effort: the client may not read it
            conn.setblocking(False)
            conn.recv(65536)  # the request, so that the close is not a reset
            conn.send(BUSY_ANSWER)
        self.shutdown_request(conn)

    def _admit_incoming(self, parked: _Parked) -> None:
        with self._lock:
            incoming, self._incoming = self._incoming, []
        for conn, address in incoming:
            oldest = parked.oldest()
            if oldest is not None and len(parked.since) >= self.limits.parked:
                self.refused()
                parked.take(oldest[0])
                self.shutdown_request(oldest[0])
            try:
                parked.add(conn, address)
            except (OSError, ValueError):  # closed under us: the watcher must go on
                self.shutdown_request(conn)

    def _close_idle(self, parked: _Parked) -> None:
        now = time.monotonic()
        while (oldest := parked.oldest()) is not None and now - oldest[1] >= self.limits.idle:
            parked.take(oldest[0])
            self.shutdown_request(oldest[0])

    def _close_all(self, parked: _Parked) -> None:
        """At stop, under the lock: close every connection not with a worker, then
        tell the workers to end (the watcher was the only one to queue work)."""
        for conn in list(parked.since):
            parked.take(conn)
            self.shutdown_request(conn)
        for conn, _ in self._incoming:
            self.shutdown_request(conn)
        self._incoming = []
        with contextlib.suppress(queue.Empty):
            while item := self._work.get_nowait():
                self.shutdown_request(item[0])
        for _ in range(self.limits.workers):
            self._work.put(None)
        self._wake.close()
        self._waker.close()
