"""A client of the local API over its Unix socket (the CLI's `admit`, `list`, ...)."""

from __future__ import annotations

import http.client
import json
import os
import socket
from typing import Any

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


MAX_SOCKET_PATH = 107  # bytes: sun_path holds 108 with the closing NUL (unix(7))


def check_socket_path(path: str) -> None:
    """A socket path the kernel can bind or connect to; else an error naming it (the
    kernel's own is "AF_UNIX path too long", which names nothing)."""
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH:
        raise NumadError(
            path,
            f"the socket path is {size} bytes; a Unix socket's may have {MAX_SOCKET_PATH} at most",
            "give a shorter --socket (or a --root DIR with a shorter path)",
        )


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
