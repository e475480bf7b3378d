"""Discovery's PCIe tree: each device's ``path`` from where /sys/bus/pci/devices links.

Two kinds of test. On scratch trees: the link gives the path, a plain directory gives
none, a link is resolved inside the root. On every recorded tree (fixtures/sysfs and
fixtures/hwloc-more): discovery still finds exactly what it found before it read the
PCIe tree, ``path`` aside. tests/data/topology-before-pcie-paths.json holds, per
archive, the SHA-256 of ``numad topology --json`` as commit 5555434 (the last before
discovery filled ``path``) printed it; the test hashes today's JSON cut to the fields
that JSON had then, so a field added later does not break the comparison, and any
change in what discovery finds does.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from numad.hostfs import HostFS
from numad.topology.archive import ArchiveFS
from numad.topology.discover import discover
from numad.topology.model import Topology
from numad.topology.render import to_json

REPO = Path(__file__).resolve().parents[2]
BEFORE: dict[str, str] = json.loads(
    (REPO / "tests" / "data" / "topology-before-pcie-paths.json").read_text()
)
# The fields of the topology JSON and of its PCI entries at commit 5555434.
TOP_FIELDS = [
    "packages",
    "cores",
    "numa_nodes",
    "cpus",
    "pci",
    "online_cpus",
    "isolated",
    "nohz_full",
    "l3_groups",
    "notes",
]
PCI_FIELDS = ("address", "numa_node", "class", "vendor", "device", "driver", "local_cpus")
# How many devices of each recorded tree have a path: every device of the trees
# whose /sys/bus/pci/devices holds links; hwloc's older recordings keep no PCI.
WITH_PATH = {
    "sysfs/144arm-2pa72co+32gpumem-gb200like.tar.bz2": 8,
    "sysfs/256intel64-64n2co2t-sgiuvlike.tar.bz2": 16,
    "sysfs/32intel64-2p8co2t+8ve.tar.bz2": 28,
    "sysfs/devmachine-2c1n.tar.gz": 6,
    "hwloc-more/2pa-pcidomain32bits.tar.bz2": 9,
    "hwloc-more/32em64t-2n8c+dax+nvme+mic+dimms.tar.bz2": 137,
    "hwloc-more/40intel64-4n10c+pci-conflicts.tar.bz2": 3,
    "hwloc-more/fakepcilocalities.tar.bz2": 30,
}


def _before_fields(topo: Topology) -> str:
    data = to_json(topo)
    kept = {k: data[k] for k in TOP_FIELDS}
    pci = data["pci"]
    assert isinstance(pci, list)
    kept["pci"] = [{k: d[k] for k in PCI_FIELDS} for d in pci]
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("key", sorted(BEFORE))
def test_recorded_trees_discover_as_before_but_for_path(key: str) -> None:
    topo = discover(ArchiveFS(REPO / "fixtures" / key))
    assert _before_fields(topo) == BEFORE[key]
    assert sum(1 for d in topo.pci_devices if d.path) == WITH_PATH.get(key, 0)


def test_every_recorded_archive_is_compared() -> None:
    archives = {
        f"{d}/{a.name}"
        for d in ("sysfs", "hwloc-more")
        for a in (REPO / "fixtures" / d).glob("*.tar.*")
        if "dgxlike" not in a.name  # made after 5555434, with paths from the start
    }
    assert archives == set(BEFORE)


def test_a_recorded_pcie_switch() -> None:
    """32intel64-2p8co2t+8ve: a NIC and four vector engines below one PLX switch."""
    topo = discover(ArchiveFS(REPO / "fixtures/sysfs/32intel64-2p8co2t+8ve.tar.bz2"))
    path = {d.address: d.path for d in topo.pci_devices}
    assert path["0000:1a:00.0"] == ("pci0000:17", "0000:17:00.0", "0000:18:00.0", "0000:19:04.0")
    assert path["0000:17:00.0"] == ("pci0000:17",)
    assert path["0000:60:00.1"] == ("pci0000:5d", "0000:5d:02.0", "0000:5e:00.0", "0000:5f:03.0")


# -- scratch trees ---------------------------------------------------------------------


def _machine(root: Path) -> None:
    """The least discovery takes: one online CPU in node 0."""
    for name, text in {
        "sys/devices/system/cpu/online": "0\n",
        "sys/devices/system/cpu/cpu0/topology/physical_package_id": "0\n",
        "sys/devices/system/node/online": "0\n",
        "sys/devices/system/node/node0/cpulist": "0\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "sys/bus/pci/devices").mkdir(parents=True)


def _device(root: Path, place: str, link: str | None = None) -> None:
    """A device at ``place`` under root; /sys/bus/pci/devices/ADDR links to it
    (with ``link`` as the target text, else relative as the kernel writes it)."""
    where = root / place.lstrip("/")
    where.mkdir(parents=True, exist_ok=True)
    (where / "numa_node").write_text("0\n")
    entry = root / "sys/bus/pci/devices" / where.name
    entry.symlink_to(link or os.path.relpath(where, entry.parent))


def test_the_link_gives_the_path_from_the_host_bridge(tmp_path: Path) -> None:
    _machine(tmp_path)
    _device(tmp_path, "sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:01.0/0000:1a:00.0")
    _device(tmp_path, "sys/devices/pci0000:17/0000:17:00.0")
    path = {d.address: d.path for d in discover(HostFS(tmp_path)).pci_devices}
    assert path == {
        "0000:1a:00.0": ("pci0000:17", "0000:17:00.0", "0000:18:00.0", "0000:19:01.0"),
        "0000:17:00.0": ("pci0000:17",),
    }


def test_only_pci_entries_from_the_first_host_bridge(tmp_path: Path) -> None:
    """A Hyper-V guest's devices sit below VMBus directories; those are not PCI."""
    _machine(tmp_path)
    vmbus = "sys/devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0004:00/VMBUS:00/7b2f6a3e-0001"
    _device(tmp_path, f"{vmbus}/pci7b2f:00/7b2f:00:02.0")
    (device,) = discover(HostFS(tmp_path)).pci_devices
    assert device.path == ("pci7b2f:00",)


def test_an_absolute_link_stays_inside_the_root(tmp_path: Path) -> None:
    _machine(tmp_path)
    _device(
        tmp_path,
        "sys/devices/pci0000:00/0000:00:03.0",
        link="/sys/devices/pci0000:00/0000:00:03.0",
    )
    (device,) = discover(HostFS(tmp_path)).pci_devices
    assert device.path == ("pci0000:00",)
    assert device.numa_node == 0  # read through the same link, inside the root


def test_a_plain_directory_has_no_path_and_changes_nothing(tmp_path: Path) -> None:
    _machine(tmp_path)
    plain = tmp_path / "sys/bus/pci/devices/0000:00:03.0"
    plain.mkdir()
    (plain / "numa_node").write_text("0\n")
    topo = discover(HostFS(tmp_path))
    (device,) = topo.pci_devices
    assert device.path == ()
    assert device.numa_node == 0
    assert topo.notes == ()
