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
daemon releases and resets at once instead of at its next pass. The workloads'
own cgroups are watched for writes to their cpuset files too (``watch_writes``):
another writer's (a ``daemon-reload`` writing a unit's own ``AllowedCPUs=`` back) is
reported in ``modified`` when it is made, so the drift is repaired then, not at the
next pass. A scratch tree is plain directories: the same events.

The standard library has no inotify; three libc calls through ctypes. Cost: one
watch per directory of the managed roots (the kernel's inotify limits apply:
``fs.inotify.max_user_watches``, 8,192 or more), and one per workload cgroup outside
them; nothing per event but the new directory's own listing. Writes are reported
for the workloads' cgroups alone, so numad's own writes to the others (thousands
per change on a busy host) raise no event.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
from collections.abc import Collection
from pathlib import Path

from numad.errors import CgroupError
from numad.host.cgroup.path import MAX_DEPTH

IN_CREATE = 0x00000100
IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)
_MADE = IN_CREATE | IN_MOVED_TO | IN_ONLYDIR  # what a directory of a managed root is watched for
# The files whose writes change where a workload runs (the kernel's own change of a
# partition's state is a write of its file too: kernfs notifies it).
CPUSET_FILES = frozenset({b"cpuset.cpus", b"cpuset.mems", b"cpuset.cpus.partition"})


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
        self._wanted: frozenset[str] = frozenset()  # cgroups whose writes are reported
        self._writes: dict[str, int] = {}  # of those, each watched -> its watch
        self.modified: set[str] = set()  # of those, written since the caller looked
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
            elif mask & IN_IGNORED:  # the directory is gone, or its write watch ended
                gone = self._paths.pop(wd, None)
                self._forget_writes(wd)
                if gone and self._inside(gone):
                    self.removed.append(gone)
            elif mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO) and wd in self._paths:
                self._follow(_join(self._paths[wd], os.fsdecode(name)), found)
            elif mask & IN_MODIFY and name in CPUSET_FILES:
                self.modified.update(p for p, w in self._writes.items() if w == wd)
        if overflowed:
            # Events were lost (more than fs.inotify.max_queued_events at once), and
            # with them the watches of the directories they announced: every directory
            # is looked at and watched again (the known ones are the caller's to skip).
            # O(the managed trees), once per overflow.
            self.overflows += 1
            self._follow("", found)
        return [p for p in found if p not in self.managed]

    def watch_writes(self, paths: Collection[str]) -> None:
        """Report writes to the cpuset files of exactly ``paths`` (the workloads'
        cgroups) from now on. A cgroup not there yet is watched once it is (each call
        tries again; a managed root's new directory is watched as it is made). Cost:
        one ``inotify_add_watch`` per cgroup added, removed or missing."""
        self._wanted = frozenset(paths)
        for path in [p for p in self._writes if p not in self._wanted]:
            wd = self._writes.pop(path)
            if wd in self._paths:  # still watched for what is made in it
                self._add_watch(path)
            else:
                self._libc.inotify_rm_watch(self._fd, wd)
        for path in self._wanted - self._writes.keys():
            self._add_watch(path)

    def _add_watch(self, path: str) -> int:
        """Watch the directory ``path`` for what numad wants of it: what is made in it
        (a managed root's), writes to its cpuset files (a workload's), or both."""
        made = self._inside(path) or path == "" or self._above(path)
        mask = (_MADE if made else IN_ONLYDIR) | (IN_MODIFY if path in self._wanted else 0)
        wd = int(self._libc.inotify_add_watch(self._fd, os.fsencode(self.root / path), mask))
        if wd >= 0 and path in self._wanted:
            self._writes[path] = wd
        return wd

    def _forget_writes(self, wd: int) -> None:
        for path in [p for p, w in self._writes.items() if w == wd]:
            del self._writes[path]

    @staticmethod
    def top_level(path: str) -> bool:
        """Whether a reported cgroup is a top-level one (beside the managed roots)."""
        return "/" not in path

    def _inside(self, path: str) -> bool:
        return any(path == m or path.startswith(m + "/") for m in self.managed)

    def _above(self, path: str) -> bool:
        return any(m.startswith(path + "/") for m in self.managed)

    def _follow(self, path: str, found: list[str]) -> None:
        """Watch ``path`` where it is in a managed root (with every directory below it,
        each reported in ``found``) or above one (and look into it: what leads to a
        managed root may have been made before the watch was in place)."""
        pending = [path]
        while pending:
            here = pending.pop()
            inside = self._inside(here)
            above = here == "" or self._above(here)
            if here and "/" not in here and not (inside or above):
                found.append(here)  # a new top-level cgroup: reported, not followed
                continue
            if not (inside or above) or here.count("/") >= MAX_DEPTH:
                continue
            wd = self._add_watch(here)
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
