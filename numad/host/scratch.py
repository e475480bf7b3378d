"""Scratch cgroup trees: plain directories laid out like cgroupfs, so that numad
runs whole without a kernel (tests, demos, ``numad serve --root``).

Builds on the cgroup layer: the trees made here hold ``SCRATCH_MARKER`` (a regular
file, which cgroupfs refuses to create), so the backends built on them emulate the
kernel's part (``numad.host.cgroup.emulation``); nothing on a real host uses it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError
from numad.host.cgroup.emulation import V1_FILES, kernel_files
from numad.host.cgroup.hierarchy import SCRATCH_MARKER, is_scratch
from numad.host.cgroup.path import CgroupPath
from numad.host.cgroup.v1 import CgroupV1Backend
from numad.host.cgroup.v2 import CgroupV2Backend


def make_scratch_v2(
    root: Path,
    cpus: CPUSet,
    mems: NodeSet,
    cgroups: Iterable[str] = (),
    *,
    partitions: bool = False,
) -> None:
    """Lay out a v2 root cgroup at ``root`` (the machine's ``cpus``/``mems``) and ``cgroups``.

    Like the kernel's root cgroup it has effective files but no ``cpuset.cpus``.
    ``partitions``: its kernel offers remote partitions, as 6.7 and later do (the
    root lists ``cpuset.cpus.isolated``, every cgroup has the partition files).
    """
    root.mkdir(parents=True, exist_ok=True)
    files = {
        "cgroup.controllers": "cpuset cpu io memory pids",
        "cgroup.subtree_control": "",
        "cgroup.procs": "",
        "cpuset.cpus.effective": cpus.format_list(),
        "cpuset.mems.effective": mems.format_list(),
        SCRATCH_MARKER: "a scratch cgroup v2 tree made by numad; its kernel is emulated",
    }
    kernel_files(root, files | ({"cpuset.cpus.isolated": ""} if partitions else {}))
    _make_cgroups(CgroupV2Backend, root, cgroups)


def make_scratch_v1(
    root: Path,
    cpus: CPUSet,
    mems: NodeSet,
    cgroups: Iterable[str] = (),
    *,
    effective_files: bool = True,
) -> None:
    """Lay out a v1 cpuset hierarchy at ``root/cpuset``, with ``cgroups`` in it.

    ``effective_files=False`` gives the older kernels' tree without
    ``cpuset.effective_cpus``/``cpuset.effective_mems``.
    """
    hierarchy = root / "cpuset"
    hierarchy.mkdir(parents=True, exist_ok=True)
    files = {
        **V1_FILES,
        "cpuset.cpus": cpus.format_list(),
        "cpuset.mems": mems.format_list(),
        SCRATCH_MARKER: "a scratch cgroup v1 cpuset hierarchy made by numad",
    }
    if effective_files:
        files |= {"cpuset.effective_cpus": cpus.format_list()}
        files |= {"cpuset.effective_mems": mems.format_list()}
    kernel_files(hierarchy, files)
    _make_cgroups(CgroupV1Backend, hierarchy, cgroups)


def scratch_mkdir(root: Path, path: str) -> None:
    """Create cgroup ``path`` (and missing levels inside its managed root) in a scratch
    v2 tree, with the interface files the kernel's mkdir would give it: what a
    service manager does when a workload starts (tests and demos)."""
    if not is_scratch(root):
        raise CgroupError(
            str(root), "is not a scratch cgroup tree", "only scratch trees are changed this way"
        )
    _make_cgroups(CgroupV2Backend, root, [path])


def _make_cgroups(
    backend: type[CgroupV2Backend | CgroupV1Backend], root: Path, cgroups: Iterable[str]
) -> None:
    paths = [CgroupPath.parse(text) for text in cgroups]
    if paths:
        tops = {CgroupPath(path.parts[:1]) for path in paths}
        maker = backend(root, tops, emulate_kernel=True)
        for path in paths:
            maker.ensure(path)
