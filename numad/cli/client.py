"""A client of the local API over its Unix socket (the CLI's `admit`, `list`, ...)."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any

from numad.defaults import check_socket_path
from numad.errors import NumadError


class APIError(NumadError):
    """The daemon answered with an error (``status``, ``body``)."""

    def __init__(self, status: int, body: dict[str, Any], subject: str = "numad API") -> None:
        self.status = status
        self.body = body
        error = body.get("error", {})
        super().__init__(subject, error.get("message", f"HTTP {status}"))


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        check_socket_path(self.unix_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except OSError as err:
            sock.close()
            raise NumadError(
                self.unix_path, f"cannot connect: {err.strerror}", "is `numad serve` running?"
            ) from err
        self.sock = sock


def request(
    socket_path: str,
    method: str,
    path: str,
    body: str | None = None,
    *,
    content_type: str = "application/json",
    timeout: float = 30.0,
) -> dict[str, Any]:
    conn = _UnixConnection(socket_path, timeout)
    try:
        headers = {"Content-Type": content_type} if body is not None else {}
        conn.request(
            method, path, body=body.encode() if body is not None else None, headers=headers
        )
        response = conn.getresponse()
        data = json.loads(response.read() or b"{}")
    finally:
        conn.close()
    if response.status >= 400:
        raise APIError(response.status, data, f"{method} {path}")
    return data  # type: ignore[no-any-return]
