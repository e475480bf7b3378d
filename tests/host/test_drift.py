"""Drift: a cpuset rewritten behind numad's back is repaired, counted, and not fought forever."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from numad.cpuset import CPUSet
from numad.daemon.root import Daemon
from numad.host.cgroup.v2 import CgroupV2Backend
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines, recorded_daemon

MACHINE = "32intel64-2p8co2t+8ve"


def _daemon(machines: Machines, tmp_path: Path) -> Daemon:
    daemon = recorded_daemon(machines, tmp_path)
    spec = {"name": "db", "cgroup": "numad.slice/db", "cpus": 4}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
    return daemon


def _cpus(daemon: Daemon) -> Path:
    return Path(str(daemon.fs.root)) / "sys/fs/cgroup/numad.slice/db/cpuset.cpus"


def test_drift_is_repaired_and_counted(machines: Machines, tmp_path: Path) -> None:
    daemon = _daemon(machines, tmp_path)
    wanted = _cpus(daemon).read_text()
    daemon.reconcile()
    assert daemon.metrics.registry.get_sample_value("numad_drift_repairs_total") == 0
    _cpus(daemon).write_text("1-31\n")  # another writer
    daemon.reconcile()
    assert _cpus(daemon).read_text() == wanted
    assert daemon.metrics.registry.get_sample_value("numad_drift_repairs_total") == 1


def test_a_cgroup_that_keeps_drifting_is_repaired_less_often(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = _daemon(machines, tmp_path)
    wanted = CPUSet.parse_list(_cpus(daemon).read_text())
    repaired = []
    for _ in range(12):
        _cpus(daemon).write_text("1-31\n")  # the other writer wins every time
        daemon.reconcile()
        repaired.append(CPUSet.parse_list(_cpus(daemon).read_text()) == wanted)
    # Three repairs in a row, then back off: 2, then 4, then 8 passes between repairs.
    t, f = True, False
    assert repaired == [t, t, t, f, t, f, f, f, t, f, f, f]
    assert daemon.metrics.registry.get_sample_value("numad_drift_repairs_total") == 5


def test_pinned_memory_drift_is_repaired_and_a_strays_memory_is_not_read(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass reads cpuset.mems only where numad holds the memory (half the reads of a
    busy host's pass): a workload's pinned mems rewritten by another is repaired; a
    stray's (numad writes only its CPUs) is neither read nor written."""
    daemon = recorded_daemon(machines, tmp_path, {"memory": {"policy": "static"}})
    spec = {"name": "db", "cgroup": "numad.slice/db", "cpus": 4, "memory": "1Gi"}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    scratch_mkdir(tree, "numad.slice/stray")
    daemon.reconcile()  # the stray isolated: its CPUs written, its memory left alone
    mems, stray = tree / "numad.slice/db/cpuset.mems", tree / "numad.slice/stray/cpuset.mems"
    wanted = mems.read_text()
    assert wanted.strip() in ("0", "1"), "the test needs memory numad pinned"
    mems.write_text("0-1\n")  # another writer
    stray.write_text("1\n")  # the stray's own, not numad's
    reads: list[tuple[str, bool]] = []
    read = CgroupV2Backend.read

    def spied(backend: CgroupV2Backend, path: str, *, mems: bool = True) -> object:
        reads.append((str(path), mems))
        return read(backend, path, mems=mems)

    monkeypatch.setattr(CgroupV2Backend, "read", spied)
    daemon.reconcile()
    assert mems.read_text() == wanted
    assert stray.read_text() == "1\n"
    assert ("numad.slice/db", True) in reads
    assert ("numad.slice/stray", False) in reads
    assert ("numad.slice/stray", True) not in reads
