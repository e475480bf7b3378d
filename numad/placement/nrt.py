"""This host as a NodeResourceTopology object (topology.node.k8s.io/v1alpha2).

Pure core. The Kubernetes scheduler's NodeResourceTopologyMatch plugin
(kubernetes-sigs/scheduler-plugins) filters and scores nodes by these objects:
one zone per NUMA node (type ``Node``, named ``node-N``) with capacity,
allocatable and available per resource, costs to the other zones from the
kernel's distances, and the Topology Manager's policy and scope as attributes
(``topologyManagerPolicy``, ``topologyManagerScope``) and, for consumers of the
deprecated field, as ``topologyPolicies``. This is how a fleet of numad hosts
feeds an existing scheduler; publishing the object to an API server is left
to a later step (README).

Per zone: ``cpu`` counts the node's online CPUs (capacity), less the reserved
ones (allocatable), less those held exclusively (available); ``memory`` and
each ``hugepages-<size>`` are the memory manager's bytes (total, allocatable,
free); each device class counts its devices on the node (all, all, not held).
Quantities are integers, as the CRD's int-or-string allows.
"""

from __future__ import annotations

from typing import Any

from numad.cpuset import CPUSet
from numad.placement.admission import Books
from numad.placement.policy import Policy
from numad.placement.scope import Scope
from numad.topology.model import Topology

API_VERSION = "topology.node.k8s.io/v1alpha2"
ZONE_TYPE = "Node"  # the API's helper.ZoneTypeNUMANode
_DEPRECATED_POLICY = {  # topologyPolicies, by policy and scope (the API's TopologyManagerPolicy)
    (Policy.SINGLE_NUMA_NODE, Scope.CONTAINER): "SingleNUMANodeContainerLevel",
    (Policy.SINGLE_NUMA_NODE, Scope.POD): "SingleNUMANodePodLevel",
    (Policy.RESTRICTED, Scope.CONTAINER): "RestrictedContainerLevel",
    (Policy.RESTRICTED, Scope.POD): "RestrictedPodLevel",
    (Policy.BEST_EFFORT, Scope.CONTAINER): "BestEffortContainerLevel",
    (Policy.BEST_EFFORT, Scope.POD): "BestEffortPodLevel",
}


def zone_name(node: int) -> str:
    return f"node-{node}"


def nrt_object(
    hostname: str, topo: Topology, books: Books, policy: Policy, scope: Scope
) -> dict[str, Any]:
    """The NodeResourceTopology object of ``topo`` with ``books``' allocations."""
    cpu = books.cpu
    available_cpus = CPUSet.from_bits(cpu.available)
    reserved = CPUSet.from_bits(cpu.reserved)
    memory = books.memory
    used = {name: books.devices.in_use(name) for name in books.devices.inventory.classes}
    zones = []
    for node in sorted(topo.nodes, key=lambda n: n.id):
        resources = [
            _resource(
                "cpu",
                len(node.cpus),
                len(node.cpus - reserved),
                len(node.cpus & available_cpus),
            )
        ]
        for (n, name), cap in sorted(memory.table.capacity.items(), key=lambda kv: kv[0][1]):
            if n == node.id and cap.total:
                resources.append(
                    _resource(name, cap.total, cap.allocatable, memory.free(node.id, name))
                )
        for name, members in sorted(books.devices.inventory.classes.items()):
            here = [d for d in members if d.node == node.id]
            if here:
                free = sum(1 for d in here if d.address not in used[name])
                resources.append(_resource(name, len(here), len(here), free))
        costs = [
            {"name": zone_name(other), "value": int(distance)}
            for other, distance in sorted((node.distances or {}).items())
        ]
        zone: dict[str, Any] = {"name": zone_name(node.id), "type": ZONE_TYPE}
        if costs:
            zone["costs"] = costs
        zone["resources"] = resources
        zones.append(zone)
    attributes = [
        {"name": "topologyManagerPolicy", "value": str(policy)},
        {"name": "topologyManagerScope", "value": str(scope)},
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "NodeResourceTopology",
        "metadata": {"name": hostname},
        "topologyPolicies": [_DEPRECATED_POLICY.get((policy, scope), "None")],
        "attributes": attributes,
        "zones": zones,
    }


def _resource(name: str, capacity: int, allocatable: int, available: int) -> dict[str, Any]:
    return {
        "name": name,
        "capacity": capacity,
        "allocatable": allocatable,
        "available": available,
    }
