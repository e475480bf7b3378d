"""The API server: HTTP/1.1 + JSON over a Unix socket (mode 0660), peer credentials logged.

Edge module. Routes (status codes of DESIGN section 4):

    GET    /v1/health                    200 ready | 503 not ready
    GET    /v1/topology                  the topology JSON of `numad topology --json`
    GET    /v1/host                      host isolation: isolated cgroups, what cannot move
    GET    /v1/nrt                       this host as a NodeResourceTopology object
    GET    /v1/workloads                 every admitted workload
    POST   /v1/workloads                 admit a spec: 201 | 409 rejected (explained) | 422 invalid
    GET    /v1/workloads/NAME            show: 200 | 404
    GET    /v1/workloads/NAME/explain    why it was placed so: 200 | 404
    DELETE /v1/workloads/NAME            release: 200 | 404
    PATCH  /v1/workloads/NAME            resize in place: 200 | 409 refused | 400 | 404
    POST   /v1/plan                      what admission would do, changing nothing: 200 | 422

Errors are ``{"error": {"code", "message"}}``; a rejection adds ``explanation``.
A request numad cannot carry out is a 4xx; numad's own fault a 500 (``checkpoint``
when the change could not be recorded, else ``internal``), logged as one event.
Served within ``API_LIMITS`` by ``numad.daemon.listener``: idle clients hold no thread.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import struct
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol

from numad.cpuset import digits
from numad.daemon.answers import outcome_json
from numad.daemon.listener import BoundedHandler, BoundedServer, Limits
from numad.daemon.metrics import Metrics
from numad.defaults import check_socket_path
from numad.errors import CheckpointError, NumadError, WorkloadError
from numad.placement.admission import Outcome
from numad.topology.model import Topology
from numad.topology.render import to_json
from numad.workload.shape import WorkloadSpec

MAX_BODY = 1 << 20  # bytes; a spec is a few hundred
# 8 workers (admissions serialize on the daemon's lock anyway), 16 connections
# queued for them; idle and keep-alive connections wait in the watcher, not a worker.
API_LIMITS = Limits(workers=8, queue=16)
_FORMATS = {"application/json": "json", "application/toml": "toml", "application/yaml": "yaml"}

Answer = tuple[int, dict[str, Any]]


class _Log(Protocol):
    def info(self, event: str, **kw: Any) -> Any: ...
    def error(self, event: str, **kw: Any) -> Any: ...


class Backend(Protocol):
    """What the API needs of the daemon: ``numad.daemon.root.Daemon``, or a test's stub."""

    @property
    def ready(self) -> bool: ...
    @property
    def started(self) -> bool: ...
    @property
    def problems(self) -> list[str]: ...
    @property
    def cgroups(self) -> object: ...
    @property
    def managed_roots(self) -> tuple[str, ...]: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def metrics_address(self) -> str: ...
    @property
    def log(self) -> _Log: ...
    @property
    def topology(self) -> Topology: ...
    def list_all(self) -> list[dict[str, Any]]: ...
    def host(self) -> dict[str, Any]: ...
    def nrt(self) -> dict[str, Any]: ...
    def parse(self, text: str, fmt: str) -> WorkloadSpec: ...
    def plan(self, spec: WorkloadSpec) -> Outcome: ...
    def admit(self, spec: WorkloadSpec) -> Outcome: ...
    def show(self, name: str) -> dict[str, Any]: ...
    def explain(self, name: str) -> dict[str, Any]: ...
    def release(self, name: str) -> None: ...
    def resize(self, name: str, raw: bytes) -> tuple[int, dict[str, Any]]: ...


def _error(status: int, code: str, message: str, **extra: Any) -> Answer:
    return status, {"error": {"code": code, "message": message, **extra}}


class _Handler(BoundedHandler):
    server: Server

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = (json.dumps(body) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":  # a HEAD answer is the status and headers only
            self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Errors the standard library's parser answers itself, as JSON and never 5xx."""
        self.request_version = "HTTP/1.1"  # an HTTP/0.9-looking line still gets a status line
        self.close_connection = True
        status = {501: 405, 505: 400}.get(code, code)
        if status >= 500:
            status = 400
        self._send(*_error(status, "bad_request", f"request: {message or 'malformed'}"))

    def _read_body(self) -> bytes | Answer:
        """The whole body, read before any answer so nothing is left on the connection
        to be taken for the next request; or the error answer if it is unusable (the
        connection then closes, its unread rest with it)."""
        lengths = self.headers.get_all("Content-Length") or []
        if self.headers.get("Transfer-Encoding"):
            refusal = _error(411, "length_required", "request: send a Content-Length, not chunks")
        elif len(lengths) > 1:
            refusal = _error(400, "bad_request", "request: more than one Content-Length")
        elif not lengths:
            return b""
        elif not digits(lengths[0].strip()):
            refusal = _error(400, "bad_request", f"request: bad Content-Length {lengths[0][:20]!r}")
        elif int(lengths[0]) > MAX_BODY:
            refusal = _error(413, "too_large", f"request: body over {MAX_BODY} bytes")
        else:
            return self.rfile.read(int(lengths[0]))
        self.close_connection = True
        return refusal

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802 - the stdlib's name
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:  # noqa: N802 - the stdlib's name
        self._dispatch("PATCH")

    def _not_allowed(self) -> None:
        body = self._read_body()
        if isinstance(body, tuple):
            self._send(*body)
        else:
            self._send(
                *_error(405, "method_not_allowed", f"request: {self.command} is not allowed")
            )

    do_PUT = do_HEAD = do_OPTIONS = _not_allowed  # noqa: N815 - the stdlib's names

    def _dispatch(self, method: str) -> None:
        daemon = self.server.daemon
        daemon.log.info(
            "api_request_received", method=method, path=self.path[:200], peer=self.server.peer(self)
        )
        raw = self._read_body()
        self._send(*(raw if isinstance(raw, tuple) else self._answer(method, raw)))

    def _answer(self, method: str, raw: bytes) -> Answer:
        """The answer to a request whose body was read; nothing is sent from here, so a
        client gone mid-answer is never taken for a fault of the route."""
        daemon = self.server.daemon
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        try:
            if parts == ["v1", "health"] and method == "GET":
                return 200 if daemon.ready else 503, {
                    "ready": daemon.ready,
                    "problems": daemon.problems,
                    "cgroup_root": str(getattr(daemon.cgroups, "root", "")),
                    "managed_roots": list(daemon.managed_roots),
                    "metrics": daemon.metrics_address,
                }
            if not daemon.started:  # started but not ready (checkpoint unwritable): still
                return _error(503, "not_ready", "numad: not ready yet")  # lists and explains
            return self._route(method, parts, raw)
        except Exception as err:  # noqa: BLE001 - one request's fault is answered, not fatal
            return self._fault(method, err)

    def _fault(self, method: str, err: Exception) -> Answer:
        """A 4xx for a request numad cannot carry out, a 5xx (logged) for numad's own."""
        if isinstance(err, WorkloadError):
            exists = "already" in err.problem
            return _error(409 if exists else 404, "conflict" if exists else "not_found", str(err))
        if isinstance(err, NumadError) and not isinstance(err, CheckpointError):
            return _error(422, "invalid", str(err))
        first = str(err).splitlines()[0][:500] if str(err) else ""
        self.server.daemon.log.error(
            "api_request_failed",
            method=method,
            path=self.path[:200],
            error=type(err).__name__,
            problem=first,
        )
        if isinstance(err, CheckpointError):  # the change could not be recorded: numad's fault
            return _error(500, "checkpoint", str(err))
        return _error(500, "internal", f"numad: {type(err).__name__}; see the daemon log")

    def _route(self, method: str, parts: list[str], raw: bytes) -> Answer:
        daemon = self.server.daemon
        if parts[:2] == ["v1", "workloads"] and len(parts) in (3, 4):
            return self._workload(method, parts[2], parts[3:], raw)
        views: dict[tuple[str, ...], Callable[[], dict[str, Any]]] = {
            ("v1", "topology"): lambda: to_json(daemon.topology),
            ("v1", "host"): daemon.host,
            ("v1", "nrt"): daemon.nrt,
            ("v1", "workloads"): lambda: {"workloads": daemon.list_all()},
        }
        if method == "GET" and tuple(parts) in views:
            return 200, views[tuple(parts)]()
        if parts in (["v1", "workloads"], ["v1", "plan"]) and method == "POST":
            return self._post_spec(parts[1], raw)
        return self._no_route(method)

    def _workload(self, method: str, name: str, rest: list[str], raw: bytes) -> Answer:
        daemon = self.server.daemon
        if not rest and method == "PATCH":
            return daemon.resize(name, raw)
        if not rest and method == "GET":
            return 200, daemon.show(name)
        if rest == ["explain"] and method == "GET":
            return 200, {"name": name, **daemon.explain(name)}
        if not rest and method == "DELETE":
            daemon.release(name)
            return 200, {"released": name}
        return self._no_route(method)

    def _no_route(self, method: str) -> Answer:
        return _error(404, "not_found", f"request: no route {method} {self.path[:100]}")

    def _post_spec(self, route: str, raw: bytes) -> Answer:
        daemon = self.server.daemon
        kind = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        if self.headers.get("Content-Length") is None:
            return _error(411, "length_required", "request: a Content-Length is required")
        if kind not in _FORMATS:
            return _error(
                415, "unsupported_media_type", f"request: unsupported Content-Type {kind!r}"
            )
        spec = daemon.parse(raw.decode("utf-8", errors="replace"), _FORMATS[kind])
        notes = {"notes": spec.notes()}
        if route == "plan":
            return 200, {**outcome_json(daemon.plan(spec)), **notes}
        outcome = daemon.admit(spec)
        if outcome.admitted:
            return 201, {**outcome_json(outcome), **notes, "workload": daemon.show(spec.name)}
        why = outcome_json(outcome)
        affinity = outcome.reason is not None and "Topology" in outcome.reason
        return _error(
            409,
            "topology_affinity" if affinity else "allocation",
            f"{spec.name}: {why['explanation'] or 'rejected: ' + why['detail']}",
            **why,
        )


class Server(BoundedServer, socketserver.UnixStreamServer):
    allow_reuse_address = True
    request_queue_size = 128  # many clients at once must queue in the kernel, not be refused

    def __init__(self, path: str, daemon: Backend, limits: Limits = API_LIMITS) -> None:
        self.daemon = daemon
        check_socket_path(path)
        if os.path.exists(path):
            os.unlink(path)  # a stale socket from a previous run
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        super().__init__(path, _Handler)
        os.chmod(path, 0o660)
        self.start_pool(limits, daemon.metrics.connections_refused.labels("api").inc)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is not an error of numad's; anything
        else is logged as one event, never as a traceback on stderr."""
        err = sys.exc_info()[1]
        if isinstance(err, (BrokenPipeError, ConnectionResetError, TimeoutError)):
            self.daemon.log.info("api_client_gone", problem=type(err).__name__)
        else:
            self.daemon.log.error("api_request_failed", problem=repr(err))

    @staticmethod
    def peer(handler: BaseHTTPRequestHandler) -> dict[str, int] | None:
        sock = handler.connection
        if not isinstance(sock, socket.socket):
            return None
        try:
            pid, uid, gid = struct.unpack(
                "3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            )
        except OSError:
            return None
        return {"pid": pid, "uid": uid, "gid": gid}
