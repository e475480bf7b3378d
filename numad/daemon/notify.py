"""The sd_notify protocol: tells systemd that numad is ready, alive, reloading or stopping.

An edge adapter with no dependencies, used only by the daemon's main loop. It may
touch one thing: the AF_UNIX datagram socket named by ``$NOTIFY_SOCKET`` (see
sd_notify(3)). A notification is a courtesy to the service manager: a missing or
broken socket is reported by the return value and never raised, because it must
never stop the daemon.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

__all__ = [
    "notify",
    "ready",
    "reloading",
    "status",
    "stopping",
    "watchdog",
    "watchdog_interval",
]


def _address(name: str) -> str | bytes:
    """A path, or (leading "@") a Linux abstract socket, whose name starts with a NUL."""
    if name.startswith("@"):
        return b"\0" + name[1:].encode()
    return name


def notify(message: str, *, env: Mapping[str, str] | None = None) -> bool:
    """Send ``message`` (newline-separated ``KEY=value`` lines) to systemd.

    Returns False when ``NOTIFY_SOCKET`` is unset (not run by systemd, or
    ``NotifyAccess=none``) or when sending failed; True once the datagram is sent.
    """
    name = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if not name:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(_address(name))
            sock.send(message.encode())
    except OSError:
        return False  # a dead or full socket: systemd will notice through the watchdog
    return True


def _status_line(text: str) -> str:
    # One datagram, one line per assignment: a newline would start a new key.
    return "STATUS=" + " ".join(text.splitlines())


def ready(status: str | None = None, *, env: Mapping[str, str] | None = None) -> bool:
    """Start-up is complete (Type=notify): the API socket is listening."""
    lines = ["READY=1"] + ([_status_line(status)] if status else [])
    return notify("\n".join(lines), env=env)


def status(text: str, *, env: Mapping[str, str] | None = None) -> bool:
    """A one-line status shown by ``systemctl status``."""
    return notify(_status_line(text), env=env)


def stopping(*, env: Mapping[str, str] | None = None) -> bool:
    """Shutdown has begun (on SIGTERM)."""
    return notify("STOPPING=1", env=env)


def reloading(*, env: Mapping[str, str] | None = None) -> bool:
    """A reload has begun (on SIGHUP); send ``ready()`` when it is done.

    systemd ≥ 253 needs MONOTONIC_USEC (CLOCK_MONOTONIC, microseconds) to tell
    this reload from an earlier one; older versions ignore it.
    """
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify(f"RELOADING=1\nMONOTONIC_USEC={usec}", env=env)


def watchdog(*, env: Mapping[str, str] | None = None) -> bool:
    """The keep-alive ping for ``WatchdogSec=``."""
    return notify("WATCHDOG=1", env=env)


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between watchdog pings, or None when no watchdog is armed for us.

    Half of ``WATCHDOG_USEC``, as sd_watchdog_enabled(3) advises, so that one late
    ping does not kill the daemon. ``WATCHDOG_PID``, when set, names the process
    the watchdog is meant for (a forked child inherits the environment, not the job).
    """
    env = os.environ if env is None else env
    pid = env.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    return usec / 2 / 1_000_000
