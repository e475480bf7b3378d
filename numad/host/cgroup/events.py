"""New cgroups as the kernel makes them: inotify on the managed roots' directories.

Host side. ``mkdir`` in cgroupfs (systemd's, a container engine's, anyone's with a
delegated subtree) raises ``IN_CREATE`` on the parent directory like any mkdir, so a
watch on every directory of the managed roots sees a new cgroup when it appears,
instead of at the next reconcile pass. Each new directory is watched in turn, and
its children made before its watch was in place are reported by a listing of it.
Directories ``MAX_DEPTH`` levels or more below the hierarchy's root are neither
watched nor reported (the reconcile pass names them in health). A new top-level
cgroup beside the managed roots (``machine.slice`` at the first VM) is reported too,
not followed: numad isolates it as a whole. A watched directory that is removed
(``rmdir``: a unit stopped, a container gone) is reported in ``removed``, so the
daemon releases and resets at once instead of at its next pass. A scratch tree is
plain directories: the same events.

The standard library has no inotify; three libc calls through ctypes. Cost: one
watch per directory of the managed roots (the kernel's inotify limits apply:
``fs.inotify.max_user_watches``, 8,192 or more), nothing per event but the new
directory's own listing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
from pathlib import Path

from numad.errors import CgroupError
from numad.host.cgroup.path import MAX_DEPTH

IN_CREATE = 0x00000100
IN_MOVED_TO = 0x00000080
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)


class CgroupEvents:
    """Reports the cgroups made under ``managed`` (relative paths below ``root``).

    The directories above a managed root are watched too, so a root made after
    numad started (``numad.slice`` at its first unit) is followed from then on."""

    def __init__(self, root: Path, managed: list[str]) -> None:
        self.root = root
        self.managed = tuple(m.strip("/") for m in managed)
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = int(self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
        if self._fd < 0:
            err = ctypes.get_errno()
            raise CgroupError(str(root), f"cannot watch for new cgroups: {os.strerror(err)}")
        self._paths: dict[int, str] = {}  # watch -> cgroup path ("" for the root)
        self.overflows = 0  # times the kernel's queue overflowed and events were lost
        self.removed: list[str] = []  # watched cgroups removed since the caller looked
        self._follow("", [])

    def close(self) -> None:
        os.close(self._fd)

    def fileno(self) -> int:
        return self._fd

    def read(self, timeout: float) -> list[str]:
        """The cgroups made in the managed roots since the last read, waiting up to
        ``timeout`` seconds for the first; [] when none came."""
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if not ready:
            return []
        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return []
        found: list[str] = []
        overflowed = False
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _, size = _HEADER.unpack_from(data, offset)
            name = data[offset + _HEADER.size : offset + _HEADER.size + size].rstrip(b"\0")
            offset += _HEADER.size + size
            if mask & IN_Q_OVERFLOW:
                overflowed = True
            elif mask & IN_IGNORED:  # the directory is gone (numad removes no watch)
                gone = self._paths.pop(wd, None)
                if gone and self._inside(gone):
                    self.removed.append(gone)
            elif mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO) and wd in self._paths:
                self._follow(_join(self._paths[wd], os.fsdecode(name)), found)
        if overflowed:
            # Events were lost (more than fs.inotify.max_queued_events at once), and
            # with them the watches of the directories they announced: every directory
            # is looked at and watched again (the known ones are the caller's to skip).
            # O(the managed trees), once per overflow.
            self.overflows += 1
            self._follow("", found)
        return [p for p in found if p not in self.managed]

    @staticmethod
    def top_level(path: str) -> bool:
        """Whether a reported cgroup is a top-level one (beside the managed roots)."""
        return "/" not in path

    def _inside(self, path: str) -> bool:
        return any(path == m or path.startswith(m + "/") for m in self.managed)

    def _follow(self, path: str, found: list[str]) -> None:
        """Watch ``path`` where it is in a managed root (with every directory below it,
        each reported in ``found``) or above one (and look into it: what leads to a
        managed root may have been made before the watch was in place)."""
        pending = [path]
        while pending:
            here = pending.pop()
            inside = self._inside(here)
            above = here == "" or any(m.startswith(here + "/") for m in self.managed)
            if here and "/" not in here and not (inside or above):
                found.append(here)  # a new top-level cgroup: reported, not followed
                continue
            if not (inside or above) or here.count("/") >= MAX_DEPTH:
                continue
            full = os.fsencode(self.root / here)
            wd = self._libc.inotify_add_watch(self._fd, full, IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)
            if wd < 0 and ctypes.get_errno() in (errno.ENOENT, errno.ENOTDIR):
                continue  # gone already, or not a directory: nothing to isolate
            if wd >= 0:  # else out of watches (fs.inotify.max_user_watches): passes find
                self._paths[wd] = here  # what is made below it; it is reported all the same
            if inside:
                found.append(here)
            try:
                with os.scandir(self.root / here) as entries:
                    pending.extend(
                        _join(here, e.name) for e in entries if e.is_dir(follow_symlinks=False)
                    )
            except OSError:
                continue


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name
