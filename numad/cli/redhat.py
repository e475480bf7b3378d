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

The advice is a plan of the guest as a workload of VCPUS exclusive CPUs and
MIB of memory, under best-effort (advice, not admission: a guest wider than
one node still gets the nodes that fit it best), asked of the running daemon
(``POST /v1/plan``: nothing is admitted) or, without one, planned offline on
this host. The nodes are those of the planned CPUs and memory. Where nothing
can hold the guest, nothing is printed, the reason goes to stderr, exit 1.

Red Hat numad's other options are named with what they did there and that
numad does not do it; exit 2.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from numad import defaults
from numad.cpuset import CPUSet, NodeSet
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
_REQUEST = re.compile(r"(\d+)(?::(\d+))?")
ADVICE_NAME = "libvirt-advice"


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
    except NumadError as err:
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


def advice(cpus: int, mib: int, socket: str | None, root: str | None) -> NodeSet:
    """The nodes numad would place a guest of ``cpus`` CPUs and ``mib`` MiB on. A plan
    makes no cgroup: the spec names one in the first managed root, whichever it is."""
    spec: dict[str, Any] = {"name": ADVICE_NAME, "policy": "best-effort", "cpus": cpus}
    if mib:
        spec["memory"] = f"{mib}Mi"
    path = socket or (None if root else defaults.SOCKET)
    if path is not None and os.path.exists(path):
        from numad.cli.client import APIError, request  # noqa: PLC0415 - the client stays light

        try:
            health = request(path, "GET", "/v1/health")
        except APIError as err:  # not ready: it still says where it works
            health = err.body
        roots = health.get("managed_roots") or [defaults.MANAGED_ROOT]
        text = json.dumps({**spec, "cgroup": f"{roots[0].strip('/')}/{ADVICE_NAME}"})
        result = request(path, "POST", "/v1/plan", text, content_type="application/json")
        topology = request(path, "GET", "/v1/topology")
        node_cpus = {int(n): CPUSet(node["cpus"]) for n, node in topology["numa_nodes"].items()}
    else:
        from numad.daemon.config import load  # noqa: PLC0415
        from numad.daemon.service import plan_offline  # noqa: PLC0415
        from numad.hostfs import HostFS  # noqa: PLC0415 - the daemon's side, offline only
        from numad.topology.discover import discover  # noqa: PLC0415

        roots = load(None).paths.managed_roots
        text = json.dumps({**spec, "cgroup": f"{roots[0].strip('/')}/{ADVICE_NAME}"})
        result = plan_offline(None, root, text, "application/json")
        topo = discover(HostFS(Path(root).resolve() if root else "/"))
        node_cpus = {n.id: n.cpus for n in topo.nodes}
    if not result["admitted"]:
        raise _UnplaceableError(result["explanation"] or result["detail"])
    nodes = NodeSet()
    for c in result["containers"].values():
        held = CPUSet.parse_list(c["cpus"])
        nodes |= NodeSet(n for n, own in node_cpus.items() if not own.isdisjoint(held))
        nodes |= NodeSet.parse_list(c["mems"])
    if not nodes:
        raise _UnplaceableError("the plan holds no node")
    return nodes


class _UnplaceableError(NumadError):
    def __init__(self, why: str) -> None:
        super().__init__("guest", f"no placement: {why}")
