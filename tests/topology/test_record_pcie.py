"""record-fixture keeps a machine's PCIe tree: the links of /sys/bus/pci/devices and
the /sys/devices/pci* directories they lead through, so a recording replays each
device's path (numad.topology.record)."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from numad.hostfs import HostFS
from numad.topology.discover import discover
from numad.topology.record import load_fixture, record_fixture

GPU = "sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:00.0/0000:1a:00.0"
NIC = "sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:01.0/0000:1b:00.0"
BARE = "sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0"  # no attribute discovery reads


def _host(root: Path) -> None:
    for name, text in {
        "sys/devices/system/cpu/online": "0-1\n",
        "sys/devices/system/cpu/cpu0/topology/physical_package_id": "0\n",
        "sys/devices/system/cpu/cpu1/topology/physical_package_id": "0\n",
        "sys/devices/system/node/online": "0\n",
        "sys/devices/system/node/node0/cpulist": "0-1\n",
        f"{GPU}/numa_node": "0\n",
        f"{GPU}/class": "0x030200\n",
        f"{GPU}/local_cpulist": "0\n",
        f"{GPU}/resource": "never read\n",
        f"{NIC}/numa_node": "0\n",
        f"{NIC}/class": "0x020700\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / BARE).mkdir(parents=True)
    devices = root / "sys/bus/pci/devices"
    devices.mkdir(parents=True)
    for place in (GPU, NIC, BARE):
        target = root / place
        (devices / target.name).symlink_to(os.path.relpath(target, devices))


def test_a_recording_replays_the_pcie_tree(tmp_path: Path) -> None:
    _host(tmp_path / "host")
    fs = HostFS(tmp_path / "host", record=True)
    topo = discover(fs)
    assert {d.address: len(d.path) for d in topo.pci_devices} == {
        "0000:1a:00.0": 4,
        "0000:1b:00.0": 4,
        "0000:81:00.0": 2,
    }
    archive = tmp_path / "host.tar.gz"
    record_fixture(fs, archive)
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
    link = members["host/sys/bus/pci/devices/0000:1a:00.0"]
    assert link.issym()
    assert link.linkname == f"../../../{GPU.removeprefix('sys/')}"
    assert members[f"host/{BARE}"].isdir()  # led to, never read in: kept, empty
    assert members["host/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0"].isdir()
    assert f"host/{GPU}/resource" not in members  # only what discovery read
    replayed = discover(HostFS(load_fixture(archive, tmp_path / "replay")))
    assert replayed == topo
    assert [d.path for d in replayed.pci_devices] == [d.path for d in topo.pci_devices]
