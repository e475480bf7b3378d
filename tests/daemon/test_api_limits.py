"""The listeners' bounds (numad.daemon.listener) and the API's HTTP edges and error mapping.

Idle connections cost no thread; a request trickled in is cut off after one deadline
for the whole request; a full queue refuses at once; duplicate Content-Lengths,
HEAD and the exact body limit; a fault of numad's answers 5xx as one log event.
Servers run in this process on a Unix socket in tmp_path or loopback TCP, with a
stub daemon, and small limits where a test waits for one.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from numad.cli.client import APIError, request
from numad.daemon.api import API_LIMITS, Server
from numad.daemon.listener import OTHER_THREADS, Limits
from numad.daemon.metrics import METRICS_LIMITS, Metrics, MetricsServer
from numad.errors import CheckpointError, SpecError, WorkloadError
from numad.placement.admission import Outcome
from numad.topology.model import Topology
from numad.workload.shape import WorkloadSpec
from tests.daemon.test_daemon_e2e import Numad, numad

__all__ = ["numad"]

IDLE_CLIENTS = 300
MARGIN = 2  # threads this process may start meanwhile (pytest's, the interpreter's)
ONE_MIB = 1 << 20  # the documented body limit, spelled out: a larger cap fails here


class _Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.events.append(("info", event, kw))

    def error(self, event: str, **kw: Any) -> None:
        self.events.append(("error", event, kw))

    def errors(self) -> list[tuple[str, dict[str, Any]]]:
        return [(event, kw) for level, event, kw in self.events if level == "error"]


@dataclass
class _Stub:
    """The little of a daemon the API server uses; admit can fail or wait."""

    ready: bool = True
    started: bool = True
    problems: list[str] = field(default_factory=list)
    cgroups: object = None
    managed_roots: tuple[str, ...] = ("numad.slice",)
    metrics: Metrics = field(default_factory=Metrics)
    metrics_address: str = ""
    log: _Log = field(default_factory=_Log)
    fault: Exception | None = None
    gate: threading.Event | None = None  # admit waits for it
    admitting: threading.Event = field(default_factory=threading.Event)
    parsed: list[int] = field(default_factory=list)  # the length of each spec text

    @property
    def topology(self) -> Topology:
        raise AssertionError("not used here")

    def host(self) -> dict[str, Any]:
        return {}

    def nrt(self) -> dict[str, Any]:
        return {}

    def list_all(self) -> list[dict[str, Any]]:
        return []

    def parse(self, text: str, fmt: str) -> WorkloadSpec:
        self.parsed.append(len(text))
        return WorkloadSpec(name="w", cgroup="numad.slice/w", policy=None, containers=())

    def plan(self, spec: WorkloadSpec) -> Outcome:
        return Outcome(admitted=True, decisions=(), placements={})

    def admit(self, spec: WorkloadSpec) -> Outcome:
        self.admitting.set()
        if self.gate is not None:
            self.gate.wait(10)
        if self.fault is not None:
            raise self.fault
        return self.plan(spec)

    def show(self, name: str) -> dict[str, Any]:
        return {"name": name}

    def explain(self, name: str) -> dict[str, Any]:
        return {}

    def release(self, name: str) -> None:
        return

    def resize(self, name: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        return 200, {"resized": name}


def _threads(status: Path = Path("/proc/self/status")) -> int:
    """The OS threads of a process, whichever code started them."""
    for line in status.read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"{status}: no Threads line")


def _refused(metrics: Metrics, listener: str) -> float:
    value = metrics.registry.get_sample_value(
        "numad_connections_refused_total", {"listener": listener}
    )
    assert value is not None
    return value


def _eventually(check: Callable[[], bool], within: float = 5.0) -> None:
    until = time.monotonic() + within
    while not check():
        assert time.monotonic() < until, "not within the time given"
        time.sleep(0.02)


@contextmanager
def _api(tmp_path: Path, stub: _Stub, limits: Limits = API_LIMITS) -> Iterator[str]:
    path = str(tmp_path / "api.sock")
    server = Server(path, stub, limits)
    accept = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    accept.start()
    try:
        yield path
    finally:
        server.shutdown()
        server.server_close()
        accept.join(5)


@contextmanager
def _metrics(limits: Limits = METRICS_LIMITS) -> Iterator[tuple[MetricsServer, Metrics]]:
    metrics = Metrics()
    server, accept = metrics.serve("127.0.0.1", 0, limits)
    try:
        yield server, metrics
    finally:
        server.shutdown()
        accept.join(5)


def _unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)  # blocking: waits while the listen queue is full (EAGAIN with a timeout)
    sock.settimeout(5)
    return sock


def _tcp(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _answer(sock: socket.socket) -> tuple[int, bytes, bytes]:
    """Status, head and body of one answer; reads to the end of its Content-Length
    (or to EOF), so a keep-alive connection stays usable."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        None,
    )
    while length is not None and len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return int(head.split(b" ")[1]), head, body


def _exchange(connect: Callable[[], socket.socket], payload: bytes) -> tuple[int, bytes, bytes]:
    """One request on its own connection, answered and closed: status, head, all after."""
    with connect() as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(payload)  # a 413 is answered before the rest is read
        status, head, body = _answer(sock)
        with contextlib.suppress(ConnectionResetError):  # closed with our bytes unread
            while chunk := sock.recv(65536):
                body += chunk  # whatever else the server wrote before it closed
    return status, head, body


def _closed_after(sock: socket.socket, trickle: bytes, within: float = 5.0) -> float:
    """Send ``trickle`` a byte at a time, 20 a second, until the server closes the
    connection; the seconds that took (inf if it never did)."""
    start = time.monotonic()
    for byte in trickle:
        if time.monotonic() - start > within:
            break
        try:
            sock.send(bytes([byte]))
        except OSError:  # reset or broken pipe: closed
            return time.monotonic() - start
        if select.select([sock], [], [], 0.05)[0]:
            try:
                if not sock.recv(65536):
                    return time.monotonic() - start
            except OSError:
                return time.monotonic() - start
    return float("inf")


# -- idle connections cost no thread ----------------------------------------------------


def _open_idle(
    connect: Callable[[], socket.socket], metrics: Metrics, name: str
) -> list[socket.socket]:
    """IDLE_CLIENTS idle connections, once the server has taken them all in."""
    conns = [connect() for _ in range(IDLE_CLIENTS)]
    evicted = max(0, IDLE_CLIENTS - API_LIMITS.parked)  # the oldest make room for the new
    _eventually(lambda: _refused(metrics, name) >= evicted)
    time.sleep(0.2)  # the watcher has parked the last ones
    return conns


def test_idle_api_connections_take_no_thread(tmp_path: Path) -> None:
    before = _threads()
    stub = _Stub()
    with _api(tmp_path, stub) as path:
        conns = _open_idle(lambda: _unix(path), stub.metrics, "api")
        try:
            during = _threads()
            start = time.monotonic()
            health = request(path, "GET", "/v1/health", timeout=5)
            took = time.monotonic() - start
        finally:
            for conn in conns:
                conn.close()
    bound = API_LIMITS.workers + OTHER_THREADS
    assert during - before <= bound + MARGIN, f"{during - before} threads for {bound}"
    assert health["ready"]
    assert took < 3.0


def test_idle_metrics_connections_take_no_thread() -> None:
    before = _threads()
    with _metrics() as (server, metrics):
        conns = _open_idle(lambda: _tcp(server.server_port), metrics, "metrics")
        try:
            during = _threads()
            start = time.monotonic()
            status, _, body = _exchange(
                lambda: _tcp(server.server_port),
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            )
            took = time.monotonic() - start
        finally:
            for conn in conns:
                conn.close()
    bound = METRICS_LIMITS.workers + OTHER_THREADS
    assert during - before <= bound + MARGIN, f"{during - before} threads for {bound}"
    assert status == 200
    assert b"numad_build_info" in body
    assert took < 3.0


def test_idle_connections_add_no_thread_to_the_daemon(numad: Numad) -> None:
    """The real daemon: 300 idle connections to each listener, not one thread more."""
    assert numad.proc is not None
    status = Path(f"/proc/{numad.proc.pid}/status")
    host, port = numad.call("GET", "/v1/health")["metrics"].rsplit(":", 1)
    before = _threads(status)
    conns = [_unix(numad.socket) for _ in range(IDLE_CLIENTS)]
    conns += [socket.create_connection((host, int(port)), timeout=5) for _ in range(IDLE_CLIENTS)]
    try:
        time.sleep(0.5)
        during = _threads(status)
        start = time.monotonic()
        assert numad.call("GET", "/v1/health")["ready"]
        took = time.monotonic() - start
    finally:
        for conn in conns:
            conn.close()
    assert during - before <= 1, f"{before} threads, then {during}"
    assert took < 3.0


# -- deadlines and the queue --------------------------------------------------------------

SLOW = Limits(workers=2, queue=2, idle=5.0, deadline=1.0)
TRICKLES = {
    "headers": b"GET /v1/health HTTP/1.1\r\nX-Slow: " + b"a" * 1000,
    "body": b"POST /v1/plan HTTP/1.1\r\nContent-Length: 1000\r\n\r\n" + b" " * 1000,
}


@pytest.mark.parametrize("part", TRICKLES)
def test_a_trickled_api_request_is_cut_off_at_the_deadline(tmp_path: Path, part: str) -> None:
    with _api(tmp_path, _Stub(), SLOW) as path, _unix(path) as sock:
        took = _closed_after(sock, TRICKLES[part])
    assert SLOW.deadline * 0.8 <= took < SLOW.deadline + 1.0


def test_a_trickled_scrape_is_cut_off_at_the_deadline() -> None:
    with _metrics(SLOW) as (server, _), _tcp(server.server_port) as sock:
        took = _closed_after(sock, b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 1000)
    assert SLOW.deadline * 0.8 <= took < SLOW.deadline + 1.0


def test_an_idle_keep_alive_connection_holds_no_worker_and_is_closed(tmp_path: Path) -> None:
    limits = Limits(workers=1, queue=1, idle=1.0, deadline=1.0)
    with _api(tmp_path, _Stub(), limits) as path, _unix(path) as kept:
        kept.sendall(b"GET /v1/health HTTP/1.1\r\n\r\n")
        assert _answer(kept)[0] == 200
        opened = time.monotonic()
        start = time.monotonic()
        assert request(path, "GET", "/v1/health", timeout=5)["ready"]  # the one worker is free
        assert time.monotonic() - start < 0.5
        assert kept.recv(1) == b""  # closed by the server, after the idle timeout
        assert limits.idle * 0.8 <= time.monotonic() - opened < limits.idle + 1.0


def test_a_silent_connection_is_closed_after_the_idle_timeout() -> None:
    limits = Limits(workers=1, idle=0.5)
    with _metrics(limits) as (server, _), _tcp(server.server_port) as sock:
        start = time.monotonic()
        assert sock.recv(1) == b""
        assert limits.idle * 0.8 <= time.monotonic() - start < limits.idle + 1.0


def test_a_connection_beyond_the_queue_is_refused_at_once(tmp_path: Path) -> None:
    gate = threading.Event()
    stub = _Stub(gate=gate)
    limits = Limits(workers=1, queue=1, deadline=5.0)
    post = b"POST /v1/workloads HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    health = b"GET /v1/health HTTP/1.1\r\nConnection: close\r\n\r\n"
    with _api(tmp_path, stub, limits) as path, _unix(path) as busy, _unix(path) as queued:
        busy.sendall(post)
        assert stub.admitting.wait(5)  # the one worker waits in admit
        queued.sendall(health)
        time.sleep(0.2)  # the watcher has queued it
        start = time.monotonic()
        status, _, body = _exchange(lambda: _unix(path), health)
        assert time.monotonic() - start < 1.0
        assert status == 503
        assert json.loads(body)["error"]["code"] == "busy"
        assert _refused(stub.metrics, "api") == 1
        gate.set()
        assert _answer(busy)[0] == 201
        assert _answer(queued)[0] == 200


# -- HTTP edges ---------------------------------------------------------------------------


@pytest.mark.parametrize("lengths", [(2, 2), (2, 5)], ids=["same", "different"])
def test_two_content_lengths_get_400(tmp_path: Path, lengths: tuple[int, int]) -> None:
    payload = (
        b"POST /v1/plan HTTP/1.1\r\nContent-Length: %d\r\nContent-Length: %d\r\n\r\n{}   " % lengths
    )
    stub = _Stub()
    with _api(tmp_path, stub) as path:
        status, _, body = _exchange(lambda: _unix(path), payload)
    assert status == 400
    assert json.loads(body)["error"]["message"] == "request: more than one Content-Length"
    assert stub.parsed == []


def test_head_gets_a_status_and_headers_only(tmp_path: Path) -> None:
    head = b"HEAD %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with _api(tmp_path, _Stub()) as path:
        api = _exchange(lambda: _unix(path), head % b"/v1/health")
    with _metrics() as (server, _):
        scrape = _exchange(lambda: _tcp(server.server_port), head % b"/metrics")
    assert (api[0], api[2]) == (405, b"")
    assert (scrape[0], scrape[2]) == (200, b"")
    assert b"content-length: 0" not in scrape[1].lower()  # the size a GET would get


@pytest.mark.parametrize(("size", "status"), [(ONE_MIB, 200), (ONE_MIB + 1, 413)])
def test_the_body_limit_is_one_mebibyte_exactly(tmp_path: Path, size: int, status: int) -> None:
    head = b"POST /v1/plan HTTP/1.1\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size
    stub = _Stub()
    with _api(tmp_path, stub) as path:
        got = _exchange(lambda: _unix(path), head + b" " * size)
    assert got[0] == status
    assert stub.parsed == ([size] if status == 200 else [])


# -- error mapping ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [
        pytest.param(
            CheckpointError("/var/lib/numad/state.json", "cannot write: No space left on device"),
            500,
            "checkpoint",
            id="checkpoint-is-numads-fault",
        ),
        pytest.param(RuntimeError("boom\n  in a frame"), 500, "internal", id="unexpected"),
        pytest.param(KeyError("cpu"), 500, "internal", id="a-bug"),
        pytest.param(WorkloadError("w", "already admitted"), 409, "conflict", id="exists"),
        pytest.param(WorkloadError("w", "no such workload"), 404, "not_found", id="missing"),
        pytest.param(SpecError("w", "cpus: not a number"), 422, "invalid", id="invalid"),
    ],
)
def test_errors_are_answered_by_whose_fault_they_are(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], fault: Exception, status: int, code: str
) -> None:
    stub = _Stub(fault=fault)
    with _api(tmp_path, stub) as path, pytest.raises(APIError) as caught:
        request(path, "POST", "/v1/workloads", "{}", timeout=5)
    assert (caught.value.status, caught.value.body["error"]["code"]) == (status, code)
    message = caught.value.body["error"]["message"]
    assert "\n" not in message
    assert message.split(":")[0] in ("w", "/var/lib/numad/state.json", "numad")
    failed = [kw for event, kw in stub.log.errors() if event == "api_request_failed"]
    assert len(failed) == (1 if status >= 500 else 0)
    assert all(kw["error"] == type(fault).__name__ for kw in failed)
    assert capfd.readouterr().err == ""  # no traceback
