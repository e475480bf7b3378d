"""The picture of the machine (issue 16, part 4): `numad topology --svg`, `numad show --svg`.

Every recorded and synthetic machine (fixtures/sysfs, fixtures/hwloc-more, the bundled
one) and a made-up 1,024-CPU machine is drawn with a known placement and the SVG read
back with xml.etree: well-formed, every CPU exactly once with its holder's class and
colour, offline CPUs marked, every node and every distance cell there, a sane size.
"""

from __future__ import annotations

import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from numad.cli.demo import CONFIG, MACHINE
from numad.cli.main import bundled_machines, main
from numad.cpuset import CPUSet
from numad.errors import NumadError
from numad.host.scratch import scratch_mkdir
from numad.hostfs import HostFS
from numad.topology.discover import discover
from numad.topology.fromjson import from_json
from numad.topology.model import CPU, CacheGroup, Core, NumaNode, Package, Topology
from numad.topology.picture import Holders, Workload, from_api, svg
from numad.topology.picture.colours import COLOURS, workload_colour
from numad.topology.picture.holders import Kind
from numad.topology.picture.layout import WIDTH, machine, place
from numad.topology.record import load_fixture
from numad.topology.render import to_json
from tests.conftest import Machines
from tests.daemon.test_daemon_e2e import Numad

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
ARCHIVES = sorted(
    p
    for d in ("sysfs", "hwloc-more")
    for p in (FIXTURES / d).iterdir()
    if p.name.endswith((".tar.bz2", ".tar.gz", ".tar.xz"))
)
MAX_BYTES = 1 << 20  # the 64-node machine draws ~0.6 MB, most of it its 4,096 distance cells


def _parse(text: str) -> ET.Element:
    return ET.fromstring(text)  # noqa: S314 - numad's own SVG, drawn by this test


def _name(archive: Path) -> str:
    return archive.name.split(".tar")[0]


def _placement(topo: Topology) -> Holders:
    """2 reserved CPUs, then two workloads of 4 CPUs each where the machine has them,
    the second holding the first PCI device on a node."""
    online = topo.online_cpus.sorted()
    device = next((d.address for d in topo.pci_devices if d.numa_node is not None), None)
    return Holders(
        reserved=CPUSet(online[:2]),
        workloads=(
            Workload("alpha", CPUSet(online[2:6])),
            Workload("beta", CPUSet(online[6:10]), () if device is None else (device,)),
            Workload("gamma", CPUSet()),  # shared: holds nothing
        ),
    )


def _pus(root: ET.Element) -> dict[int, ET.Element]:
    found: dict[int, ET.Element] = {}
    for e in root.iter():
        if e.get("data-cpu") is not None:
            cpu = int(e.get("data-cpu", ""))
            assert cpu not in found, f"cpu {cpu} drawn twice"
            found[cpu] = e
    return found


def _fill(pu: ET.Element) -> str:
    rect = pu.find("{http://www.w3.org/2000/svg}rect")
    assert rect is not None
    return rect.get("fill", "")


def check_picture(topo: Topology, holders: Holders) -> tuple[ET.Element, str]:
    """Draw ``topo`` and check every promise of the picture; the parsed root and text."""
    text = svg(topo, holders)
    root = _parse(text)  # well-formed, or this raises
    pus = _pus(root)
    assert set(pus) == {c.id for c in topo.all_cpus}
    for cpu in topo.all_cpus:
        pu = pus[cpu.id]
        classes = pu.get("class", "").split()
        if not cpu.online:
            assert "offline" in classes
            assert _fill(pu) == COLOURS[Kind.OFFLINE]
            continue
        kind, index = holders.holder(cpu.id)
        assert kind.value in classes, (cpu.id, classes)
        if index is None:
            assert _fill(pu) == COLOURS[kind]
        else:
            assert f"w{index}" in classes
            assert pu.get("data-holder") == holders.workloads[index].name
            assert _fill(pu) == workload_colour(holders.workloads[index].name)
    drawn_nodes = {int(e.get("data-node", "")) for e in root.iter() if e.get("data-node")}
    assert drawn_nodes == set(topo.node_ids)
    cells = {
        (int(e.get("data-from", "")), int(e.get("data-to", ""))): e.get("data-distance")
        for e in root.iter()
        if e.get("class") == "dist"
    }
    assert len(cells) == len(topo.nodes) ** 2
    for (a, b), shown in cells.items():
        d = topo.distance(a, b)
        assert shown == ("" if d is None else str(d))
    for w in holders.workloads:
        for address in w.devices:
            (device,) = [e for e in root.iter() if e.get("data-address") == address]
            assert device.get("data-holder") == w.name
    assert len(text.encode()) < MAX_BYTES
    return root, text


@pytest.fixture(scope="module")
def unpacked() -> dict[str, Path]:
    return {}


@pytest.mark.parametrize("archive", ARCHIVES, ids=_name)
def test_every_machine_is_drawn_whole(
    archive: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    topo = discover(HostFS(load_fixture(archive, tmp_path_factory.mktemp(_name(archive)))))
    assert from_json(to_json(topo)) == topo  # `show --svg` draws the daemon's JSON
    check_picture(topo, _placement(topo))
    check_picture(topo, Holders())
    check_layout(topo)


def check_layout(topo: Topology) -> None:
    """Every box lies inside its parent, and the machine within the picture's width."""
    body = machine(topo)
    place(body, WIDTH)
    assert body.w <= WIDTH
    for box in body.walk():
        for child in box.children:
            assert box.x <= child.x
            assert child.x + child.w <= box.x + box.w
            assert box.y <= child.y
            assert child.y + child.h <= box.y + box.h, (box.kind, box.label, child.label)


def test_the_bundled_machine_with_a_known_placement(machines: Machines) -> None:
    assert MACHINE in bundled_machines()
    topo = discover(HostFS(machines.root(MACHINE)))
    holders = Holders(
        reserved=CPUSet([0, 16]),
        workloads=(
            Workload("db", CPUSet([1, 2, 17, 18]), ("0000:1b:00.0", "0000:1c:00.0")),
            Workload("batch", CPUSet([8, 9, 10, 11, 24, 25, 26, 27])),
        ),
    )
    root, text = check_picture(topo, holders)
    pus = _pus(root)
    assert pus[0].get("class") == "pu reserved"
    assert pus[3].get("class") == "pu shared"
    assert pus[17].get("class") == "pu exclusive w0"
    assert pus[27].get("class") == "pu exclusive w1"
    assert workload_colour("db") != workload_colour("batch")
    assert "db (4 CPUs, 2 devices)" in text  # the legend names each workload
    assert "batch (8 CPUs)" in text
    assert "reserved (2 CPUs)" in text
    assert "shared pool (18 CPUs)" in text
    kinds = [e.get("class") for e in root.iter() if e.get("class")]
    for kind in ("package", "node", "l3", "core", "device", "memory", "legend", "distances"):
        assert kind in kinds, kind
    memory = [e for e in root.iter() if e.get("class") == "memory"]
    assert len(memory) == 2  # no books (no daemon): nothing held, the whole node free
    assert all(int(m.get("data-held-bytes", "")) == 0 for m in memory)
    assert all(int(m.get("data-free-bytes", "0")) > 0 for m in memory)


def _big(packages: int = 4, nodes_per_package: int = 2, cores_per_node: int = 64) -> Topology:
    """A made-up machine of 4 x 2 x 64 x 2 = 1,024 CPUs: no recording is that large."""
    cpus, cores, nodes, l3s = [], [], [], []
    per_node = cores_per_node * 2
    count = packages * nodes_per_package
    for n in range(count):
        first = n * per_node
        pkg = n // nodes_per_package
        for k in range(cores_per_node):
            pair = (first + 2 * k, first + 2 * k + 1)
            cores.append(Core(pair[0], pkg, 0, k, CPUSet(pair)))
            cpus += [CPU(c, True, n, pkg, 0, None, pair[0], k, n) for c in pair]
        ids = CPUSet(range(first, first + per_node))
        distances = {
            m: 10 if m == n else 16 if m // nodes_per_package == pkg else 32 for m in range(count)
        }
        nodes.append(NumaNode(n, ids, 64 << 20, 48 << 20, (), distances))
        l3s.append(CacheGroup(n, ids, n, 65536))
    packages_ = tuple(
        Package(p, CPUSet(range(p * 2 * per_node, (p + 1) * 2 * per_node))) for p in range(4)
    )
    return Topology(tuple(cpus), tuple(nodes), packages_, tuple(cores), tuple(l3s))


def test_1024_cpus_are_drawn_readably_and_fast() -> None:
    topo = _big()
    assert len(topo.online_cpus) == 1024
    holders = Holders(
        reserved=CPUSet([0, 1]),
        workloads=tuple(
            Workload(f"w{i}", CPUSet(range(64 + 32 * i, 96 + 32 * i))) for i in range(20)
        ),
    )
    start = time.perf_counter()
    text = svg(topo, holders)
    seconds = time.perf_counter() - start
    root, _ = check_picture(topo, holders)
    check_layout(topo)
    width = root.get("width")
    height = int(root.get("height", "0"))
    assert width == "1200"  # wraps into rows: never wider, only taller
    assert 1000 < height < 6000
    print(f"1,024 CPUs: {len(text)} bytes, {height} units tall, drawn in {seconds * 1000:.0f} ms")
    assert seconds < 1.0


@pytest.mark.parametrize(
    ("workloads", "host", "error"),
    [
        pytest.param([], {}, None, id="nothing-held"),
        pytest.param(
            [{"name": "x", "containers": {"m": {"cpus": "3-4", "exclusive": True, "devices": {}}}}],
            {"reserved": "0"},
            None,
            id="one-exclusive",
        ),
        pytest.param([{"name": "x"}], {}, "not as served", id="no-containers"),
        pytest.param([], {"reserved": "zero"}, "not as served", id="bad-reserved"),
    ],
)
def test_holders_from_the_api(
    workloads: list[dict[str, Any]], host: dict[str, Any], error: str | None
) -> None:
    if error is not None:
        with pytest.raises(NumadError, match=error):
            from_api(workloads, host)
        return
    holders = from_api(workloads, host)
    if workloads:
        assert holders.workloads == (Workload("x", CPUSet([3, 4])),)
        assert holders.reserved == CPUSet([0])


def test_topology_svg_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a daemon: the machine as on a fresh start, the config's reserved CPUs."""
    out = tmp_path / "machine.svg"
    (tmp_path / "numad.toml").write_text(CONFIG)  # reserved-count = 2
    config = ["--config", str(tmp_path / "numad.toml")]
    assert main(["topology", "--fixture", MACHINE, "--svg", str(out), *config]) == 0
    pus = _pus(_parse(out.read_text()))
    assert len(pus) == 32
    assert sorted(c for c, e in pus.items() if e.get("class") == "pu reserved") == [0, 16]
    assert {e.get("class") for c, e in pus.items() if c not in (0, 16)} == {"pu shared"}
    assert f"{out}: " in capsys.readouterr().out
    (tmp_path / "bad.toml").write_text('[cpu]\nreserved-cpus = "0,99"\n')
    bad = ["--config", str(tmp_path / "bad.toml")]
    assert main(["topology", "--fixture", MACHINE, "--svg", str(out), *bad]) == 1
    assert "CPU 99 does not exist" in capsys.readouterr().err
    assert main(["topology", "--fixture", MACHINE, "--svg", str(tmp_path / "no" / "x.svg")]) == 1
    assert "cannot write the picture" in capsys.readouterr().err


def test_show_svg_and_topology_svg_draw_the_running_daemon(
    machines: Machines, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both draw the daemon's holders and its books' memory; `show db --svg` singles
    out db (issue 25 item 8): its CPUs and devices outlined, the other workloads' dimmed."""
    root = tmp_path / "machine"
    subprocess.run(["cp", "-a", str(machines.root(MACHINE)), str(root)], check=True, timeout=60)
    (tmp_path / "numad.toml").write_text(CONFIG)
    daemon = Numad(root, tmp_path / "numad.toml")
    daemon.start()
    try:
        for name in ("db", "batch"):
            scratch_mkdir(daemon.cgroups, f"numad.slice/{name}")
        db = daemon.call(
            "POST",
            "/v1/workloads",
            {"name": "db", "cgroup": "numad.slice/db", "cpus": 4, "devices": {"vector-engine": 2}},
        )
        daemon.call(
            "POST", "/v1/workloads", {"name": "batch", "cgroup": "numad.slice/batch", "cpus": 2}
        )
        nrt = from_api([], {}, daemon.call("GET", "/v1/nrt")).memory
        shown, whole = tmp_path / "db.svg", tmp_path / "host.svg"
        assert main(["show", "db", "--socket", daemon.socket, "--svg", str(shown)]) == 0
        assert "db" in capsys.readouterr().out  # the show itself, as without --svg
        assert main(["topology", "--socket", daemon.socket, "--svg", str(whole)]) == 0
        assert main(["show", "nosuch", "--socket", daemon.socket, "--svg", str(tmp_path / "n")])
        assert not (tmp_path / "n").exists()
    finally:
        daemon.stop()
    recorded = discover(HostFS(machines.root(MACHINE)))
    for picture in (shown, whole):
        svg_root = _parse(picture.read_text())
        pus = _pus(svg_root)
        held = sorted(c for c, e in pus.items() if e.get("data-holder") == "db")
        assert held == list(CPUSet.parse_list(db["containers"]["main"]["cpus"]).sorted())
        assert sorted(c for c, e in pus.items() if e.get("data-holder") == "reserved") == [0, 16]
        bars = [e for e in svg_root.iter() if e.get("class") == "memory"]
        assert [
            (int(b.get("data-held-bytes", "")), int(b.get("data-free-bytes", ""))) for b in bars
        ] == [(m.held, m.free) for m in nrt]  # the books' free, not the recording's (MemFree):
        assert [m.free for m in nrt] != [(n.memory_free_kb or 0) * 1024 for n in recorded.nodes]
    marked = _parse(shown.read_text())
    assert marked.get("data-highlight") == "db"
    classes = {
        e.get("data-holder"): e.get("class", "").split() for e in marked.iter() if e.get("data-cpu")
    }
    assert "highlight" in classes["db"]
    assert "dim" in classes["batch"]
    assert "dim" not in classes["shared"]
    assert "dim" not in classes["reserved"]
    devices = [e for e in marked.iter() if e.get("data-holder") == "db" and e.get("data-address")]
    assert len(devices) == 2
    assert all("highlight" in e.get("class", "") for e in devices)
    plain = _parse(whole.read_text())
    assert plain.get("data-highlight") is None
    assert not [e for e in plain.iter() if "dim" in e.get("class", "").split()]
