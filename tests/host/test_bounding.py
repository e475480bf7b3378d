"""The cgroups around one numad gives back or isolates anew (cgroup v2): a cgroup
isolated as a stray bounds every cgroup below it, so the order of the writes is
what keeps those below off the exclusive CPUs. Each test watches every cgroup write
numad makes (the emulated kernel's effective sets after each) and injects the
faults that could break the order: a write that fails, a restart, a workload's
cgroup gone and made again. On the recorded 2-socket machine with a scratch v2 tree.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from numad.cpuset import CPUSet, NodeSet
from numad.daemon.root import Daemon
from numad.errors import CgroupError
from numad.host.cgroup.v2 import CgroupV2Backend
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines, recorded_daemon, restarted_daemon
from tests.host.test_isolation import _admit, _cpus, _effective, _tree, _watch_every_write


def _failing(daemon: Daemon, monkeypatch: pytest.MonkeyPatch, path: str) -> list[bool]:
    """Every write of ``path``'s cpuset fails (EBUSY) while the returned flag is set."""
    backend = daemon.isolation.cgroups
    real = backend.write
    failing = [True]

    def write(target: str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        if failing[0] and str(target) == path:
            raise CgroupError(path, "cannot write cpuset.cpus: injected EBUSY")
        real(target, cpus, mems)

    monkeypatch.setattr(backend, "write", write)
    return failing


def test_a_stray_that_cannot_be_written_keeps_the_cgroup_above_it_isolated(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workload admitted in a pod below ``kubepods``, which numad isolated: the other
    pod must hold the pool before ``kubepods`` gets its own setting back. Its write
    fails: ``kubepods`` stays isolated (health says why), the workload runs within the
    pool meanwhile, and no stray runs on an exclusive CPU at any write. Once the write
    goes through, the next pass gives ``kubepods`` back."""
    daemon = recorded_daemon(machines, tmp_path)
    for path in ("kubepods/pod0/c0", "kubepods/pod1/c0", "kubepods/pod1/c1"):
        scratch_mkdir(_tree(daemon), f"numad.slice/{path}")
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    daemon.reconcile()
    assert "numad.slice/kubepods" in daemon.others
    failing = _failing(daemon, monkeypatch, "numad.slice/kubepods/pod0")
    strays = ["numad.slice/kubepods/pod0", "numad.slice/kubepods/pod0/c0"]
    breaches = _watch_every_write(daemon, monkeypatch, strays, "numad.slice/db")
    _admit(daemon, {"name": "c1", "cgroup": "numad.slice/kubepods/pod1/c1", "cpus": 4})
    assert not breaches, breaches
    assert "numad.slice/kubepods" in daemon.others  # kept: the pod below is not written
    assert daemon.health.has("bounding:numad.slice/kubepods")
    said = [p for p in daemon.problems if p.startswith("numad.slice/kubepods: still isolated")]
    assert said, daemon.problems
    assert "numad.slice/kubepods/pod0, around it" in said[0]
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert not _effective(daemon, "numad.slice/kubepods/pod0/c0") - pool
    assert not _effective(daemon, "numad.slice/kubepods/pod1/c1") - pool  # within, meanwhile
    failing[0] = False
    daemon.reconcile()
    assert not breaches, breaches
    assert "numad.slice/kubepods" not in daemon.others
    assert not daemon.health.has("bounding:numad.slice/kubepods")
    assert _cpus(daemon, "numad.slice/kubepods/pod0") == pool
    grant = CPUSet.from_bits(daemon.books.cpu.assignments[("c1", "main")])
    assert _effective(daemon, "numad.slice/kubepods/pod1/c1") == grant


def test_a_cgroup_above_a_workloads_cgroup_that_is_gone_is_isolated_until_it_is_back(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's container cgroup goes (its workload is held through the release grace)
    and the pod's cgroup is made again, empty: whatever runs in it meanwhile stays on
    the pool, from the event its mkdir raises. When the container's cgroup is back,
    the pod gets its own setting back at that event, its sidecar written first."""
    daemon = recorded_daemon(machines, tmp_path)
    scratch_mkdir(_tree(daemon), "numad.slice/pod/c")
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    _admit(daemon, {"name": "c", "cgroup": "numad.slice/pod/c", "cpus": 2})
    daemon.reconcile()
    assert "numad.slice/pod" not in daemon.others
    shutil.rmtree(_tree(daemon) / "numad.slice/pod")
    scratch_mkdir(_tree(daemon), "numad.slice/pod")  # made again, its container not yet
    daemon.isolate_new(["numad.slice/pod"])
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert "numad.slice/pod" in daemon.others
    assert _cpus(daemon, "numad.slice/pod") == pool
    daemon.reconcile()  # within the grace: held, and the pod still isolated
    assert "c" in daemon.specs
    assert "numad.slice/pod" in daemon.others
    breaches = _watch_every_write(
        daemon, monkeypatch, ["numad.slice/pod/sidecar"], "numad.slice/db"
    )
    for path in ("numad.slice/pod/sidecar", "numad.slice/pod/c"):
        scratch_mkdir(_tree(daemon), path)
    daemon.isolate_new(["numad.slice/pod/sidecar", "numad.slice/pod/c"])
    assert not breaches, breaches
    assert "numad.slice/pod" not in daemon.others
    assert "numad.slice/pod/sidecar" in daemon.others
    assert _cpus(daemon, "numad.slice/pod") == CPUSet()  # its own, given back
    daemon.reconcile()
    assert not breaches, breaches
    grant = CPUSet.from_bits(daemon.books.cpu.assignments[("c", "main")])
    assert _effective(daemon, "numad.slice/pod/c") == grant


def test_after_a_restart_a_stray_above_cgroups_isolated_before_is_written_before_theirs(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """numad isolated ``x/inner`` while ``x`` was above a workload; it is killed, and
    the workload's cgroup goes meanwhile. The next numad knows ``x/inner`` from its
    record only: ``x`` is a stray now and bounds it, so ``x`` holds the pool before
    ``x/inner`` gets its own setting back, at no write running on an exclusive CPU."""
    daemon = recorded_daemon(machines, tmp_path)
    scratch_mkdir(_tree(daemon), "numad.slice/x/w")
    scratch_mkdir(_tree(daemon), "numad.slice/x/inner")
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    _admit(daemon, {"name": "w", "cgroup": "numad.slice/x/w", "cpus": 2})
    daemon.reconcile()
    assert "numad.slice/x/inner" in daemon.others
    shutil.rmtree(_tree(daemon) / "numad.slice/x/w")  # while numad is down
    db = CPUSet.from_bits(daemon.books.cpu.assignments[("db", "main")])
    breaches: list[str] = []
    real = CgroupV2Backend.write

    def write(self: CgroupV2Backend, path: str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        real(self, path, cpus, mems)
        if (
            _effective(daemon, "numad.slice/db") == db
            and _effective(daemon, "numad.slice/x/inner") & db
        ):
            breaches.append(f"after writing {path}: {_effective(daemon, 'numad.slice/x/inner')}")

    monkeypatch.setattr(CgroupV2Backend, "write", write)
    new = restarted_daemon(daemon)
    assert not breaches, breaches
    assert "numad.slice/x" in new.others
    assert "numad.slice/x/inner" not in new.others
    assert _cpus(new, "numad.slice/x/inner") == CPUSet()  # its own, given back
    assert _effective(new, "numad.slice/x/inner") == CPUSet.from_bits(new.books.cpu.shared_pool)


def test_a_workload_released_after_its_cgroup_went_leaves_the_cgroup_above_it_isolated(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``x/v``'s and ``x/w``'s cgroups go, so ``x`` is a stray again and isolated; then
    ``v`` is released (its grace over, or by the API) while ``w`` is still held. The
    release gives ``x`` nothing back: at no write does ``x`` run on another
    workload's exclusive CPUs (before 2026-12-05 it was given back, as if ``v``
    were being admitted)."""
    daemon = recorded_daemon(machines, tmp_path)
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    for name in ("v", "w"):
        scratch_mkdir(_tree(daemon), f"numad.slice/x/{name}")
        _admit(daemon, {"name": name, "cgroup": f"numad.slice/x/{name}", "cpus": 2})
    daemon.reconcile()
    for name in ("v", "w"):
        shutil.rmtree(_tree(daemon) / f"numad.slice/x/{name}")
    daemon.reconcile()
    assert "numad.slice/x" in daemon.others
    breaches = _watch_every_write(daemon, monkeypatch, ["numad.slice/x"], "numad.slice/db")
    daemon.release("v")
    daemon.reconcile()
    assert not breaches, breaches
    assert "w" in daemon.specs
    assert "numad.slice/x" in daemon.others
    assert _cpus(daemon, "numad.slice/x") == CPUSet.from_bits(daemon.books.cpu.shared_pool)
