"""Recorded machines read back fast: straight from the archive, or from a checked cache.

Edge module for the command line's ``--fixture``. A recording holds far more
than discovery reads (the 64-node one: 17,619 members, of which discovery
opens about 2,300), and unpacking it means creating and then deleting every
member on disk: 8-13 s there, against 0.03 s of discovery. So:

- ``ArchiveFS`` is a ``HostFS`` over the archive's members, read once into
  memory and checked as ``load_fixture`` checks them: nothing is written.
- ``cached_fixture`` unpacks an archive once into a cache directory, for what
  needs a tree on disk (the offline daemon behind ``topology --nrt``). An
  entry is trusted only while it still matches the manifest sealed into it
  when it was made; one that does not is set aside and made again.

It reads the archive and the cache directory, and writes only in the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from numad.errors import FixtureError, HostFileError
from numad.hostfs import HostFS
from numad.topology.record import (
    MAX_BYTES,
    MAX_MEMBERS,
    check_members,
    load_fixture,
    member_parts,
    reading,
)

_MAX_FILE_BYTES = 1 << 20  # as HostFS: no sysfs attribute comes near this
_SEAL = ".numad-entry.json"  # beside the machine's top directory in an entry


class ArchiveFS(HostFS):
    """The tree of a recorded archive, as ``HostFS`` reads a tree on disk.

    Links resolve as on disk, inside the tree (``HostFS.resolve``); reads,
    listings and ``is_dir`` answer from the members. ``root`` is the archive
    itself, so anything that still asked the disk below it would find nothing.
    """

    def __init__(self, archive: Path) -> None:
        super().__init__(archive)
        self._files: dict[str, bytes] = {}
        self._symlinks: dict[str, str] = {}
        self._children: dict[str, set[str]] = {"/": set()}
        for path, member, data in _members(archive):
            if member.issym():
                self._symlinks[path] = member.linkname
            elif member.isfile():
                self._files[path] = data
            self._add(path, directory=member.isdir())

    def _add(self, path: str, *, directory: bool) -> None:
        if directory:
            self._children.setdefault(path, set())
        while path != "/":
            parent, name = path.rsplit("/", 1)
            parent = parent or "/"
            known = parent in self._children
            self._children.setdefault(parent, set()).add(name)
            if known:
                return
            path = parent

    def _readlink(self, path: str) -> str | None:
        # The one lookup HostFS.resolve makes of the tree: overriding it keeps
        # the link rules (absolute targets root-relative, ELOOP) exactly HostFS's.
        return self._symlinks.get(path)

    def read_bytes_optional(self, path: str) -> bytes | None:
        if not path.startswith("/") or "\x00" in path:
            raise HostFileError(path, "not an absolute host path")
        resolved = self.resolve(path)
        data = self._files.get(resolved)
        if data is None and resolved in self._children:
            raise HostFileError(path, "cannot read: a directory, not a regular file")
        if data is not None and len(data) > _MAX_FILE_BYTES:
            raise HostFileError(path, "cannot read: file is too large for a sysfs attribute")
        return data

    def listdir(self, path: str) -> tuple[str, ...]:
        return tuple(sorted(self._children.get(self.resolve(path), ())))

    def is_dir(self, path: str) -> bool:
        try:
            return self.resolve(path) in self._children
        except HostFileError:
            return False


def _members(archive: Path) -> list[tuple[str, tarfile.TarInfo, bytes]]:
    """(host path, member, bytes of a file) for every member below the top directory,
    in one pass, checked as ``load_fixture`` checks them before any use."""
    found: list[tuple[tarfile.TarInfo, bytes]] = []
    total = 0
    # One pass in tarfile's random-access mode: each file's bytes are read where
    # its header leaves the stream. Its stream mode ("r|*") slices the whole
    # decompressed buffer for every block read: 25 s for the 64-node recording;
    # reading the bytes after getmembers() decompresses everything twice.
    with reading(archive), tarfile.open(archive, mode="r:*") as tar:
        for member in tar:
            if len(found) >= MAX_MEMBERS:
                raise FixtureError(str(archive), f"has more than {MAX_MEMBERS} members")
            stream = tar.extractfile(member) if member.isfile() else None
            total += member.size if stream is not None else 0
            if total > MAX_BYTES:  # before the bytes are read into memory
                raise FixtureError(str(archive), f"holds more than {MAX_BYTES >> 20} MiB")
            found.append((member, b"" if stream is None else stream.read()))
    check_members(archive, [m for m, _ in found])
    out = []
    for member, data in found:
        parts = member_parts(archive, member)[1:]
        if parts:  # the top directory itself is the root
            out.append(("/" + "/".join(parts), member, data))
    return out


# -- the cache of unpacked machines ---------------------------------------------


def cached_fixture(archive: Path, cache: Path) -> Path:
    """The root of ``archive`` unpacked under ``cache``, unpacking it only when needed.

    Keyed by the archive's SHA-256, so a changed archive gets a new entry. Safe
    against concurrent callers: each unpacks into its own temporary directory
    beside the entry, seals it and renames it into place; a loser of the race
    drops its copy and takes the winner's. An entry is used only while every
    name, kind, size, link target and file time in it matches its seal: one that
    does not (a file edited or removed, an entry of an older numad) is set aside
    and unpacked again. The tree is for reading (discovery, an offline daemon that
    writes nothing): ``serve --root`` needs its own copy.
    """
    try:
        key = hashlib.sha256(archive.read_bytes()).hexdigest()[:32]
    except OSError as err:
        raise FixtureError(str(archive), f"cannot read: {err.strerror or err}") from err
    entry = cache / key
    root = _sealed_root(entry)
    if root is not None:
        return root
    if entry.exists():
        _set_aside(entry, cache)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache))
    except OSError as err:
        raise FixtureError(str(cache), f"cannot create: {err.strerror or err}") from err
    try:
        top = load_fixture(archive, scratch)
        (scratch / _SEAL).write_text(json.dumps({"top": top.name, "manifest": _manifest(top)}))
        os.rename(scratch, entry)
    except OSError as err:
        if not entry.is_dir():  # not a lost race: a real failure
            raise FixtureError(str(entry), f"cannot store: {err.strerror or err}") from err
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # gone already when renamed
    root = _sealed_root(entry)
    if root is None:
        raise FixtureError(str(entry), "does not match its seal once unpacked", "remove it")
    return root


def _sealed_root(entry: Path) -> Path | None:
    """The machine's root in ``entry`` if the entry is whole and unchanged, else None."""
    try:
        seal = json.loads((entry / _SEAL).read_text())
        top, manifest = seal["top"], seal["manifest"]
        if not isinstance(top, str) or "/" in top or top in ("", ".", ".."):
            return None
        root = entry / top
        if manifest != _manifest(root):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return root


def _manifest(root: Path) -> str:
    """A digest of every name under ``root`` with its kind, size, link target and time."""
    lines = []
    stack = [root]
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as entries:
            for e in entries:
                st = e.stat(follow_symlinks=False)
                if e.is_symlink():
                    line = f"{e.path}\0l\0{os.readlink(e.path)}"
                elif e.is_dir(follow_symlinks=False):
                    line = f"{e.path}\0d"
                    stack.append(Path(e.path))
                else:
                    line = f"{e.path}\0f\0{st.st_mode:o}\0{st.st_size}\0{st.st_mtime_ns}"
                lines.append(line.removeprefix(str(root)))
    if not lines:
        raise OSError(f"{root}: empty")
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


def _set_aside(entry: Path, cache: Path) -> None:
    """Move a bad entry out of the way in one rename, then remove it."""
    aside = Path(tempfile.mkdtemp(prefix=".stale.", dir=cache))
    with contextlib.suppress(OSError):  # gone already: another caller set it aside
        os.rename(entry, aside / "entry")
    shutil.rmtree(aside, ignore_errors=True)
