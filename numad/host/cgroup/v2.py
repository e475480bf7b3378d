"""The unified (v2) hierarchy: cpusets written with plain file writes.

The cgroup layer (the last stage, run after the checkpoint). Touches only the
hierarchy under its root, through ``Hierarchy``'s checks. One write reaches
above a managed root: ``+cpuset`` in an ancestor's ``cgroup.subtree_control``,
made only where cpuset is not enabled yet, because without it the managed
cgroups have no cpuset files.

Kernel behaviour callers rely on (reference/vm-testbed.md, step 4): a child's
effective set is its configured set masked by the parent's effective set, or
the parent's when that is empty, so an empty ``cpuset.cpus`` means "inherit";
a cpuset with tasks cannot become empty (ENOSPC); ids beyond the possible CPUs
give ERANGE, other bad lists EINVAL. With ``emulate_kernel``, ``numad.host.scratch``
does the kernel's part in a scratch tree.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError
from numad.host.cgroup.emulation import KernelV2
from numad.host.cgroup.hierarchy import Hierarchy, read_and_close
from numad.host.cgroup.path import DEFAULT_MANAGED_ROOTS, CgroupPath, as_path

ADOPTED_KEPT = 100_000  # scratch directories remembered as complete (then forgotten)


def _write_file(path: Path, value: str) -> None:
    """Write ``value`` in one open, one write() and one close, as cgroupfs wants.

    One unbuffered write(), so that the kernel's verdict comes from it, not from
    a flush at close. A write() that takes fewer bytes than given raises OSError
    rather than leave the rest unwritten: cgroupfs takes a whole value or
    refuses it, so a short count means the file is not what it should be.
    Opened without O_CREAT (cgroupfs files exist or their controller is off, and
    a scratch tree must not grow a file the kernel would not have) and without
    following links (cgroupfs has none). An empty value goes out as a lone
    newline: a zero-length write() changes nothing.
    """
    data = f"{value}\n".encode()
    fd = _open_regular(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    try:
        written = os.write(fd, data)
        if written != len(data):
            problem = f"short write: {written} of {len(data)} bytes"
            raise OSError(errno.EIO, problem, str(path))
    finally:
        os.close(fd)


def _read_file(path: Path) -> str:
    """A cgroup file's text, read to its end."""
    return read_and_close(_open_regular(path, os.O_RDONLY))


def _open_regular(path: Path, flags: int) -> int:
    """``path`` opened with ``flags``, refused (ENXIO) unless it is a regular file.

    With O_NONBLOCK, which changes nothing for a regular file (kernfs ignores
    it), a FIFO planted in a scratch tree fails or opens at once (ENXIO for a
    writer without a reader) instead of waiting for its other end; fstat then
    refuses a FIFO, socket or device. Safe on a real hierarchy: cgroupfs
    interface files are kernfs nodes, which the kernel creates as regular files
    (fs/kernfs/file.c, __kernfs_create_file: "(mode & S_IALLUGO) | S_IFREG"), and
    stat shows them as S_IFREG 0644 or 0444.
    """
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.ENXIO, os.strerror(errno.ENXIO), str(path))
    return fd


def _parse_pids(text: str) -> list[int]:
    return [int(line) for line in text.split()]


class CgroupV2Backend(Hierarchy):
    """The unified (v2) hierarchy, written with plain file writes."""

    def __init__(
        self,
        root: Path,
        managed_roots: Iterable[CgroupPath | str] = DEFAULT_MANAGED_ROOTS,
        *,
        emulate_kernel: bool = False,
    ) -> None:
        super().__init__(root, managed_roots, emulate_kernel=emulate_kernel)
        self._kernel: KernelV2 | None = None
        self._adopted: dict[Path, int] = {}  # scratch directories completed, by inode
        if emulate_kernel:
            self._kernel = KernelV2(self._real_root)

    def _locate(self, path: CgroupPath | str) -> tuple[CgroupPath, CgroupPath, Path]:
        found = super()._locate(path)
        if self._kernel is not None:  # a plain mkdir in a scratch tree is a cgroup too
            # Once per directory (by inode: one made again is completed again), not
            # at every read of a pass.
            try:
                inode: int | None = os.stat(found[2]).st_ino
            except OSError:
                inode = None
            if inode is None or self._adopted.get(found[2]) != inode:
                with (
                    self._kernel_mutex,
                    self._failures(found[0], "completing it as a cgroup", found[2]),
                ):
                    self._kernel.adopt(self._real_root, found[2])
                if inode is not None:
                    if len(self._adopted) > ADOPTED_KEPT:
                        self._adopted.clear()
                    self._adopted[found[2]] = inode
        return found

    def ensure(self, path: CgroupPath | str) -> None:
        """Make ``path`` exist with cpuset enabled in every ancestor's subtree_control."""
        with self._kernel_mutex:
            cg, managed, _ = self._locate(path)
            levels = self._levels(cg, managed)
            for (parent, parent_dir), (child, child_dir) in itertools.pairwise(levels):
                self._enable_cpuset(parent, parent_dir)
                if not child_dir.is_dir():
                    with self._failures(child, "creating the cgroup", parent_dir):
                        if self._kernel is not None:
                            self._kernel.mkdir(child_dir)
                        else:
                            child_dir.mkdir(exist_ok=True)

    def write(self, path: CgroupPath | str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        """Write cpuset.cpus, then cpuset.mems; None leaves a file alone, empty inherits."""
        cg, _, d = self._locate(path)
        if cpus is not None:
            self._write(cg, d / "cpuset.cpus", cpus.format_list())
        if mems is not None:
            self._write(cg, d / "cpuset.mems", mems.format_list())

    def read(self, path: CgroupPath | str, *, mems: bool = True) -> tuple[CPUSet, NodeSet]:
        """The configured sets (empty: inherited from the parent); without ``mems``,
        cpuset.mems is not read and the empty set stands for it (half the reads of a
        pass that checks cgroups whose memory numad leaves alone)."""
        cg, _, d = self._locate(path)
        with self._kernel_mutex, self._failures(cg, "reading cpuset.cpus and cpuset.mems", d):
            cpus = _read_file(d / "cpuset.cpus")
            nodes = _read_file(d / "cpuset.mems") if mems else ""
            return CPUSet.parse_list(cpus), NodeSet.parse_list(nodes)

    def restore_cpus(self, cpus: CPUSet) -> None:
        """Nothing to do: v2 keeps a CPU in cpuset.cpus while it is offline."""

    def read_effective(self, path: CgroupPath | str) -> tuple[CPUSet, NodeSet]:
        """What the kernel applies; empty sets where the effective files are missing."""
        cg, _, d = self._locate(path)
        with self._kernel_mutex, self._failures(cg, "reading the effective cpuset", d):
            cpus = _read_optional(d / "cpuset.cpus.effective")
            mems = _read_optional(d / "cpuset.mems.effective")
            return CPUSet.parse_list(cpus), NodeSet.parse_list(mems)

    # -- remote partitions (kernel >= 6.7; numad.host.exclusive) ----------------------------

    def partitions_offered(self) -> bool:
        """Whether the kernel offers remote partitions: its root cgroup lists the
        isolated CPUs (``cpuset.cpus.isolated``, from 6.7 on, with
        ``cpuset.cpus.exclusive``)."""
        return (self._real_root / "cpuset.cpus.isolated").is_file()

    def partition(self, path: CgroupPath | str) -> tuple[CPUSet, str]:
        """A cgroup's ``cpuset.cpus.exclusive`` and ``cpuset.cpus.partition`` (``member``,
        ``root``, or ``root invalid (why)``); a level above a managed root too."""
        cg, d = self._level(path)
        with self._kernel_mutex, self._failures(cg, "reading its cpuset partition", d):
            cpus = _read_file(d / "cpuset.cpus.exclusive")
            state = _read_file(d / "cpuset.cpus.partition")
            return CPUSet.parse_list(cpus), state.strip()

    def write_exclusive(self, path: CgroupPath | str, cpus: CPUSet) -> None:
        cg, d = self._level(path)
        self._write(cg, d / "cpuset.cpus.exclusive", cpus.format_list())

    def write_partition(self, path: CgroupPath | str, state: str) -> None:
        cg, d = self._level(path)
        self._write(cg, d / "cpuset.cpus.partition", state)

    def _level(self, path: CgroupPath | str) -> tuple[CgroupPath, Path]:
        """A cgroup inside a managed root, or a level above one (a partition's
        exclusive CPUs are written down every level from the top)."""
        cg = as_path(path)
        for root in self.managed_roots:
            if root.is_within(cg) and root != cg:
                return cg, self._real(cg, cg)
        located, _, d = self._locate(cg)
        return located, d

    def processes(self, path: CgroupPath | str) -> list[int]:
        cg, _, d = self._locate(path)
        with self._failures(cg, "reading cgroup.procs", d):
            return _parse_pids(_read_file(d / "cgroup.procs"))

    def _enable_cpuset(self, cg: CgroupPath, d: Path) -> None:
        with self._failures(cg, "reading its controllers", d):
            if "cpuset" in _read_file(d / "cgroup.subtree_control").split():
                return
            available = _read_file(d / "cgroup.controllers").split()
            populated = bool(cg.parts) and bool(_parse_pids(_read_file(d / "cgroup.procs")))
        if "cpuset" not in available:
            raise CgroupError(
                self._subject(cg),
                "the cpuset controller is not available here (not in cgroup.controllers)",
                "enable it in the parent's cgroup.subtree_control; at the root, cpuset is"
                " bound to a v1 hierarchy or not built into the kernel",
            )
        if populated:
            # cpuset is threaded-capable, so the kernel accepts "+cpuset" here, but the
            # cgroup becomes a threaded root whose new children refuse tasks (EOPNOTSUPP).
            raise CgroupError(
                self._subject(cg),
                "has processes, so enabling cpuset for its children would leave them unusable",
                "move its processes into a leaf cgroup first",
            )
        self._write(cg, d / "cgroup.subtree_control", "+cpuset")

    def _write(self, cg: CgroupPath, file: Path, value: str) -> None:
        with self._failures(cg, f"writing {value!r} to {file.name}", file.parent):
            if self._kernel is not None:
                with self._kernel_mutex:
                    self._kernel.write(file, value, _write_file)
            else:
                _write_file(file, value)


def _read_optional(file: Path) -> str:
    try:
        return _read_file(file)
    except FileNotFoundError:
        return ""
