"""The device manager: classes, NUMA hints, tiered deterministic allocation, reuse, release.

Table-driven tests over recorded machines and a small hand-built one, then
Hypothesis properties over random machines and random allocate/release runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from numad.cpuset import CPUSet, NodeSet
from numad.errors import AllocationError, ConfigError
from numad.placement.hints import Hint
from numad.placement.hintspace import HintSpace, listed
from numad.placement.managers.device import DeviceClass, DeviceInventory, DeviceState, Key
from numad.topology.model import NumaNode, PciDevice, Topology

INTEL = "32intel64-2p8co2t+8ve"  # 2 nodes; every PCI device on node 0
VES = [
    "0000:1b:00.0", "0000:1c:00.0", "0000:1d:00.0", "0000:1e:00.0",
    "0000:3d:00.0", "0000:3f:00.0", "0000:40:00.0", "0000:41:00.0",
]  # fmt: skip
MLX = ["0000:1a:00.0", "0000:3e:00.0"]
VIRTIO = ["0000:00:01.0", "0000:00:02.0", "0000:00:03.0", "0000:00:04.0", "0000:00:05.0"]
KEY: Key = ("w", "c")
Masks = list[tuple[tuple[int, ...], bool]]


def _topology(nodes: int, devices: list[tuple[str, int | None]]) -> Topology:
    """A machine reduced to what the device manager reads: node ids and GPUs (vendor 0x10de)."""
    numa = tuple(NumaNode(n, CPUSet([n])) for n in range(nodes))
    pci = tuple(PciDevice(a, node, "0x10de", "0x2330", "0x030200", "nvidia") for a, node in devices)
    return Topology(all_cpus=(), nodes=numa, packages=(), cores=(), l3_groups=(), pci_devices=pci)


# Three nodes; node 0 has 2 GPUs, node 1 has 3, node 2 has 2 (with the lowest addresses of
# the nodes), and 2 have no node (-1), one of them with the lowest address of all.
GPUS: list[tuple[str, int | None]] = [
    ("0000:00:01.0", None),
    ("0000:10:00.0", 2),
    ("0000:11:00.0", 2),
    ("0000:20:00.0", 0),
    ("0000:21:00.0", 1),
    ("0000:22:00.0", 0),
    ("0000:23:00.0", 1),
    ("0000:24:00.0", 1),
    ("0000:30:00.0", None),
]
ADDRESSES = tuple(a for a, _ in GPUS)
GPU = DeviceClass("gpu", vendor="0x10de")


def _gpus(devices: list[tuple[str, int | None]] = GPUS, nodes: int = 3) -> DeviceState:
    return DeviceState(DeviceInventory.build(_topology(nodes, devices), [GPU]))


def _masks(hints: HintSpace | tuple[Hint, ...] | None) -> Masks | None:
    hints = listed(hints)
    if hints is None:
        return None
    return [(tuple(h.affinity or ()), h.preferred) for h in hints]


def _take(state: DeviceState, held: list[str], key: Key = ("other", "c")) -> DeviceState:
    """``held`` given to another container, as if allocated earlier."""
    if not held:
        return state
    return replace(state, held={**state.held, key: {"gpu": tuple(held)}})


# -- classes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cls", "expected"),
    [
        pytest.param(INTEL, DeviceClass("x", class_prefix="0x0b40"), VES, id="class-prefix"),
        pytest.param(INTEL, DeviceClass("x", vendor="0x15b3"), MLX, id="vendor"),
        pytest.param(INTEL, DeviceClass("x", vendor="0x15B3"), MLX, id="vendor-any-case"),
        pytest.param(
            INTEL,
            DeviceClass("x", vendor="0x8086", device="0x37d2"),
            ["0000:60:00.0", "0000:60:00.1"],
            id="vendor-and-device",
        ),
        pytest.param(INTEL, DeviceClass("x", driver="ve_drv"), VES, id="driver"),
        pytest.param(
            INTEL, DeviceClass("x", vendor="0x15b3", driver="ve_drv"), [], id="all-must-match"
        ),
        pytest.param(INTEL, DeviceClass("x", class_prefix="0x02"),
                     [*MLX, "0000:60:00.0", "0000:60:00.1"], id="class-prefix-network"),
        pytest.param(INTEL, DeviceClass("x"), [], id="no-selector-selects-nothing"),
        pytest.param(
            INTEL,
            DeviceClass("x", vendor="0x15b3", addresses=("0000:41:00.0", "0000:17:00.0")),
            ["0000:17:00.0", "0000:41:00.0"],
            id="addresses-win-and-are-sorted",
        ),
        pytest.param("devmachine-2c1n", DeviceClass("x", vendor="0x1af4"), VIRTIO, id="virtio"),
        pytest.param(
            "devmachine-2c1n", DeviceClass("x", class_prefix="0xffff"),
            ["0000:00:01.0", "0000:00:04.0", "0000:00:05.0"], id="virtio-class",
        ),
    ],
)  # fmt: skip
def test_class_selectors(
    recorded: Callable[[str], Topology], name: str, cls: DeviceClass, expected: list[str]
) -> None:
    inventory = DeviceInventory.build(recorded(name), [cls])
    assert [d.address for d in inventory.classes["x"]] == expected
    topo = recorded(name)
    assert inventory.nodes == tuple(n.id for n in topo.nodes)
    nodes = {d.address: d.numa_node for d in topo.pci_devices}
    assert all(d.node == nodes[d.address] for d in inventory.classes["x"])


def test_pcie_bridges_by_driver_and_vendor(recorded: Callable[[str], Topology]) -> None:
    classes = [
        DeviceClass("plx", vendor="0x10b5", class_prefix="0x0604"),
        DeviceClass("ports", driver="pcieport", vendor="0x8086"),
    ]
    inventory = DeviceInventory.build(recorded(INTEL), classes)
    assert len(inventory.classes["plx"]) == 12
    assert [d.address for d in inventory.classes["ports"]] == [
        "0000:17:00.0", "0000:3a:00.0", "0000:5d:02.0", "0000:5e:00.0",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        pytest.param(
            [DeviceClass("ve", addresses=("0000:1b:00.0", "0000:ff:00.0"))],
            "device class ve: no PCI device 0000:ff:00.0 on this machine",
            id="unknown-address",
        ),
        pytest.param(
            [DeviceClass("nic", vendor="0x15b3"), DeviceClass("nic2", class_prefix="0x0207")],
            "device class nic2: device 0000:1a:00.0 is already in class nic; "
            "make the selectors of the two classes disjoint",
            id="device-in-two-classes",
        ),
        pytest.param(
            [DeviceClass("ve", driver="ve_drv"), DeviceClass("one", addresses=("0000:41:00.0",))],
            "device class one: device 0000:41:00.0 is already in class ve; "
            "make the selectors of the two classes disjoint",
            id="listed-device-in-a-selected-class",
        ),
    ],
)
def test_class_errors(
    recorded: Callable[[str], Topology], classes: list[DeviceClass], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        DeviceInventory.build(recorded(INTEL), classes)
    assert str(caught.value) == message
    assert caught.value.subject == f"device class {classes[-1].name}"


def test_unknown_class_is_named() -> None:
    state = _gpus()
    message = "device class tpu: no such class; known classes: gpu"
    with pytest.raises(ConfigError, match=message):
        state.hints(KEY, "tpu", 1)
    with pytest.raises(ConfigError, match=message):
        state.allocate(KEY, {"tpu": 1}, None)


# -- hints ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cls", "count", "expected"),
    [
        pytest.param(INTEL, DeviceClass("x", class_prefix="0x0b40"), 3,
                     [((0,), True), ((0, 1), False)], id="ves-on-node-0"),
        pytest.param(INTEL, DeviceClass("x", class_prefix="0x0b40"), 8,
                     [((0,), True), ((0, 1), False)], id="all-8-ves"),
        pytest.param(INTEL, DeviceClass("x", class_prefix="0x0b40"), 9, [], id="too-many"),
        pytest.param(INTEL, DeviceClass("x", class_prefix="0x0b40"), 0, None, id="zero"),
        pytest.param(INTEL, DeviceClass("x", driver="nothing"), 1, None, id="empty-class"),
        pytest.param("devmachine-2c1n", DeviceClass("x", vendor="0x1af4"), 2, None,
                     id="all-numa-node-minus-1"),
    ],
)  # fmt: skip
def test_hints_on_recorded_machines(
    recorded: Callable[[str], Topology],
    name: str,
    cls: DeviceClass,
    count: int,
    expected: Masks | None,
) -> None:
    state = DeviceState(DeviceInventory.build(recorded(name), [cls]))
    assert _masks(state.hints(KEY, "x", count)) == expected


@pytest.mark.parametrize(
    ("busy", "count", "expected"),
    [
        pytest.param([], 2, [((0,), True), ((1,), True), ((2,), True), ((0, 1), False),
                             ((0, 2), False), ((1, 2), False), ((0, 1, 2), False)], id="two"),
        pytest.param([], 3, [((1,), True), ((0, 1), False), ((0, 2), False), ((1, 2), False),
                             ((0, 1, 2), False)], id="three-fit-node-1-only"),
        pytest.param([], 5, [((0, 1), True), ((1, 2), True), ((0, 1, 2), False)], id="five"),
        # 9 free, but only 7 have a node: no mask holds 8.
        pytest.param([], 8, [], id="no-node-devices-count-in-no-mask"),
        pytest.param([], 10, [], id="more-than-the-class"),
        # Node 1 has 2 of its 3 left: 3 still fit one node by total count, so only wider
        # hints remain and none is preferred.
        pytest.param(["0000:21:00.0"], 3, [((0, 1), False), ((0, 2), False), ((1, 2), False),
                                           ((0, 1, 2), False)], id="busy-node-loses-preferred"),
        pytest.param(["0000:20:00.0", "0000:22:00.0"], 2,
                     [((1,), True), ((2,), True), ((0, 1), False), ((0, 2), False),
                      ((1, 2), False), ((0, 1, 2), False)], id="node-0-busy"),
        # 7 free, 5 of them on a node: 6 fit the free count but no mask.
        pytest.param(["0000:21:00.0", "0000:22:00.0"], 5, [((0, 1, 2), False)], id="five-left"),
        pytest.param(["0000:21:00.0", "0000:22:00.0"], 6, [], id="free-but-not-in-a-mask"),
        pytest.param(["0000:20:00.0", "0000:21:00.0", "0000:22:00.0", "0000:23:00.0",
                      "0000:24:00.0", "0000:10:00.0", "0000:11:00.0"], 2, [],
                     id="only-no-node-devices-free"),
        pytest.param(list(ADDRESSES[:8]), 2, [], id="fewer-free-than-asked"),
    ],
)  # fmt: skip
def test_hints(busy: list[str], count: int, expected: Masks) -> None:
    assert _masks(_take(_gpus(), busy).hints(KEY, "gpu", count)) == expected


def test_hints_of_a_container_that_holds_devices() -> None:
    state = _take(_gpus(), ["0000:20:00.0", "0000:21:00.0"], KEY)
    state = _take(state, ["0000:22:00.0", "0000:10:00.0", "0000:11:00.0"])
    # From its own devices, even though no others are free on their nodes.
    expected = [((0, 1), False), ((0, 1, 2), False)]
    assert _masks(state.hints(KEY, "gpu", 2)) == expected
    assert _masks(state.hints(KEY, "gpu", 3)) == []  # another count than held
    assert _masks(state.hints(("x", "y"), "gpu", 2)) == [
        ((1,), True), ((0, 1), False), ((1, 2), False), ((0, 1, 2), False),
    ]  # fmt: skip


# -- allocation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("busy", "affinity", "order"),
    [
        # No affinity: one tier, by address.
        pytest.param([], None, list(ADDRESSES), id="no-affinity"),
        # Nodes 0 and 2 tie at 2 free devices: the lower node first.
        pytest.param([], (0, 2), ["0000:20:00.0", "0000:22:00.0", "0000:10:00.0", "0000:11:00.0",
                                  "0000:21:00.0", "0000:23:00.0", "0000:24:00.0",
                                  "0000:00:01.0", "0000:30:00.0"], id="aligned-tie-lower-node"),
        pytest.param([], (1,), ["0000:21:00.0", "0000:23:00.0", "0000:24:00.0",
                                "0000:20:00.0", "0000:22:00.0", "0000:10:00.0", "0000:11:00.0",
                                "0000:00:01.0", "0000:30:00.0"], id="aligned-then-unaligned"),
        pytest.param([], (0, 1, 2), ["0000:21:00.0", "0000:23:00.0", "0000:24:00.0",
                                     "0000:20:00.0", "0000:22:00.0", "0000:10:00.0",
                                     "0000:11:00.0", "0000:00:01.0", "0000:30:00.0"],
                     id="most-free-node-first"),
        # Node 1 has one left: nodes 0 and 2 (two each) come before it.
        pytest.param(["0000:21:00.0", "0000:23:00.0"], (0, 1, 2),
                     ["0000:20:00.0", "0000:22:00.0", "0000:10:00.0", "0000:11:00.0",
                      "0000:24:00.0", "0000:00:01.0", "0000:30:00.0"], id="counts-are-free"),
        pytest.param(["0000:10:00.0"], (0,),
                     ["0000:20:00.0", "0000:22:00.0", "0000:21:00.0", "0000:23:00.0",
                      "0000:24:00.0", "0000:11:00.0", "0000:00:01.0", "0000:30:00.0"],
                     id="unaligned-most-free-first"),
    ],
)  # fmt: skip
def test_allocation_order(
    busy: list[str], affinity: tuple[int, ...] | None, order: list[str]
) -> None:
    state = _take(_gpus(), busy)
    mask = None if affinity is None else NodeSet(affinity)
    assert [d.address for d in state.order("gpu", mask)] == order
    for count in range(1, len(order) + 1):
        placed = state.allocate(KEY, {"gpu": count}, mask)
        assert placed.held[KEY]["gpu"] == tuple(order[:count])
        assert placed.allocate(KEY, {"gpu": count}, mask) == placed  # already held: kept
        assert state.allocate(KEY, {"gpu": count}, mask) == placed  # deterministic


def test_recorded_machine_allocation(recorded: Callable[[str], Topology]) -> None:
    classes = [DeviceClass("ve", class_prefix="0x0b40"), DeviceClass("nic", vendor="0x15b3")]
    state = DeviceState(DeviceInventory.build(recorded(INTEL), classes))
    placed = state.allocate(KEY, {"ve": 3, "nic": 1}, NodeSet([0]))
    assert dict(placed.held[KEY]) == {"ve": tuple(VES[:3]), "nic": (MLX[0],)}
    placed = placed.allocate(("w", "d"), {"ve": 5}, NodeSet([1]))  # unaligned tier
    assert placed.held[("w", "d")]["ve"] == tuple(VES[3:])
    assert placed.free("ve") == ()
    assert _masks(placed.hints(("x", "y"), "ve", 1)) == []
    virtio = DeviceClass("v", vendor="0x1af4")
    vm = DeviceState(DeviceInventory.build(recorded("devmachine-2c1n"), [virtio]))
    assert vm.allocate(KEY, {"v": 2}, NodeSet([0])).held[KEY]["v"] == tuple(VIRTIO[:2])


@pytest.mark.parametrize(
    ("busy", "count", "message"),
    [
        pytest.param([], 10, "w/c: requested number of devices unavailable for gpu. "
                             "Requested: 10, Available: 9", id="more-than-the-class"),
        pytest.param(list(ADDRESSES[:7]), 3, "w/c: requested number of devices "
                     "unavailable for gpu. Requested: 3, Available: 2", id="too-few-free"),
    ],
)  # fmt: skip
def test_not_enough_devices(busy: list[str], count: int, message: str) -> None:
    state = _take(_gpus(), busy)
    with pytest.raises(AllocationError) as caught:
        state.allocate(KEY, {"gpu": count}, NodeSet([0]))
    assert str(caught.value) == message
    assert caught.value.subject == "w/c"


def test_nothing_requested() -> None:
    state = _gpus()
    assert dict(state.allocate(KEY, {"gpu": 0}, None).held) == {}
    assert dict(state.allocate(KEY, {}, NodeSet([1])).held) == {}


# -- reuse and release ------------------------------------------------------------------------

INIT: Key = ("p", "init")
APP: Key = ("p", "app")


@pytest.mark.parametrize(
    ("init", "app", "moved", "kept"),
    [
        pytest.param(2, 2, 2, 0, id="all-moved"),
        pytest.param(2, 3, 2, 0, id="moved-then-aligned"),
        pytest.param(3, 1, 1, 2, id="init-keeps-the-rest"),
    ],
)
def test_init_container_devices_are_moved(init: int, app: int, moved: int, kept: int) -> None:
    state = _gpus().allocate(INIT, {"gpu": init}, NodeSet([1]))
    theirs = state.held[INIT]["gpu"]
    placed = state.allocate(APP, {"gpu": app}, NodeSet([2]), reuse_from=[INIT])
    mine = placed.held[APP]["gpu"]
    assert mine[:moved] == theirs[:moved]
    assert mine[moved:] == tuple(d.address for d in state.order("gpu", NodeSet([2])))[: app - moved]
    assert placed.held.get(INIT, {}).get("gpu", ()) == theirs[moved:]
    assert len(placed.in_use("gpu")) == init + app - moved
    if not kept:
        assert INIT not in placed.held  # nothing left: the entry is gone


@pytest.mark.parametrize(
    ("donor", "message"),
    [
        pytest.param(("q", "init"), "p/app: cannot reuse devices of q/init", id="other-workload"),
        pytest.param(APP, "p/app: cannot reuse devices of p/app", id="itself"),
    ],
)
def test_reuse_only_within_the_workload(donor: Key, message: str) -> None:
    state = _gpus().allocate(("q", "init"), {"gpu": 1}, None)
    with pytest.raises(AllocationError) as caught:
        state.allocate(APP, {"gpu": 1}, None, reuse_from=[donor])
    assert str(caught.value) == message


def test_reused_devices_count_as_available() -> None:
    state = _gpus().allocate(INIT, {"gpu": 2}, None)
    state = _take(state, list(ADDRESSES[2:8]))
    with pytest.raises(AllocationError, match="Requested: 4, Available: 3"):
        state.allocate(APP, {"gpu": 4}, None, reuse_from=[INIT])
    placed = state.allocate(APP, {"gpu": 3}, None, reuse_from=[INIT])
    assert placed.free("gpu") == ()
    assert state.held[INIT]["gpu"] == ADDRESSES[:2]  # the state before is unchanged


def test_release_gives_back_exactly_the_devices() -> None:
    state = _gpus()
    for key, count in [(("a", "x"), 2), (("a", "y"), 3), (("b", "x"), 1)]:
        state = state.allocate(key, {"gpu": count}, NodeSet([1]))
    taken = state.held[("a", "y")]["gpu"]
    after = state.release("a", "y")
    assert set(after.held) == {("a", "x"), ("b", "x")}
    assert {d.address for d in after.free("gpu")} == {d.address for d in state.free("gpu")} | set(
        taken
    )
    assert set(state.release("a").held) == {("b", "x")}
    assert state.release("zzz") == state
    assert state.release("a").release("b") == _gpus()


# -- properties -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Alloc:
    key: Key
    request: dict[str, int]
    affinity: NodeSet | None
    reuse: bool  # from the workload's "init" container


@dataclass(frozen=True)
class Release:
    workload: str
    container: str | None


@dataclass(frozen=True)
class Run:
    state: DeviceState
    ops: tuple[Alloc | Release, ...]

    def __repr__(self) -> str:
        classes = {
            name: [f"{d.address[5:7]}@{d.node}" for d in devices]
            for name, devices in self.state.inventory.classes.items()
        }
        return f"Run(nodes={self.state.inventory.nodes}, classes={classes}, ops={self.ops})"


@st.composite
def _machines(draw: st.DrawFn) -> DeviceState:
    nodes = draw(st.integers(1, 4))
    count = draw(st.integers(1, 14))
    where = st.none() | st.integers(0, nodes - 1)
    devices = [(f"0000:{i:02x}:00.0", draw(where)) for i in range(count)]
    topo = _topology(nodes, devices)
    # Two classes by address: a device may be in either or neither.
    owner = [draw(st.sampled_from("abn")) for _ in range(count)]
    classes = [
        DeviceClass(
            c, addresses=tuple(a for (a, _), o in zip(devices, owner, strict=True) if o == c)
        )
        for c in "ab"
    ]
    return DeviceState(DeviceInventory.build(topo, classes))


@st.composite
def _runs(draw: st.DrawFn) -> Run:
    state = draw(_machines())
    masks = st.sets(st.sampled_from(state.inventory.nodes), min_size=1).map(NodeSet)
    workloads = st.sampled_from("pq")
    ops: list[Alloc | Release] = []
    for _ in range(draw(st.integers(1, 14))):
        if draw(st.integers(0, 3)) == 0:
            ops.append(Release(draw(workloads), draw(st.none() | st.sampled_from(["init", "app"]))))
            continue
        key = (draw(workloads), draw(st.sampled_from(["init", "app"])))
        request = {c: draw(st.sampled_from([0, 1, 1, 2, 3])) for c in "ab"}
        reuse = key[1] == "app" and draw(st.booleans())
        ops.append(Alloc(key, request, draw(st.none() | masks), reuse))
    return Run(state, tuple(ops))


def _check_sound(state: DeviceState) -> None:
    seen: dict[str, Key] = {}
    for key, per_class in state.held.items():
        for name, addresses in per_class.items():
            assert addresses, "an empty entry is dropped"
            members = {d.address for d in state.inventory.classes[name]}
            for address in addresses:
                assert address in members
                assert address not in seen, f"{address} held by {seen.get(address)} and {key}"
                seen[address] = key
    for name, devices in state.inventory.classes.items():
        free = {d.address for d in state.free(name)}
        assert free | state.in_use(name) == {d.address for d in devices}
        assert not free & state.in_use(name)


def _reusable(state: DeviceState, donors: list[Key], name: str) -> int:
    return sum(len(state.held.get(d, {}).get(name, ())) for d in donors)


def _step(state: DeviceState, op: Alloc) -> DeviceState:
    donors = [(op.key[0], "init")] if op.reuse else []
    held = state.held.get(op.key, {})
    wanted = {n: c for n, c in op.request.items() if c > 0 and n not in held}
    try:
        placed = state.allocate(op.key, op.request, op.affinity, reuse_from=donors)
    except AllocationError as err:
        note(f"rejected: {err}")
        assert any(len(state.free(n)) + _reusable(state, donors, n) < c for n, c in wanted.items())
        return state
    for name, count in wanted.items():
        mine = placed.held[op.key][name]
        assert len(mine) == count
        # Tiers: the init container's devices, then the order of the free ones.
        moved = tuple(a for d in donors for a in state.held.get(d, {}).get(name, ()))[:count]
        order = tuple(d.address for d in state.order(name, op.affinity))
        assert mine == moved + order[: count - len(moved)]
        if op.affinity is not None and not moved:
            # Where the affinity holds enough free devices, all are aligned.
            nodes = {d.address: d.node for d in state.inventory.classes[name]}
            if sum(nodes[a] in op.affinity for a in order) >= count:
                assert all(nodes[a] in op.affinity for a in mine)
    if not donors and op.key not in state.held:
        assert placed.release(*op.key) == state  # release gives back exactly what was taken
    return placed


@settings(max_examples=300, deadline=None)
@given(_runs())
def test_random_runs_never_share_a_device(run: Run) -> None:
    state = run.state
    for op in run.ops:
        if isinstance(op, Release):
            state = state.release(op.workload, op.container)
        else:
            state = _step(state, op)
        _check_sound(state)


@settings(max_examples=300, deadline=None)
@given(_runs(), st.sampled_from("ab"), st.integers(1, 6))
def test_hints_are_exactly_the_masks_with_enough_free_devices(
    run: Run, name: str, count: int
) -> None:
    state = run.state
    for op in run.ops:
        if isinstance(op, Alloc):
            try:
                state = state.allocate(op.key, op.request, op.affinity)
            except AllocationError:
                continue
    devices = state.inventory.classes[name]
    hints = state.hints(("s", "new"), name, count)
    if all(d.node is None for d in devices):
        assert hints is None
        return
    free = state.free(name)
    nodes = state.inventory.nodes
    masks = [m for w in range(1, len(nodes) + 1) for m in itertools.combinations(nodes, w)]
    total = {m: sum(d.node in m for d in devices) for m in masks}
    narrowest = min((len(m) for m in masks if total[m] >= count), default=len(nodes))
    expected = [
        (m, len(m) == narrowest)
        for m in masks
        if len(free) >= count and sum(d.node in m for d in free) >= count
    ]
    assert _masks(hints) == expected


@settings(max_examples=300, deadline=None)
@given(_runs(), st.sampled_from("ab"), st.integers(1, 6), st.data())
def test_hints_count_the_devices_of_finished_init_containers_as_the_kubelet_does(
    run: Run, name: str, count: int, data: st.DataObject
) -> None:
    """Reference 2.2 step 5: a mask must hold every reusable device that has a node;
    those count toward the request with the free devices in the mask (reusable devices
    without a node are skipped); preferred is still the narrowest by all devices."""
    state = run.state
    for op in run.ops:
        if isinstance(op, Alloc):
            try:
                state = state.allocate(op.key, op.request, op.affinity)
            except AllocationError:
                continue
    holders = sorted(k for k, v in state.held.items() if v.get(name))
    donors = data.draw(st.lists(st.sampled_from(holders), unique=True)) if holders else []
    hints = state.hints(("s", "new"), name, count, donors)
    devices = state.inventory.classes[name]
    if all(d.node is None for d in devices):
        assert hints is None
        return
    theirs = {a for k in donors for a in state.held[k][name]}
    reusable = [d for d in devices if d.address in theirs]
    placed = [d for d in reusable if d.node is not None]
    free = state.free(name)
    nodes = state.inventory.nodes
    masks = [m for w in range(1, len(nodes) + 1) for m in itertools.combinations(nodes, w)]
    total = {m: sum(d.node in m for d in devices) for m in masks}
    narrowest = min((len(m) for m in masks if total[m] >= count), default=len(nodes))
    enough = len(free) + len(reusable) >= count
    expected = [
        (m, len(m) == narrowest)
        for m in masks
        if enough
        and all(d.node in m for d in placed)
        and sum(d.node in m for d in free) + len(placed) >= count
    ]
    assert _masks(hints) == expected


def test_a_finished_init_containers_devices_make_room_for_the_app() -> None:
    """Every GPU of nodes 0-2 is held, two of node 1 by the workload's init container:
    the app's request for 2 fits only on masks holding node 1 (reuse), else nowhere."""
    state = _gpus().allocate(INIT, {"gpu": 2}, NodeSet([1]))
    others = [a for a, node in GPUS if node is not None and a not in state.held[INIT]["gpu"]]
    state = _take(state, others)
    assert _masks(state.hints(APP, "gpu", 2)) == []  # nothing free
    assert _masks(state.hints(APP, "gpu", 2, [INIT])) == [
        ((1,), True),
        ((0, 1), False),
        ((1, 2), False),
        ((0, 1, 2), False),
    ]
