"""One line to systemd's journal, for commands whose stderr may reach no one.

An OCI runtime runs ``numad oci-hook``; what the hook prints on stderr is shown by
runc (inside its error) but dropped by crun, podman's default runtime (crun 1.8 runs
hooks with no output kept, measured under Debian's podman 4.3), so the line that says
why a container was not placed would be lost. The hook also sends each of its lines
here: ``journalctl -t numad-oci-hook`` shows them.

The journal's native protocol: one datagram of ``FIELD=value`` lines to its socket
(``systemd.journal-fields(7)``, the socket of ``systemd-journald.socket``). Best effort:
where no journal listens (a container, a host without systemd) nothing is sent and
nothing fails, and a journal too busy to take the line at once (a full socket buffer)
loses it rather than hold a container's start.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

SOCKET = Path("/run/systemd/journal/socket")
ERR, INFO = 3, 6  # syslog priorities


def send(identifier: str, line: str, priority: int, path: Path = SOCKET) -> bool:
    """Send ``line`` (one line: newlines become spaces) to the journal; whether it went."""
    message = " ".join(line.split())
    fields = f"MESSAGE={message}\nPRIORITY={priority}\nSYSLOG_IDENTIFIER={identifier}\n"
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        sock.sendto(fields.encode(), str(path))
        return True
    return False
