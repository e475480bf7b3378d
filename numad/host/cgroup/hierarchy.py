"""A cgroup hierarchy on disk: the checks and error mapping both backends share.

The cgroup layer (the last stage, run after the checkpoint). Reads only the
hierarchy under the root it is given (``/sys/fs/cgroup`` for v2,
``/sys/fs/cgroup/cpuset`` for v1, a scratch tree in tests and under ``numad
serve --root``) and writes nothing: ``numad.host.cgroup.v2`` and ``numad.host.cgroup.v1``
write, after ``Hierarchy`` has located their cgroup.

A path inside a managed root (``CgroupPath``) must also stay inside it on disk:
its real path must lie within the managed root's, so no symbolic link can lead
a write elsewhere (DESIGN invariant 5), and nothing above a managed root is
created. ``OSError`` becomes a ``CgroupError`` naming the cgroup, with what the
kernel's errno means for a cpuset.

Scratch trees (``numad.host.scratch``) hold ``SCRATCH_MARKER``, a regular file that
cgroupfs cannot hold (it refuses to create regular files). Kernel emulation
refuses a tree without the marker, so on a real hierarchy numad never writes a
file that the kernel owns. The kernel does each cgroup operation whole (under its
``cgroup_mutex``); the emulation does the same across processes with ``KernelMutex``,
so numad reacting to a test's ``mkdir`` never sees, or writes into, half a cgroup.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from numad.errors import CgroupError
from numad.host.cgroup.path import DEFAULT_MANAGED_ROOTS, CgroupPath, as_path

SCRATCH_MARKER = ".numad-scratch"
# Directories walked between two beats of a pass under way: the watchdog hears it
# advance, and a change that started meanwhile gets the interpreter to itself from the
# next one. Under emulation (the 6.12 guest, 10,000 strays) a beat of 256 took about
# 140 ms of walking, so an admission shared it for that long; beats of 32 cost nothing
# measurable on this host (a pass of 10,000 strays: 37-40 ms either way).
BEAT_EVERY = 32


def is_scratch(root: Path) -> bool:
    """Whether ``root`` is a scratch tree (``numad.host.scratch``): it holds the marker."""
    return (root / SCRATCH_MARKER).is_file()


def _linked(root: str, parts: Iterable[str]) -> bool:
    """Whether a level of the path below the real directory ``root`` is a symbolic link
    (one lstat per level, up to the first that does not exist: ``realpath`` would make
    one per level of the whole path, the root's included)."""
    here = root
    for part in parts:
        here = os.path.join(here, part)
        try:
            if stat.S_ISLNK(os.lstat(here).st_mode):
                return True
        except OSError:
            return False  # missing (or unreadable): nothing below it is resolved either
    return False


def _subdirectories(directory: str) -> list[str]:
    """The names of ``directory``'s subdirectories, sorted (the file type comes with each
    entry: no call per entry); none when it cannot be listed: removed meanwhile, as a
    cgroup may be at any time (``os.walk``'s rule, which the walk used before)."""
    try:
        with os.scandir(directory) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _may_have_subdirectories(directory: str) -> bool:
    """False when the link count says ``directory`` has no subdirectory: 2 (its own
    entry and its ``.``), each subdirectory adding one (its ``..``). cgroupfs counts them
    so (kernfs sets ``subdirs + 2``), as do ext4, xfs and tmpfs; one lstat where listing
    a cgroup would read its 30-70 control files. A filesystem that does not count (btrfs
    and overlayfs' merged directories say 1, ext4 past 65,000 subdirectories says 1) is
    listed. A link says 1 too, and is not followed."""
    try:
        st = os.lstat(directory)
    except OSError:
        return False  # removed meanwhile
    return stat.S_ISDIR(st.st_mode) and st.st_nlink != 2


class KernelMutex:
    """The emulated kernel's one lock, shared by every process on a scratch tree.

    ``flock`` on the tree's marker serialises processes (and the threads of one
    process, each entry holding its own open file); entering again from the thread
    that holds it only counts, as the emulation's operations nest.
    """

    def __init__(self, marker: Path) -> None:
        self._marker = marker
        self._local = threading.RLock()
        self._depth = 0
        self._fd = -1

    def __enter__(self) -> None:
        self._local.acquire()
        if self._depth == 0:
            try:
                if self._fd < 0:  # kept open: a lock and an unlock per operation
                    self._fd = os.open(self._marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except OSError as err:
                self._local.release()
                raise CgroupError(
                    str(self._marker.parent), f"the scratch tree's lock: {err.strerror}"
                ) from err
        self._depth += 1

    def __exit__(self, *_: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._local.release()

    def __del__(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)


class Hierarchy:
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
        self.managed_roots = tuple(as_path(r) for r in managed_roots)
        if not self.managed_roots:
            raise CgroupError(str(root), "no managed cgroup roots", "name one, e.g. numad.slice")
        if emulate_kernel and not is_scratch(self._real_root):
            raise CgroupError(
                str(root),
                "kernel emulation is only for scratch trees, and this is not one",
                "lay the tree out with numad.host.scratch.make_scratch_v2 or make_scratch_v1",
            )
        self.emulate_kernel = emulate_kernel
        self._kernel_mutex: contextlib.AbstractContextManager[None] = (
            KernelMutex(self._real_root / SCRATCH_MARKER)
            if emulate_kernel
            else contextlib.nullcontext()
        )

    def kernel_turn(self) -> contextlib.AbstractContextManager[None]:
        """Hold the emulated kernel still (a scratch tree; nothing on a real one): a
        reader listing the tree sees every cgroup whole."""
        return self._kernel_mutex

    def __repr__(self) -> str:
        roots = [str(r) for r in self.managed_roots]
        return f"{type(self).__name__}(root={str(self.root)!r}, managed_roots={roots!r})"

    def exists(self, path: CgroupPath | str) -> bool:
        return self._locate(path)[2].is_dir()

    def identity(self, path: CgroupPath | str) -> int | None:
        """The cgroup directory's inode (one made again gets another); None: absent."""
        try:
            return self._locate(path)[2].stat().st_ino
        except FileNotFoundError:
            return None

    def descendants(
        self, path: CgroupPath | str, beat: Callable[[], object] | None = None
    ) -> list[str]:
        """Every cgroup below ``path`` (not ``path`` itself), from the hierarchy root,
        parents first. Links are not followed: cgroupfs has none. A directory is listed
        only where its link count shows subdirectories (``_may_have_subdirectories``): on
        cgroupfs one lstat per leaf cgroup, one listing per parent. ``beat`` is called
        every ``BEAT_EVERY`` directories walked, in a directory's entries too (a
        reconcile pass advancing; where it steps aside for a change)."""
        cg, _, d = self._locate(path)
        found: list[str] = []
        stack = [("/".join(cg.parts), str(d))]
        walked = 0
        while stack:
            prefix, directory = stack.pop()
            children = _subdirectories(directory)
            named = [f"{prefix}/{child}" if prefix else child for child in children]
            found += named
            for name, child in zip(reversed(named), reversed(children), strict=True):
                below = os.path.join(directory, child)
                if _may_have_subdirectories(below):
                    stack.append((name, below))
                walked += 1
                if beat is not None and walked >= BEAT_EVERY:
                    walked = 0
                    beat()
        return found

    # -- paths -----------------------------------------------------------------------------

    def _subject(self, cg: CgroupPath) -> str:
        return os.path.join(self.root, str(cg)) if cg.parts else str(self.root)

    def _locate(self, path: CgroupPath | str) -> tuple[CgroupPath, CgroupPath, Path]:
        """The checked path, its managed root, and its directory on disk."""
        cg = as_path(path)
        managed = cg.managed_by(self.managed_roots)
        return cg, managed, self._real(cg, managed)

    def _real(self, cg: CgroupPath, fence: CgroupPath) -> Path:
        """``cg``'s directory, after checking that no link leads it out of ``fence``."""
        root = str(self._real_root)  # strings, not Paths: this runs for every read of a pass
        joined = os.path.join(root, *cg.parts)
        if not _linked(root, cg.parts):
            return Path(joined)  # the root is real already: nothing below it to resolve
        allowed = os.path.join(root, *fence.parts)
        real = os.path.realpath(joined)
        if real != allowed and not real.startswith(allowed.rstrip("/") + "/"):
            where = f"the managed root {fence}" if fence.parts else "the cgroup root"
            raise CgroupError(
                self._subject(cg),
                f"a symbolic link leads it to {real}, outside {where}",
                "remove the link: numad writes only inside its managed roots",
            )
        return Path(real)

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
        " exclusive CPUs outside the parent's or a sibling's, a node that does not exist,"
        " or a malformed list)",
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
    # What v2's writer makes of a FIFO, socket or device (cgroupfs files are regular).
    errno.ENXIO: (
        "the file is not a regular file (a FIFO, socket or device), which cgroupfs never has",
        "remove it",
    ),
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


def read_and_close(fd: int) -> str:
    """The text behind ``fd``, read to its end; ``fd`` is closed."""
    try:
        chunks: list[bytes] = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()
