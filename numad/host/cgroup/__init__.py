"""cgroup enforcement: numad's CPU and memory-node sets written into cpuset cgroups.

The last stage of the pipeline, run after the checkpoint. It touches only the
cgroup hierarchy under the root it is given: ``/sys/fs/cgroup`` (v2) or
``/sys/fs/cgroup/cpuset`` (v1) on a host, a scratch tree in tests and under
``numad serve --root``. ``path`` checks a cgroup path as text, ``hierarchy`` on
disk (DESIGN invariant 5: nothing outside the managed roots is written); ``v2``
and ``v1`` are the two backends (cgroupspy lives only in ``v1``), and
``detect_backend`` here picks the one a host has.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeAlias

from numad.errors import CgroupError
from numad.host.cgroup.hierarchy import is_scratch
from numad.host.cgroup.path import DEFAULT_MANAGED_ROOTS, CgroupPath
from numad.host.cgroup.v1 import CgroupV1Backend
from numad.host.cgroup.v2 import CgroupV2Backend

# What the rest of numad needs (numad.daemon.root names CgroupPath from here); code that
# builds a backend of one kind (numad.host.scratch, tests) imports it from v2 or v1.
__all__ = ["CgroupBackend", "CgroupPath", "detect_backend", "host_parts"]

CgroupBackend: TypeAlias = CgroupV2Backend | CgroupV1Backend


def detect_backend(
    root: Path = Path("/sys/fs/cgroup"),
    managed_roots: Iterable[CgroupPath | str] = DEFAULT_MANAGED_ROOTS,
    *,
    emulate_kernel: bool | None = None,
) -> CgroupBackend:
    """v2 if the root offers cpuset, else a v1 cpuset hierarchy at ``root/cpuset``.

    ``emulate_kernel=None`` emulates exactly on scratch trees (they hold the marker).
    """
    root = Path(root)
    try:
        offered = (root / "cgroup.controllers").read_text().split()
    except (FileNotFoundError, NotADirectoryError):
        offered = []
    except OSError as err:
        raise CgroupError(str(root), f"cannot read cgroup.controllers: {err.strerror}") from err
    if "cpuset" in offered:
        emulate = is_scratch(root) if emulate_kernel is None else emulate_kernel
        return CgroupV2Backend(root, managed_roots, emulate_kernel=emulate)
    hierarchy = root / "cpuset"
    if (hierarchy / "cpuset.cpus").is_file():
        emulate = is_scratch(hierarchy) if emulate_kernel is None else emulate_kernel
        return CgroupV1Backend(hierarchy, managed_roots, emulate_kernel=emulate)
    raise CgroupError(
        str(root),
        "no cpuset controller is available (no cpuset in a v2 cgroup.controllers,"
        " no v1 cpuset hierarchy at cpuset/)",
        "use a kernel with CONFIG_CPUSETS and mount cgroup2 (or the v1 cpuset hierarchy) here",
    )


def host_parts(cgroups: object) -> dict[str, Any]:
    """What ``Isolation`` needs to reach the top-level cgroups of ``cgroups``'s
    hierarchy: its root and a backend of the same kind fenced to them. Nothing for a
    backend without a hierarchy (a test double): only the managed roots are isolated."""
    if not isinstance(cgroups, CgroupV2Backend | CgroupV1Backend):
        return {}
    kind, root, emulate = type(cgroups), cgroups.root, cgroups.emulate_kernel

    def fenced(tops: list[str]) -> CgroupBackend:
        return kind(root, tops, emulate_kernel=emulate)

    return {"root": root, "host_backend": fenced, "v1": kind is CgroupV1Backend}
