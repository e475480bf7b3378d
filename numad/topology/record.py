"""Recorded machines: writing what discovery read into an archive, and reading one back.

Edge module for ``record-fixture`` and for tests. ``record_fixture`` writes
what a recording ``HostFS`` holds (files as read, directories listed, links
followed); it touches the host only through a ``HostFS``, to list again the
directories discovery listed and to find which links lead to directories.
``load_fixture`` extracts an archive that may come from anywhere (a bug
report), so every member is checked (``check_members``) before anything is
written; ``numad.topology.archive`` reads one without writing it out.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import posixpath
import tarfile
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from numad.errors import FixtureError
from numad.hostfs import HostFS, Recording

_WRITTEN_SUFFIXES = (".tar.gz", ".tgz")  # what record_fixture writes
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".tar")
MAX_MEMBERS = 200_000  # the largest hwloc recording has ~18 000
MAX_BYTES = 256 << 20  # a whole sysfs recording is a few MiB


# -- writing --------------------------------------------------------------------


def record_fixture(fs: HostFS, out: Path) -> int:
    """Write what ``fs`` recorded to the ``.tar.gz`` ``out``; return its member count.

    Every member sits under one top-level directory named after ``out``
    (``myhost.tar.gz`` holds ``myhost/sys/...``). Files keep the bytes
    discovery read; links keep their targets (an absolute target, which
    ``HostFS`` reads relative to its root, is written relative so the tree
    stays self-contained); parents of all of these are added as directories.

    A listed directory is written with every entry it had, so listing it
    again gives the same names: discovery uses names it never opens (a
    ``cpuN`` directory is how an offline CPU is known). Such entries carry no
    content: directories stay empty, files are empty, links keep their
    target. A link keeps the directory it leads to, empty unless discovery
    read in it (a PCI device's place under /sys/devices/pci*, which discovery
    reads as its PCIe path). Finding kinds is the only host access here,
    through a fresh, non-recording ``HostFS`` on the same root. The archive
    is deterministic and written atomically.
    """
    rec = fs.recording
    if rec is None:
        raise FixtureError(repr(fs), "was not created with record=True; nothing was recorded")
    if not out.name.endswith(_WRITTEN_SUFFIXES):
        # What is written is a gzip-compressed tar, whatever the name says: a
        # host.zip would be a tar.gz that unzip refuses.
        raise FixtureError(
            str(out),
            "the archive is a gzip-compressed tar, and this name says otherwise",
            f"name it {out.name.split('.')[0] or 'host'}.tar.gz (or .tgz)",
        )
    top = _top_name(out)
    entries = _recorded_entries(rec)
    probe = HostFS(fs.root)
    entries |= _listing_entries(probe, rec.dirs, entries)
    entries |= _link_directories(probe, rec.links, entries)
    _add_parents(entries)
    _write_atomically(out, _archive_bytes(entries, top))
    return len(entries) + 1  # and the top-level directory


@dataclass(frozen=True, slots=True)
class _Entry:
    kind: bytes  # tarfile.DIRTYPE, REGTYPE or SYMTYPE
    data: bytes = b""
    target: str = ""


_DIR = _Entry(tarfile.DIRTYPE)


def _top_name(out: Path) -> str:
    name = out.name
    for suffix in _ARCHIVE_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    if name in ("", ".", "..") or name.startswith("-"):
        raise FixtureError(str(out), "cannot name a machine after this file name")
    return name


def _recorded_entries(rec: Recording) -> dict[str, _Entry]:
    """Host path -> entry for what discovery touched.

    Host paths in a Recording are absolute with their parents resolved, so no
    entry ever lies below a link entry.
    """
    entries = dict.fromkeys(rec.dirs, _DIR)
    entries.update((p, _Entry(tarfile.REGTYPE, data=d)) for p, d in rec.files.items())
    entries.update(
        (p, _Entry(tarfile.SYMTYPE, target=_relative_target(p, t))) for p, t in rec.links.items()
    )
    entries.pop("/", None)
    return entries


def _listing_entries(
    probe: HostFS, listed: Iterable[str], known: dict[str, _Entry]
) -> dict[str, _Entry]:
    """Content-free entries for names in listed directories that discovery never opened."""
    found: dict[str, _Entry] = {}
    for directory in sorted(listed):
        for name in probe.listdir(directory):
            path = posixpath.join(directory, name)
            if path in known:
                continue
            target = probe.readlink(path)
            if target is not None:
                found[path] = _Entry(tarfile.SYMTYPE, target=_relative_target(path, target))
            elif probe.is_dir(path):
                found[path] = _DIR
            else:
                found[path] = _Entry(tarfile.REGTYPE)
    return found


def _link_directories(
    probe: HostFS, links: Iterable[str], known: dict[str, _Entry]
) -> dict[str, _Entry]:
    """The directories recorded links lead to, so that no such link dangles in the
    archive: /sys/bus/pci/devices/ADDR leads to the device's place in the PCIe tree,
    /sys/devices/pci0000:17/0000:17:00.0/..., which discovery reads as its path even
    where it opened no file in it."""
    found: dict[str, _Entry] = {}
    for link in sorted(links):
        target = probe.resolve(link)
        if target not in known and target != "/" and probe.is_dir(target):
            found[target] = _DIR
    return found


def _add_parents(entries: dict[str, _Entry]) -> None:
    for path in list(entries):
        parent = posixpath.dirname(path)
        while parent != "/" and parent not in entries:
            entries[parent] = _DIR
            parent = posixpath.dirname(parent)


def _archive_bytes(entries: dict[str, _Entry], top: str) -> bytes:
    buffer = io.BytesIO()
    # mtime=0 and no file name in the gzip header: equal recordings, equal bytes.
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.addfile(_info(top, _DIR))
        for path in sorted(entries):
            entry = entries[path]
            data = io.BytesIO(entry.data) if entry.kind == tarfile.REGTYPE else None
            tar.addfile(_info(top + path, entry), data)
    return buffer.getvalue()


def _info(name: str, entry: _Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = entry.kind
    info.mode = {tarfile.DIRTYPE: 0o755, tarfile.SYMTYPE: 0o777}.get(entry.kind, 0o644)
    info.size = len(entry.data)
    info.linkname = entry.target
    info.mtime = 0
    info.uname = info.gname = ""
    return info


def _relative_target(link: str, target: str) -> str:
    if not target.startswith("/"):
        return target
    return posixpath.relpath(posixpath.normpath(target), posixpath.dirname(link))


def _write_atomically(out: Path, data: bytes) -> None:
    directory = out.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=directory)
    except OSError as err:
        raise FixtureError(str(out), f"cannot create a file beside it: {err.strerror}") from err
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise FixtureError(str(out), f"cannot write: {err.strerror}") from err
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename durable; some file systems refuse fsync on a directory.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# -- reading --------------------------------------------------------------------


def load_fixture(archive: Path, dest: Path) -> Path:
    """Extract a recorded machine (``.tar.gz``, ``.tar.bz2``) into ``dest``; return its root.

    The archive must hold one top-level directory, and only directories,
    regular files and symbolic links whose targets stay inside that directory
    (``../..`` within the tree is fine). Anything else (absolute or ``..``
    names, devices, hard links, links leaving the tree) is refused before a
    single file is written; tarfile's ``data`` filter checks again on the way out.
    """
    with reading(archive, "extract"), tarfile.open(archive, mode="r:*") as tar:
        members = tar.getmembers()
        top = check_members(archive, members)
        root = dest / top
        if root.exists():
            raise FixtureError(str(root), "already exists; load into an empty directory")
        tar.extractall(dest, members=members, filter="data")
    return root


@contextlib.contextmanager
def reading(archive: Path, doing: str = "read") -> Iterator[None]:
    """Turn what tarfile and the OS raise while ``archive`` is read into a
    ``FixtureError`` naming it (``doing``: what the message says could not be done)."""
    try:
        yield
    except FixtureError:
        raise
    except tarfile.FilterError as err:
        raise FixtureError(str(archive), f"unsafe member: {err}") from err
    except tarfile.ReadError as err:  # tarfile lists each method it tried, one a line
        raise FixtureError(
            str(archive), "not a recorded archive", "give a .tar.gz or .tar.bz2 from record-fixture"
        ) from err
    except (tarfile.TarError, EOFError, zlib.error) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise FixtureError(str(archive), f"not a readable archive: {first}") from err
    except OSError as err:  # a missing archive, a corrupt bz2/gzip stream, a full disk
        raise FixtureError(str(archive), f"cannot {doing}: {err.strerror or err}") from err


def check_members(archive: Path, members: list[tarfile.TarInfo]) -> str:
    """The single top-level directory name; raises FixtureError on any unsafe member."""
    if not members:
        raise FixtureError(str(archive), "is empty")
    if len(members) > MAX_MEMBERS:
        raise FixtureError(str(archive), f"has more than {MAX_MEMBERS} members")
    if sum(m.size for m in members if m.isfile()) > MAX_BYTES:
        raise FixtureError(str(archive), f"holds more than {MAX_BYTES >> 20} MiB")
    tops: set[str] = set()
    for member in members:
        parts = member_parts(archive, member)
        tops.add(parts[0])
        if member.issym():
            _check_link(archive, member, parts)
    if len(tops) != 1:
        names = ", ".join(sorted(tops)[:5])
        raise FixtureError(str(archive), f"holds {len(tops)} top-level entries ({names}), not 1")
    return tops.pop()


def member_parts(archive: Path, member: tarfile.TarInfo) -> tuple[str, ...]:
    """The member's name split into its parts, without empty and ``.`` ones."""
    if not (member.isdir() or member.isfile() or member.issym()):
        raise FixtureError(
            f"{archive}: {member.name}", "is not a directory, regular file or symbolic link"
        )
    if member.name.startswith("/") or "\x00" in member.name:
        raise FixtureError(f"{archive}: {member.name}", "has an absolute or malformed name")
    # Split by hand, as PurePosixPath would: it cost a third of reading a recording.
    parts = tuple(p for p in member.name.split("/") if p not in ("", "."))
    if not parts or ".." in parts:
        subject = f"{archive}: {member.name}"
        raise FixtureError(subject, "has a name that leaves the archive")
    return parts


def _check_link(archive: Path, member: tarfile.TarInfo, parts: tuple[str, ...]) -> None:
    target = member.linkname
    if not target or target.startswith("/") or "\x00" in target:
        raise FixtureError(f"{archive}: {member.name}", f"links to {target!r}, outside the tree")
    # The target counted from the top-level directory must not climb out of it.
    depth = len(parts) - 2  # directories between the top and the link
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                raise FixtureError(
                    f"{archive}: {member.name}", f"links to {target!r}, outside the tree"
                )
        elif part not in ("", "."):
            depth += 1
