"""The checkpoint: every admitted workload and what it holds, versioned and checksummed.

Edge module (the only one that writes numad's own state files). Written
atomically before any cgroup changes (DESIGN invariant 3): a temp file in the
same directory, every byte written and fsynced, rename over the old file, fsync
of the directory. A write that fails at any step raises CheckpointError and
leaves the previous checkpoint as it was. A checkpoint that cannot be read (bad
JSON, bad checksum, unknown version, any part of the wrong shape) is moved
aside, never deleted, and the caller rebuilds and says so.

Only decisions are stored — which CPUs, memory splits and devices each
container holds, and the specs — never tables derived from the machine, so a
restart on a slightly different machine (MemTotal drift, a CPU gone) keeps
what is still valid and reports the rest.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from numad.admission import Books
from numad.cpuset import CPUSet, NodeSet
from numad.errors import CheckpointError
from numad.managers.memory import Block

VERSION = 1
FILE = "checkpoint.json"
# Far above any real checkpoint (a workload takes well under 1 KiB); a file
# beyond it is not parsed, so a damaged one cannot exhaust memory on restart.
MAX_BYTES = 16 << 20
_T = TypeVar("_T")
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Record:
    """One admitted workload: its spec (as a dict) and what each container holds.

    ``unplaced`` non-empty: admitted but not placed, for that reason (e.g. its
    CPUs went offline while numad was stopped); such a record holds nothing.
    """

    spec: Mapping[str, Any]
    cpus: Mapping[str, str] = field(default_factory=dict)  # container -> CPU list
    # container -> blocks, each [resource, [nodes], [[node, bytes], ...]]
    memory: Mapping[str, list[Any]] = field(default_factory=dict)
    devices: Mapping[str, Mapping[str, list[str]]] = field(default_factory=dict)
    unplaced: str = ""

    def __post_init__(self) -> None:
        if self.unplaced and (self.cpus or self.memory or self.devices):
            raise ValueError(f"an unplaced workload ({self.unplaced}) cannot hold resources")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    reserved: str
    workloads: Mapping[str, Record]
    # Cgroups of released workloads that still exist: they follow the shared
    # pool (also after a stop between the checkpoint and the cgroup writes)
    # until they are removed.
    orphans: tuple[str, ...] = ()
    # The config setting the reserved CPUs were chosen from ("cpus=0,16",
    # "count=2"): a restart keeps them unless the config changed it.
    reserved_from: str = ""
    # cgroup -> the exclusive CPUs its cpuset file may hold (a CPU list): the
    # last exclusive set written there. Until the cgroup is rewritten or gone,
    # no other cgroup is given those CPUs (invariant 4), also after a restart.
    grants: Mapping[str, str] = field(default_factory=dict)


def record_of(books: Books, name: str, spec: Mapping[str, Any], unplaced: str = "") -> Record:
    cpus = {
        c: CPUSet.from_bits(m).format_list()
        for (w, c), m in books.cpu.assignments.items()
        if w == name
    }
    memory = {
        c: [[b.resource, list(b.nodes), [list(s) for s in b.split]] for b in blocks]
        for (w, c), blocks in books.memory.blocks.items()
        if w == name
    }
    devices = {
        c: {k: list(v) for k, v in held.items()}
        for (w, c), held in books.devices.held.items()
        if w == name
    }
    return Record(spec, cpus, memory, devices, unplaced)


def restore_blocks(raw: list[Any]) -> tuple[Block, ...]:
    """Memory blocks from their checkpoint form (as checked by ``decode``)."""
    return tuple(
        Block(
            str(resource), NodeSet(int(n) for n in nodes), tuple((int(n), int(b)) for n, b in split)
        )
        for resource, nodes, split in raw
    )


# -- the file format ---------------------------------------------------------------------


def _checksum(body: object) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def encode(checkpoint: Checkpoint) -> bytes:
    workloads = {}
    for name, r in sorted(checkpoint.workloads.items()):
        w: dict[str, Any] = {
            "spec": dict(r.spec),
            "cpus": dict(r.cpus),
            "memory": dict(r.memory),
            "devices": {c: dict(held) for c, held in r.devices.items()},
        }
        if r.unplaced:
            w["unplaced"] = r.unplaced
        workloads[name] = w
    body = {
        "reserved": checkpoint.reserved,
        "reserved_from": checkpoint.reserved_from,
        "orphans": sorted(checkpoint.orphans),
        "grants": dict(sorted(checkpoint.grants.items())),
        "workloads": workloads,
    }
    return (
        json.dumps({"version": VERSION, "checksum": _checksum(body), "body": body}) + "\n"
    ).encode()


def decode(data: bytes, source: str) -> Checkpoint:
    """The checkpoint in ``data``; CheckpointError (naming ``source``) for anything else."""
    if len(data) > MAX_BYTES:
        raise CheckpointError(source, f"unreadable: larger than {MAX_BYTES} bytes")
    try:
        outer = json.loads(data)
        signed = isinstance(outer, dict) and outer.get("checksum") == _checksum(outer.get("body"))
    except (ValueError, RecursionError) as err:  # RecursionError: nesting beyond the stack
        raise CheckpointError(source, f"unreadable: {type(err).__name__}: {err}") from err
    if not isinstance(outer, dict) or "body" not in outer:
        raise CheckpointError(source, "unreadable: not a numad checkpoint (no body)")
    version = outer.get("version")
    if type(version) is not int or version != VERSION:
        raise CheckpointError(source, f"unknown version {_short(version)} (numad writes {VERSION})")
    if not signed:
        raise CheckpointError(source, "checksum mismatch: the file was changed or truncated")
    try:
        return _checkpoint(outer["body"])
    except _ShapeError as err:
        raise CheckpointError(source, f"malformed: {_clip(str(err))}") from err


# -- the checkpoint's shape: one check per part, each naming where it failed ---------------
#
# A checkpoint that passes its checksum was still written by someone: every part
# is checked here so the daemon meets only well-typed records (invariant 6).


class _ShapeError(Exception):
    """A part of the body of the wrong shape; the message says where and what."""


_KINDS: dict[type, str] = {dict: "an object", list: "an array", str: "a string", int: "an integer"}


def _short(value: object) -> str:
    if isinstance(value, dict | list):  # never repr a (possibly huge or deep) container
        return f"a JSON {'object' if isinstance(value, dict) else 'array'}"
    return _clip(repr(value))


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is(value: object, kind: type[_T], where: str) -> _T:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _ShapeError(f"{where}: expected {_KINDS[kind]}, found {_short(value)}")
    return value


def _field(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise _ShapeError(f"{where}/{key}: missing")
    return obj[key]


def _map(
    obj: dict[str, Any], key: str, where: str, check: Callable[[Any, str], _T]
) -> dict[str, _T]:
    """``obj[key]``, an object (JSON keys are always strings) of values that pass ``check``."""
    at = f"{where}/{key}"
    return {k: check(v, f"{at}/{k}") for k, v in _is(_field(obj, key, where), dict, at).items()}


def _strings(value: object, where: str) -> list[str]:
    return [_is(s, str, f"{where}[{i}]") for i, s in enumerate(_is(value, list, where))]


def _count(value: object, where: str) -> int:
    count = _is(value, int, where)
    if count < 0:
        raise _ShapeError(f"{where}: expected a count, found {count}")
    return count


def _cpu_list(value: object, where: str) -> str:
    text = _is(value, str, where)
    try:
        CPUSet.parse_list(text)
    except ValueError as err:
        raise _ShapeError(f"{where}: not a CPU list: {err}") from err
    return text


def _blocks(value: object, where: str) -> list[Any]:
    """A container's blocks, each ``[resource, [nodes], [[node, bytes], ...]]``."""
    return [_block(b, f"{where}[{i}]") for i, b in enumerate(_is(value, list, where))]


def _block(value: object, where: str) -> list[Any]:
    parts = _is(value, list, where)
    if len(parts) != 3:
        raise _ShapeError(f"{where}: expected [resource, [nodes], [[node, bytes], ...]]")
    resource = _is(parts[0], str, f"{where}[0]")
    nodes = [
        _count(n, f"{where}[1][{i}]") for i, n in enumerate(_is(parts[1], list, f"{where}[1]"))
    ]
    try:
        NodeSet(nodes)
    except ValueError as err:
        raise _ShapeError(f"{where}[1]: not a node set: {err}") from err
    split = []
    for i, pair in enumerate(_is(parts[2], list, f"{where}[2]")):
        at = f"{where}[2][{i}]"
        if len(_is(pair, list, at)) != 2 or _count(pair[0], f"{at}[0]") not in nodes:
            raise _ShapeError(f"{at}: expected [node, bytes] on one of the nodes {nodes}")
        split.append([pair[0], _count(pair[1], f"{at}[1]")])
    return [resource, nodes, split]


def _held(value: object, where: str) -> dict[str, list[str]]:
    """A container's devices: class -> addresses."""
    return {k: _strings(a, f"{where}/{k}") for k, a in _is(value, dict, where).items()}


def _record(value: object, where: str) -> Record:
    w = _is(value, dict, where)
    spec = _is(_field(w, "spec", where), dict, f"{where}/spec")
    cpus = _map(w, "cpus", where, _cpu_list)
    memory = _map(w, "memory", where, _blocks)
    devices = _map(w, "devices", where, _held)
    unplaced = _is(w.get("unplaced", ""), str, f"{where}/unplaced")
    if unplaced and (cpus or memory or devices):
        raise _ShapeError(f"{where}: unplaced ({_clip(unplaced)}) but holds resources")
    return Record(spec, cpus, memory, devices, unplaced)


def _checkpoint(value: object) -> Checkpoint:
    body = _is(value, dict, "body")
    return Checkpoint(
        _cpu_list(_field(body, "reserved", "body"), "body/reserved"),
        MappingProxyType(_map(body, "workloads", "body", _record)),
        tuple(_strings(body.get("orphans", []), "body/orphans")),
        _is(body.get("reserved_from", ""), str, "body/reserved_from"),
        MappingProxyType(_map({"grants": {}, **body}, "grants", "body", _cpu_list)),
    )


# -- the system calls a write makes, and the faults they can be made to meet -------------


class Fault(StrEnum):
    """A fault ``Syscalls.injecting`` makes every checkpoint write meet."""

    SHORT_WRITES = "short-writes"  # each write takes half of what it is given (no error)
    STALLED_WRITE = "stalled-write"  # half the file, then writes that return 0
    ENOSPC = "enospc"  # half the file, then a full disk
    EDQUOT = "edquot"  # half the file, then the quota
    EIO = "eio"  # half the file, then an I/O error
    FSYNC = "fsync"  # the temp file's fsync fails (EIO)
    RENAME = "rename"  # the rename over the checkpoint fails (EIO)
    DIR_FSYNC = "dir-fsync"  # the directory's fsync, after the rename, fails (EIO)


_WRITE_ERRNO = {Fault.ENOSPC: errno.ENOSPC, Fault.EDQUOT: errno.EDQUOT, Fault.EIO: errno.EIO}


def _os_error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@dataclass(frozen=True, slots=True)
class Syscalls:
    """The fault-injection seam of ``write``: the calls it makes to write, sync and rename.

    ``write(directory, checkpoint, syscalls)`` takes one (default ``SYSCALLS``, the
    real calls). A ready-made fault::

        state.write(directory, checkpoint, state.Syscalls.injecting(state.Fault.ENOSPC))

    or any callables of these signatures: ``write`` returns the bytes written
    (fewer is a short write), ``fsync`` gets the temp file's fd, then (after the
    rename) the directory's; a failure is an OSError. Held by the caller, so a
    daemon or simulation can swap it between checkpoints.
    """

    write: Callable[[int, memoryview], int] = os.write
    fsync: Callable[[int], None] = os.fsync
    replace: Callable[[Path, Path], None] = os.replace

    @classmethod
    def injecting(cls, fault: Fault) -> Syscalls:
        """The real calls, except that every checkpoint write meets ``fault``."""

        def write(fd: int, data: memoryview) -> int:
            at_start = os.lseek(fd, 0, os.SEEK_CUR) == 0
            if fault is Fault.SHORT_WRITES or (at_start and fault in _AFTER_HALF):
                return os.write(fd, data[: max(1, len(data) // 2)])
            if fault is Fault.STALLED_WRITE:
                return 0
            if fault in _WRITE_ERRNO:
                raise _os_error(_WRITE_ERRNO[fault])
            return os.write(fd, data)

        def fsync(fd: int) -> None:
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            if fault is (Fault.DIR_FSYNC if is_dir else Fault.FSYNC):
                raise _os_error(errno.EIO)
            os.fsync(fd)

        def replace(src: Path, dst: Path) -> None:
            if fault is Fault.RENAME:
                raise _os_error(errno.EIO)
            os.replace(src, dst)

        return cls(write, fsync, replace)


_AFTER_HALF = {Fault.STALLED_WRITE, *_WRITE_ERRNO}
SYSCALLS = Syscalls()


# -- writing and reading -----------------------------------------------------------------


def _cause(err: OSError) -> str:
    if err.errno is None:
        return str(err)
    return f"{err.strerror} [{errno.errorcode.get(err.errno, err.errno)}]"


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _write_all(fd: int, data: bytes, write: Callable[[int, memoryview], int]) -> None:
    """Every byte of ``data``, however many calls it takes (a file-size limit, a full
    disk or a quota first shortens a write, then fails the next one)."""
    left = memoryview(data)
    while left:
        written = write(fd, left)
        if written <= 0:
            raise OSError(f"short write: {len(left)} of {len(data)} bytes not written")
        left = left[written:]


_UNCHANGED = "the previous checkpoint is unchanged; free space or fix the disk, then retry"


def write(directory: Path, checkpoint: Checkpoint, syscalls: Syscalls = SYSCALLS) -> None:
    """Atomically replace the checkpoint: temp file, fsync, rename, fsync the directory.

    On any failure CheckpointError names the step and its cause, the temp file is
    removed and the previous checkpoint stays (or is put back) as it was.
    """
    target = directory / FILE
    temp = directory / f".{FILE}.{os.getpid()}.tmp"
    previous = directory / f".{FILE}.prev"  # a second name for it until the rename is durable
    backup: Path | None = previous
    data = encode(checkpoint)
    if len(data) > MAX_BYTES:
        raise CheckpointError(str(target), f"{len(data)} bytes is more than numad reads back")
    step = "create the state directory"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        step = f"create {temp.name}"
        _unlink(temp)  # a stale one of our own name, or a link planted there
        fd = os.open(temp, _TEMP_FLAGS, 0o600)
        try:
            step = f"write {temp.name}"
            _write_all(fd, data, syscalls.write)
            step = f"fsync {temp.name}"
            syscalls.fsync(fd)
        finally:
            os.close(fd)
        step = f"link the previous {FILE} to {previous.name}"
        _unlink(previous)
        try:
            os.link(target, previous, follow_symlinks=False)
        except FileNotFoundError:
            backup = None  # no previous checkpoint: undoing the rename removes the new one
        step = f"rename {temp.name} over {FILE}"
        syscalls.replace(temp, target)
    except OSError as err:
        with contextlib.suppress(OSError):  # already failing; the next write removes them
            _unlink(temp)
            _unlink(previous)
        raise CheckpointError(str(target), f"cannot {step}: {_cause(err)}", _UNCHANGED) from err
    _sync_directory(directory, target, backup, syscalls)


def _sync_directory(directory: Path, target: Path, backup: Path | None, syscalls: Syscalls) -> None:
    """Make the rename durable; if that fails, put the previous checkpoint back, so the
    caller's refusal (it changes no cgroup) matches what a restart finds."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            syscalls.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as err:
        try:
            if backup is None:
                target.unlink()
                undone = "the new checkpoint is removed"
            else:
                os.replace(backup, target)
                undone = "the previous checkpoint is put back"
        except OSError as undo:
            undone = f"the new checkpoint stays ({_cause(undo)}) and a restart may keep it"
        raise CheckpointError(
            str(target), f"cannot fsync {directory}: {_cause(err)}", f"{undone}; check the disk"
        ) from err
    if backup is not None:
        with contextlib.suppress(OSError):  # harmless if left: the next write removes it
            backup.unlink()


def read(directory: Path) -> tuple[Checkpoint | None, str | None]:
    """The checkpoint, or (None, why) when there is none or it was unreadable and moved aside."""
    target = directory / FILE
    try:
        with target.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except OSError as err:
        raise CheckpointError(str(target), f"cannot read: {_cause(err)}") from err
    try:
        return decode(data, str(target)), None
    except CheckpointError as err:
        aside = directory / f"{FILE}.corrupt.{time.strftime('%Y%m%dT%H%M%S')}.{os.getpid()}"
        try:
            os.replace(target, aside)
        except OSError as move:
            raise CheckpointError(
                str(target), f"{err.problem}; cannot move it aside: {_cause(move)}"
            ) from move
        return None, f"{err}; kept aside as {aside}"
