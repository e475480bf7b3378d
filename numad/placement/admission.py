"""Admission: hints from the three managers, the merge, the decision, the allocations.

Pure core. ``Books`` is the whole allocation state (CPU, memory, devices) as
one immutable value; ``admit`` returns new books and an ``Outcome`` and never
changes the old ones, so a rejected or failed workload leaves no trace.
Providers are asked in the kubelet's registration order: device manager, CPU
manager, memory manager; allocation runs in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from numad.cpuset import CPUSet, NodeSet
from numad.errors import AllocationError
from numad.placement.explain import Asked, Explanation, Move, NodeFree, explain
from numad.placement.groups import Group, cpu_first, groups, memory_weights
from numad.placement.hints import ProviderHints
from numad.placement.managers.cpu.state import ContainerKind, CPUState
from numad.placement.managers.cpu.static import StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology
from numad.placement.managers.device import DeviceState
from numad.placement.managers.memory import MemoryState
from numad.placement.policy import Decision, Machine, Policy, PolicyOptions, merge
from numad.placement.scope import Container, Scope, effective_request


class Reason(StrEnum):
    TOPOLOGY = "TopologyAffinityError"  # the merge refused the workload
    ALLOCATION = "UnexpectedAdmissionError"  # admitted by the merge, then an allocation failed


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    name: str
    cpus: int = 0  # exclusive CPUs (0: the container runs on the shared pool)
    memory: Mapping[str, int] = field(default_factory=dict)  # "memory", "hugepages-2Mi": bytes
    devices: Mapping[str, int] = field(default_factory=dict)  # device class -> count
    kind: ContainerKind = ContainerKind.APP


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    name: str
    containers: tuple[ContainerRequest, ...]
    policy: Policy | None = None  # overrides the host's topology policy


@dataclass(frozen=True, slots=True)
class Engine:
    """The host's configuration for admission (everything but the state)."""

    machine: Machine
    cpu_policy: StaticPolicy
    policy: Policy = Policy.BEST_EFFORT
    options: PolicyOptions = field(default_factory=PolicyOptions)
    scope: Scope = Scope.CONTAINER
    memory_manager: bool = True  # static memory policy; False: the kubelet's "None"


@dataclass(frozen=True, slots=True)
class Books:
    cpu: CPUState
    memory: MemoryState
    devices: DeviceState


@dataclass(frozen=True, slots=True)
class Placement:
    cpus: CPUSet  # exclusive CPUs (empty: shared pool)
    mems: NodeSet  # cpuset.mems (empty: no memory pinning)
    devices: Mapping[str, tuple[str, ...]]
    # Each device with a node and the CPUs and memory that go with it (groups.groups);
    # () for a container without such devices, or where no CPU topology was given.
    groups: tuple[Group, ...] = ()


@dataclass(frozen=True, slots=True)
class Outcome:
    admitted: bool
    decisions: tuple[tuple[str, Decision], ...]
    placements: Mapping[str, Placement]
    reason: Reason | None = None
    detail: str = ""
    failed_container: str | None = None
    # What each decided container asked for, in decision order; by pod scope one, the pod's.
    asks: tuple[Asked, ...] = ()
    free: tuple[NodeFree, ...] = ()  # what each node had free, on a rejection
    held: bool = False  # decided before: the workload holds these placements already
    # (container, what its devices share in the PCIe tree), for two devices or more
    wiring: tuple[tuple[str, str], ...] = ()
    # Admitted after moving these running workloads (numad.placement.moves).
    moves: tuple[Move, ...] = ()
    # Rejected, but moving these workloads, which are not movable, would admit it.
    unmovable: tuple[str, ...] = ()
    planned: bool = False  # an answer to ``plan``: nothing was committed

    def move_lines(self) -> tuple[str, ...]:
        """The moves made (or, planned, that would be made), or the workloads whose
        move would have admitted a rejected one."""
        verb = "would move" if self.planned else "moved"
        out = tuple(m.text(verb) for m in self.moves)
        if self.unmovable:
            names = ", ".join(self.unmovable)
            are = "they are" if len(self.unmovable) > 1 else "it is"
            out += (
                f"moving {names} would admit it, but {are} not movable"
                " (movable = true, --movable or numad.io/movable)",
            )
        return out

    @property
    def explanation(self) -> Explanation | None:
        """The explanation of the decisive merge (the rejected one, else the last); an
        allocation that failed after the merge admitted makes it a rejection."""
        return self.decisive(self.explained())

    def decisive(self, explained: tuple[tuple[str, Explanation], ...]) -> Explanation | None:
        """Of ``explained`` (this outcome's ``explained()``), the rejected container's,
        else the last; None when nothing was decided."""
        for name, why in explained:
            if name == self.failed_container:
                return why
        return explained[-1][1] if explained else None

    def explained(self) -> tuple[tuple[str, Explanation], ...]:
        """Each decided container's explanation, in decision order (by pod scope one:
        ``"the pod"``'s). Only the decisive one of a rejection lists what was free; a
        container after it was not decided and is not listed."""
        if not self.decisions:
            return ()
        failure = self.detail if self.reason is Reason.ALLOCATION else ""
        if self.asks and self.asks[0].container == POD:
            wiring = tuple(
                text if len(self.wiring) == 1 else f"{name}: {text}" for name, text in self.wiring
            )
            why = explain(self.decisions[0][1], self.asks[0], self.free, failure, wiring)
            return ((POD, why),)
        asks = {a.container: a for a in self.asks}
        wired = dict(self.wiring)
        out = []
        for name, decision in self.decisions:
            decisive = name == self.failed_container
            out.append(
                (
                    name,
                    explain(
                        decision,
                        asks.get(name),
                        self.free if decisive else (),
                        failure if decisive else "",
                        (wired[name],) if name in wired else (),
                    ),
                )
            )
        return tuple(out)


def _providers(
    engine: Engine,
    books: Books,
    key: tuple[str, str],
    request: ContainerRequest,
    donors: Sequence[tuple[str, str]] = (),
) -> list[ProviderHints]:
    device: ProviderHints = {
        name: books.devices.hints(key, name, count, donors)
        for name, count in sorted(request.devices.items())
        if count
    }
    cpu: ProviderHints = {}
    if request.cpus:
        cpu = {"cpu": books.cpu.hints(engine.cpu_policy, key[0], key[1], request.cpus)}
    memory: ProviderHints = {}
    if engine.memory_manager:
        memory = books.memory.hints(request.memory) or {}
    return [device, cpu, memory]


def _allocate(
    engine: Engine,
    books: Books,
    key: tuple[str, str],
    request: ContainerRequest,
    decision: Decision,
    *,
    donors: Sequence[tuple[str, str]] = (),
) -> Books:
    affinity = decision.affinity
    devices = books.devices.allocate(key, request.devices, affinity, donors)
    near = devices.near(key)  # CPUs local to its devices of locality classes
    # align-per-resource: a best-effort container that no single preferred mask holds
    # gets its CPUs and memory per device node first (numad.placement.groups).
    paired = (
        devices.located(key)
        if engine.options.align_per_resource
        and decision.policy is Policy.BEST_EFFORT
        and not decision.preferred
        else ()
    )
    cpu = books.cpu.allocate(
        engine.cpu_policy,
        key,
        request.cpus,
        affinity,
        request.kind,
        near=near,
        first=cpu_first(paired, request.cpus) if paired else (),
    )
    memory = books.memory
    if engine.memory_manager:
        weights = memory_weights(paired) if paired else None
        memory = memory.allocate(key, request.memory, affinity, weights)
    return Books(cpu, memory, devices)


def admit(engine: Engine, books: Books, workload: WorkloadRequest) -> tuple[Books, Outcome]:
    """Admit ``workload`` or say why not; the returned books hold its allocations."""
    policy = workload.policy or engine.policy
    ordered = [c for c in workload.containers if c.kind is not ContainerKind.APP] + [
        c for c in workload.containers if c.kind is ContainerKind.APP
    ]
    decisions: list[tuple[str, Decision]] = []
    pod_decision: Decision | None = None
    if engine.scope is Scope.POD:
        pod = _pod_request(workload.name, ordered)
        pod_decision = merge(
            policy,
            engine.options,
            engine.machine,
            _providers(engine, books, (workload.name, ""), pod),
        )
        if not pod_decision.admit:
            decisions = [(c.name, pod_decision) for c in ordered]
            return books, Outcome(
                False,
                tuple(decisions),
                {},
                Reason.TOPOLOGY,
                failed_container=ordered[0].name,
                asks=(_asked(books, pod, POD),),
                free=_free(engine, books, pod),
            )
    start = books
    # The regular init containers allocated so far: they have run to completion when the
    # next container starts, so it may take their devices over (the kubelet's reuse).
    donors: list[tuple[str, str]] = []
    for container in ordered:
        key = (workload.name, container.name)
        decision = pod_decision or merge(
            policy,
            engine.options,
            engine.machine,
            _providers(engine, books, key, container, donors),
        )
        decisions.append((container.name, decision))
        if not decision.admit:
            return start, Outcome(
                False,
                tuple(decisions),
                {},
                Reason.TOPOLOGY,
                failed_container=container.name,
                asks=_asks(start, ordered[: len(decisions)]),
                free=_free(engine, books, container),
            )
        try:
            books = _allocate(engine, books, key, container, decision, donors=donors)
        except AllocationError as err:
            return start, Outcome(
                False,
                tuple(decisions),
                {},
                Reason.ALLOCATION,
                err.problem,
                failed_container=container.name,
                asks=_asks(start, ordered[: len(decisions)]),
                free=_free(engine, books, container),
            )
        if container.kind is ContainerKind.INIT:
            donors.append(key)
    asks = (
        _asks(start, ordered)
        if pod_decision is None
        else (_asked(start, _pod_request(workload.name, ordered), POD),)
    )
    held = placements(books, workload.name, engine.cpu_policy.topo)
    wiring = tuple(
        (name, text) for name, p in held.items() if (text := books.devices.wiring(p.devices))
    )
    return books, Outcome(True, tuple(decisions), held, asks=asks, wiring=wiring)


POD = "the pod"  # who asks, by pod scope


def _asks(books: Books, containers: Sequence[ContainerRequest]) -> tuple[Asked, ...]:
    return tuple(_asked(books, c) for c in containers)


def _asked(books: Books, request: ContainerRequest, who: str = "") -> Asked:
    """What ``request`` asks for, with how many devices of each asked class were free
    on the whole machine before the workload."""
    classes = books.devices.inventory.classes
    asked = [name for name, count in request.devices.items() if count and name in classes]
    available = {name: len(books.devices.free(name)) for name in asked}
    present = {name: len(classes[name]) for name in asked}
    return Asked(
        who or request.name, request.cpus, request.memory, request.devices, available, present
    )


def _free(engine: Engine, books: Books, request: ContainerRequest) -> tuple[NodeFree, ...]:
    """What each node has free of what ``request`` asks for (CPUs always)."""
    topo = engine.cpu_policy.topo
    available = books.cpu.available
    memory = [r for r, b in sorted(request.memory.items()) if b] if engine.memory_manager else []
    devices: dict[str, dict[int, int]] = {}
    for name, count in sorted(request.devices.items()):
        if count and name in books.devices.inventory.classes:
            per_node = devices.setdefault(name, {})
            for d in books.devices.free(name):
                if d.node is not None:
                    per_node[d.node] = per_node.get(d.node, 0) + 1
    return tuple(
        NodeFree(
            node,
            (available & topo.numa.get(node, 0)).bit_count(),
            {r: books.memory.free(node, r) for r in memory},
            {name: per_node.get(node, 0) for name, per_node in devices.items()},
        )
        for node in engine.machine.nodes
    )


def _pod_request(name: str, containers: Sequence[ContainerRequest]) -> ContainerRequest:
    as_scope = [
        Container(
            c.name,
            {"cpu": c.cpus, **c.memory, **{f"device:{k}": v for k, v in c.devices.items()}},
            init=c.kind is not ContainerKind.APP,
            sidecar=c.kind is ContainerKind.SIDECAR,
        )
        for c in containers
    ]
    total = effective_request(as_scope)
    return ContainerRequest(
        name,
        cpus=total.pop("cpu", 0),
        memory={k: v for k, v in total.items() if not k.startswith("device:")},
        devices={k.removeprefix("device:"): v for k, v in total.items() if k.startswith("device:")},
    )


def placements(
    books: Books, workload: str, topo: CPUTopology | None = None
) -> dict[str, Placement]:
    """What each container of ``workload`` holds; with ``topo`` (the CPU manager's
    view), each device's group of CPUs and memory too."""
    names = {k[1] for k in books.cpu.assignments if k[0] == workload}
    names |= {k[1] for k in books.memory.blocks if k[0] == workload}
    names |= {k[1] for k in books.devices.held if k[0] == workload}
    out = {}
    for name in sorted(names):
        key = (workload, name)
        cpus = CPUSet.from_bits(books.cpu.assignments.get(key, 0))
        paired: tuple[Group, ...] = ()
        if topo is not None:
            paired = groups(books.devices.located(key), cpus, books.memory.per_node(key), topo)
        out[name] = Placement(
            cpus, books.memory.mems(key), dict(books.devices.held.get(key, {})), paired
        )
    return out


def release(books: Books, workload: str) -> Books:
    """Give back everything the workload holds."""
    return Books(
        books.cpu.release(workload), books.memory.release(workload), books.devices.release(workload)
    )
