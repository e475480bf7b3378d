"""Host isolation inside the managed roots: a cgroup there that is no workload's runs
only on the shared pool (and reserved CPUs), never on an exclusive CPU, and gets every
CPU back when numad stops. On the recorded 2-socket machine with a scratch v2 tree."""

from __future__ import annotations

import json
from pathlib import Path

from numad.cpuset import CPUSet
from numad.daemon import Daemon
from numad.scratch import scratch_mkdir
from tests.conftest import Machines, recorded_daemon


def _tree(daemon: Daemon) -> Path:
    return Path(str(daemon.fs.root)) / "sys/fs/cgroup"


def _cpus(daemon: Daemon, path: str) -> CPUSet:
    return CPUSet.parse_list((_tree(daemon) / path / "cpuset.cpus").read_text())


def _admit(daemon: Daemon, spec: dict[str, object]) -> None:
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted


def test_a_cgroup_that_is_no_workloads_never_runs_on_exclusive_cpus(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    for path in ("numad.slice/stray", "numad.slice/stray/child", "numad.slice/pod/sidecar"):
        scratch_mkdir(_tree(daemon), path)
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    _admit(
        daemon,
        {
            "name": "pod",
            "cgroup": "numad.slice/pod",
            "containers": [{"name": "main", "cgroup": "main", "cpus": 4}],
        },
    )
    scratch_mkdir(_tree(daemon), "numad.slice/pod/main")
    scratch_mkdir(_tree(daemon), "numad.slice/db/runtime-child")  # inside a workload
    daemon.reconcile()  # new cgroups are isolated as they appear
    exclusive = CPUSet.from_bits(daemon.books.cpu.exclusive)
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    for path in ("numad.slice/stray", "numad.slice/stray/child", "numad.slice/pod/sidecar"):
        assert _cpus(daemon, path) == pool, path
        assert not _cpus(daemon, path) & exclusive
    assert _cpus(daemon, "numad.slice/pod") == CPUSet()  # above a workload: untouched
    assert _cpus(daemon, "numad.slice/db/runtime-child") == CPUSet()  # db's own business
    assert "numad.slice/stray" in daemon.others
    daemon.release("db")  # the pool grows: so do the isolated cgroups
    assert _cpus(daemon, "numad.slice/stray") == CPUSet.from_bits(daemon.books.cpu.shared_pool)


def test_a_cgroup_admitted_later_is_no_longer_isolated(machines: Machines, tmp_path: Path) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    scratch_mkdir(_tree(daemon), "numad.slice/late")
    daemon.reconcile()
    assert "numad.slice/late" in daemon.others
    _admit(daemon, {"name": "late", "cgroup": "numad.slice/late", "cpus": 4})
    held = CPUSet.from_bits(daemon.books.cpu.assignments[("late", "main")])
    assert _cpus(daemon, "numad.slice/late") == held
    daemon.reconcile()
    assert "numad.slice/late" not in daemon.others


def test_stopping_gives_every_cpu_back(machines: Machines, tmp_path: Path) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    scratch_mkdir(_tree(daemon), "numad.slice/stray")
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    daemon.reconcile()
    assert _cpus(daemon, "numad.slice/stray")
    daemon.stop()
    assert _cpus(daemon, "numad.slice/stray") == CPUSet()  # inherits its parent's again
    daemon.reconcile()  # a pass that was waiting for the lock changes nothing
    assert _cpus(daemon, "numad.slice/stray") == CPUSet()


def test_isolation_can_be_turned_off(machines: Machines, tmp_path: Path) -> None:
    daemon = recorded_daemon(machines, tmp_path, {"host": {"isolate": False}})
    scratch_mkdir(_tree(daemon), "numad.slice/stray")
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    daemon.reconcile()
    assert _cpus(daemon, "numad.slice/stray") == CPUSet()
    assert daemon.others == set()
