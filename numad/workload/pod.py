"""Kubernetes Pod manifests as workload specs: the kubelet's reading of a v1 Pod.

The input edge of admission, beside ``numad.workload.spec`` (numad's own shape), whose
``parse_spec`` hands it any YAML or JSON document with an ``apiVersion`` or a
``kind``. Touches nothing but the decoded document: the checks shared with the
native shape (names, cgroup paths inside a managed root, sizes, hugepages,
containers) are ``numad.workload.reader.Reader``'s, quantities ``numad.workload.quantity``'s. What
is the kubelet's here: the Guaranteed QoS rule (exclusive CPUs and pinned
memory only then), init and sidecar containers, and extended resources read as
device classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, Decimal

from numad.placement.managers.cpu.state import ContainerKind
from numad.placement.managers.memory import MEMORY
from numad.workload.decode import member, show, type_name
from numad.workload.quantity import EXACT, exact_number, is_whole
from numad.workload.reader import Reader
from numad.workload.shape import (
    HUGEPAGES,
    MAX_CPUS,
    MAX_DEVICES,
    ContainerSpec,
    WorkloadSpec,
    frozen,
)

CGROUP_ANNOTATION = "numad.io/cgroup"
POLICY_ANNOTATION = "numad.io/topology-policy"
MOVABLE_ANNOTATION = "numad.io/movable"  # "true": numad may move it (WorkloadSpec.movable)
_NOT_DEVICES = frozenset({"cpu", MEMORY, "ephemeral-storage", "storage"})


@dataclass(frozen=True, slots=True)
class _PodContainer:
    where: str
    name: str
    kind: ContainerKind
    requests: Mapping[str, Decimal]  # with the limits filled in where no request is given
    limits: Mapping[str, Decimal]

    def guaranteed(self) -> bool:
        """The kubelet's QoS rule: cpu and memory limits, and requests equal to them."""
        return all(
            self.limits.get(r, 0) > 0 and self.requests.get(r) == self.limits[r]
            for r in ("cpu", MEMORY)
        )


def read_pod(reader: Reader, doc: Mapping[str, object]) -> WorkloadSpec:
    """The workload a v1 Pod manifest asks for, as the kubelet reads it."""
    if doc.get("apiVersion") != "v1" or doc.get("kind") != "Pod":
        problem = f"{show(doc.get('apiVersion'))} {show(doc.get('kind'))} is not a v1 Pod"
        raise reader.fail("kind", problem, "numad reads apiVersion: v1, kind: Pod manifests")
    meta = reader.table(reader.required(doc, "metadata", ""), "metadata")
    raw = reader.required(meta, "name", "metadata")
    name = reader.name(raw.lower() if isinstance(raw, str) else raw, "metadata.name")
    r = replace(reader, subject=name)
    notes = r.table(meta.get("annotations") or {}, "metadata.annotations")
    if not r.roots:
        raise r.fail("metadata", "no managed cgroup roots are configured")
    where = member("metadata.annotations", CGROUP_ANNOTATION)
    cgroup = r.workload_cgroup(notes.get(CGROUP_ANNOTATION, f"{r.roots[0]}/{name}"), where)
    policy = None
    if POLICY_ANNOTATION in notes:
        where = member("metadata.annotations", POLICY_ANNOTATION)
        policy = r.policy(notes[POLICY_ANNOTATION], where)
    movable = False
    if MOVABLE_ANNOTATION in notes:
        where = member("metadata.annotations", MOVABLE_ANNOTATION)
        movable = r.flag(notes[MOVABLE_ANNOTATION], where, text=True)
    spec = r.table(r.required(doc, "spec", ""), "spec")
    parsed = [
        _pod_container(r, item, f"spec.{key}[{i}]", init=key == "initContainers")
        for key in ("initContainers", "containers")
        for i, item in enumerate(_pod_list(r, spec, key, required=key == "containers"))
    ]
    guaranteed = all(c.guaranteed() for c in parsed)
    containers = tuple(_container_spec(r, c, guaranteed=guaranteed) for c in parsed)
    r.check_containers(containers, [c.where for c in parsed])
    return WorkloadSpec(name, cgroup, policy, containers, movable=movable)


def _pod_list(r: Reader, spec: Mapping[str, object], key: str, *, required: bool) -> list[object]:
    value = spec.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        problem = f"expected a {'non-empty ' if required else ''}list, got "
        raise r.fail(f"spec.{key}", problem + type_name(value, empty=True))
    return value


def _pod_container(r: Reader, value: object, where: str, *, init: bool) -> _PodContainer:
    doc = r.table(value, where)
    name = r.name(r.required(doc, "name", where), f"{where}.name")
    restart = doc.get("restartPolicy")
    kind = ContainerKind.APP
    if init and restart == "Always":
        kind = ContainerKind.SIDECAR
    elif init and restart is None:
        kind = ContainerKind.INIT
    elif init:
        raise r.fail(f"{where}.restartPolicy", f"{show(restart)} is not Always")
    resources = r.table(doc.get("resources") or {}, f"{where}.resources")
    limits = _quantities(r, resources.get("limits"), f"{where}.resources.limits")
    asked = _quantities(r, resources.get("requests"), f"{where}.resources.requests")
    for resource in limits.keys() & asked.keys():
        if asked[resource] > limits[resource]:
            raise r.fail(
                member(f"{where}.resources.requests", resource),
                f"{show(asked[resource])} is more than its limit {show(limits[resource])}",
            )
    return _PodContainer(where, name, kind, limits | asked, limits)


def _quantities(r: Reader, value: object, where: str) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for resource, raw in r.table(value or {}, where).items():
        amount = exact_number(raw)
        if amount is None or amount < 0:
            problem = f"{show(raw)} is not a quantity"
            raise r.fail(member(where, resource), problem, "use a suffix like 500m or 32Gi")
        out[resource] = amount
    return out


def _container_spec(r: Reader, c: _PodContainer, *, guaranteed: bool) -> ContainerSpec:
    """The kubelet's reading: exclusive CPUs and memory pinning only when Guaranteed."""
    cpu = c.requests.get("cpu", Decimal(0))
    if cpu > MAX_CPUS:
        where = member(f"{c.where}.resources.requests", "cpu")
        raise r.fail(where, f"{show(cpu)} is more than {MAX_CPUS} CPUs")
    millis = int(EXACT.multiply(cpu, Decimal(1000)).to_integral_value(ROUND_CEILING))
    whole = guaranteed and millis > 0 and millis % 1000 == 0
    memory: dict[str, int] = {}
    for resource, amount in c.requests.items() if guaranteed else ():
        where = member(f"{c.where}.resources.requests", resource)
        if resource == MEMORY and amount > 0:
            memory[MEMORY] = r.size(amount.to_integral_value(ROUND_CEILING), where)
        elif resource.startswith(HUGEPAGES) and amount > 0:
            name, size = r.hugepages(resource, amount, where, pages=False)
            if name in memory:
                raise r.fail(where, f"names the same page size as {name}")
            memory[name] = size
    cpus = (millis // 1000, 0) if whole else (0, millis)
    devices = _devices(r, c)
    return ContainerSpec(c.name, c.name, *cpus, frozen(memory), frozen(devices), c.kind)


def _devices(r: Reader, c: _PodContainer) -> dict[str, int]:
    """Extended resources named like a device class, or like one after a vendor prefix."""
    classes = r.device_classes or frozenset()
    out: dict[str, int] = {}
    origin: dict[str, str] = {}
    for resource, amount in sorted(c.limits.items()):
        cls = resource if resource in classes else resource.rpartition("/")[2]
        if resource in _NOT_DEVICES or resource.startswith(HUGEPAGES) or cls not in classes:
            continue
        where = member(f"{c.where}.resources.limits", resource)
        if not is_whole(amount) or amount > MAX_DEVICES:
            raise r.fail(where, f"{show(amount)} is not a device count")
        if cls in origin:
            raise r.fail(where, f"asks for device class {cls} again (as {origin[cls]})")
        if amount:
            out[cls], origin[cls] = int(amount), resource
    return out
