"""``numad topology`` groups PCI devices by PCIe switch (numad.topology.pcirender)."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree

import pytest

from numad.cpuset import CPUSet
from numad.topology.archive import ArchiveFS
from numad.topology.discover import discover
from numad.topology.fromjson import from_json
from numad.topology.model import CPU, Core, NumaNode, Package, PciDevice, Topology
from numad.topology.picture import svg
from numad.topology.render import to_json, to_text

DGX = Path(__file__).resolve().parents[2] / (
    "fixtures/sysfs/224intel64-2pa56co2t+8gpu8nic-dgxlike.tar.bz2"
)


@pytest.fixture(scope="module")
def dgx() -> Topology:
    return discover(ArchiveFS(DGX))


def _small(devices: tuple[PciDevice, ...]) -> Topology:
    """Node 0 of CPUs 0-3, with ``devices``."""
    cpus = tuple(CPU(c, True, 0, 0, 0, None, c, c, None) for c in range(4))
    cores = tuple(Core(c, 0, 0, c, CPUSet([c])) for c in range(4))
    return Topology(
        all_cpus=cpus,
        nodes=(NumaNode(0, CPUSet(range(4))),),
        packages=(Package(0, CPUSet(range(4))),),
        cores=cores,
        l3_groups=(),
        pci_devices=devices,
    )


def _pci_lines(text: str) -> list[str]:
    return text[text.index("PCI devices:") :].splitlines()


def test_text_lists_a_switch_s_devices_under_its_address(dgx: Topology) -> None:
    lines = _pci_lines(to_text(dgx))
    head = lines.index(
        "    switch 0000:16:00.0: display 0000:18:00.0, network 0000:19:00.0,"
        " display 0000:1a:00.0, network 0000:1b:00.0"
    )
    group = lines[head + 1 : head + 10]
    assert [line.split()[0] for line in group] == [
        "0000:16:00.0",  # the switch's upstream port, then its downstream ports
        *(f"0000:17:0{p}.0" for p in range(4)),
        "0000:18:00.0",
        "0000:19:00.0",
        "0000:1a:00.0",
        "0000:1b:00.0",
    ]
    assert all(line.startswith("      0000:") for line in group)
    assert "    switch 0000:38:00.0: display 0000:3a:00.0, network 0000:3b:00.0, " in "\n".join(
        lines
    )
    # On a root port: alone, as before.
    assert any(line.startswith("    0000:01:00.0  storage [0x010802]") for line in lines)
    assert sum(line.startswith("    switch ") for line in lines) == 4


def test_json_has_each_device_s_path_and_switch(dgx: Topology) -> None:
    pci = {d["address"]: d for d in to_json(dgx)["pci"]}  # type: ignore[attr-defined]
    assert pci["0000:18:00.0"]["path"] == [
        "pci0000:15",
        "0000:15:01.0",
        "0000:16:00.0",
        "0000:17:00.0",
    ]
    assert pci["0000:18:00.0"]["switch"] == pci["0000:19:00.0"]["switch"] == "0000:16:00.0"
    assert pci["0000:01:00.0"]["path"] == ["pci0000:00", "0000:00:1d.0"]
    assert pci["0000:01:00.0"]["switch"] is None
    assert pci["0000:16:00.0"]["switch"] is None  # the switch itself


def test_json_reads_back_with_paths(dgx: Topology) -> None:
    assert from_json(to_json(dgx)) == dgx


def test_json_without_paths_reads_back(dgx: Topology) -> None:
    """The JSON of a numad from before the PCIe tree: no path, no switch."""
    data = to_json(dgx)
    for device in data["pci"]:  # type: ignore[attr-defined]
        del device["path"], device["switch"]
    assert all(d.path == () for d in from_json(data).pci_devices)


def test_text_says_where_local_cpus_are_narrower_than_the_node() -> None:
    topo = _small(
        (
            PciDevice("0000:3b:00.0", 0, "0x15b3", "0x1017", "0x020000", None, CPUSet([0, 1])),
            PciDevice("0000:3c:00.0", 0, "0x15b3", "0x1017", "0x020000", None, CPUSet(range(4))),
            PciDevice("0000:3d:00.0", 0, "0x15b3", "0x1017", "0x020000", None, None),
        )
    )
    lines = _pci_lines(to_text(topo))
    assert lines[2].endswith("15b3:1017  local cpus 0-1 (node 0: 0-3)")
    assert lines[3].endswith("15b3:1017")
    assert lines[4].endswith("15b3:1017")


def test_devices_without_a_path_list_as_before() -> None:
    topo = _small(
        (
            PciDevice("0000:3b:00.0", 0, "0x15b3", "0x1017", "0x020000", "mlx5_core"),
            PciDevice("0000:3c:00.0", 0, "0x8086", "0x1572", "0x020000"),
        )
    )
    assert (
        _pci_lines(to_text(topo))
        == [
            "PCI devices:",
            "  NUMA node 0:",
            "    0000:3b:00.0  network [0x020000]  15b3:1017  driver mlx5_core",
            "    0000:3c:00.0  network [0x020000]  8086:1572",
            "",
        ][: len(_pci_lines(to_text(topo)))]
    )


def test_the_picture_draws_a_switch_s_devices_in_its_box(dgx: Topology) -> None:
    tree = ElementTree.fromstring(svg(dgx))  # noqa: S314 - numad's own SVG, drawn here
    ns = "{http://www.w3.org/2000/svg}"
    boxes = {
        g.get("data-switch"): sorted(d.get("data-address", "") for d in g.iter(f"{ns}g"))
        for g in tree.iter(f"{ns}g")
        if g.get("class") == "switch"
    }
    # Bridges stay hidden in the picture: the switch's box holds its GPUs, NICs, NVMe.
    assert {k: [a for a in v if a] for k, v in boxes.items()} == {
        "0000:16:00.0": ["0000:18:00.0", "0000:19:00.0", "0000:1a:00.0", "0000:1b:00.0"],
        "0000:38:00.0": [f"0000:{b}:00.0" for b in ("3a", "3b", "3c", "3d", "3e")],
        "0000:9b:00.0": ["0000:9d:00.0", "0000:9e:00.0", "0000:9f:00.0", "0000:a0:00.0"],
        "0000:bd:00.0": [f"0000:{b}:00.0" for b in ("bf", "c0", "c1", "c2", "c3")],
    }
    boot = [g for g in tree.iter(f"{ns}g") if g.get("data-address") == "0000:01:00.0"]
    assert len(boot) == 1  # drawn, in no switch's box
