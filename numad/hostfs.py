"""The one seam to the host's file system.

Every host file numad reads goes through a ``HostFS``. Code names real paths
(``/sys/devices/system/node``); the seam re-roots them under ``root`` so that a
recorded tree or a scratch directory stands in for the host. Symbolic links are
resolved here, component by component, inside the root: an absolute link
target is taken relative to the root, never to the real ``/``, so a recorded
tree can never make numad read this machine's own ``/sys``.

With ``record=True`` the seam remembers every file it read, every directory it
listed and every link it followed, which is exactly what ``record-fixture``
needs to reproduce a machine.

A ``HostFS`` is a snapshot: it caches link resolutions, so it answers for the
tree as it was when first read. Make a new one for every discovery pass (the
watcher does); never keep one across hotplug events.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from numad.errors import HostFileError

_MAX_LINK_HOPS = 40  # the kernel's MAXSYMLINKS
_MAX_FILE_BYTES = 1 << 20  # no sysfs attribute comes near this; a bigger file is garbage

_MISSING = (errno.ENOENT, errno.ENOTDIR)


@dataclass
class Recording:
    """What a recording ``HostFS`` touched, as host paths."""

    files: dict[str, bytes] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)


class HostFS:
    """Reads host files under ``root`` (``/`` for the live host)."""

    def __init__(self, root: str | Path = "/", *, record: bool = False) -> None:
        real_root = os.path.realpath(os.fspath(root))
        self._prefix = "" if real_root == "/" else real_root
        self.root = Path(real_root)
        self.recording: Recording | None = Recording() if record else None
        self._links: dict[str, str | None] = {}
        self._resolved: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"HostFS(root={str(self.root)!r})"

    # -- paths -------------------------------------------------------------

    def real(self, path: str) -> str:
        """The path on this machine's file system that stands for host ``path``."""
        return self._prefix + self.resolve(path)

    def resolve(self, path: str) -> str:
        """Resolve every symbolic link in host ``path``, staying inside the root.

        A dangling link resolves to its (missing) target; a link loop raises
        ``HostFileError`` (ELOOP).
        """
        done = self._resolved.get(path)
        if done is not None:
            return done
        _check_host_path(path)
        parts = deque(path.split("/"))
        current = "/"
        hops = 0
        while parts:
            name = parts.popleft()
            if name in ("", "."):
                continue
            if name == "..":
                current = posixpath.dirname(current)
                continue
            candidate = posixpath.join(current, name)
            target = self._readlink(candidate)
            if target is None:
                current = candidate
                continue
            hops += 1
            if hops > _MAX_LINK_HOPS:
                raise HostFileError(path, "too many levels of symbolic links (a link loop)")
            if target.startswith("/"):
                current = "/"
            parts.extendleft(reversed(target.split("/")))
        self._resolved[path] = current
        return current

    def readlink(self, path: str) -> str | None:
        """The target text of the link at host ``path`` (its parent resolved), or None."""
        _check_host_path(path)
        parent, name = posixpath.split(path)
        return self._readlink(posixpath.join(self.resolve(parent), name))

    def _readlink(self, path: str) -> str | None:
        if path in self._links:
            return self._links[path]
        try:
            target: str | None = os.readlink(self._prefix + path)
        except OSError:
            target = None
        self._links[path] = target
        if target is not None and self.recording is not None:
            self.recording.links[path] = target
        return target

    # -- reads -------------------------------------------------------------

    def read_bytes_optional(self, path: str) -> bytes | None:
        """The file's bytes, or None if it (or a link on the way) is missing."""
        # Checked here, not only in resolve(parent): a NUL in the last component
        # would otherwise reach os.open and escape as ValueError.
        _check_host_path(path)
        parent, name = posixpath.split(path)
        try:
            real = self._prefix + posixpath.join(self.resolve(parent), name)
            data = _read(real, path)
        except HostFileError as err:  # a loop in the parent: name the file asked for
            raise HostFileError(path, err.problem, err.hint) from err
        except OSError as err:
            if err.errno in _MISSING:
                return None
            if err.errno == errno.ELOOP:  # the last component is a link: slow path
                return self._read_through_link(path)
            raise HostFileError(path, f"cannot read: {err.strerror}") from err
        if self.recording is not None:
            self.recording.files[posixpath.join(self.resolve(parent), name)] = data
        return data

    def _read_through_link(self, path: str) -> bytes | None:
        resolved = self.resolve(path)
        try:
            data = _read(self._prefix + resolved, path)
        except OSError as err:
            if err.errno in _MISSING:
                return None
            raise HostFileError(path, f"cannot read: {err.strerror}") from err
        if self.recording is not None:
            self.recording.files[resolved] = data
        return data

    def read_optional(self, path: str) -> str | None:
        """The file's text (UTF-8, bad bytes replaced), or None if missing."""
        data = self.read_bytes_optional(path)
        return None if data is None else data.decode("utf-8", errors="replace")

    def read_text(self, path: str) -> str:
        text = self.read_optional(path)
        if text is None:
            raise HostFileError(path, "no such file")
        return text

    def listdir(self, path: str) -> tuple[str, ...]:
        """Sorted entry names of a directory; empty if it is missing or not a dir."""
        resolved = self.resolve(path)
        try:
            names = tuple(sorted(os.listdir(self._prefix + resolved)))
        except OSError as err:
            if err.errno in (*_MISSING, errno.ELOOP):
                return ()
            raise HostFileError(path, f"cannot list: {err.strerror}") from err
        if self.recording is not None:
            self.recording.dirs.add(resolved)
        return names

    def is_dir(self, path: str) -> bool:
        try:
            resolved = self.resolve(path)
        except HostFileError:
            return False
        found = os.path.isdir(self._prefix + resolved)
        if found and self.recording is not None:
            self.recording.dirs.add(resolved)
        return found


def _check_host_path(path: str) -> None:
    if not path.startswith("/") or "\x00" in path:
        raise HostFileError(path, "not an absolute host path")


_NOT_REGULAR = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


class NotRegularFileError(OSError):
    """A FIFO, socket, device or directory where a regular file was expected."""


def read_regular(path: Path, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of the regular file ``path`` (more than ``limit``:
    the caller's "too large"), links followed. Opened with O_NONBLOCK, so a FIFO in
    its place (``mkfifo checkpoint.json``) does not block the open until a writer
    comes; anything but a regular file raises ``NotRegularFileError`` before any read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    chunks: list[bytes] = []
    size = 0
    try:
        kind = stat.S_IFMT(os.fstat(fd).st_mode)
        if kind != stat.S_IFREG:
            what = _NOT_REGULAR.get(kind, "not a file")
            raise NotRegularFileError(errno.EINVAL, f"{what}, not a regular file")
        while size <= limit and (chunk := os.read(fd, min(65536, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _read(real: str, path: str) -> bytes:
    """The bytes of the regular file ``real`` (host ``path``, named in errors).

    Opened with O_NONBLOCK: a FIFO in a tree (``node/online`` made with mkfifo)
    would block the open until a writer came; sysfs and procfs attributes ignore
    the flag. The open file must be a regular file, as every sysfs and procfs
    attribute is: a FIFO, socket or device is refused before any read.
    """
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    chunks: list[bytes] = []
    size = 0
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise HostFileError(
                path,
                f"cannot read: {_NOT_REGULAR.get(stat.S_IFMT(mode), 'not a file')},"
                " not a regular file",
                "host files numad reads are sysfs and procfs attributes; remove it from the tree",
            )
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > _MAX_FILE_BYTES:
                raise OSError(errno.EFBIG, "file is too large for a sysfs attribute")
    finally:
        os.close(fd)
    return b"".join(chunks)
