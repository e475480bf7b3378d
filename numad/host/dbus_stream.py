"""One authenticated D-Bus stream over a Unix socket, every call with a deadline.

Built from jeepney's pieces (its SASL ``Authenticator``, its message ``Parser``),
because jeepney's blocking connection always says Hello and systemd's private
peer socket has no bus daemon to say it to (``numad.host.systemd_bus``). One call
at a time; ``interrupt`` ends a waiting call from another thread. A reply that
comes to no waiting call is kept by serial, so a timeout can tell a slow peer
from a lost reply.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import struct
import time

# jeepney ships no type information (no py.typed); its values are checked where they come in.
from jeepney import HeaderFields, Message, Parser
from jeepney.auth import BEGIN, Authenticator


class Stream:
    """One authenticated D-Bus stream over a Unix socket; each call has a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._parser = Parser()
        self._serials = itertools.count(1)
        # Replies to no call waiting on them: a lost reply would show here (the
        # reply to a call that had already timed out, or one sent to the wrong call).
        self.unmatched: list[int] = []
        self.serial = 0  # the last call's

    @classmethod
    def open(cls, path: str, timeout: float, *, peer: bool) -> Stream:
        """Connect and authenticate (SASL EXTERNAL); raises OSError or ValueError."""
        deadline = time.monotonic() + timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        stream = cls(sock)
        try:
            stream._bound(deadline)
            sock.connect(path)
            if peer:
                # What systemctl checks of the private socket (bus_check_peercred).
                creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                _, uid, _ = struct.unpack("3i", creds)
                if uid not in (0, os.geteuid()):
                    raise PermissionError(f"{path}: the peer runs as uid {uid}, not root")
            auth = Authenticator()  # sends the leading NUL byte, then AUTH EXTERNAL <uid>
            for line in auth:
                stream._send(line, deadline)
                auth.feed(stream._receive(deadline))
            stream._send(BEGIN, deadline)  # the Authenticator stops before BEGIN
        except BaseException:
            sock.close()
            raise
        return stream

    def call(self, message: Message, deadline: float) -> Message:
        """Send ``message`` and return its reply; other messages (signals) are dropped,
        and a reply to another serial is kept in ``unmatched``."""
        serial = next(self._serials)
        self.serial = serial
        self._send(message.serialise(serial=serial), deadline)
        while True:
            reply = self._parser.get_next_message()
            if reply is None:
                self._parser.add_data(self._receive(deadline))
                continue
            answers = reply.header.fields.get(HeaderFields.reply_serial)
            if answers == serial:
                return reply
            if answers is not None:
                self.unmatched.append(answers)

    def close(self) -> None:
        self._sock.close()

    def interrupt(self) -> None:
        """End a call waiting on this stream now, from any thread (its receive sees
        the stream shut and raises)."""
        with contextlib.suppress(OSError):  # closed already: nothing waits on it
            self._sock.shutdown(socket.SHUT_RDWR)

    def _bound(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no reply in time")
        self._sock.settimeout(left)

    def _send(self, data: bytes, deadline: float) -> None:
        if data:
            self._bound(deadline)
            self._sock.sendall(data)

    def _receive(self, deadline: float) -> bytes:
        self._bound(deadline)
        data = self._sock.recv(1 << 16)
        if not data:
            raise ConnectionResetError("systemd closed the connection")
        return data


def stray(serials: list[int]) -> str:
    """What a timeout says of replies that came to no waiting call on its stream:
    none, where systemd was slow; some, where a reply went astray."""
    if not serials:
        return "; no reply to any other serial came meanwhile"
    shown = ", ".join(str(s) for s in serials[-5:])
    return f"; {len(serials)} replies came to no waiting call (serials {shown})"
