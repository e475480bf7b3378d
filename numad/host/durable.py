"""Durable files in numad's state directory, and the faults their writes can meet.

Edge module. ``write_file`` replaces a file atomically: a temp file in the same
directory (``O_EXCL|O_NOFOLLOW``), every byte written and fsynced, rename over
the old file, fsync of the directory; on any failure it raises CheckpointError
naming the step and leaves the previous file as it was (or puts it back).
Writes of one file from several threads take turns (its temp and previous names
are per process). ``Syscalls`` is the fault-injection seam. Used for the checkpoint
(``numad.daemon.state``) and for what host isolation must give back (``numad.host.isolation``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from numad.errors import CheckpointError
from numad.hostfs import read_regular

_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TURNS: dict[Path, threading.Lock] = {}  # target -> the lock its writers take turns by
_TURNS_LOCK = threading.Lock()


# -- the system calls a write makes, and the faults they can be made to meet -------------


class Fault(StrEnum):
    """A fault ``Syscalls.injecting`` makes every durable write meet."""

    SHORT_WRITES = "short-writes"  # each write takes half of what it is given (no error)
    STALLED_WRITE = "stalled-write"  # half the file, then writes that return 0
    ENOSPC = "enospc"  # half the file, then a full disk
    EDQUOT = "edquot"  # half the file, then the quota
    EIO = "eio"  # half the file, then an I/O error
    FSYNC = "fsync"  # the temp file's fsync fails (EIO)
    RENAME = "rename"  # the rename over the checkpoint fails (EIO)
    DIR_FSYNC = "dir-fsync"  # the directory's fsync, after the rename, fails (EIO)


_WRITE_ERRNO = {Fault.ENOSPC: errno.ENOSPC, Fault.EDQUOT: errno.EDQUOT, Fault.EIO: errno.EIO}


def _os_error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@dataclass(frozen=True, slots=True)
class Syscalls:
    """The fault-injection seam of ``write``: the calls it makes to write, sync and rename.

    ``write(directory, checkpoint, syscalls)`` takes one (default ``SYSCALLS``, the
    real calls). A ready-made fault::

        state.write(directory, checkpoint, durable.Syscalls.injecting(durable.Fault.ENOSPC))

    or any callables of these signatures: ``write`` returns the bytes written
    (fewer is a short write), ``fsync`` gets the temp file's fd, then (after the
    rename) the directory's; a failure is an OSError. Held by the caller, so a
    daemon or simulation can swap it between checkpoints.
    """

    write: Callable[[int, memoryview], int] = os.write
    fsync: Callable[[int], None] = os.fsync
    replace: Callable[[Path, Path], None] = os.replace

    @classmethod
    def injecting(cls, fault: Fault) -> Syscalls:
        """The real calls, except that every checkpoint write meets ``fault``."""

        def write(fd: int, data: memoryview) -> int:
            at_start = os.lseek(fd, 0, os.SEEK_CUR) == 0
            if fault is Fault.SHORT_WRITES or (at_start and fault in _AFTER_HALF):
                return os.write(fd, data[: max(1, len(data) // 2)])
            if fault is Fault.STALLED_WRITE:
                return 0
            if fault in _WRITE_ERRNO:
                raise _os_error(_WRITE_ERRNO[fault])
            return os.write(fd, data)

        def fsync(fd: int) -> None:
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            if fault is (Fault.DIR_FSYNC if is_dir else Fault.FSYNC):
                raise _os_error(errno.EIO)
            os.fsync(fd)

        def replace(src: Path, dst: Path) -> None:
            if fault is Fault.RENAME:
                raise _os_error(errno.EIO)
            os.replace(src, dst)

        return cls(write, fsync, replace)


_AFTER_HALF = {Fault.STALLED_WRITE, *_WRITE_ERRNO}
SYSCALLS = Syscalls()
MAX_RECORD_BYTES = 16 << 20  # a JSON record larger than this is garbage, not read whole


# -- writing ------------------------------------------------------------------------------


def _cause(err: OSError) -> str:
    if err.errno is None:
        return str(err)
    return f"{err.strerror} [{errno.errorcode.get(err.errno, err.errno)}]"


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _write_all(fd: int, data: bytes, write: Callable[[int, memoryview], int]) -> None:
    """Every byte of ``data``, however many calls it takes (a file-size limit, a full
    disk or a quota first shortens a write, then fails the next one)."""
    left = memoryview(data)
    while left:
        written = write(fd, left)
        if written <= 0:
            raise OSError(f"short write: {len(left)} of {len(data)} bytes not written")
        left = left[written:]


def write_file(
    directory: Path, name: str, data: bytes, syscalls: Syscalls = SYSCALLS, what: str = ""
) -> None:
    """Atomically replace ``directory/name`` with ``data``: temp file, fsync, rename,
    fsync the directory. On any failure CheckpointError names the step and its
    cause, the temp file is removed and the previous file (``what``, default its
    name) stays (or is put back) as it was."""
    target = directory / name
    with _TURNS_LOCK:
        turn = _TURNS.setdefault(target, threading.Lock())
    with turn:  # one writer of the file at a time: they share its temp and previous names
        _replace(directory, name, data, syscalls, what or name)


def _replace(directory: Path, name: str, data: bytes, syscalls: Syscalls, what: str) -> None:
    target = directory / name
    temp = directory / f".{name}.{os.getpid()}.tmp"
    previous = directory / f".{name}.prev"  # a second name for it until the rename is durable
    backup: Path | None = previous
    step = "create the state directory"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        step = f"create {temp.name}"
        _unlink(temp)  # a stale one of our own name, or a link planted there
        fd = os.open(temp, _TEMP_FLAGS, 0o600)
        try:
            step = f"write {temp.name}"
            _write_all(fd, data, syscalls.write)
            step = f"fsync {temp.name}"
            syscalls.fsync(fd)
        finally:
            os.close(fd)
        step = f"link the previous {name} to {previous.name}"
        _unlink(previous)
        try:
            os.link(target, previous, follow_symlinks=False)
        except FileNotFoundError:
            backup = None  # no previous checkpoint: undoing the rename removes the new one
        step = f"rename {temp.name} over {name}"
        syscalls.replace(temp, target)
    except OSError as err:
        with contextlib.suppress(OSError):  # already failing; the next write removes them
            _unlink(temp)
            _unlink(previous)
        raise CheckpointError(
            str(target),
            f"cannot {step}: {_cause(err)}",
            f"the previous {what} is unchanged; free space or fix the disk, then retry",
        ) from err
    _sync_directory(directory, target, backup, syscalls, what)


def _sync_directory(
    directory: Path, target: Path, backup: Path | None, syscalls: Syscalls, what: str
) -> None:
    """Make the rename durable; if that fails, put the previous file back, so the
    caller's refusal (it changes nothing) matches what a restart finds."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            syscalls.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as err:
        try:
            if backup is None:
                target.unlink()
                undone = f"the new {what} is removed"
            else:
                os.replace(backup, target)
                undone = f"the previous {what} is put back"
        except OSError as undo:
            undone = f"the new {what} stays ({_cause(undo)}) and a restart may keep it"
        raise CheckpointError(
            str(target), f"cannot fsync {directory}: {_cause(err)}", f"{undone}; check the disk"
        ) from err
    if backup is not None:
        with contextlib.suppress(OSError):  # harmless if left: the next write removes it
            backup.unlink()


def read_json(directory: Path, name: str) -> tuple[Any, str | None]:
    """The JSON in ``directory/name``: (None, None) when there is none; (None, why) when
    it is unreadable, after moving it aside (``NAME.corrupt.TIME``), never deleting it."""
    path = directory / name
    try:
        data = read_regular(path, MAX_RECORD_BYTES)
        if len(data) > MAX_RECORD_BYTES:
            raise ValueError(f"larger than {MAX_RECORD_BYTES} bytes")
        return json.loads(data.decode("utf-8")), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as err:
        aside = path.with_name(f"{name}.corrupt.{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(path, aside)
        except OSError:
            aside = path
        return None, f"{path}: unreadable ({err}); kept as {aside}"
