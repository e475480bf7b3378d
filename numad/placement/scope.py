"""Topology Manager scopes: which requests are merged, container by container or once per pod.

Pure core. A workload (numad's pod) has init containers and app containers,
each with a request per resource. Under the container scope every container
is merged on its own, init containers first, in spec order, and the first
rejection rejects the workload. Under the pod scope one merge is made for the
pod's effective request and its decision holds for every container.

The effective request per resource is the kubelet's (reference 3.3):
max(sum over app containers + sum over sidecars, the largest regular init
container's request + the sidecars declared before it); without sidecars,
max(sum of app containers, largest init container).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from numad.placement.hints import ProviderHints
from numad.placement.policy import Decision, Machine, Policy, PolicyOptions, merge

Request = Mapping[str, int]  # resource name -> amount (CPUs, bytes, pages, devices)


class Scope(StrEnum):
    CONTAINER = "container"
    POD = "pod"


@dataclass(frozen=True, slots=True)
class Container:
    name: str
    request: Request
    init: bool = False
    sidecar: bool = False  # a restartable init container (runs beside the app containers)


@dataclass(frozen=True, slots=True)
class ScopeDecision:
    """Every container's decision; ``rejected`` names the container that failed, if any."""

    admit: bool
    decisions: tuple[tuple[str, Decision], ...]
    rejected: str | None = None


HintSource = Callable[[Request], Sequence[ProviderHints]]
OnAdmit = Callable[[Container, Decision], None]


def effective_request(containers: Sequence[Container]) -> dict[str, int]:
    """The pod-level request per resource (reference 3.3)."""
    resources = sorted({r for c in containers for r in c.request})
    total: dict[str, int] = {}
    for resource in resources:
        long_running = sum(
            c.request.get(resource, 0) for c in containers if c.sidecar or not c.init
        )
        init_peak = sidecars = 0
        for c in containers:
            if not c.init:
                continue
            if c.sidecar:
                sidecars += c.request.get(resource, 0)
            else:
                init_peak = max(init_peak, c.request.get(resource, 0) + sidecars)
        total[resource] = max(long_running, init_peak)
    return total


def decide(
    scope: Scope,
    policy: Policy,
    options: PolicyOptions,
    machine: Machine,
    containers: Sequence[Container],
    *,
    hints_for: HintSource,
    on_admit: OnAdmit | None = None,
) -> ScopeDecision:
    """Merge under ``scope``: ``hints_for(request)`` asks every provider for hints.

    ``on_admit(container, decision)`` runs after each admitted container (the
    kubelet allocates there, so the next container's hints see it); under the
    pod scope it runs for every container once the pod is admitted.
    """
    notify = on_admit or (lambda _c, _d: None)
    ordered = [c for c in containers if c.init] + [c for c in containers if not c.init]
    if scope is Scope.POD:
        decision = merge(policy, options, machine, hints_for(effective_request(ordered)))
        pairs = tuple((c.name, decision) for c in ordered)
        if not decision.admit:
            return ScopeDecision(False, pairs, "(pod)")
        for c in ordered:
            notify(c, decision)
        return ScopeDecision(True, pairs)
    pairs_list: list[tuple[str, Decision]] = []
    for container in ordered:
        decision = merge(policy, options, machine, hints_for(container.request))
        pairs_list.append((container.name, decision))
        if not decision.admit:
            return ScopeDecision(False, tuple(pairs_list), container.name)
        notify(container, decision)
    return ScopeDecision(True, tuple(pairs_list))
