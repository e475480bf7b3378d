"""One numad per host: an exclusive lock on the state directory.

Edge module; touches one file, ``<state dir>/numad.lock``. ``numad serve``
takes the lock before it touches the API socket, so a second instance never
unlinks the first one's socket or rewrites its cpusets (DESIGN invariant 9).
The lock is a ``flock`` on an open file: the kernel drops it when the holder
exits, however it exits, so a stale lock file never blocks a restart. The
file holds the holder's pid, to name it in the second instance's error.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from numad.errors import NumadError

FILE = "numad.lock"


class InstanceError(NumadError):
    """Another numad already runs on this state directory."""


class InstanceLock:
    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    def release(self) -> None:
        os.close(self.fd)  # closing the descriptor drops the flock


def acquire(state_dir: Path) -> InstanceLock:
    """The instance lock, or InstanceError naming the pid that holds it."""
    path = state_dir / FILE
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise InstanceError(str(path), f"cannot open the lock: {err.strerror}") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise InstanceError(
            str(path),
            f"another numad (pid {holder}) is running on this state directory",
            "stop it first (systemctl stop numad)",
        ) from None
    data = f"{os.getpid()}\n".encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    return InstanceLock(fd, path)
