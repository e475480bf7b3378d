"""The device manager: PCI devices grouped into classes, NUMA hints, tiered allocation.

Pure core (reference/memory-device-managers.md section 2). A device's NUMA
node is its PCI ``numa_node``; -1 (``None`` in the topology model) means the
device has no node, exactly as a device plugin reporting no topology: it
never counts inside a mask and is handed out last. ``local_cpulist`` is not
used to guess a node: on machines where the firmware gives no node it
usually lists every CPU, and the kubelet-exact behaviour is what users of the
admission vectors expect.

Where numad departs from the kubelet: allocation is deterministic. Within a
tier, nodes with the most free devices of the class come first (then the
lower node id), and within a node, ascending PCI address; the kubelet takes
from an unordered set. A class that picks by locality (``Pick.LOCALITY``, the
default) then has its devices of a container moved, node for node, to the set
closest in the PCIe tree (``numad.placement.managers.locality``); ``Pick.INDEX``
keeps this order exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from numad.cpuset import CPUSet, NodeSet
from numad.errors import AllocationError, ConfigError
from numad.placement.hintspace import HintSpace, min_width
from numad.placement.managers.locality import Slot, closest, wiring
from numad.topology.model import PciDevice, Topology

Key = tuple[str, str]  # (workload, container)


class Pick(StrEnum):
    """How a class's devices are picked inside the nodes the merge chose."""

    LOCALITY = "locality"  # the set closest in the PCIe tree (then the order below)
    INDEX = "index"  # the kubelet's order: lowest index (address) first


@dataclass(frozen=True, slots=True)
class DeviceClass:
    """Devices selected by PCI ids (all given selectors must match) or listed by address."""

    name: str
    vendor: str | None = None  # "0x10de"
    device: str | None = None
    class_prefix: str | None = None  # "0x0302": the start of the PCI class code
    driver: str | None = None
    addresses: tuple[str, ...] = ()
    pick: Pick = Pick.LOCALITY

    def described(self) -> str:
        """The selectors as the config gives them: "vendor 0x1bcf, class-prefix 0x0b40"."""
        if self.addresses:
            return "addresses " + ", ".join(self.addresses)
        given = (
            ("vendor", self.vendor),
            ("device", self.device),
            ("class-prefix", self.class_prefix),
            ("driver", self.driver),
        )
        return ", ".join(f"{k} {v}" for k, v in given if v is not None)

    def matches(self, d: PciDevice) -> bool:
        if self.addresses:
            return d.address in self.addresses
        if not any((self.vendor, self.device, self.class_prefix, self.driver)):
            return False
        return (
            (self.vendor is None or d.vendor == self.vendor.lower())
            and (self.device is None or d.device == self.device.lower())
            and (
                self.class_prefix is None
                or (d.pci_class or "").startswith(self.class_prefix.lower())
            )
            and (self.driver is None or d.driver == self.driver)
        )


@dataclass(frozen=True, slots=True)
class Device:
    address: str
    node: int | None
    path: tuple[str, ...] = ()  # its place in the PCIe tree (PciDevice.path)
    local_cpus: CPUSet | None = None  # PciDevice.local_cpus


@dataclass(frozen=True, slots=True)
class DeviceInventory:
    """Every class's devices, in ascending address order."""

    nodes: tuple[int, ...]  # every NUMA node of the machine: the masks' universe
    classes: Mapping[str, tuple[Device, ...]]
    picks: Mapping[str, Pick] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def build(cls, topo: Topology, classes: Sequence[DeviceClass]) -> DeviceInventory:
        found: dict[str, tuple[Device, ...]] = {}
        owner: dict[str, str] = {}
        for c in classes:
            members = sorted(d.address for d in topo.pci_devices if c.matches(d))
            for address in c.addresses:
                if address not in {d.address for d in topo.pci_devices}:
                    raise ConfigError(
                        f"device class {c.name}", f"no PCI device {address} on this machine"
                    )
            for address in members:
                if address in owner:
                    raise ConfigError(
                        f"device class {c.name}",
                        f"device {address} is already in class {owner[address]}",
                        "make the selectors of the two classes disjoint",
                    )
                owner[address] = c.name
            by_address = {d.address: d for d in topo.pci_devices}
            found[c.name] = tuple(
                Device(a, by_address[a].numa_node, by_address[a].path, by_address[a].local_cpus)
                for a in members
            )
        return cls(
            tuple(n.id for n in topo.nodes),
            MappingProxyType(found),
            MappingProxyType({c.name: c.pick for c in classes}),
        )


@dataclass(frozen=True, slots=True)
class DeviceState:
    inventory: DeviceInventory
    held: Mapping[Key, Mapping[str, tuple[str, ...]]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def in_use(self, name: str) -> set[str]:
        return {a for per_class in self.held.values() for a in per_class.get(name, ())}

    def free(self, name: str) -> tuple[Device, ...]:
        used = self.in_use(name)
        return tuple(d for d in self._devices(name) if d.address not in used)

    def _devices(self, name: str) -> tuple[Device, ...]:
        try:
            return self.inventory.classes[name]
        except KeyError:
            known = ", ".join(sorted(self.inventory.classes)) or "none configured"
            raise ConfigError(
                f"device class {name}", "no such class", f"known classes: {known}"
            ) from None

    # -- hints (reference 2.2) -------------------------------------------------------------

    def hints(
        self, key: Key, name: str, count: int, reuse_from: Sequence[Key] = ()
    ) -> HintSpace | tuple[()] | None:
        """The kubelet's device hints (reference 2.2), described. ``reuse_from``: the
        workload's finished init containers, whose devices this container may take
        over: a mask must hold every one of them that has a node, and they count
        toward the request."""
        devices = self._devices(name)
        if count <= 0 or all(d.node is None for d in devices):
            return None  # the class has no topology: no preference
        held = self.held.get(key, {}).get(name)
        reusable: tuple[Device, ...] = ()
        if held is not None:
            if len(held) != count:
                return ()
            pool = tuple(d for d in devices if d.address in held)
        else:
            pool = self.free(name)
            theirs = {a for donor in reuse_from for a in self.held.get(donor, {}).get(name, ())}
            reusable = tuple(d for d in devices if d.address in theirs)
            if len(pool) + len(reusable) < count:
                return ()
        ids = list(self.inventory.nodes)
        size = max(ids, default=0) + 1
        total, usable = [0] * size, [0] * size
        for d in devices:
            if d.node is not None and d.node in ids:
                total[d.node] += 1
        for d in pool:
            if d.node is not None and d.node in ids:
                usable[d.node] += 1
        must = sum(1 << n for n in {d.node for d in reusable if d.node is not None})
        placed = len([d for d in reusable if d.node is not None])  # the kubelet skips the rest
        nodes = sum(1 << n for n in ids)
        return HintSpace(
            nodes,
            (tuple(usable),),
            (count - placed,),
            min_width((tuple(total),), (count,), nodes),
            must=must,
        )

    # -- allocation (reference 2.3, made deterministic) ---------------------------------------

    def order(self, name: str, affinity: NodeSet | None) -> list[Device]:
        """Free devices in the order they are handed out: aligned, unaligned, no node."""
        free = self.free(name)
        counts: dict[int, int] = {}
        for d in free:
            if d.node is not None:
                counts[d.node] = counts.get(d.node, 0) + 1

        def tier(d: Device) -> tuple[int, int, int, str]:
            if d.node is None or affinity is None:
                return (2, 0, 0, d.address)
            aligned = 0 if d.node in affinity else 1
            return (aligned, -counts[d.node], d.node, d.address)

        return sorted(free, key=tier)

    def allocate(
        self,
        key: Key,
        request: Mapping[str, int],
        affinity: NodeSet | None,
        reuse_from: Sequence[Key] = (),
    ) -> DeviceState:
        """Devices for one container. Tiers: devices held by ``reuse_from`` (finished init
        containers of the same workload, moved over), aligned, unaligned, no node."""
        held = {k: dict(v) for k, v in self.held.items()}
        mine = held.setdefault(key, {})
        subject = f"{key[0]}/{key[1]}"
        fresh: set[str] = set()  # the classes allocated here, by the kubelet's order
        reused: set[str] = set()  # devices moved over from finished init containers
        for name, count in sorted(request.items()):
            if count <= 0 or name in mine:
                continue
            fresh.add(name)
            taken: list[str] = []
            for donor in reuse_from:
                if donor[0] != key[0] or donor == key:
                    raise AllocationError(subject, f"cannot reuse devices of {donor[0]}/{donor[1]}")
                theirs = list(held.get(donor, {}).get(name, ()))
                while theirs and len(taken) < count:
                    taken.append(theirs.pop(0))
                if donor in held and name in held[donor]:
                    held[donor][name] = tuple(theirs)
            order = [d.address for d in self.order(name, affinity)]
            if len(taken) + len(order) < count:
                raise AllocationError(
                    subject,
                    f"requested number of devices unavailable for {name}. "
                    f"Requested: {count}, Available: {len(taken) + len(order)}",
                )
            mine[name] = tuple(taken + order[: count - len(taken)])
            reused.update(taken)
        mine.update(self._closer(mine, fresh, reused))
        frozen = {
            k: MappingProxyType({n: a for n, a in v.items() if a})
            for k, v in held.items()
            if any(v.values())
        }
        return DeviceState(self.inventory, MappingProxyType(frozen))

    def _closer(
        self, mine: Mapping[str, tuple[str, ...]], fresh: set[str], reused: set[str]
    ) -> dict[str, tuple[str, ...]]:
        """The fresh picks of locality classes moved, node for node, to the closest set
        in the PCIe tree (``locality.closest``); the other devices stay as they are."""
        by_address = {d.address: d for ds in self.inventory.classes.values() for d in ds}
        need: dict[Slot, int] = {}
        fixed: list[tuple[str, ...]] = []
        for name, addresses in mine.items():
            movable = (
                name in fresh and self.inventory.picks.get(name, Pick.LOCALITY) == Pick.LOCALITY
            )
            for a in addresses:
                node = by_address[a].node
                if movable and a not in reused and node is not None:
                    need[(name, node)] = need.get((name, node), 0) + 1
                else:
                    fixed.append(by_address[a].path)
        if not need or sum(need.values()) + len(fixed) < 2:
            return {}
        candidates = {
            slot: [(d.address, d.path) for d in self.free(slot[0]) if d.node == slot[1]]
            for slot in need
        }
        chosen = closest(need, candidates, fixed)
        if chosen is None:
            return {}
        out: dict[str, tuple[str, ...]] = {}
        for name in {slot[0] for slot in need}:
            queues = {slot: list(chosen[slot]) for slot in chosen if slot[0] == name}
            moved = []
            for a in mine[name]:  # each fresh pick on a node gives way to its slot's next
                node = by_address[a].node
                if a in reused or node is None:
                    moved.append(a)
                else:
                    moved.append(queues[(name, node)].pop(0))
            out[name] = tuple(moved)
        return out

    def near(self, key: Key) -> int:
        """The CPUs local to ``key``'s devices of locality classes (their
        ``local_cpulist``), as a mask, from devices whose place in the PCIe tree is known
        (recordings without the tree, and conformance vectors, keep the kubelet's CPUs);
        0 where none is known."""
        mask = 0
        for name, addresses in self.held.get(key, {}).items():
            if self.inventory.picks.get(name, Pick.LOCALITY) != Pick.LOCALITY:
                continue
            for d in self._devices(name):
                if d.address in addresses and d.path and d.local_cpus is not None:
                    mask |= d.local_cpus.bits
        return mask

    def located(self, key: Key) -> tuple[tuple[str, Device], ...]:
        """``key``'s devices that have a NUMA node, as (class, device), by node, class
        and address: the order of its aligned pairs (numad.placement.groups)."""
        held = self.held.get(key, {})
        found = [
            (name, d)
            for name, addresses in held.items()
            for d in self.inventory.classes.get(name, ())
            if d.address in addresses and d.node is not None
        ]
        return tuple(sorted(found, key=lambda nd: (nd[1].node or 0, nd[0], nd[1].address)))

    def wiring(self, devices: Mapping[str, tuple[str, ...]]) -> str:
        """What ``devices`` (class -> addresses, one container's) share in the PCIe tree,
        in words (``locality.wiring``); empty for fewer than two devices."""
        by_address = {d.address: d for ds in self.inventory.classes.values() for d in ds}
        return wiring(
            [
                (name, a, by_address[a].path, by_address[a].node)
                for name, addresses in sorted(devices.items())
                for a in addresses
                if a in by_address
            ]
        )

    def release(self, workload: str, container: str | None = None) -> DeviceState:
        kept = {
            k: v
            for k, v in self.held.items()
            if not (k[0] == workload and container in (None, k[1]))
        }
        return DeviceState(self.inventory, MappingProxyType(kept))
