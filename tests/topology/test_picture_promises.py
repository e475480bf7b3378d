"""The picture's promises of issue 25 item 8, each read back from the SVG: a workload
keeps its colour for its life, `show NAME --svg` singles NAME out, memory bars from
numad's books, plurals, a heat map with a scale whose labels never collide at 64 nodes
and whose ordinary distances do not alarm, GPU memory nodes drawn with their GPU.

The live page's own promises (swatches, CPU lists that never break inside a range, a
legend a phone shows whole) are measured in Chromium in tests/daemon/test_livepage.py.
"""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET

import pytest

from numad.cpuset import CPUSet
from numad.hostfs import HostFS
from numad.topology.discover import discover
from numad.topology.model import CPU, Core, NumaNode, Package, PciDevice, Topology
from numad.topology.picture import Holders, NodeMemory, Workload, svg
from numad.topology.picture.colours import distance_colour, warm, workload_colour
from numad.topology.picture.heat import LABEL_SIZE
from numad.topology.picture.layout import gpu_memory, label_width
from tests.conftest import Machines
from tests.topology.test_picture import _big, _fill, _parse, _pus, check_layout, check_picture

GB200 = "144arm-2pa72co+32gpumem-gb200like"
SVG = "{http://www.w3.org/2000/svg}"


def _colours(text: str) -> dict[str, set[str]]:
    """Each holder's PU fills."""
    found: dict[str, set[str]] = {}
    for e in _pus(_parse(text)).values():
        found.setdefault(e.get("data-holder", ""), set()).add(_fill(e))
    return found


def test_a_workload_keeps_its_colour_when_another_is_released() -> None:
    """The colour was the workload's place in the list: releasing the first workload
    repainted every one after it, and a self-refreshing page then lied."""
    topo = _big()
    a, b, c = (Workload(n, CPUSet(range(8 * i, 8 * i + 8))) for i, n in enumerate("abc", 1))
    before = _colours(svg(topo, Holders(workloads=(a, b, c))))
    after = _colours(svg(topo, Holders(workloads=(b, c))))
    alone = _colours(svg(topo, Holders(workloads=(c,))))
    assert before["c"] == after["c"] == alone["c"] == {workload_colour("c")}
    assert before["b"] == after["b"]
    assert len({workload_colour(n) for n in "abc"}) == 3


def test_show_singles_out_one_workload() -> None:
    topo = _big()
    holders = Holders(
        reserved=CPUSet([0, 1]),
        workloads=(Workload("db", CPUSet([2, 3])), Workload("web", CPUSet([4, 5]))),
    )
    root = _parse(svg(topo, holders, highlight="db"))
    assert root.get("data-highlight") == "db"
    pus = _pus(root)
    assert "highlight" in pus[2].get("class", "").split()
    assert "dim" in pus[4].get("class", "").split()
    assert pus[0].get("class") == "pu reserved"  # not a workload: neither
    assert pus[9].get("class") == "pu shared"
    keys = [e for e in root.iter() if e.get("class") == "key"]
    assert "db (2 CPUs) - shown" in [
        ET.tostring(k, encoding="unicode", method="text") for k in keys
    ]
    plain = _parse(svg(topo, holders))
    assert plain.get("data-highlight") is None
    assert _pus(plain)[4].get("class") == "pu exclusive w1"


def _tiny(devices: int = 0) -> Topology:
    """1 package, 1 node, 1 core of 1 thread, ``devices`` network functions on the node."""
    pci = tuple(
        PciDevice(f"0000:{i + 1:02x}:00.0", 0, "0x8086", "0x10fb", "0x020000")
        for i in range(devices)
    )
    return Topology(
        (CPU(0, True, 0, 0, 0, None, 0, 0, None),),
        (NumaNode(0, CPUSet([0]), 4 << 20, 1 << 20, (), {0: 10}),),
        (Package(0, CPUSet([0])),),
        (Core(0, 0, 0, 0, CPUSet([0])),),
        (),
        pci,
    )


@pytest.mark.parametrize(
    ("topo", "holders", "said"),
    [
        pytest.param(
            _tiny(),
            Holders(),
            "Machine: 1 package, 1 NUMA node, 1 core, 1/1 CPUs online",
            id="one-of-each",
        ),
        pytest.param(_tiny(), Holders(reserved=CPUSet([0])), "reserved (1 CPU)", id="one-cpu"),
        pytest.param(_tiny(13), Holders(), "+1 more PCI device", id="one-more-device"),
        pytest.param(
            _big(),
            Holders(workloads=(Workload("db", CPUSet([5]), ("x",)),)),
            "db (1 CPU, 1 device)",
            id="one-cpu-one-device",
        ),
        pytest.param(_big(), Holders(), "Machine: 4 packages, 8 NUMA nodes, 512 cores", id="many"),
    ],
)
def test_counts_say_one_and_many_rightly(topo: Topology, holders: Holders, said: str) -> None:
    text = svg(topo, holders)
    assert said in text
    for wrong in ("1 packages", "1 NUMA nodes", "1 cores", "1 CPUs)", "1 devices", "(1 CPU,"):
        if wrong not in said:
            assert wrong not in text, wrong


def test_memory_bars_draw_numads_books_not_the_recording() -> None:
    """The bar showed MemTotal - MemFree as recorded; numad's books are what it holds."""
    topo = _big()  # every node recorded 64 GiB, 48 GiB free
    books = tuple(NodeMemory(n, 64 << 30, 60 << 30, (60 - n) << 30) for n in range(8))
    root = _parse(svg(topo, Holders(memory=books)))
    bars = {
        int(node.get("data-node", "")): next(e for e in node if e.get("class") == "memory")
        for node in root.iter()
        if node.get("data-node")
    }
    for n, bar in bars.items():
        assert int(bar.get("data-held-bytes", "")) == n << 30
        assert int(bar.get("data-free-bytes", "")) == (60 - n) << 30
    said = ET.tostring(bars[3], encoding="unicode", method="text")
    assert "3.0 held / 57.0 GiB free" in said
    unknown = _parse(svg(topo))  # no daemon: nothing held
    assert "64.0 GiB, none held" in ET.tostring(unknown, encoding="unicode", method="text")


def _far(n: int) -> Topology:
    """``n`` nodes of 2 CPUs; distances 10, 12 (same pair), 21 (same eight), 32 and 120."""
    cpus, nodes, cores = [], [], []
    for i in range(n):
        pair = CPUSet([2 * i, 2 * i + 1])
        cores.append(Core(2 * i, i, 0, 0, pair))
        cpus += [CPU(c, True, i, i, 0, None, 2 * i, 0, None) for c in pair]

        def d(j: int, i: int = i) -> int:
            if i == j:
                return 10
            if i // 2 == j // 2:
                return 12
            if i // 8 == j // 8:
                return 21
            return 32 if i // 32 == j // 32 else 120

        nodes.append(NumaNode(i, pair, 8 << 20, 4 << 20, (), {j: d(j) for j in range(n)}))
    packages = tuple(Package(i, CPUSet([2 * i, 2 * i + 1])) for i in range(n))
    return Topology(tuple(cpus), tuple(nodes), packages, tuple(cores), ())


def test_the_heat_map_at_64_nodes_has_a_scale_and_labels_that_do_not_collide() -> None:
    topo = _far(64)
    root, _ = check_picture(topo, Holders())
    check_layout(topo)
    (heat,) = [e for e in root.iter() if e.get("class") == "distances"]
    step = int(heat.get("data-label-step", ""))
    labels = [e for e in heat.iter() if e.get("data-node-label") is not None]
    shown = [int(e.get("data-node-label", "")) for e in labels]
    assert shown == list(range(0, 64, step))
    assert step > 1  # not all 64: they would run into each other
    xs = [float(e.get("x", "")) for e in labels]
    widest = label_width("63", LABEL_SIZE)
    assert min(b - a for a, b in itertools.pairwise(xs)) >= widest + 4
    (scale,) = [e for e in heat.iter() if e.get("class") == "scale"]
    keys = {int(e.get("data-distance", "")): e for e in scale if e.get("class") == "step"}
    assert sorted(keys) == [10, 12, 21, 32, 120]  # every distance on the machine, once
    for d, key in keys.items():
        assert key.find(f"{SVG}rect").get("fill") == distance_colour(d)  # type: ignore[union-attr]
    assert "10 is local" in ET.tostring(scale, encoding="unicode", method="text")


@pytest.mark.parametrize(
    ("distance", "alarms"),
    [
        pytest.param(10, False, id="local"),
        pytest.param(11, False, id="sub-numa-cluster"),
        pytest.param(21, False, id="other-socket"),
        pytest.param(32, False, id="two-hops"),
        pytest.param(40, False, id="grace-to-grace"),
        pytest.param(80, True, id="gpu-memory"),
        pytest.param(120, True, id="far-gpu-memory"),
    ],
)
def test_only_far_distances_are_warm(distance: int, alarms: bool) -> None:
    """The colours were stretched from the machine's least distance to its greatest: on
    a two-node machine an ordinary 21 came out alarm red."""
    assert warm(distance_colour(distance)) is alarms
    two = _far(2)  # distances 10 and 12 only
    cells = [e for e in _parse(svg(two)).iter() if e.get("class") == "dist"]
    assert not [c for c in cells if warm(c.get("fill", ""))]


def _parents(root: ET.Element) -> dict[ET.Element, ET.Element]:
    return {child: parent for parent in root.iter() for child in parent}


def _inside(e: ET.Element, parents: dict[ET.Element, ET.Element]) -> list[ET.Element]:
    found = []
    while e in parents:
        e = parents[e]
        found.append(e)
    return found


def test_gpu_memory_nodes_are_drawn_with_their_gpu(machines: Machines) -> None:
    """The GB200-like tray: each GPU's 8 CPU-less nodes were drawn in a "Memory-only
    NUMA nodes" box at the bottom, far from the GPU; now in one box with it, inside the
    node of its Grace."""
    topo = discover(HostFS(machines.root(GB200)))
    owners = gpu_memory(topo)
    assert owners == {
        "0008:01:00.0": tuple(range(2, 10)),
        "0009:01:00.0": tuple(range(10, 18)),
        "0018:01:00.0": tuple(range(18, 26)),
        "0019:01:00.0": tuple(range(26, 34)),
    }  # the synthetic tray's own truth (fixtures/synthetic/make.py: 8 nodes per GPU)
    root, text = check_picture(topo, Holders())
    check_layout(topo)
    assert "Memory-only NUMA nodes" not in text
    parents = _parents(root)
    nodes = {e.get("data-node"): e for e in root.iter() if e.get("data-node")}
    for address, memory in owners.items():
        (gpu,) = [e for e in root.iter() if e.get("data-address") == address]
        box = parents[gpu]
        assert box.get("class") == "gpu"
        grace = 0 if address.startswith("000") else 1
        assert nodes[str(grace)] in _inside(gpu, parents)
        assert {e.get("data-node") for e in box if e.get("data-node")} == {str(n) for n in memory}
        assert f"GPU {address}, its memory: nodes {memory[0]}-{memory[-1]}" in text
        (first, last) = (nodes[str(memory[0])], nodes[str(memory[-1])])
        for node in (first, last):
            assert box in _inside(node, parents)


def test_a_memory_only_node_without_a_gpu_stays_apart() -> None:
    topo = _tiny()
    lone = NumaNode(1, CPUSet(), 4 << 20, 4 << 20, (), {0: 20, 1: 10})
    node0 = NumaNode(0, CPUSet([0]), 4 << 20, 1 << 20, (), {0: 10, 1: 20})
    topo = Topology(topo.all_cpus, (node0, lone), topo.packages, topo.cores, ())
    assert gpu_memory(topo) == {}
    assert "Memory-only NUMA nodes" in svg(topo)
