"""cgroup v2 cpuset partitions, as the kernel keeps them, emulated on scratch trees.

A remote partition (kernel 6.7 and later; the rules below are those of 6.11 and
later, where ``cpuset.cpus.exclusive`` no longer depends on ``cpuset.cpus``) takes
its CPUs out of the root cgroup's effective set, and so out of every cgroup that is
not inside it, with no write to any of them. What the emulation holds to:

- ``cpuset.cpus.exclusive`` of a cgroup below a top-level one must lie within its
  parent's, and may not overlap a sibling's (EINVAL); it may not drop CPUs that a
  child's still names (EBUSY);
- ``cpuset.cpus.partition`` = ``root`` makes a valid partition when its exclusive
  set is not empty, lies within every ancestor's exclusive set (the root's aside),
  no ancestor is itself a partition, it overlaps no other partition nor the
  cpuset.cpus of a cgroup beside it without exclusive CPUs, and the root keeps a
  CPU (a write of cpuset.cpus naming a valid partition's CPUs beside it is then
  refused, EINVAL); otherwise the file reads ``root invalid (<reason>)`` and nothing
  moves. ``member`` dissolves it;
- a valid partition's effective set is its exclusive set; every other cgroup's is
  its configured set masked by its parent's, the root's being the online CPUs less
  every partition's.

The root of a scratch tree that offers partitions holds ``cpuset.cpus.isolated``
(as the kernel's does from 6.7); the valid partitions are listed in ``REGISTRY``
there, a file cgroupfs could not hold (with the online CPUs they were taken from).
Cost: a change of partitions rewrites every cgroup's effective file, as the kernel
walks every cpuset; nothing else does.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path

from numad.cpuset import CPUSet

REGISTRY = ".numad-partitions"
FILES = {
    "cpuset.cpus.exclusive": "",
    "cpuset.cpus.exclusive.effective": "",
    "cpuset.cpus.partition": "member",
}


def offered(root: Path) -> bool:
    """Whether the tree's kernel offers remote partitions (its root lists isolated CPUs)."""
    return (root / "cpuset.cpus.isolated").is_file()


class Partitions:
    """The partitions of one scratch tree (``root``), read and written through the
    emulated kernel's own file access (``read``/``store``)."""

    def __init__(
        self, root: Path, read: Callable[[Path], str], store: Callable[[Path, str], None]
    ) -> None:
        self.root = root
        self.read = read
        self.store = store

    def valid(self) -> dict[str, CPUSet]:
        """Every valid partition: its directory (from the root) -> its CPUs."""
        return {p: CPUSet.parse_list(c) for p, c in self._registry()[1].items()}

    def online(self) -> CPUSet:
        return self._registry()[0]

    def _registry(self) -> tuple[CPUSet, dict[str, str]]:
        try:
            data = json.loads(self.read(self.root / REGISTRY))
        except FileNotFoundError:
            effective = self.read(self.root / "cpuset.cpus.effective")
            return CPUSet.parse_list(effective), {}
        return CPUSet.parse_list(data["online"]), dict(data["partitions"])

    def _save(self, online: CPUSet, parts: dict[str, CPUSet]) -> None:
        data = {"online": online.format_list(), "partitions": {}}
        data["partitions"] = {p: c.format_list() for p, c in sorted(parts.items())}
        self.store(self.root / REGISTRY, json.dumps(data))
        self.store(self.root / "cpuset.cpus.effective", _pool(online, parts).format_list())

    def exclusive(self, d: Path) -> CPUSet:
        if d == self.root:
            return self.online()
        return CPUSet.parse_list(self.read(d / "cpuset.cpus.exclusive"))

    def write_exclusive(self, d: Path, value: CPUSet) -> bool:
        """The checks of a write to ``cpuset.cpus.exclusive`` (OSError), the write, and
        what it does to a partition there; True when the partitions changed."""
        if d.parent != self.root and not value.issubset(self.exclusive(d.parent)):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(d))
        named = [c for c in _children(d.parent) if (c / "cpuset.cpus.exclusive").exists()]
        if any(value & self.exclusive(c) for c in named if c != d):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(d))
        below = [c for c in _children(d) if (c / "cpuset.cpus.exclusive").exists()]
        if any(not self.exclusive(c).issubset(value) for c in below):
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(d))
        self.store(d / "cpuset.cpus.exclusive", value.format_list())
        self.store(d / "cpuset.cpus.exclusive.effective", value.format_list())
        key = self._key(d)
        online, parts = self.online(), self.valid()
        if key not in parts:
            return False
        del parts[key]
        reason = self._invalid(d, value, parts, online)
        if reason is None:
            parts[key] = value
        else:
            self.store(d / "cpuset.cpus.partition", f"root invalid ({reason})")
        self._save(online, parts)
        return True

    def write_partition(self, d: Path, value: str) -> bool:
        """A write to ``cpuset.cpus.partition``; True when the partitions changed."""
        if value not in ("root", "member"):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(d))
        online, parts = self.online(), self.valid()
        key = self._key(d)
        was = parts.pop(key, None)
        if value == "member":
            self.store(d / "cpuset.cpus.partition", "member")
            if was is not None:
                self._save(online, parts)
            return was is not None
        cpus = self.exclusive(d)
        reason = self._invalid(d, cpus, parts, online)
        if reason is not None:
            self.store(d / "cpuset.cpus.partition", f"root invalid ({reason})")
            if was is not None:
                self._save(online, parts)
            return was is not None
        parts[key] = cpus
        self.store(d / "cpuset.cpus.partition", "root")
        self._save(online, parts)
        return was != cpus

    def _invalid(
        self, d: Path, cpus: CPUSet, others: dict[str, CPUSet], online: CPUSet
    ) -> str | None:
        """Why ``d`` cannot be a valid partition of ``cpus`` beside ``others``; None if it can."""
        if not cpus:
            return "Empty cpuset.cpus.exclusive"
        for level in d.parents:
            if level == self.root:
                break
            if self._key(level) in others:
                return "Parent is a partition root"
            if not cpus.issubset(self.exclusive(level)):
                return "Invalid cpu list in cpuset.cpus.exclusive"
        if any(cpus & c for c in others.values()) or self._named_beside(d, cpus):
            return "Cpu list in cpuset.cpus not exclusive"
        if not _pool(online, others) - cpus:
            return "Partition root state has no CPU left for the root"
        return None

    def _named_beside(self, d: Path, cpus: CPUSet) -> bool:
        """Whether a cgroup beside ``d`` with no exclusive CPUs of its own names any of
        ``cpus`` in its cpuset.cpus (the kernel compares a sibling's cpuset.cpus when
        its cpuset.cpus.exclusive is empty)."""
        for other in _children(d.parent):
            if other == d or self.exclusive(other) or not (other / "cpuset.cpus").exists():
                continue
            if CPUSet.parse_list(self.read(other / "cpuset.cpus")) & cpus:
                return True
        return False

    def refuses_cpus(self, d: Path, cpus: CPUSet) -> bool:
        """Whether a write of ``cpus`` to ``d``'s cpuset.cpus is refused (EINVAL): a valid
        partition beside it holds any of them."""
        return any(
            (self.root / key).parent == d.parent and (self.root / key) != d and held & cpus
            for key, held in self.valid().items()
        )

    def effective(self, d: Path) -> CPUSet | None:
        """A valid partition's effective CPUs; None for any other cgroup."""
        return self.valid().get(self._key(d))

    def prune(self) -> bool:
        """Partitions whose cgroup was removed give their CPUs back (the kernel does so
        at the rmdir; the emulation at its next operation); True if any did."""
        online, parts = self.online(), self.valid()
        kept = {p: c for p, c in parts.items() if (self.root / p).is_dir()}
        if kept == parts:
            return False
        self._save(online, kept)
        return True

    def _key(self, d: Path) -> str:
        return d.relative_to(self.root).as_posix()


def _pool(online: CPUSet, parts: dict[str, CPUSet]) -> CPUSet:
    left = online
    for cpus in parts.values():
        left -= cpus
    return left


def _children(d: Path) -> list[Path]:
    return [c for c in d.iterdir() if c.is_dir() and not c.is_symlink()]
