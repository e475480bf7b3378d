"""The kernel's part in a scratch cgroup tree, emulated (``numad.host.scratch`` makes
the trees; the backends call this when built with ``emulate_kernel``).

v2: the interface files of a new cgroup, ``cgroup.subtree_control`` (controllers
listed in children's ``cgroup.controllers``, cpuset files on enabling),
``cpuset.cpus.effective``/``cpuset.mems.effective`` (configured set masked by the
parent's, or the parent's when that is empty), EINVAL for a bad list and ENOSPC for
emptying a cpuset with tasks. v1: a new cpuset's files, EINVAL for a set outside the
parent's, ENOSPC as in v2, and effective sets equal to the configured ones.

The kernel's files are written and read only as regular files, never through a
link: a link planted in a scratch cgroup cannot carry a write out of the tree, and a
FIFO planted there fails at once instead of blocking numad. Imports no backend: the
backends depend on it, not the reverse.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError
from numad.host.cgroup.hierarchy import read_and_close
from numad.host.cgroup.partitions import FILES as PARTITION_FILES
from numad.host.cgroup.partitions import Partitions, offered

_S = TypeVar("_S", CPUSet, NodeSet)

# A new v1 cpuset's interface files (what mkdir in the cpuset hierarchy makes).
V1_FILES = {
    "cpuset.cpus": "",
    "cpuset.mems": "",
    "cgroup.procs": "",
    "tasks": "",
    "cgroup.clone_children": "0",
    "notify_on_release": "0",
    "cpuset.memory_migrate": "0",
}


def kernel_files(d: Path, files: Mapping[str, str]) -> None:
    """Files only the kernel writes on a real hierarchy; scratch trees only."""
    for name, text in files.items():
        _kernel_write(d / name, f"{text}\n")


def _kernel_write(file: Path, text: str) -> None:
    """Create or replace ``file`` as a regular file, never through a link.

    The file is truncated only once ``_open_regular`` has seen a regular file, so
    no FIFO or device is written either.
    """
    fd = _open_regular(file, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW)
    try:
        os.ftruncate(fd, 0)
        data = text.encode()
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def _kernel_read(file: Path) -> str:
    """The text of a file the kernel keeps; a FIFO or device is refused, not waited on."""
    return read_and_close(_open_regular(file, os.O_RDONLY))


def _open_regular(file: Path, flags: int) -> int:
    """``file`` opened with ``flags`` if it is a regular file; else ``_not_regular``.

    O_NOFOLLOW (where given) refuses a link (ELOOP); O_NONBLOCK makes a FIFO open
    at once, or fail (ENXIO) for a writer without a reader, instead of waiting
    for its other end; fstat then refuses whatever is not a regular file.
    """
    try:
        fd = os.open(file, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise
        raise _not_regular(file) from err
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_regular(file)
    return fd


def _not_regular(file: Path) -> CgroupError:
    return CgroupError(
        str(file),
        "is not a regular file (a link, FIFO, socket, device or directory), and the"
        " emulated kernel reads and writes only regular files in a scratch tree",
        "remove it",
    )


def _ids(kind: type[_S], file: Path) -> _S:
    return kind.parse_list(_kernel_read(file))


class KernelV2:
    """What cgroupfs v2 does on its own, emulated on scratch trees; with remote
    partitions where the tree's root offers them (``numad.host.cgroup.partitions``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.partitions: Partitions | None = None
        if offered(root):
            self.partitions = Partitions(root, _kernel_read, _kernel_write)

    def mkdir(self, d: Path) -> None:
        self.prune()
        d.mkdir()
        enabled = _kernel_read(d.parent / "cgroup.subtree_control").split()
        files = {"cgroup.controllers": " ".join(enabled), "cgroup.subtree_control": ""}
        kernel_files(d, files | {"cgroup.procs": "", "cgroup.type": "domain"})
        if "cpuset" in enabled:
            self._add_cpuset(d)

    def adopt(self, root: Path, d: Path) -> None:
        """Complete each plain directory from ``root`` down to ``d`` as a cgroup.

        In cgroupfs every directory is a cgroup: ``mkdir`` alone gives it its
        interface files. In a scratch tree a plain ``mkdir`` (a user, a test, a
        service manager stand-in) makes a bare directory, which would never get a
        cpuset; the emulated kernel gives it now what the kernel's mkdir would have,
        keeping any file already there. Levels that do not exist are left alone.
        """
        if root not in d.parents:
            return
        for level in reversed([d, *d.parents[: d.parents.index(root)]]):
            if not level.is_dir() or level.is_symlink():
                return
            if not (level / "cgroup.procs").exists():
                self._complete(level)

    def _complete(self, d: Path) -> None:
        self.prune()
        enabled = _kernel_read(d.parent / "cgroup.subtree_control").split()
        files = {
            "cgroup.controllers": " ".join(enabled),
            "cgroup.subtree_control": "",
            "cgroup.procs": "",
            "cgroup.type": "domain",
        }
        kernel_files(d, {name: text for name, text in files.items() if not (d / name).exists()})
        if "cpuset" in enabled and not (d / "cpuset.cpus").exists():
            self._add_cpuset(d)

    def write(self, file: Path, value: str, write_file: Callable[[Path, str], None]) -> None:
        """numad's write of ``value`` to ``file``, stored with the backend's own
        ``write_file`` (so that its failures are the backend's), and what the kernel
        makes of it."""
        if file.name == "cgroup.subtree_control":
            self._subtree_control(file.parent, value, write_file)
            return
        if file.name in ("cpuset.cpus.exclusive", "cpuset.cpus.partition"):
            self.prune()
            self._partition(file, value)
            return
        if file.name in ("cpuset.cpus", "cpuset.mems"):
            try:
                ids = CPUSet.parse_list(value)
            except ValueError as err:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(file)) from err
            if not ids and file.name == "cpuset.cpus" and _has_tasks(file.parent):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
            if file.name == "cpuset.cpus" and self.partitions is not None:
                self.prune()
                if self.partitions.refuses_cpus(file.parent, ids):
                    raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(file))
        write_file(file, value)
        if file.name in ("cpuset.cpus", "cpuset.mems"):
            self._refresh(file.parent)

    def _subtree_control(
        self, d: Path, value: str, write_file: Callable[[Path, str], None]
    ) -> None:
        available = _kernel_read(d / "cgroup.controllers").split()
        enabled = set(_kernel_read(d / "cgroup.subtree_control").split())
        for token in value.split():
            if token[:1] not in ("+", "-") or token[1:] not in available:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(d))
            if token[0] == "+":
                enabled.add(token[1:])
            else:
                enabled.discard(token[1:])
        listed = " ".join(name for name in available if name in enabled)
        write_file(d / "cgroup.subtree_control", listed)
        for child in _children(d):
            kernel_files(child, {"cgroup.controllers": listed})
            if "cpuset" in enabled and not (child / "cpuset.cpus").exists():
                self._add_cpuset(child)

    def _partition(self, file: Path, value: str) -> None:
        """A write to a partition file: refused where the kernel offers none (the file
        would not exist), checked, and every effective set refreshed if the
        partitions changed."""
        if self.partitions is None or not file.exists():
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), str(file))
        if file.name == "cpuset.cpus.exclusive":
            try:
                cpus = CPUSet.parse_list(value)
            except ValueError as err:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(file)) from err
            changed = self.partitions.write_exclusive(file.parent, cpus)
        else:
            changed = self.partitions.write_partition(file.parent, value.strip())
        if changed:
            self._refresh_all()

    def prune(self) -> None:
        """Removed cgroups' partitions end (the real kernel ends them at the rmdir)."""
        if self.partitions is not None and self.partitions.prune():
            self._refresh_all()

    def _refresh_all(self) -> None:
        """Every cgroup's effective CPUs after the partitions changed (mems do not)."""
        assert self.partitions is not None
        parts = self.partitions.valid()
        top = _ids(CPUSet, self.root / "cpuset.cpus.effective")
        for child in _children(self.root):
            if (child / "cpuset.cpus").exists():
                self._refresh_cpus(child, child.name, top, parts)

    def _refresh_cpus(
        self, d: Path, key: str, inherited: CPUSet, parts: Mapping[str, CPUSet]
    ) -> None:
        own = parts.get(key)
        if own is None:
            own = (_ids(CPUSet, d / "cpuset.cpus") & inherited) or inherited
        text = f"{own.format_list()}\n"
        effective = d / "cpuset.cpus.effective"
        with contextlib.suppress(FileNotFoundError):
            if _kernel_read(effective) == text:
                text = ""
        if text:
            _kernel_write(effective, text)
        for child in _children(d):
            if (child / "cpuset.cpus").exists():
                self._refresh_cpus(child, f"{key}/{child.name}", own, parts)

    def _add_cpuset(self, d: Path) -> None:
        files = {"cpuset.cpus": "", "cpuset.mems": ""}
        kernel_files(d, files | (PARTITION_FILES if self.partitions is not None else {}))
        self._refresh(d)

    def _refresh(self, d: Path, parts: Mapping[str, CPUSet] | None = None) -> None:
        """Effective = configured ∩ parent's effective, or the parent's if that is empty
        (a valid partition's: its exclusive CPUs); the children's follow where this
        one's changed."""
        if parts is None and self.partitions is not None:
            parts = self.partitions.valid()
        own = (parts or {}).get(d.relative_to(self.root).as_posix())
        cpus = _refresh_effective(CPUSet, d, "cpus", own)
        mems = _refresh_effective(NodeSet, d, "mems")
        if not (cpus or mems):
            return
        for child in _children(d):
            if (child / "cpuset.cpus").exists():
                self._refresh(child, parts)


def _refresh_effective(kind: type[_S], d: Path, name: str, fixed: _S | None = None) -> bool:
    """Write ``d``'s effective set (``fixed`` where given: a partition's); False when
    it already held it."""
    if fixed is not None:
        text = f"{fixed.format_list()}\n"
    else:
        inherited = _ids(kind, d.parent / f"cpuset.{name}.effective")
        own = _ids(kind, d / f"cpuset.{name}") & inherited
        text = f"{(own or inherited).format_list()}\n"
    effective = d / f"cpuset.{name}.effective"
    with contextlib.suppress(FileNotFoundError):
        if _kernel_read(effective) == text:
            return False  # a write would only cost: the tree is rewritten often
    _kernel_write(effective, text)
    return True


class KernelV1:
    """What the legacy cpuset hierarchy does on its own, emulated on scratch trees."""

    def populate(self, d: Path) -> None:
        files = dict(V1_FILES)
        if (d.parent / "cpuset.effective_cpus").exists():
            files |= {"cpuset.effective_cpus": "", "cpuset.effective_mems": ""}
        kernel_files(d, files)

    def check(self, file: Path, ids: _S) -> None:
        """v1's rules: a cpuset stays within its parent's, and is not emptied under tasks."""
        if not ids.issubset(_ids(type(ids), file.parent.parent / file.name)):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(file))
        if not ids and _has_tasks(file.parent):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))

    def refresh(self, d: Path) -> None:
        # Without cgroup.sane_behavior a v1 cpuset's effective sets are its own.
        for name in ("cpus", "mems"):
            if (d / f"cpuset.effective_{name}").exists():
                text = _kernel_read(d / f"cpuset.{name}").strip()
                kernel_files(d, {f"cpuset.effective_{name}": text})


def _has_tasks(d: Path) -> bool:
    return bool([int(pid) for pid in _kernel_read(d / "cgroup.procs").split()])


def _children(d: Path) -> list[Path]:
    return sorted(child for child in d.iterdir() if child.is_dir() and not child.is_symlink())
