"""A stand-in for the daemon's API on a Unix socket: canned answers, every request kept.

For client tests of what the daemon side does not answer yet (or cannot on a
scratch tree, like systemd units), and for a client whose stdout is closed.
"""

from __future__ import annotations

import json
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import TracebackType
from typing import Any

Answers = dict[tuple[str, str], tuple[int, dict[str, Any]]]


class FakeDaemon:
    """Serves ``answers[(method, path)]``; 404 for anything else. ``requests`` holds
    (method, path, JSON body or None) in arrival order."""

    def __init__(self, path: Path, answers: Answers) -> None:
        self.path = path
        self.answers = answers
        self.requests: list[tuple[str, str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                fake.requests.append((self.command, self.path, json.loads(raw) if raw else None))
                status, body = fake.answers.get(
                    (self.command, self.path),
                    (404, {"error": {"code": "not_found", "message": f"{self.path}: not here"}}),
                )
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = _answer  # noqa: N815 - the stdlib's names

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's
                return None

        self.server = socketserver.UnixStreamServer(str(path), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,))

    def __enter__(self) -> FakeDaemon:
        self.thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
