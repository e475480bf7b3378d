"""Red Hat numad's command line, where libvirt and scripts call it.

Edge. libvirt asks for placement advice for a guest whose ``<vcpu
placement='auto'>`` (or ``<numatune>`` placement) is auto: it runs
``numad -w VCPUS:MIB`` (src/util/virnuma.c, virNumaGetAutoPlacementAdvice:
the guest's memory in KiB, divided by 1024 and rounded up), fails the guest's
start on a non-zero exit ("Failed to query numad for the advisory nodeset"),
and parses standard output as a node list with virBitmapParse
(src/util/virbitmap.c: spaces and a trailing newline are skipped; an empty
answer or one starting with anything but a digit is an error), then
intersects it with the host's memory nodes (src/qemu/qemu_process.c,
qemuProcessPrepareDomainNUMAPlacement). So ``numad -w`` prints one line, a
node list in the kernel's list format (``0-1``), and exits 0.

The advice is Red Hat numad's: the NUMA nodes that best fit a guest of VCPUS
CPUs and MIB of memory, by what each node has free now (the running daemon's
``GET /v1/nrt``, or, without one, this host as on a fresh start). It is advice,
not admission: nothing is held, no CPU need be free for the guest alone, and a
guest that fits nowhere still gets the nodes that come closest (``best_nodes``
gives the steps). Only a machine with no node that has online CPUs gets no
advice: nothing on stdout, the reason on stderr, exit 1.

Red Hat numad's other options are named with what they did there and that
numad does not do it; exit 2.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from numad import defaults
from numad.cpuset import NodeSet
from numad.errors import NumadError

# Red Hat numad's options (numad.8), and what each did there.
OTHERS = {
    "-C": "-C 0|1 counted inactive file cache as available memory",
    "-d": "-d ran in debug mode",
    "-D": "-D set the cgroup mount point",
    "-H": "-H set the transparent hugepage scan interval",
    "-i": "-i set the interval between its scans of the system",
    "-K": "-K 0|1 kept or interleaved memory across nodes",
    "-l": "-l set the log level",
    "-m": "-m set the target memory locality",
    "-p": "-p added a process to the list it manages",
    "-r": "-r removed a process from the lists it manages",
    "-R": "-R reserved CPUs for other uses",
    "-S": "-S 0|1 scanned all processes or only the listed ones",
    "-t": "-t set the logical CPU percentage of a core",
    "-u": "-u set the target utilisation of a node",
    "-v": "-v logged verbosely",
    "-V": "-V printed its version",
    "-x": "-x excluded a process from management",
}
INSTEAD = {
    "-p": "numad manages workloads by cgroup: `numad admit` or a spec in the workloads directory",
    "-r": "`numad release NAME`",
    "-R": "reserved-cpus in the config file",
    "-V": "`numad --version`",
    "-l": "the log level in the config file",
}
# Whole numbers as libvirt passes them (an unsigned short of vCPUs, MiB from KiB);
# the bounds keep int() clear of Python's 4300-digit limit.
_REQUEST = re.compile(r"(\d{1,9})(?::(\d{1,15}))?")
_MIB = 1 << 20


def is_redhat(argv: list[str]) -> bool:
    """Whether ``argv`` is a Red Hat numad command line (its first word is one of its
    one-letter options; ``-h`` stays numad's help)."""
    return bool(argv) and argv[0][:2] in ({"-w"} | set(OTHERS))


def main(argv: list[str]) -> int:
    flag = argv[0][:2]
    if flag != "-w":
        instead = INSTEAD.get(flag, "see `numad --help` for what numad does")
        print(
            f"numad: {OTHERS[flag]} in Red Hat's numad; this numad does not do that"
            f" (instead: {instead}). Of Red Hat numad's options it answers only -w",
            file=sys.stderr,
        )
        return 2
    rest = [argv[0][2:], *argv[1:]] if len(argv[0]) > 2 else argv[1:]
    value, socket, root = _options(rest)
    if value is None:
        return 2
    match = _REQUEST.fullmatch(value)
    if match is None or int(match.group(1)) == 0:
        print(
            f"numad: -w {value!r}: expected NCPUS[:MB], a whole number of CPUs (at least 1)"
            " and optionally of MiB, as libvirt passes them (e.g. -w 4:8192)",
            file=sys.stderr,
        )
        return 2
    cpus, mib = int(match.group(1)), int(match.group(2) or 0)
    try:
        nodes = advice(cpus, mib, socket, root)
    except (NumadError, OSError) as err:
        print(f"numad: -w {value}: {err}", file=sys.stderr)  # stdout stays empty
        return 1
    print(nodes.format_list())
    return 0


def _options(rest: list[str]) -> tuple[str | None, str | None, str | None]:
    """-w's value, and numad's own --socket and --root (for tests and scratch trees)."""
    value = socket = root = None
    words = iter(rest)
    for word in words:
        if word in ("--socket", "--root"):
            given = next(words, None)
            if given is None:
                print(f"numad: {word} needs a value", file=sys.stderr)
                return None, None, None
            if word == "--socket":
                socket = given
            else:
                root = given
        elif value is None and not word.startswith("-"):
            value = word
        else:
            print(f"numad: -w: unexpected argument {word!r}", file=sys.stderr)
            return None, None, None
    if value is None:
        print("numad: -w needs NCPUS[:MB] (e.g. -w 4:8192)", file=sys.stderr)
    return value, socket, root


@dataclass(frozen=True, slots=True)
class Zone:
    """What one NUMA node offers a guest (a zone of the NodeResourceTopology object)."""

    node: int
    cpus: int  # online CPUs
    free_cpus: int  # neither reserved nor held exclusively
    free_mib: int  # memory not held, whole MiB


def best_nodes(zones: Iterable[Zone], cpus: int, mib: int) -> NodeSet:
    """The nodes Red Hat numad would advise for a guest of ``cpus`` CPUs and ``mib`` MiB.

    1. Only nodes with online CPUs can run a guest: libvirt pins its vCPUs to the
       advised nodes' CPUs. Without one there is no advice (an empty set).
    2. One node that holds the guest (free CPUs and free memory): the one with the
       most free CPUs, then the most free memory, then the lowest id.
    3. Else the fewest nodes that hold it together, taken most free first: by
       free CPUs, or by free memory where that needs fewer nodes.
    4. Else (more than the machine has free) every node with CPUs: the guest runs
       shared, as Red Hat numad would still place it.
    """
    usable = [z for z in zones if z.cpus > 0]
    by_cpus = sorted(usable, key=lambda z: (-z.free_cpus, -z.free_mib, z.node))
    by_memory = sorted(usable, key=lambda z: (-z.free_mib, -z.free_cpus, z.node))
    for zone in by_cpus:
        if zone.free_cpus >= cpus and zone.free_mib >= mib:
            return NodeSet([zone.node])
    for count in range(2, len(usable) + 1):
        for order in (by_cpus, by_memory):
            chosen = order[:count]
            if sum(z.free_cpus for z in chosen) >= cpus and sum(z.free_mib for z in chosen) >= mib:
                return NodeSet(z.node for z in chosen)
    return NodeSet(z.node for z in usable)


def advice(cpus: int, mib: int, socket: str | None, root: str | None) -> NodeSet:
    """The nodes to advise for a guest of ``cpus`` CPUs and ``mib`` MiB on this machine."""
    nodes = best_nodes(zones(socket, root), cpus, mib)
    if not nodes:
        raise NumadError("this machine", "no NUMA node has online CPUs; there is nothing to advise")
    return nodes


def zones(socket: str | None, root: str | None) -> tuple[Zone, ...]:
    """Each node's free CPUs and memory: the running daemon's (``--socket``, else the
    default socket where it exists), else this machine (or ``--root``) as on a fresh
    start, with the config's reserved CPUs."""
    path = socket or (None if root else defaults.SOCKET)
    if path is not None and os.path.exists(path):
        from numad.cli.client import request  # noqa: PLC0415 - the client stays light

        nrt = request(path, "GET", "/v1/nrt")
    else:
        from numad.daemon.service import nrt_offline  # noqa: PLC0415 - offline only

        nrt = nrt_offline(None, root)
    return tuple(_zone(z) for z in nrt["zones"])


def _zone(zone: dict[str, Any]) -> Zone:
    resources = {r["name"]: r for r in zone["resources"]}
    cpu = resources.get("cpu", {})
    memory = resources.get("memory", {})
    return Zone(
        node=int(zone["name"].removeprefix("node-")),
        cpus=int(cpu.get("capacity", 0)),
        free_cpus=int(cpu.get("available", 0)),
        free_mib=int(memory.get("available", 0)) // _MIB,
    )
