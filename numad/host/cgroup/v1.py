"""The legacy (v1) cpuset hierarchy, written through cgroupspy.

The cgroup layer (the last stage, run after the checkpoint), and the only user
of cgroupspy. Touches only the cpuset hierarchy under its root
(``/sys/fs/cgroup/cpuset`` on a host), through ``Hierarchy``'s checks. v1 has
no inheritance: an empty cpuset takes no tasks, and a CPU that goes offline
leaves every cpuset for good, so this backend fills and restores sets itself.
With ``emulate_kernel``, ``numad.host.scratch`` does the kernel's part in a scratch
tree.
"""

from __future__ import annotations

import errno
import itertools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from cgroupspy import controllers, nodes

from numad.cpuset import CPUSet, NodeSet
from numad.host.cgroup.emulation import KernelV1
from numad.host.cgroup.hierarchy import Hierarchy
from numad.host.cgroup.path import DEFAULT_MANAGED_ROOTS, CgroupPath

_S = TypeVar("_S", CPUSet, NodeSet)


class CgroupV1Backend(Hierarchy):
    """The legacy cpuset hierarchy (``/sys/fs/cgroup/cpuset``), through cgroupspy.

    cgroupspy's ``trees`` are not used: a ``Tree`` walks the whole hierarchy when
    built, and with ``sub_groups`` it creates every missing component, which would
    re-create a removed cgroup or create one above the managed root. numad builds
    the ``Node`` of one checked directory instead and attaches the cpuset
    controller itself (cgroupspy would pick it by the name of the directory under
    its tree root, which need not be ``cpuset``). Files are read as text through
    cgroupspy and parsed by ``CPUSet``, whose parser is bounded and names the bad part.
    """

    def __init__(
        self,
        root: Path,
        managed_roots: Iterable[CgroupPath | str] = DEFAULT_MANAGED_ROOTS,
        *,
        emulate_kernel: bool = False,
    ) -> None:
        super().__init__(root, managed_roots, emulate_kernel=emulate_kernel)
        self._kernel: KernelV1 | None = None
        if emulate_kernel:
            self._kernel = KernelV1()

    def ensure(self, path: CgroupPath | str) -> None:
        """Make ``path`` exist; a new cgroup gets its parent's cpus and mems.

        v1 has no inheritance, and a cgroup with an empty cpuset.cpus or cpuset.mems
        takes no tasks; so every managed level that is empty (new, or left so by a
        crash between mkdir and the first write) is filled from its parent.
        """
        with self._kernel_mutex:
            cg, managed, _ = self._locate(path)
            levels = self._levels(cg, managed)
            for (parent, parent_dir), (child, child_dir) in itertools.pairwise(levels):
                if not child_dir.is_dir():
                    with self._failures(child, "creating the cgroup", parent_dir):
                        nodes.Node(os.fsencode(parent_dir)).create_cgroup(
                            os.fsencode(child.parts[-1])
                        )
                    if self._kernel is not None:
                        self._kernel.populate(child_dir)
                if child.is_within(managed):
                    cpus, mems = self._configured(child, child_dir)
                    if not cpus or not mems:
                        parent_cpus, parent_mems = self._configured(parent, parent_dir)
                        self._set(child, child_dir, cpus or parent_cpus, mems or parent_mems)

    def write(self, path: CgroupPath | str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        """Write cpuset.cpus, then cpuset.mems; None leaves a file alone.

        An empty set takes the parent's current set: v1 has no inheritance, and an
        empty cpuset cannot hold tasks. Unlike v2 it does not follow later changes
        of the parent.
        """
        cg, _, d = self._locate(path)
        if (cpus is not None and not cpus) or (mems is not None and not mems):
            parent_cpus, parent_mems = self._configured(cg.parent, d.parent)
            cpus = parent_cpus if cpus is not None and not cpus else cpus
            mems = parent_mems if mems is not None and not mems else mems
        self._set(cg, d, cpus, mems)

    def read(self, path: CgroupPath | str, *, mems: bool = True) -> tuple[CPUSet, NodeSet]:
        """The configured sets; without ``mems`` the empty set stands for cpuset.mems."""
        cg, _, d = self._locate(path)
        return self._configured(cg, d, mems=mems)

    def restore_cpus(self, cpus: CPUSet) -> None:
        """Give the online ``cpus`` back to the managed cgroups that hold others.

        v1 takes a CPU that goes offline out of every cpuset for good, and a CPU
        that goes offline and comes back within one burst of uevents leaves no
        trace in the topology; so after each hotplug burst the managed roots and
        the levels between them and the workloads' cgroups (pod slices) get back,
        top down, the CPUs of ``cpus`` that their parent has: else numad's next
        write naming one fails (EACCES). The workloads' own cgroups are left to
        numad's writes, so no exclusive CPU is shared on the way.
        """
        for managed in self.managed_roots:
            top = self._real(managed, managed)
            for dirpath, dirnames, _ in os.walk(top):
                if not dirnames:
                    continue
                d = Path(dirpath)
                cg = CgroupPath((*managed.parts, *d.relative_to(top).parts))
                have = self._configured(cg, d)[0]
                back = (cpus - have) & self._configured(cg.parent, d.parent)[0]
                if back:
                    self._set(cg, d, have | back, None)

    def read_effective(self, path: CgroupPath | str) -> tuple[CPUSet, NodeSet]:
        """``cpuset.effective_cpus``/``_mems`` where the kernel has them, else the configured."""
        cg, _, d = self._locate(path)
        cpus, mems = self._configured(cg, d)
        ctl = _controller(d)
        with self._kernel_mutex, self._failures(cg, "reading the effective cpuset", d):
            if (d / "cpuset.effective_cpus").is_file():
                cpus = CPUSet.parse_list(ctl.get_property(b"cpuset.effective_cpus"))
            if (d / "cpuset.effective_mems").is_file():
                mems = NodeSet.parse_list(ctl.get_property(b"cpuset.effective_mems"))
        return cpus, mems

    def processes(self, path: CgroupPath | str) -> list[int]:
        cg, _, d = self._locate(path)
        with self._failures(cg, "reading cgroup.procs", d):
            return [int(pid) for pid in _controller(d).procs]

    def _configured(self, cg: CgroupPath, d: Path, *, mems: bool = True) -> tuple[CPUSet, NodeSet]:
        ctl = _controller(d)
        with self._kernel_mutex, self._failures(cg, "reading cpuset.cpus and cpuset.mems", d):
            cpus = CPUSet.parse_list(ctl.get_property(b"cpuset.cpus"))
            nodes = NodeSet.parse_list(ctl.get_property(b"cpuset.mems")) if mems else NodeSet()
        return cpus, nodes

    def _set(self, cg: CgroupPath, d: Path, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        if cpus is not None:
            self._set_one(cg, d, "cpus", cpus)
        if mems is not None:
            self._migrate_memory(cg, d)
            self._set_one(cg, d, "mems", mems)

    def _migrate_memory(self, cg: CgroupPath, d: Path) -> None:
        """v1 moves a cgroup's pages on a mems change only with memory_migrate set
        (v2 always does); numad sets it before it first narrows a cgroup's mems."""
        file = d / "cpuset.memory_migrate"
        with self._failures(cg, "setting cpuset.memory_migrate", d):
            ctl = _controller(d)
            if file.is_file() and ctl.get_property(b"cpuset.memory_migrate").strip() != "1":
                ctl.set_property(b"cpuset.memory_migrate", "1")

    def _set_one(self, cg: CgroupPath, d: Path, name: str, ids: _S) -> None:
        file = d / f"cpuset.{name}"
        with self._kernel_mutex, self._failures(cg, f"writing {str(ids)!r} to {file.name}", d):
            if file.is_symlink():  # cgroupspy's open() would follow it
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(file))
            if self._kernel is not None:
                self._kernel.check(file, ids)
            # cgroupspy's CpuSetController.cpus/.mems write the whole list in one
            # write() (an empty set as " ", never a zero-length write).
            setattr(_controller(d), name, set(ids))
            if self._kernel is not None:
                self._kernel.refresh(d)


def _controller(d: Path) -> Any:
    return controllers.CpuSetController(nodes.Node(os.fsencode(d)))
