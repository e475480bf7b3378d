"""The checkpoint: every admitted workload and what it holds, versioned and checksummed.

Edge module. Written atomically before any cgroup changes (DESIGN invariant
3) through ``numad.host.durable``: a temp file in the same directory, every byte
written and fsynced, rename over the old file, fsync of the directory. A
write that fails at any step raises CheckpointError and leaves the previous
checkpoint as it was. A checkpoint that cannot be read (bad JSON, bad
checksum, unknown version, any part of the wrong shape) is moved aside, never
deleted, and the caller rebuilds and says so.

Only decisions are stored — which CPUs, memory splits and devices each
container holds, and the specs — never tables derived from the machine, so a
restart on a slightly different machine (MemTotal drift, a CPU gone) keeps
what is still valid and reports the rest.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CheckpointError
from numad.host.durable import SYSCALLS, Syscalls, write_file
from numad.hostfs import NotRegularFileError, read_regular
from numad.placement.admission import Books
from numad.placement.managers.memory import Block

VERSION = 1
FILE = "checkpoint.json"
# Far above any real checkpoint (a workload takes well under 1 KiB); a file
# beyond it is not parsed, so a damaged one cannot exhaust memory on restart.
MAX_BYTES = 16 << 20
_T = TypeVar("_T")


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
    # Workloads whose cgroups have existed: one whose cgroups are all gone is
    # released after the grace period, also when they went while numad was down.
    seen: tuple[str, ...] = ()


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
        "seen": sorted(checkpoint.seen),
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
        tuple(_strings(body.get("seen", []), "body/seen")),
    )


def write(directory: Path, checkpoint: Checkpoint, syscalls: Syscalls = SYSCALLS) -> None:
    """Atomically replace the checkpoint (``durable.write_file``); on any failure
    CheckpointError names the step and the previous checkpoint stays as it was."""
    data = encode(checkpoint)
    if len(data) > MAX_BYTES:
        target = directory / FILE
        raise CheckpointError(str(target), f"{len(data)} bytes is more than numad reads back")
    write_file(directory, FILE, data, syscalls, "checkpoint")


def _cause(err: OSError) -> str:
    if err.errno is None:
        return str(err)
    return f"{err.strerror} [{errno.errorcode.get(err.errno, err.errno)}]"


def read(directory: Path) -> tuple[Checkpoint | None, str | None]:
    """The checkpoint, or (None, why) when there is none or it was unreadable and moved aside."""
    target = directory / FILE
    try:
        data = read_regular(target, MAX_BYTES)
    except FileNotFoundError:
        return None, None
    except NotRegularFileError as err:  # a FIFO or a directory in its place: never opened twice
        return None, _keep_aside(
            target, CheckpointError(str(target), f"unreadable: {err.strerror}")
        )
    except OSError as err:
        raise CheckpointError(str(target), f"cannot read: {_cause(err)}") from err
    try:
        return decode(data, str(target)), None
    except CheckpointError as err:
        return None, _keep_aside(target, err)


def _keep_aside(target: Path, err: CheckpointError) -> str:
    """Move an unreadable checkpoint aside (never delete it); why, and where it is."""
    aside = target.with_name(f"{FILE}.corrupt.{time.strftime('%Y%m%dT%H%M%S')}.{os.getpid()}")
    try:
        os.replace(target, aside)
    except OSError as move:
        raise CheckpointError(
            str(target), f"{err.problem}; cannot move it aside: {_cause(move)}"
        ) from move
    return f"{err}; kept aside as {aside}"
