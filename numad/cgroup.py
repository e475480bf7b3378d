"""cgroup enforcement: numad's CPU and memory-node sets written into cpuset cgroups.

The last stage of the pipeline, run after the checkpoint. It touches only the
cgroup hierarchy under the root it is given: ``/sys/fs/cgroup`` (v2) or
``/sys/fs/cgroup/cpuset`` (v1) on a host, a scratch tree in tests and under
``numad serve --root``. It is the only user of cgroupspy (the v1 backend).

Invariant 5 (DESIGN.md): nothing outside the managed roots is written. A path
is checked as text (``CgroupPath``: relative, no ``.``/``..``, no empty
components, inside a managed root) and on disk (its real path must stay inside
the managed root's, so no symbolic link can lead a write elsewhere). Nothing is
created above a managed root. One write does reach above it, on v2 only:
``+cpuset`` in an ancestor's ``cgroup.subtree_control``, made only where cpuset
is not enabled yet, because without it the managed cgroups have no cpuset files.

Kernel behaviour callers rely on (reference/vm-testbed.md, step 4): a v2 child's
effective set is its configured set masked by the parent's effective set, or the
parent's when that is empty, so an empty ``cpuset.cpus`` means "inherit"; a
cpuset with tasks cannot become empty (ENOSPC); ids beyond the possible CPUs
give ERANGE, other bad lists EINVAL.

Scratch trees (``numad.scratch``) hold a marker file that cgroupfs cannot hold
(it refuses to create regular files). With ``emulate_kernel`` a backend also
has ``numad.scratch`` do the kernel's part there: interface files of new
cgroups, ``cgroup.subtree_control`` semantics and the effective sets. Emulation
refuses a tree without the marker, so on a real hierarchy numad never writes a
file that the kernel owns.
"""

from __future__ import annotations

import errno
import itertools
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from cgroupspy import controllers, nodes

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError

if TYPE_CHECKING:
    from numad.scratch import KernelV1, KernelV2

SCRATCH_MARKER = ".numad-scratch"
DEFAULT_MANAGED_ROOTS = ("numad.slice",)
_NAME_MAX = 255  # the kernel's limit on one cgroup (directory) name

_S = TypeVar("_S", CPUSet, NodeSet)


@dataclass(frozen=True, slots=True)
class CgroupPath:
    """A cgroup's path relative to the hierarchy root, checked as text."""

    parts: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> CgroupPath:
        """Check ``text`` (``numad.slice/db.service``); raises CgroupError naming the fault."""
        subject = f"cgroup path {text!r}"
        if not text:
            raise CgroupError(subject, "is empty")
        if text.startswith("/"):
            raise CgroupError(subject, "is absolute", "make it relative to the cgroup root")
        parts = tuple(text.split("/"))
        for part in parts:
            if part in ("", ".", ".."):
                raise CgroupError(
                    subject, f"has a {part!r} component", "write it without '.', '..' or '//'"
                )
            if len(part.encode()) > _NAME_MAX or any(ord(c) < 32 or c == "\x7f" for c in part):
                raise CgroupError(subject, f"{part!r} is not a valid cgroup name")
        return cls(parts)

    def __str__(self) -> str:
        return "/".join(self.parts)

    @property
    def parent(self) -> CgroupPath:
        return CgroupPath(self.parts[:-1])

    def is_within(self, other: CgroupPath) -> bool:
        """True if this path is ``other`` or below it."""
        return self.parts[: len(other.parts)] == other.parts

    def managed_by(self, roots: Iterable[CgroupPath]) -> CgroupPath:
        """The (innermost) managed root this path lies in; CgroupError if none."""
        inside = [root for root in roots if self.is_within(root)]
        if not inside:
            names = ", ".join(str(root) for root in roots)
            raise CgroupError(
                f"cgroup path {str(self)!r}",
                f"is outside the managed cgroup roots ({names})",
                "use a path below one of them",
            )
        return max(inside, key=lambda root: len(root.parts))


def _as_path(path: CgroupPath | str) -> CgroupPath:
    return path if isinstance(path, CgroupPath) else CgroupPath.parse(path)


class _Backend:
    """Path checks and error mapping shared by the v2 and v1 backends."""

    def __init__(
        self,
        root: Path,
        managed_roots: Iterable[CgroupPath | str] = DEFAULT_MANAGED_ROOTS,
        *,
        emulate_kernel: bool = False,
    ) -> None:
        self.root = Path(root)
        self._real_root = Path(os.path.realpath(root))
        self.managed_roots = tuple(_as_path(r) for r in managed_roots)
        if not self.managed_roots:
            raise CgroupError(str(root), "no managed cgroup roots", "name one, e.g. numad.slice")
        if emulate_kernel and not (self._real_root / SCRATCH_MARKER).is_file():
            raise CgroupError(
                str(root),
                "kernel emulation is only for scratch trees, and this is not one",
                "lay the tree out with numad.scratch.make_scratch_v2 or make_scratch_v1",
            )
        self.emulate_kernel = emulate_kernel

    def __repr__(self) -> str:
        roots = [str(r) for r in self.managed_roots]
        return f"{type(self).__name__}(root={str(self.root)!r}, managed_roots={roots!r})"

    def exists(self, path: CgroupPath | str) -> bool:
        return self._locate(path)[2].is_dir()

    # -- paths -----------------------------------------------------------------------------

    def _subject(self, cg: CgroupPath) -> str:
        return os.path.join(self.root, str(cg)) if cg.parts else str(self.root)

    def _locate(self, path: CgroupPath | str) -> tuple[CgroupPath, CgroupPath, Path]:
        """The checked path, its managed root, and its directory on disk."""
        cg = _as_path(path)
        managed = cg.managed_by(self.managed_roots)
        return cg, managed, self._real(cg, managed)

    def _real(self, cg: CgroupPath, fence: CgroupPath) -> Path:
        """``cg``'s directory, after checking that no link leads it out of ``fence``."""
        allowed = self._real_root.joinpath(*fence.parts)
        real = Path(os.path.realpath(self._real_root.joinpath(*cg.parts)))
        if real != allowed and allowed not in real.parents:
            where = f"the managed root {fence}" if fence.parts else "the cgroup root"
            raise CgroupError(
                self._subject(cg),
                f"a symbolic link leads it to {real}, outside {where}",
                "remove the link: numad writes only inside its managed roots",
            )
        return real

    def _levels(self, cg: CgroupPath, managed: CgroupPath) -> list[tuple[CgroupPath, Path]]:
        """Every cgroup from the root down to ``cg`` with its directory.

        Those above the managed root must exist: numad never creates them. Each is
        checked before ``ensure`` changes anything.
        """
        levels: list[tuple[CgroupPath, Path]] = []
        for depth in range(len(cg.parts) + 1):
            level = CgroupPath(cg.parts[:depth])
            above = depth < len(managed.parts)
            real = self._real(level, level if above else managed)
            if above and not real.is_dir():
                raise CgroupError(
                    self._subject(level),
                    f"does not exist, and numad creates nothing above its managed root {managed}",
                    "create it first (e.g. as a systemd slice)",
                )
            levels.append((level, real))
        return levels

    # -- errors ----------------------------------------------------------------------------

    @contextmanager
    def _failures(self, cg: CgroupPath, action: str, directory: Path) -> Iterator[None]:
        """Turn OSError (and unparsable content) into CgroupError naming the cgroup."""
        try:
            yield
        except OSError as err:
            raise _failure(self._subject(cg), action, err, directory) from err
        except ValueError as err:
            raise CgroupError(self._subject(cg), f"{action}: unusable content ({err})") from err


_PERMISSION = (
    "permission denied",
    "run numad as root, or delegate the subtree to its user (systemd Delegate=)",
)
_MEANINGS: Mapping[int, tuple[str, str | None]] = {
    errno.EINVAL: (
        "the kernel rejected the value (CPUs or nodes outside the parent's effective set,"
        " a node that does not exist, or a malformed list)",
        "compare it with the parent's cpuset.cpus.effective and cpuset.mems.effective",
    ),
    errno.ERANGE: (
        "an id is beyond the machine's possible CPUs or nodes",
        "rediscover the topology",
    ),
    errno.ENOSPC: (
        "a cpuset with tasks (or populated children) cannot become empty",
        "move its tasks out first, or write a non-empty set",
    ),
    errno.EBUSY: (
        "the cgroup is busy: an exclusive cpuset (v1) or a cpuset partition conflicts",
        "release the conflicting exclusive set or partition first",
    ),
    errno.EACCES: _PERMISSION,
    errno.EPERM: _PERMISSION,
    errno.ELOOP: ("the file is a symbolic link, which cgroupfs never has", "remove the link"),
}


def _failure(subject: str, action: str, err: OSError, directory: Path) -> CgroupError:
    if err.errno == errno.ENOENT:
        if not directory.is_dir():
            return CgroupError(
                subject, f"{action}: the cgroup is gone", "ensure() re-creates a managed cgroup"
            )
        return CgroupError(
            subject,
            f"{action}: the file does not exist",
            "the cpuset controller is not enabled in the parent; ensure() enables it",
        )
    meaning, hint = _MEANINGS.get(err.errno or 0, (err.strerror or str(err), None))
    return CgroupError(subject, f"{action}: {meaning}", hint)


def _write_file(path: Path, value: str) -> None:
    """Write ``value`` in one open, one write() and one close, as cgroupfs wants.

    Unbuffered, so that the kernel's verdict comes from this write(), not from a
    flush at close. Opened without O_CREAT (cgroupfs files exist or their
    controller is off, and a scratch tree must not grow a file the kernel would
    not have) and without following links (cgroupfs has none). An empty value
    goes out as a lone newline: a zero-length write() changes nothing.
    """
    with open(path, "wb", buffering=0, opener=_open_existing) as f:
        f.write(f"{value}\n".encode())


def _open_existing(path: str, flags: int) -> int:
    return os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)


def _parse_pids(text: str) -> list[int]:
    return [int(line) for line in text.split()]


class CgroupV2Backend(_Backend):
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
        if emulate_kernel:
            # numad.scratch builds on this module; only scratch trees need it.
            from numad.scratch import KernelV2  # noqa: PLC0415

            self._kernel = KernelV2()

    def ensure(self, path: CgroupPath | str) -> None:
        """Make ``path`` exist with cpuset enabled in every ancestor's subtree_control."""
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

    def read(self, path: CgroupPath | str) -> tuple[CPUSet, NodeSet]:
        """The configured sets (empty: inherited from the parent)."""
        cg, _, d = self._locate(path)
        with self._failures(cg, "reading cpuset.cpus and cpuset.mems", d):
            cpus = (d / "cpuset.cpus").read_text()
            mems = (d / "cpuset.mems").read_text()
            return CPUSet.parse_list(cpus), NodeSet.parse_list(mems)

    def restore_cpus(self, cpus: CPUSet) -> None:
        """Nothing to do: v2 keeps a CPU in cpuset.cpus while it is offline."""

    def read_effective(self, path: CgroupPath | str) -> tuple[CPUSet, NodeSet]:
        """What the kernel applies; empty sets where the effective files are missing."""
        cg, _, d = self._locate(path)
        with self._failures(cg, "reading the effective cpuset", d):
            cpus = _read_optional(d / "cpuset.cpus.effective")
            mems = _read_optional(d / "cpuset.mems.effective")
            return CPUSet.parse_list(cpus), NodeSet.parse_list(mems)

    def processes(self, path: CgroupPath | str) -> list[int]:
        cg, _, d = self._locate(path)
        with self._failures(cg, "reading cgroup.procs", d):
            return _parse_pids((d / "cgroup.procs").read_text())

    def _enable_cpuset(self, cg: CgroupPath, d: Path) -> None:
        with self._failures(cg, "reading its controllers", d):
            if "cpuset" in (d / "cgroup.subtree_control").read_text().split():
                return
            available = (d / "cgroup.controllers").read_text().split()
            populated = bool(cg.parts) and bool(_parse_pids((d / "cgroup.procs").read_text()))
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
                self._kernel.write(file, value, _write_file)
            else:
                _write_file(file, value)


def _read_optional(file: Path) -> str:
    try:
        return file.read_text()
    except FileNotFoundError:
        return ""


class CgroupV1Backend(_Backend):
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
            # numad.scratch builds on this module; only scratch trees need it.
            from numad.scratch import KernelV1  # noqa: PLC0415

            self._kernel = KernelV1()

    def ensure(self, path: CgroupPath | str) -> None:
        """Make ``path`` exist; a new cgroup gets its parent's cpus and mems.

        v1 has no inheritance, and a cgroup with an empty cpuset.cpus or cpuset.mems
        takes no tasks; so every managed level that is empty (new, or left so by a
        crash between mkdir and the first write) is filled from its parent.
        """
        cg, managed, _ = self._locate(path)
        levels = self._levels(cg, managed)
        for (parent, parent_dir), (child, child_dir) in itertools.pairwise(levels):
            if not child_dir.is_dir():
                with self._failures(child, "creating the cgroup", parent_dir):
                    nodes.Node(os.fsencode(parent_dir)).create_cgroup(os.fsencode(child.parts[-1]))
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

    def read(self, path: CgroupPath | str) -> tuple[CPUSet, NodeSet]:
        cg, _, d = self._locate(path)
        return self._configured(cg, d)

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
        with self._failures(cg, "reading the effective cpuset", d):
            if (d / "cpuset.effective_cpus").is_file():
                cpus = CPUSet.parse_list(ctl.get_property(b"cpuset.effective_cpus"))
            if (d / "cpuset.effective_mems").is_file():
                mems = NodeSet.parse_list(ctl.get_property(b"cpuset.effective_mems"))
        return cpus, mems

    def processes(self, path: CgroupPath | str) -> list[int]:
        cg, _, d = self._locate(path)
        with self._failures(cg, "reading cgroup.procs", d):
            return [int(pid) for pid in _controller(d).procs]

    def _configured(self, cg: CgroupPath, d: Path) -> tuple[CPUSet, NodeSet]:
        ctl = _controller(d)
        with self._failures(cg, "reading cpuset.cpus and cpuset.mems", d):
            cpus = CPUSet.parse_list(ctl.get_property(b"cpuset.cpus"))
            mems = NodeSet.parse_list(ctl.get_property(b"cpuset.mems"))
        return cpus, mems

    def _set(self, cg: CgroupPath, d: Path, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        if cpus is not None:
            self._set_one(cg, d, "cpus", cpus)
        if mems is not None:
            self._set_one(cg, d, "mems", mems)

    def _set_one(self, cg: CgroupPath, d: Path, name: str, ids: _S) -> None:
        file = d / f"cpuset.{name}"
        with self._failures(cg, f"writing {str(ids)!r} to {file.name}", d):
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


def is_scratch(root: Path) -> bool:
    """Whether ``root`` is a scratch tree (``numad.scratch``): it holds the marker."""
    return (root / SCRATCH_MARKER).is_file()
