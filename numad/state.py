"""The checkpoint: every admitted workload and what it holds, versioned and checksummed.

Edge module (the only one that writes numad's own state files). Written
atomically before any cgroup changes (DESIGN invariant 3): a temp file in the
same directory, fsync, rename over the old file, fsync of the directory. A
checkpoint that cannot be read (bad JSON, bad checksum, unknown version) is
moved aside, never deleted, and the caller rebuilds and says so.

Only decisions are stored — which CPUs, memory splits and devices each
container holds, and the specs — never tables derived from the machine, so a
restart on a slightly different machine (MemTotal drift, a CPU gone) keeps
what is still valid and reports the rest.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from numad.admission import Books
from numad.cpuset import CPUSet, NodeSet
from numad.errors import CheckpointError
from numad.managers.memory import Block

VERSION = 1
FILE = "checkpoint.json"


@dataclass(frozen=True, slots=True)
class Record:
    """One admitted workload: its spec (as a dict) and what each container holds."""

    spec: Mapping[str, Any]
    cpus: Mapping[str, str] = field(default_factory=dict)  # container -> CPU list
    memory: Mapping[str, list[Any]] = field(default_factory=dict)  # container -> blocks
    devices: Mapping[str, Mapping[str, list[str]]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    reserved: str
    workloads: Mapping[str, Record]
    # Cgroups of released workloads that still exist: they follow the shared
    # pool (also after a stop between the checkpoint and the cgroup writes)
    # until they are removed.
    orphans: tuple[str, ...] = ()


def record_of(books: Books, name: str, spec: Mapping[str, Any]) -> Record:
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
    return Record(spec, cpus, memory, devices)


def encode(checkpoint: Checkpoint) -> bytes:
    body = {
        "reserved": checkpoint.reserved,
        "orphans": sorted(checkpoint.orphans),
        "workloads": {
            name: {"spec": r.spec, "cpus": r.cpus, "memory": r.memory, "devices": r.devices}
            for name, r in sorted(checkpoint.workloads.items())
        },
    }
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return (
        json.dumps({"version": VERSION, "checksum": f"sha256:{digest}", "body": body}) + "\n"
    ).encode()


def decode(data: bytes, source: str) -> Checkpoint:
    try:
        outer = json.loads(data)
        body = outer["body"]
        if outer.get("version") != VERSION:
            raise CheckpointError(
                source, f"unknown version {outer.get('version')!r} (numad writes {VERSION})"
            )
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        if outer.get("checksum") != "sha256:" + hashlib.sha256(canonical.encode()).hexdigest():
            raise CheckpointError(source, "checksum mismatch: the file was changed or truncated")
        workloads = {
            str(name): Record(w["spec"], dict(w["cpus"]), dict(w["memory"]), dict(w["devices"]))
            for name, w in body["workloads"].items()
        }
        orphans = tuple(str(o) for o in body.get("orphans", ()))
        return Checkpoint(str(body["reserved"]), MappingProxyType(workloads), orphans)
    except CheckpointError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(source, f"unreadable: {type(err).__name__}: {err}") from err


def write(directory: Path, checkpoint: Checkpoint) -> None:
    """Atomically replace the checkpoint: temp file, fsync, rename, fsync the directory."""
    target = directory / FILE
    temp = directory / f".{FILE}.{os.getpid()}.tmp"
    data = encode(checkpoint)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, target)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as err:
        raise CheckpointError(
            str(target), f"cannot write: {err.strerror}", "check the state directory"
        ) from err


def read(directory: Path) -> tuple[Checkpoint | None, str | None]:
    """The checkpoint, or (None, why) when there is none or it was unreadable and moved aside."""
    target = directory / FILE
    try:
        data = target.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as err:
        raise CheckpointError(str(target), f"cannot read: {err.strerror}") from err
    try:
        return decode(data, str(target)), None
    except CheckpointError as err:
        aside = directory / f"{FILE}.corrupt.{time.strftime('%Y%m%dT%H%M%S')}.{os.getpid()}"
        os.replace(target, aside)
        return None, f"{err}; kept aside as {aside}"


def restore_blocks(raw: list[Any]) -> tuple[Block, ...]:
    """Memory blocks from their checkpoint form."""
    return tuple(
        Block(
            str(resource), NodeSet(int(n) for n in nodes), tuple((int(n), int(b)) for n, b in split)
        )
        for resource, nodes, split in raw
    )
