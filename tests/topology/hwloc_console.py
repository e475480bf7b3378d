"""hwloc's reading of a recorded machine: the text ``lstopo`` printed for it (NAME.console).

Test support, no numad code: this parses hwloc's own output so that discovery can
be compared with an independent reader of the same sysfs tree. The console is an
indented tree, one object a line::

    Package L#0 (P#0 total=32GiB CPUModel="...")
      L3Cache L#0 (size=6144KiB linesize=64 ways=64)
        NUMANode L#0 (P#0 local=16GiB total=16GiB)
        Core L#0 (P#0)
          PU L#0 (P#0)

``P#`` is the OS index (the kernel's number: cpuN, nodeN, physical_package_id,
core_id); a NUMA node is attached to the smallest object holding its CPUs; I/O
objects (HostBridge, PCIBridge, PCI, OSDev) hang under the object holding their
``local_cpus``. The summary after the tree names the CPUs hwloc leaves out
("N processors not represented in topology: 0x...").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

_OBJECT = re.compile(
    r"(?P<indent> *)(?P<type>[A-Za-z][A-Za-z0-9]*)(?:\[[^\]]*\]|\([^)]*\))*(?: L#\d+)?"
    r"(?: \((?P<attrs>.*)\))?"
    r'(?: "[^"]*")?'
)
_OS_INDEX = re.compile(r"(?:^| )P#(\d+)")
_LOCAL = re.compile(r"(?:^| )local=(\d+[KMGT]iB)")
_BUSID = re.compile(r"(?:^| )busid=([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])")
_HIDDEN = re.compile(r"\d+ processors not represented in topology: (0x[0-9a-f,x]+)")
_IO_TYPES = frozenset({"HostBridge", "PCIBridge", "PCI", "OSDev"})


@dataclass
class HwlocObject:
    type: str
    os_index: int | None
    attrs: str
    parent: HwlocObject | None
    children: list[HwlocObject] = field(default_factory=list)

    def pus(self) -> frozenset[int]:
        """The OS indexes of the PUs below this object."""
        if self.type == "PU":
            assert self.os_index is not None
            return frozenset((self.os_index,))
        return frozenset().union(*(c.pus() for c in self.children))

    def walk(self) -> list[HwlocObject]:
        return [self, *(o for c in self.children for o in c.walk())]


@dataclass(frozen=True)
class Console:
    """One parsed console: the object tree and the CPUs hwloc did not represent."""

    root: HwlocObject
    hidden: frozenset[int]

    def objects(self, kind: str) -> list[HwlocObject]:
        return [o for o in self.root.walk() if o.type == kind]

    def has(self, kind: str) -> bool:
        return bool(self.objects(kind))


def parse(path: Path) -> Console:
    # Only "\n" ends a line: a DMI string can hold a carriage return.
    lines = [line for line in path.read_bytes().decode().split("\n") if line]
    root: HwlocObject | None = None
    stack: list[tuple[int, HwlocObject]] = []
    hidden: frozenset[int] = frozenset()
    in_tree = True
    for line in lines:
        if line.lstrip().startswith("depth 0:"):
            in_tree = False  # the summary: level counts, distances, memory attributes
        if not in_tree:
            if m := _HIDDEN.fullmatch(line.strip()):
                hidden = _mask(m.group(1))
            continue
        m = _OBJECT.fullmatch(line)
        if m is None:
            raise ValueError(f"{path}: not an object line: {line!r}")
        indent, attrs = len(m.group("indent")), m.group("attrs") or ""
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else None
        index = _OS_INDEX.search(attrs)
        obj = HwlocObject(m.group("type"), int(index.group(1)) if index else None, attrs, parent)
        if parent is None:
            root = obj
        else:
            parent.children.append(obj)
        stack.append((indent, obj))
    if root is None:
        raise ValueError(f"{path}: no object tree")
    return Console(root, hidden)


def _mask(text: str) -> frozenset[int]:
    bits = int(text.replace("0x", "").replace(",", ""), 16)
    return frozenset(i for i in range(bits.bit_length()) if bits >> i & 1)


def local_memory(obj: HwlocObject) -> str | None:
    """A NUMA node's memory as lstopo prints it (``16GiB``), None where it shows none."""
    m = _LOCAL.search(obj.attrs)
    return m.group(1) if m else None


def busid(obj: HwlocObject) -> str | None:
    m = _BUSID.search(obj.attrs)
    return m.group(1) if m else None


def attach_point(obj: HwlocObject) -> HwlocObject:
    """The CPU-side object an I/O object hangs under (its locality)."""
    parent = obj.parent
    while parent is not None and parent.type in _IO_TYPES:
        parent = parent.parent
    assert parent is not None
    return parent


def memory_size(kib: int) -> str:
    """``kib`` KiB as lstopo prints a size: hwloc's ``hwloc_memory_size_snprintf``
    (include/private/private.h) rounds to the nearest unit, switching unit at 10."""
    size = kib << 10
    for shift, unit in ((10, "KiB"), (20, "MiB"), (30, "GiB")):
        if size < 10 << (shift + 10):
            return f"{((size >> (shift - 1)) + 1) >> 1}{unit}"
    return f"{((size >> 39) + 1) >> 1}TiB"


def cpulist(ids: Iterable[int]) -> str:
    """Ids in the kernel's list format (``0-3,8``), written here rather than by numad."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def parse_list(text: str) -> frozenset[int]:
    ids: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            ids.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(ids)


def cgroup_allowed(root: Path) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """The CPUs and nodes the recording process's cpuset allowed (None: no restriction).

    lstopo shows only those (without ``--disallowed``). /proc/self/cpuset names the
    cpuset relative to the mount of the cpuset hierarchy in /proc/mounts, whose
    directory holds ``cpus``/``mems`` (``cpuset.`` prefixed unless mounted with
    noprefix): Documentation/admin-guide/cgroup-v1/cpusets.rst.
    """
    try:
        cpuset = (root / "proc/self/cpuset").read_text().strip()
        mounts = (root / "proc/mounts").read_text().splitlines()
    except FileNotFoundError:
        return None, None
    for line in mounts:
        _, mount, kind, options, *_ = line.split()
        if kind == "cpuset" or (kind == "cgroup" and "cpuset" in options.split(",")):
            directory = root / f"{mount}/{cpuset}".strip("/")
            return _first(directory, "cpus"), _first(directory, "mems")
    return None, None


def _first(directory: Path, name: str) -> frozenset[int] | None:
    for candidate in (directory / name, directory / f"cpuset.{name}"):
        if candidate.is_file():
            return parse_list(candidate.read_text())
    return None
