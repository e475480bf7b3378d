"""Drift: a cpuset rewritten behind numad's back is repaired, counted, and not fought forever."""

from __future__ import annotations

import json
from pathlib import Path

from numad.cpuset import CPUSet
from numad.daemon.root import Daemon
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
