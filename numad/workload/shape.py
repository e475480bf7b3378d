"""Workload specs as values: ``WorkloadSpec`` and ``ContainerSpec``, the limits every
shape shares, and the request admission takes (``to_request``) and the checkpoint
records (``to_dict``). Pure; read from text by ``numad.workload.reader``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from numad.placement.admission import ContainerRequest, WorkloadRequest
from numad.placement.managers.cpu.state import ContainerKind
from numad.placement.managers.memory import MEMORY
from numad.placement.policy import Policy
from numad.workload.quantity import page_size

MAX_CPUS = 4096
MAX_BYTES = (1 << 63) - 1
MAX_DEVICES = 1 << 16
MAX_CGROUP_PATH = 1024
DEFAULT_MANAGED_ROOTS = ("numad.slice",)
DEFAULT_CONTAINER = "main"

# Directory names as systemd units and plain tools spell them, without the
HUGEPAGES = "hugepages-"


def frozen(values: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(sorted(values.items())))


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    name: str
    cgroup: str  # relative to the workload's cgroup; "" is the workload cgroup itself
    exclusive_cpus: int = 0
    shared_millicpus: int = 0  # a request on the shared pool (pinned to the whole pool)
    memory: Mapping[str, int] = field(default_factory=lambda: frozen({}))  # resource -> bytes
    devices: Mapping[str, int] = field(default_factory=lambda: frozen({}))  # class -> count
    kind: ContainerKind = ContainerKind.APP


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str
    cgroup: str  # relative to the cgroup root, inside a managed root
    policy: Policy | None
    containers: tuple[ContainerSpec, ...]
    unit: str | None = None  # a systemd unit: cgroup is its cgroup ("" until resolved)
    # Released once its cgroups have been empty for the grace period (numad run, an
    # OCI container): its client may die without releasing it.
    transient: bool = False
    # numad may move its exclusive CPUs and memory to other CPUs or nodes that meet its
    # own policy, to admit another workload (re-placement: not built yet).
    movable: bool = False

    def container_cgroup(self, container: ContainerSpec) -> str:
        """The container's cgroup, relative to the cgroup root."""
        return f"{self.cgroup}/{container.cgroup}" if container.cgroup else self.cgroup

    def to_request(self) -> WorkloadRequest:
        return WorkloadRequest(
            self.name,
            tuple(
                ContainerRequest(c.name, c.exclusive_cpus, dict(c.memory), dict(c.devices), c.kind)
                for c in self.containers
            ),
            self.policy,
        )

    def container(self, name: str | None) -> ContainerSpec | None:
        """The container named ``name``; None: its only app container. None when there
        is no such container, or no name was given and it has more than one app one."""
        if name is not None:
            return next((c for c in self.containers if c.name == name), None)
        apps = [c for c in self.containers if c.kind is ContainerKind.APP]
        return apps[0] if len(apps) == 1 else None

    def resized(self, name: str, cpus: int | None, memory: int | None) -> WorkloadSpec:
        """The spec with container ``name`` asking for ``cpus`` exclusive CPUs and
        ``memory`` bytes (None: as it asks now)."""
        out = []
        for c in self.containers:
            if c.name == name:
                amounts = dict(c.memory)
                if memory is not None:
                    amounts[MEMORY] = memory
                cpus_now = c.exclusive_cpus if cpus is None else cpus
                c = replace(c, exclusive_cpus=cpus_now, memory=frozen(amounts))  # noqa: PLW2901
            out.append(c)
        return replace(self, containers=tuple(out))

    def notes(self) -> list[str]:
        """What the spec asks for that a reader may not expect: a request of one CPU or
        more that is fractional or in millicpus runs on the shared pool, not on
        exclusive CPUs (one below a CPU, "500m", plainly asks for the pool)."""
        out = []
        for c in self.containers:
            m = c.shared_millicpus
            if m < 1000:
                continue
            who = f"{self.name}/{c.name}" if len(self.containers) > 1 else self.name
            if m % 1000:
                asked = f"{m / 1000:g} CPUs is not a whole number"
            else:
                asked = f"{m}m is written in millicpus (write {m // 1000} for exclusive CPUs)"
            out.append(f"{who}: {asked}: it runs on the shared pool, not on CPUs of its own")
        return out

    def to_dict(self) -> dict[str, Any]:
        """The spec in its own JSON shape: ``parse_spec`` reads it back to an equal spec."""
        out: dict[str, Any] = {"name": self.name}
        if self.unit is not None:
            out["unit"] = self.unit
        if self.cgroup:
            out["cgroup"] = self.cgroup
        if self.policy is not None:
            out["policy"] = self.policy.value
        if self.transient:
            out["transient"] = True
        if self.movable:
            out["movable"] = True
        only = self.containers[0] if len(self.containers) == 1 else None
        default = (DEFAULT_CONTAINER, "", ContainerKind.APP)
        if only and (only.name, only.cgroup, only.kind) == default:
            return out | _resources_dict(only)
        out["containers"] = [
            {"name": c.name, "cgroup": c.cgroup, "kind": c.kind.value, **_resources_dict(c)}
            for c in self.containers
        ]
        return out


def _resources_dict(c: ContainerSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if c.exclusive_cpus:
        out["cpus"] = c.exclusive_cpus
    elif c.shared_millicpus:
        out["cpus"] = f"{c.shared_millicpus}m"
    for resource, amount in c.memory.items():
        # Memory in bytes, hugepages as a page count (the spec's integer form).
        page = page_size(resource.removeprefix(HUGEPAGES)) if resource != MEMORY else None
        out[resource] = amount // page if page else amount
    if c.devices:
        out["devices"] = dict(c.devices)
    return out
