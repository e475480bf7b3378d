"""One numad per host: an exclusive lock on the state directory, and one on the
cgroup tree.

Edge module; touches one file, ``<state dir>/numad.lock``, and locks the cgroup
tree's root directory. ``numad serve`` takes both before it touches the API
socket, so a second instance never unlinks the first one's socket or rewrites
its cpusets (DESIGN invariant 9), even one given another state directory (two
numads on one tree would each isolate the other's workloads). Each lock is a
``flock`` on an open descriptor: the kernel drops it when the holder exits,
however it exits, so a stale lock never blocks a restart. The lock file holds
the holder's pid, to name it in the second instance's error; the tree's holder
is named from ``/proc/locks``. cgroupfs takes a ``flock`` like any directory.
"""

from __future__ import annotations

import contextlib
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


def acquire_tree(cgroup_root: Path) -> InstanceLock:
    """The lock on the cgroup tree, or InstanceError naming the pid that holds it."""
    try:
        fd = os.open(cgroup_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise InstanceError(
            str(cgroup_root), f"cannot open the cgroup tree: {err.strerror}"
        ) from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _flock_holder(os.fstat(fd)) or "unknown"
        os.close(fd)
        raise InstanceError(
            str(cgroup_root),
            f"another numad (pid {holder}) manages this cgroup tree",
            "one numad per host: stop it first, whatever state directory it uses",
        ) from None
    return InstanceLock(fd, cgroup_root)


def _flock_holder(st: os.stat_result, locks: Path = Path("/proc/locks")) -> str | None:
    """The pid holding a flock on the file ``st`` describes, from ``/proc/locks``
    (``1: FLOCK  ADVISORY  WRITE 1234 00:1a:5 0 EOF``); None where it cannot say."""
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with contextlib.suppress(OSError):
        for line in locks.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == where:
                return fields[4]
    return None


class HostLocks:
    """Both locks ``numad serve`` holds, released together."""

    def __init__(self, locks: list[InstanceLock]) -> None:
        self.locks = locks

    def release(self) -> None:
        for lock in reversed(self.locks):
            lock.release()


def acquire_host(state_dir: Path, cgroup_root: Path | None) -> HostLocks:
    """The state directory's lock, then the cgroup tree's (where numad has one)."""
    first = acquire(state_dir)
    if cgroup_root is None:
        return HostLocks([first])
    try:
        tree = acquire_tree(cgroup_root)
    except BaseException:
        first.release()
        raise
    return HostLocks([first, tree])
