"""The API server: HTTP/1.1 + JSON over a Unix socket (mode 0660), peer credentials logged.

Edge module. Routes (status codes of DESIGN section 4):

    GET    /v1/health                    200 ready | 503 not ready
    GET    /v1/topology                  the topology JSON of `numad topology --json`
    GET    /v1/workloads                 every admitted workload
    POST   /v1/workloads                 admit a spec: 201 | 409 rejected (explained) | 422 invalid
    GET    /v1/workloads/NAME            show: 200 | 404
    GET    /v1/workloads/NAME/explain    why it was placed so: 200 | 404
    DELETE /v1/workloads/NAME            release: 200 | 404
    POST   /v1/plan                      what admission would do, changing nothing: 200 | 422

Errors are ``{"error": {"code", "message"}}``; a rejection adds ``explanation``.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import struct
import sys
from http.server import BaseHTTPRequestHandler
from typing import Any

from numad.admission import Outcome
from numad.daemon import Daemon
from numad.errors import NumadError, WorkloadError
from numad.topology.render import to_json

MAX_BODY = 1 << 20
_FORMATS = {"application/json": "json", "application/toml": "toml", "application/yaml": "yaml"}


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    why = outcome.explanation
    return {
        "admitted": outcome.admitted,
        "reason": None if outcome.reason is None else str(outcome.reason),
        "detail": outcome.detail,
        "explanation": None if why is None else why.text(),
        "conflict": [] if why is None else list(why.conflict),
        "containers": {
            name: {
                "cpus": p.cpus.format_list(),
                "mems": p.mems.format_list(),
                "devices": {k: list(v) for k, v in p.devices.items()},
            }
            for name, p in outcome.placements.items()
        },
    }


class _Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that sends half a request does not hold a thread forever

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        return  # requests are logged as structured events instead

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = (json.dumps(body) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, code: str, message: str, **extra: Any) -> None:
        self._send(status, {"error": {"code": code, "message": message, **extra}})

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Errors the standard library's parser answers itself, as JSON and never 5xx."""
        self.request_version = "HTTP/1.1"  # an HTTP/0.9-looking line still gets a status line
        self.close_connection = True
        status = {501: 405, 505: 400}.get(code, code)
        if status >= 500:
            status = 400
        self._error(status, "bad_request", f"request: {message or 'malformed'}")

    def _read_body(self) -> bytes | None:
        """The whole body, read before any answer so nothing is left on the connection
        to be taken for the next request; None (after an error answer) if unusable."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            self._error(411, "length_required", "request: send a Content-Length, not chunks")
            return None
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        length = length.strip()
        if not (length.isascii() and length.isdigit()):
            self.close_connection = True
            self._error(400, "bad_request", f"request: bad Content-Length {length[:20]!r}")
            return None
        if int(length) > MAX_BODY:
            self.close_connection = True
            self._error(413, "too_large", f"request: body over {MAX_BODY} bytes")
            return None
        return self.rfile.read(int(length))

    def _spec_text(self, raw: bytes) -> tuple[str, str] | None:
        if self.headers.get("Content-Length") is None:
            self._error(411, "length_required", "request: a Content-Length is required")
            return None
        kind = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        if kind not in _FORMATS:
            self._error(
                415, "unsupported_media_type", f"request: unsupported Content-Type {kind!r}"
            )
            return None
        return raw.decode("utf-8", errors="replace"), _FORMATS[kind]

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _not_allowed(self) -> None:
        body = self._read_body()
        if body is not None:
            self._error(405, "method_not_allowed", f"request: {self.command} is not allowed")

    do_PUT = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed  # noqa: N815 - the stdlib's names

    def _dispatch(self, method: str) -> None:
        daemon = self.server.daemon
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        daemon.log.info(
            "api_request_received", method=method, path=self.path[:200], peer=self.server.peer(self)
        )
        raw = self._read_body()
        if raw is None:
            return
        try:
            if parts == ["v1", "health"] and method == "GET":
                status = 200 if daemon.ready else 503
                root = str(getattr(daemon.cgroups, "root", ""))
                self._send(
                    status,
                    {
                        "ready": daemon.ready,
                        "problems": daemon.problems,
                        "cgroup_root": root,
                        "metrics": daemon.metrics_address,
                    },
                )
                return
            if not daemon.ready:
                self._error(503, "not_ready", "numad: not ready yet")
                return
            self._route(method, parts, raw)
        except WorkloadError as err:
            exists = "already" in err.problem
            self._error(409 if exists else 404, "conflict" if exists else "not_found", str(err))
        except NumadError as err:
            self._error(422, "invalid", str(err))

    def _route(self, method: str, parts: list[str], raw: bytes) -> None:
        daemon = self.server.daemon
        if parts == ["v1", "topology"] and method == "GET":
            self._send(200, to_json(daemon.topology))
        elif parts == ["v1", "workloads"] and method == "GET":
            self._send(200, {"workloads": daemon.list_all()})
        elif parts in (["v1", "workloads"], ["v1", "plan"]) and method == "POST":
            body = self._spec_text(raw)
            if body is None:
                return
            spec = daemon.parse(*body)
            if parts[1] == "plan":
                self._send(200, outcome_json(daemon.plan(spec)))
                return
            outcome = daemon.admit(spec)
            if outcome.admitted:
                self._send(201, {**outcome_json(outcome), "workload": daemon.show(spec.name)})
            else:
                why = outcome_json(outcome)
                self._error(
                    409,
                    "topology_affinity"
                    if outcome.reason and "Topology" in outcome.reason
                    else "allocation",
                    f"{spec.name}: rejected: {why['explanation'] or why['detail']}",
                    **why,
                )
        elif len(parts) == 3 and parts[:2] == ["v1", "workloads"] and method == "GET":
            self._send(200, daemon.show(parts[2]))
        elif (
            len(parts) == 4
            and parts[:2] == ["v1", "workloads"]
            and parts[3] == "explain"
            and method == "GET"
        ):
            self._send(200, {"name": parts[2], **daemon.explain(parts[2])})
        elif len(parts) == 3 and parts[:2] == ["v1", "workloads"] and method == "DELETE":
            daemon.release(parts[2])
            self._send(200, {"released": parts[2]})
        else:
            self._error(404, "not_found", f"request: no route {method} {self.path[:100]}")


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # many clients at once must queue, not be refused

    def __init__(self, path: str, daemon: Daemon) -> None:
        self.daemon = daemon
        if os.path.exists(path):
            os.unlink(path)  # a stale socket from a previous run
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        super().__init__(path, _Handler)
        os.chmod(path, 0o660)

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
