"""Restore and rediscovery: numad's decisions carried across a restart or a hotplug.

Daemon side, pure apart from discovery (``rediscovered`` reads the machine
again). A recorded workload is put back exactly where it was when that is
still valid. When it is not (a CPU went offline while numad was stopped, the
config reserved one of its CPUs, a device left), its lost CPUs are replaced by
free CPUs of the same NUMA nodes, the rule hotplug follows; when that fails
too, the workload stays admitted but *unplaced*: it holds nothing, its cgroups
follow the shared pool, and the daemon admits it again once it fits. Nothing
admitted is dropped, and nothing it held is handed out while its cgroups
still run there (DESIGN invariant 8).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from numad.cpuset import CPUSet, NodeSet
from numad.daemon import state
from numad.daemon.config import Config
from numad.errors import AllocationError, NumadError
from numad.hostfs import HostFS
from numad.placement.admission import Books, Engine
from numad.placement.managers.cpu.state import CPUState
from numad.placement.managers.cpu.static import StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology
from numad.placement.managers.device import DeviceInventory, DeviceState
from numad.placement.managers.memory import MemoryTable
from numad.placement.policy import Machine
from numad.topology.discover import discover
from numad.topology.model import Topology
from numad.workload.shape import WorkloadSpec


def reserved_setting(config: Config) -> str:
    """The config setting the reserved CPUs come from, as the checkpoint keeps it."""
    if config.reserved_cpus is not None:
        return f"cpus={CPUSet.parse_list(config.reserved_cpus).format_list()}"
    return f"count={config.reserved_count}"


def choose_reserved(
    config: Config, policy: StaticPolicy, recorded: state.Checkpoint | None
) -> tuple[int, str | None]:
    """The reserved CPUs (offline ones included) and, when they changed, why. The
    CPUs chosen at first start are kept while the config's setting stays the same,
    across restarts and hotplug; a changed setting chooses anew."""
    setting = reserved_setting(config)
    if recorded is not None and recorded.reserved_from in ("", setting):
        return CPUSet.parse_list(recorded.reserved).bits, None
    explicit = config.reserved_cpus
    count = len(CPUSet.parse_list(explicit)) if explicit else config.reserved_count
    chosen = policy.reserve(count, None if explicit is None else CPUSet.parse_list(explicit).bits)
    if recorded is None:
        return chosen, None
    was = f"{recorded.reserved} ({recorded.reserved_from})"
    now = f"{CPUSet.from_bits(chosen).format_list()} ({setting})"
    return chosen, f"reserved cpus changed by the config: {was} -> {now}"


def place_exact(books: Books, name: str, record: state.Record, wanted: Mapping[str, int]) -> Books:
    """Put a recorded workload back exactly where it was; AllocationError if that
    is no longer valid (or a container holds fewer CPUs than it asks for: one
    flagged by hotplug before the restart)."""
    cpu = books.cpu
    assignments = dict(cpu.assignments)
    for container, listed in record.cpus.items():
        cpus = CPUSet.parse_list(listed).bits
        if cpus & ~cpu.online or cpus & cpu.reserved or cpus & cpu.exclusive:
            raise AllocationError(
                f"{name}/{container}", f"recorded cpus {listed} are no longer free and online"
            )
        if cpus.bit_count() < wanted.get(container, 0):
            raise AllocationError(f"{name}/{container}", f"holds {listed}: too few cpus")
        assignments[(name, container)] = cpus
    return _with_memory_and_devices(books, name, record, assignments)


def place_repaired(
    books: Books,
    name: str,
    record: state.Record,
    wanted: Mapping[str, int],
    *,
    policy: StaticPolicy,
    topology: Topology,
) -> tuple[Books, list[str]]:
    """Put a recorded workload back, replacing each CPU that is offline, reserved
    or taken (and any it was short of) by a free CPU of the NUMA nodes its other
    CPUs are on, never of another node. AllocationError when that cannot be done."""
    cpu = books.cpu
    assignments = dict(cpu.assignments)
    notes = []
    for container, listed in record.cpus.items():
        where = f"{name}/{container}"
        cpus = CPUSet.parse_list(listed).bits
        valid = cpus & cpu.online & ~cpu.reserved & ~cpu.exclusive
        lost, need = cpus & ~valid, wanted.get(container, 0) - valid.bit_count()
        if need > 0:
            nodes = NodeSet(n.id for n in topology.nodes if n.cpus.bits & valid)
            if not nodes:
                raise AllocationError(where, f"none of its recorded cpus {listed} is usable")
            taken = _bits(assignments) | valid  # other containers', and its own kept CPUs
            local = cpu.available & ~taken & policy.topo.numa_mask(nodes)
            extra = policy.allocate(local, need, nodes, reserved=cpu.reserved)
            lost_text, new = CPUSet.from_bits(lost).format_list() or "none", CPUSet.from_bits(extra)
            notes.append(f"{where}: cpus {lost_text} no longer usable; given {new}")
            cpus = valid | extra
        assignments[(name, container)] = cpus
    return _with_memory_and_devices(books, name, record, assignments), notes


def _bits(assignments: Mapping[tuple[str, str], int]) -> int:
    union = 0
    for cpus in assignments.values():
        union |= cpus
    return union


def _with_memory_and_devices(
    books: Books, name: str, record: state.Record, assignments: Mapping[tuple[str, str], int]
) -> Books:
    blocks = dict(books.memory.blocks)
    for container, raw in record.memory.items():
        blocks[(name, container)] = state.restore_blocks(raw)
    held = dict(books.devices.held)
    for container, per_class in record.devices.items():
        for cls, addresses in per_class.items():
            known = {d.address for d in books.devices.inventory.classes.get(cls, ())}
            if not set(addresses) <= known - books.devices.in_use(cls):
                raise AllocationError(
                    f"{name}/{container}", f"recorded {cls} devices are gone or taken"
                )
        held[(name, container)] = {k: tuple(v) for k, v in per_class.items()}
    cpu = replace(books.cpu, assignments=MappingProxyType(dict(assignments)))
    restored = Books(
        cpu, replace(books.memory, blocks=blocks), DeviceState(books.devices.inventory, held)
    )
    if not restored.cpu.shared_pool:
        raise AllocationError(name, "its cpus would leave the shared pool empty")
    if restored.memory.conflicts():
        raise AllocationError(name, "; ".join(restored.memory.conflicts()))
    return restored


def restore(
    books: Books, spec: WorkloadSpec, record: state.Record, policy: StaticPolicy, topology: Topology
) -> tuple[Books, str]:
    """The books with ``spec`` put back: exactly, repaired, or not at all. The text
    says what happened ("" when restored exactly; "unplaced: why" when it holds
    nothing now)."""
    if record.unplaced:
        return books, f"unplaced: {record.unplaced}"
    name, wanted = spec.name, {c.name: c.exclusive_cpus for c in spec.containers}
    try:
        return place_exact(books, name, record, wanted), ""
    except NumadError:
        pass
    try:
        repaired, notes = place_repaired(
            books, name, record, wanted, policy=policy, topology=topology
        )
    except NumadError as err:
        return books, f"unplaced: {err}"
    return repaired, "; ".join(notes)


@dataclass(frozen=True, slots=True)
class Rediscovered:
    topology: Topology
    policy: StaticPolicy
    engine: Engine
    books: Books
    changes: tuple[str, ...]
    flagged: tuple[str, ...]
    whole: tuple[str, ...] = ()  # containers ("workload/container") short before, whole now


def rediscovered(
    fs: HostFS,
    config: Config,
    engine: Engine,
    books: Books,
    *,
    old: Topology,
    reserved: int,
    wanted: Mapping[tuple[str, str], int] | None = None,
) -> Rediscovered:
    """The machine read again after hotplug, with every decision that still holds
    kept. A CPU that went offline under an exclusive set is replaced by a free CPU
    of the same NUMA nodes, or the container keeps the rest and is flagged; a
    container that holds fewer than it asks (``wanted``: exclusive CPUs per
    container) is given the rest there once it can; CPUs and nodes that appear join
    the pool and the merge; a held device that left is dropped from its container
    and flagged. Reserved CPUs stay reserved, also those that went offline and came
    back."""
    wanted = wanted or {}
    topo = discover(HostFS(fs.root))
    view = CPUTopology.from_topology(topo)
    policy = StaticPolicy(view, engine.cpu_policy.options)
    gone = books.cpu.online & ~view.all
    cpu = CPUState(
        view.all,
        reserved & view.all,
        books.cpu.strict,
        MappingProxyType({k: v & view.all for k, v in books.cpu.assignments.items()}),
    )
    inventory = DeviceInventory.build(topo, config.device_classes)
    present = {d.address for devices in inventory.classes.values() for d in devices}
    changes: list[str] = []
    whole: list[str] = []
    held = {}
    for key, per_class in books.devices.held.items():
        kept = {c: tuple(a for a in addrs if a in present) for c, addrs in per_class.items()}
        for c, addrs in per_class.items():
            for a in sorted(set(addrs) - set(kept[c])):
                changes.append(f"{key[0]}/{key[1]}: device {a} ({c}) left; flagged")
        held[key] = kept
    table = MemoryTable.build(topo, config.memory_reserved)
    new = Books(cpu, replace(books.memory, table=table), DeviceState(inventory, held))
    for key, before in sorted(books.cpu.assignments.items()):
        if before & gone:
            nodes = NodeSet(n.id for n in old.nodes if n.cpus.bits & before)
            new, change = _reassign(new, policy, key, before=before, nodes=nodes)
            changes.append(change)
        elif before and wanted.get(key, 0) > before.bit_count():  # flagged short before
            new, change = _top_up(new, policy, key, wanted[key] - before.bit_count(), topo)
            if change:
                changes.append(change)
                whole.append(f"{key[0]}/{key[1]}")
    changes += [f"memory: {c}" for c in new.memory.conflicts()]
    machine = Machine(topo.node_ids, distances(topo))
    engine = replace(engine, machine=machine, cpu_policy=policy)
    flagged = tuple(c for c in changes if "flagged" in c or c.startswith("memory"))
    return Rediscovered(topo, policy, engine, new, tuple(changes), flagged, tuple(whole))


def _reassign(
    books: Books, policy: StaticPolicy, key: tuple[str, str], *, before: int, nodes: NodeSet
) -> tuple[Books, str]:
    """Replace the ``lost`` CPUs of an exclusive set by free CPUs of the NUMA nodes
    the set was on, never elsewhere: moving a container off its node silently
    would break its alignment. With none free there (``_free_near``), the container
    is flagged."""
    where = f"{key[0]}/{key[1]}"
    lost = before & ~books.cpu.online
    lost_text = CPUSet.from_bits(lost).format_list()
    extra, short = _free_near(books, policy, lost.bit_count(), nodes)
    if not extra:
        return (
            books,
            f"{where}: cpus {lost_text} went offline; none free to replace them{short}; flagged",
        )
    replaced = CPUSet.from_bits(extra).format_list()
    books = _given(books, key, (before & ~lost) | extra)
    return books, f"{where}: cpus {lost_text} went offline; reassigned {replaced}"


def _top_up(
    books: Books, policy: StaticPolicy, key: tuple[str, str], need: int, topo: Topology
) -> tuple[Books, str]:
    """A container short of ``need`` CPUs (flagged when they went offline) given free
    CPUs of the NUMA nodes its others are on, once there are (``_free_near``); ""
    while there are not."""
    have = books.cpu.assignments[key]
    nodes = NodeSet(n.id for n in topo.nodes if n.cpus.bits & have)
    extra, _ = _free_near(books, policy, need, nodes)
    if not extra:
        return books, ""
    given = CPUSet.from_bits(extra).format_list()
    change = f"{key[0]}/{key[1]}: short of {need} cpus; given {given}"
    return _given(books, key, have | extra), change


def _free_near(books: Books, policy: StaticPolicy, count: int, nodes: NodeSet) -> tuple[int, str]:
    """``count`` free CPUs of ``nodes`` as the policy picks them, and ""; else 0 and
    why not: none free there, or only the shared pool's last (every cgroup that is no
    workload's runs there: the rule an admission keeps)."""
    local = books.cpu.available & policy.topo.numa_mask(nodes)
    try:
        extra = policy.allocate(local, count, nodes, reserved=books.cpu.reserved)
    except NumadError:
        return 0, ""
    if not books.cpu.shared_pool & ~extra:
        return 0, " (but the shared pool's last)"
    return extra, ""


def _given(books: Books, key: tuple[str, str], cpus: int) -> Books:
    assignments = {**books.cpu.assignments, key: cpus}
    return replace(books, cpu=replace(books.cpu, assignments=MappingProxyType(assignments)))


def distances(topo: Topology) -> Mapping[int, Mapping[int, int]] | None:
    if any(n.distances is None for n in topo.nodes):
        return None
    return {n.id: dict(n.distances or {}) for n in topo.nodes}
