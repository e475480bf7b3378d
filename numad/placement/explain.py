"""Explanations of merge decisions, as values and in plain words.

Pure core. The kubelet rejects with "Resources cannot be allocated with
Topology locality"; numad says what was decided first (admitted where, or
rejected and the smallest reason: the group of resources with no preferred
node set in common, or the allocation that failed), then what was asked for,
what each NUMA node had free (on a rejection), and each resource's preferred
node sets. The text is those parts joined by "; " (no part holds one), so a
reader may show one part a line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from numad.cpuset import CPUSet, NodeSet
from numad.placement.hints import HintList
from numad.placement.policy import Decision, Policy
from numad.placement.search import Search, SearchBudgetError

_ANY = (1 << 4096) - 1  # every node: described masks need no machine mask here


@dataclass(frozen=True, slots=True)
class ResourceView:
    """What one resource's hints allow."""

    resource: str
    provider: int
    preferred: tuple[NodeSet, ...]  # node sets the provider prefers for it
    possible: tuple[NodeSet, ...]  # every node set it could use, preferred or not
    anywhere: bool  # a preferred "any node" hint (no preference)
    nowhere: bool  # an empty hint list: it cannot be placed at all
    hints: HintList | None = field(default=None, repr=False, compare=False)
    more: bool = False  # described hints: more preferred node sets than ``preferred`` shows


@dataclass(frozen=True, slots=True)
class Asked:
    """What one container (or a pod, by scope) asked for."""

    container: str
    cpus: int = 0  # exclusive CPUs (0: the shared pool)
    memory: Mapping[str, int] = field(default_factory=dict)  # resource -> bytes
    devices: Mapping[str, int] = field(default_factory=dict)  # class -> count
    # class -> devices of it free on the whole machine, when it was decided
    available: Mapping[str, int] = field(default_factory=dict, compare=False)
    present: Mapping[str, int] = field(default_factory=dict, compare=False)  # class -> devices

    def text(self) -> str:
        parts = [_cpus(self.cpus, "exclusive ") if self.cpus else "CPUs of the shared pool"]
        parts += [f"{human_bytes(b)} {name}" for name, b in sorted(self.memory.items()) if b]
        parts += [f"{n} {name}" for name, n in sorted(self.devices.items()) if n]
        return f"{self.container} asks for {', '.join(parts)}"


@dataclass(frozen=True, slots=True)
class NodeFree:
    """What one NUMA node had free when the request was decided."""

    node: int
    cpus: int  # CPUs free for exclusive use
    memory: Mapping[str, int] = field(default_factory=dict)  # resource -> bytes
    devices: Mapping[str, int] = field(default_factory=dict)  # class -> count

    def text(self) -> str:
        parts = [_cpus(self.cpus)]
        parts += [f"{human_bytes(b)} {name}" for name, b in sorted(self.memory.items())]
        parts += [f"{n} {name}" for name, n in sorted(self.devices.items())]
        return f"node {self.node} has {', '.join(parts)} free"


@dataclass(frozen=True, slots=True)
class Move:
    """A running workload moved to make room for another: its CPUs and nodes (those of
    its CPUs and its ``cpuset.mems``) before and after, and the bytes of memory that
    migrate (its resident memory on the nodes its new ``cpuset.mems`` leaves out)."""

    workload: str
    cpus_from: CPUSet
    cpus_to: CPUSet
    nodes_from: NodeSet
    nodes_to: NodeSet
    bytes: int = 0

    @property
    def across(self) -> bool:
        return self.nodes_from != self.nodes_to

    @property
    def changed(self) -> int:
        """The CPUs it gives up (as many as it gains, its size unchanged)."""
        return (self.cpus_from.bits & ~self.cpus_to.bits).bit_count()

    def text(self, verb: str = "moved") -> str:
        """ "moved A from node 0 to node 1, 64Mi of memory"; "would move B within node 0
        (CPUs 2-3 to 6-7), no memory to migrate"."""
        if self.across:
            where = f"from {nodes_text(self.nodes_from)} to {nodes_text(self.nodes_to)}"
        else:
            cpus = f"CPUs {self.cpus_from.format_list()} to {self.cpus_to.format_list()}"
            where = f"within {nodes_text(self.nodes_to)} ({cpus})"
        memory = f"{human_bytes(self.bytes)} of memory" if self.bytes else "no memory to migrate"
        return f"{verb} {self.workload} {where}, {memory}"


@dataclass(frozen=True, slots=True)
class Explanation:
    policy: Policy
    admitted: bool
    affinity: NodeSet | None
    preferred: bool
    resources: tuple[ResourceView, ...]
    conflict: tuple[str, ...]  # smallest group with no preferred node set in common
    asked: Asked | None = None
    free: tuple[NodeFree, ...] = ()  # per node, given on a rejection
    failure: str = ""  # the merge admitted, then this allocation failed: rejected
    # What the devices placed share in the PCIe tree ("gpu 0000:1b:00.0 and nic
    # 0000:1a:00.0 share switch 0000:18:00.0"), for two devices or more
    wiring: tuple[str, ...] = ()

    def parts(self) -> tuple[str, ...]:
        """The decision, the request, what its devices share, what was free, then each
        resource's node sets."""
        out = [self._decision()]
        if self.asked is not None:
            out.append(self.asked.text())
        out += self.wiring
        out += [f.text() for f in self.free[:FREE_SHOWN]]
        if len(self.free) > FREE_SHOWN:
            out.append(f"{len(self.free) - FREE_SHOWN} more nodes (numad topology shows them)")
        lines = [_resource_line(r, self.asked) for r in self.resources if r.resource]
        out += lines or ["no resource asked for NUMA placement"]
        return tuple(out)

    def text(self) -> str:
        return "; ".join(self.parts())

    def _decision(self) -> str:
        if self.failure:  # never "admitted": the merge's answer did not hold
            return f"rejected: {plain(self.failure)} (policy {self.policy})"
        where = "any node" if self.affinity is None else nodes_text(self.affinity)
        if self.admitted:
            quality = "preferred" if self.preferred else "not preferred"
            return f"admitted on {where} ({quality}, policy {self.policy})"
        return f"rejected: {self._reason()} (policy {self.policy})"

    def _reason(self) -> str:
        nowhere = [r.resource for r in self.resources if r.nowhere]
        if nowhere:
            return f"{_names(nowhere)} cannot be placed on any NUMA node"
        if len(self.conflict) == 1:
            return f"{self.conflict[0]} has no preferred NUMA placement"
        if self.conflict:
            return f"no NUMA node set is preferred by all of {_names(self.conflict)}"
        return "no preferred alignment was found"


def explain(
    decision: Decision,
    asked: Asked | None = None,
    free: tuple[NodeFree, ...] = (),
    failure: str = "",
    wiring: tuple[str, ...] = (),
) -> Explanation:
    """``decision`` explained; ``failure``: the allocation that failed after the merge
    admitted (then the explanation is a rejection); ``wiring``: what the devices
    placed share in the PCIe tree."""
    views = tuple(_view(hl) for hl in decision.lists)
    return Explanation(
        policy=decision.policy,
        admitted=decision.admit and not failure,
        affinity=decision.affinity,
        preferred=decision.preferred,
        resources=views,
        conflict=() if decision.preferred else conflict(views),
        asked=asked,
        free=free,
        failure=failure,
        wiring=wiring,
    )


SHOWN = 5  # preferred node sets named per described resource
FREE_SHOWN = 16  # nodes whose free resources a rejection lists


def _view(hl: HintList) -> ResourceView:
    if hl.space is not None:
        space = hl.space
        found: list[NodeSet] = []
        for w in range(1, space.nodes.bit_count() + 1):
            found += [NodeSet.from_bits(m) for m in space.of_width(w) if space.prefers(m)][
                : SHOWN + 1 - len(found)
            ]
            if len(found) > SHOWN or (not space.min_sockets and w >= space.width):
                break
        shown = tuple(found[:SHOWN])
        return ResourceView(
            hl.resource, hl.provider, shown, (), False, False, hl, more=len(found) > SHOWN
        )
    preferred = _distinct(h.affinity for h in hl.hints if h.preferred and h.affinity is not None)
    possible = _distinct(h.affinity for h in hl.hints if h.affinity is not None)
    anywhere = any(h.preferred and h.affinity is None for h in hl.hints)
    return ResourceView(hl.resource, hl.provider, preferred, possible, anywhere, hl.given == (), hl)


def _distinct(sets: Iterable[NodeSet]) -> tuple[NodeSet, ...]:
    return tuple(sorted(set(sets), key=lambda s: (len(s), s.bits)))


def conflict(views: Sequence[ResourceView]) -> tuple[str, ...]:
    """A smallest-by-removal group of resources with no preferred node set in common."""
    group: list[ResourceView] = []
    for view in views:
        group.append(view)
        if not _common(group):
            break
    else:
        return ()
    # Drop every member the conflict does not need, earliest first.
    for member in list(group[:-1]):
        rest = [v for v in group if v is not member]
        if not _common(rest):
            group = rest
    return tuple(v.resource or "(provider without preference)" for v in group)


def _common(group: Sequence[ResourceView]) -> bool:
    """Whether some node set (or "anywhere") is preferred by every member."""
    if all(v.anywhere for v in group):
        return True
    if any(v.hints is not None and v.hints.space is not None for v in group):
        try:  # described hints: the merge's own search for a common preferred mask
            return (
                Search([v.hints for v in group if v.hints is not None], _ANY).preferred()
                is not None
            )
        except SearchBudgetError:
            return True  # not known: no conflict is claimed
    candidates = {s for v in group for s in v.preferred}
    return any(all(v.anywhere or s in v.preferred for v in group) for s in candidates)


def _resource_line(view: ResourceView, asked: Asked | None) -> str:
    if asked is not None and asked.present.get(view.resource, 1) == 0:
        return f"{view.resource}: its selector matches no device on this machine"
    if asked is not None and asked.available.get(view.resource, 1) == 0:
        return f"{view.resource}: none free on this machine"
    if view.nowhere:
        return f"{view.resource} fits nowhere"
    if view.anywhere and not view.preferred:
        return f"{view.resource} has no NUMA preference"
    if not view.preferred:
        return f"{view.resource} fits on no preferred node set"
    sets = " or ".join(nodes_text(s) for s in view.preferred[:4])
    more = f" (+{len(view.preferred) - 4} more)" if len(view.preferred) > 4 else ""
    if view.more:
        more = " (and more)"
    only = "only " if len(view.preferred) == 1 else ""
    return f"{view.resource} fits {only}on {sets}{more}"


def nodes_text(nodes: NodeSet) -> str:
    """A node set as numad writes one in text: "node 0", "nodes 0-1,3" (the kernel's list)."""
    return f"node {nodes.format_list()}" if len(nodes) == 1 else f"nodes {nodes.format_list()}"


def _names(names: Sequence[str]) -> str:
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


# The managers fail in the kubelet's words (the conformance vectors hold them, and the
# API's ``detail`` keeps them); an explanation says the same in plain words.
_PLAIN: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), words)
    for pattern, words in (
        (
            r"\[memorymanager\] failed to .*no NUMA nodes with enough memory",
            "no NUMA node, nor set of nodes, has that much memory free",
        ),
        (
            r"\[memorymanager\] preferred hint violates NUMA node allocation",
            "its NUMA nodes already hold memory spread across another set of nodes",
        ),
        (
            r"requested number of devices unavailable for (\S+)\. "
            r"Requested: (\d+), Available: (\d+)",
            r"\2 \1 asked for, \3 free",
        ),
        (
            r"not enough cpus available to satisfy request: requested=(\d+), available=(\d+)",
            r"\1 exclusive CPUs asked for, \2 free",
        ),
        (
            r"SMT Alignment Error: requested (\d+) cpus not multiple cpus per core = (\d+)",
            r"\1 CPUs is not a whole number of cores (\2 CPUs each)",
        ),
        (
            r"SMT Alignment Error: not enough free physical CPUs: available physical CPUs = "
            r"(\d+), requested CPUs = (\d+), .*",
            r"\2 CPUs asked for on whole cores, \1 free there",
        ),
    )
)


def plain(problem: str) -> str:
    """A manager's failure in plain words (unchanged when it is plain already)."""
    for pattern, words in _PLAIN:
        found = pattern.search(problem)
        if found:
            return found.expand(words)
    return problem


def human_bytes(n: int) -> str:
    """Bytes in the largest unit that holds one (Ti, Gi, Mi, Ki), to one decimal:
    "2Gi", "21.8Gi", "190.7Ti"."""
    for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f}".removesuffix(".0") + unit
    return f"{n}B"


def _cpus(n: int, kind: str = "") -> str:
    return f"{n} {kind}CPU" if n == 1 else f"{n} {kind}CPUs"
