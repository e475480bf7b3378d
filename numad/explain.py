"""Explanations of merge decisions, as values and in plain words.

Pure core. The kubelet rejects with "Resources cannot be allocated with
Topology locality"; numad names each resource's preferred NUMA node sets and
the smallest group of resources that have none in common.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from numad.cpuset import NodeSet
from numad.hints import HintList
from numad.policy import Decision, Policy
from numad.search import Search, SearchBudgetError

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
class Explanation:
    policy: Policy
    admitted: bool
    affinity: NodeSet | None
    preferred: bool
    resources: tuple[ResourceView, ...]
    conflict: tuple[str, ...]  # smallest group with no preferred node set in common

    def text(self) -> str:
        lines = [_resource_line(r) for r in self.resources if r.resource]
        head = "; ".join(lines) if lines else "no resource asked for NUMA placement"
        where = "any NUMA node" if self.affinity is None else f"NUMA nodes {_nodes(self.affinity)}"
        if self.admitted:
            quality = "preferred" if self.preferred else "not preferred"
            return f"{head}: admitted on {where} ({quality}, policy {self.policy})"
        return f"{head}: {self._reason()} (policy {self.policy})"

    def _reason(self) -> str:
        nowhere = [r.resource for r in self.resources if r.nowhere]
        if nowhere:
            return f"{_names(nowhere)} cannot be placed on any NUMA node"
        if len(self.conflict) == 1:
            return f"{self.conflict[0]} has no preferred NUMA placement"
        if self.conflict:
            return f"no NUMA node set is preferred by all of {_names(self.conflict)}"
        return "no preferred alignment was found"


def explain(decision: Decision) -> Explanation:
    views = tuple(_view(hl) for hl in decision.lists)
    return Explanation(
        policy=decision.policy,
        admitted=decision.admit,
        affinity=decision.affinity,
        preferred=decision.preferred,
        resources=views,
        conflict=() if decision.preferred else conflict(views),
    )


SHOWN = 5  # preferred node sets named per described resource


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


def _resource_line(view: ResourceView) -> str:
    if view.nowhere:
        return f"{view.resource} fits nowhere"
    if view.anywhere and not view.preferred:
        return f"{view.resource} fits anywhere"
    if not view.preferred:
        return f"{view.resource} has no preferred placement"
    sets = " or ".join(_nodes(s) for s in view.preferred[:4])
    more = f" (+{len(view.preferred) - 4} more)" if len(view.preferred) > 4 else ""
    if view.more:
        more = " (and more)"
    only = "only " if len(view.preferred) == 1 else ""
    return f"{view.resource} fits {only}on {sets}{more}"


def _nodes(nodes: NodeSet) -> str:
    return "{" + ",".join(str(n) for n in nodes) + "}"


def _names(names: Sequence[str]) -> str:
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]
