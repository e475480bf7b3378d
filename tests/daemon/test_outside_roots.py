"""A managed root taken out of the config (issue 24 item 11): a workload admitted in
it is neither dropped nor moved onto the shared pool. Its CPUs stay its own, its
cgroups stay as numad last wrote them, health names it and numad is not ready
until it is released or its root is back.

A daemon on the recorded 2-socket machine with a scratch cgroup v2 tree, managing
``numad.slice`` and ``db.slice``; the workload db lives in ``db.slice/x``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from numad.cpuset import CPUSet
from numad.daemon.root import Daemon
from numad.host.cgroup.v2 import CgroupV2Backend
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines, recorded_daemon, restarted_daemon

BOTH = {"paths": {"managed-roots": ["numad.slice", "db.slice"]}}
ONE = {"paths": {"managed-roots": ["numad.slice"]}}
NODE1 = CPUSet.parse_list("8-15,24-31")


def _tree(daemon: Daemon) -> Path:
    return Path(str(daemon.fs.root)) / "sys/fs/cgroup"


def _cpus(daemon: Daemon, path: str, file: str = "cpuset.cpus") -> CPUSet:
    return CPUSet.parse_list((_tree(daemon) / path / file).read_text())


def _admit(daemon: Daemon, name: str, cgroup: str, cpus: int) -> CPUSet | None:
    scratch_mkdir(_tree(daemon), cgroup)
    spec = {"name": name, "cgroup": cgroup, "cpus": cpus}
    outcome = daemon.admit(daemon.parse(json.dumps(spec), "json"))
    return outcome.placements["main"].cpus if outcome.admitted else None


def _behind_numads_back(daemon: Daemon, path: str, cpus: str) -> None:
    top = path.split("/", maxsplit=1)[0]
    CgroupV2Backend(_tree(daemon), [top], emulate_kernel=True).write(
        path, CPUSet.parse_list(cpus), None
    )


def _outside(
    machines: Machines, tmp_path: Path, extra: dict[str, Any] | None = None
) -> tuple[Daemon, CPUSet]:
    """db admitted in db.slice/x; numad restarted with db.slice out of the config."""
    daemon = recorded_daemon(machines, tmp_path, {**BOTH, **(extra or {})})
    placed = _admit(daemon, "db", "db.slice/x", 4)
    assert placed is not None
    daemon.reconcile()
    assert _cpus(daemon, "db.slice/x", "cpuset.cpus.effective") == placed
    daemon.stop()
    return restarted_daemon(daemon, {**ONE, **(extra or {})}), placed


def test_a_workload_whose_root_left_the_config_keeps_its_cpus_and_makes_numad_not_ready(
    machines: Machines, tmp_path: Path
) -> None:
    again, placed = _outside(machines, tmp_path)
    assert not again.ready
    (problem,) = again.problems
    assert problem.startswith(
        "workload db: its cgroup db.slice/x is outside [paths] managed-roots (numad.slice);"
        f" numad keeps its exclusive cpus {placed.format_list()}"
    ), problem
    assert "release it (numad release db) or add its root back" in problem
    shown = again.show("db")
    assert shown["state"] == "outside"
    assert "outside [paths] managed-roots" in shown["outside"]
    assert shown["containers"]["main"]["cpus"] == placed.format_list()
    # It still runs on its own CPUs: db.slice, isolated now, keeps them beside the pool.
    assert _cpus(again, "db.slice/x", "cpuset.cpus.effective") == placed
    assert placed.issubset(_cpus(again, "db.slice"))
    # Nothing else is given them: node 1 whole, then the rest of node 0, then nothing.
    assert _admit(again, "a", "numad.slice/a", 16) == NODE1
    rest = _admit(again, "b", "numad.slice/b", 10)
    assert rest is not None
    assert not rest & placed
    assert _admit(again, "c", "numad.slice/c", 1) is None
    assert not placed & CPUSet.from_bits(again.books.cpu.shared_pool)
    again.reconcile()
    assert placed.issubset(_cpus(again, "db.slice"))
    assert _cpus(again, "db.slice/x", "cpuset.cpus.effective") == placed
    # numad writes its cgroup no more: a change made there is not repaired.
    _behind_numads_back(again, "db.slice/x", "1")
    again.reconcile()
    assert _cpus(again, "db.slice/x") == CPUSet.parse_list("1")
    # SIGHUP re-reads the workloads directory only: nothing changes.
    again.reload_workloads()
    assert not again.ready
    assert again.show("db")["state"] == "outside"


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "isolation-off"])
def test_releasing_it_frees_its_cpus_and_numad_is_ready(
    machines: Machines, tmp_path: Path, isolate: bool
) -> None:
    """Released, its cgroup is given the shared pool (its processes leave the CPUs
    handed out next), also with isolation off, where nothing else reaches db.slice."""
    again, placed = _outside(machines, tmp_path, {"host": {"isolate": isolate}})
    again.release("db")
    assert again.ready
    assert again.problems == []
    pool = CPUSet.from_bits(again.books.cpu.shared_pool)
    assert placed.issubset(pool)
    assert _cpus(again, "db.slice/x") == pool
    assert _admit(again, "a", "numad.slice/a", 16) == NODE1
    rest = _admit(again, "b", "numad.slice/b", 14)
    assert rest == pool - NODE1 - CPUSet.parse_list("0,16")
    again.reconcile()
    assert again.problems == []  # both granted: db.slice/x holds none of their CPUs
    assert _cpus(again, "numad.slice/b", "cpuset.cpus.effective") == rest
    assert not _cpus(again, "db.slice/x", "cpuset.cpus.effective") & placed


def test_adding_its_root_back_manages_it_again_with_the_same_cpus(
    machines: Machines, tmp_path: Path
) -> None:
    again, placed = _outside(machines, tmp_path)
    again.stop()
    back = restarted_daemon(again, BOTH)
    assert back.ready
    assert back.problems == []
    assert back.show("db")["state"] != "outside"
    assert back.show("db")["containers"]["main"]["cpus"] == placed.format_list()
    assert _cpus(back, "db.slice") == CPUSet()  # a managed root again: its own setting back
    assert _cpus(back, "db.slice/x", "cpuset.cpus.effective") == placed
    _behind_numads_back(back, "db.slice/x", "1")
    back.reconcile()
    assert _cpus(back, "db.slice/x") == placed  # numad's again: drift repaired
