"""Host isolation inside the managed roots: a cgroup there that is no workload's runs
only on the shared pool (and reserved CPUs), never on an exclusive CPU, and gets every
CPU back when numad stops. On the recorded 2-socket machine with a scratch v2 tree."""

from __future__ import annotations

import json
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import pytest

import numad.daemon.others as others_module
from numad.cpuset import CPUSet, NodeSet
from numad.daemon.root import Daemon
from numad.errors import CgroupError
from numad.host.cgroup import detect_backend
from numad.host.cgroup.v2 import CgroupV2Backend
from numad.host.scratch import make_scratch_v1, scratch_mkdir
from numad.host.systemd_bus import SystemdError
from numad.host.unmovable import unmovable
from tests.conftest import Machines, recorded_daemon, restarted_daemon


def _tree(daemon: Daemon) -> Path:
    return Path(str(daemon.fs.root)) / "sys/fs/cgroup"


def _cpus(daemon: Daemon, path: str) -> CPUSet:
    return CPUSet.parse_list((_tree(daemon) / path / "cpuset.cpus").read_text())


def _effective(daemon: Daemon, path: str) -> CPUSet:
    """The CPUs the (emulated) kernel lets the cgroup's processes run on."""
    return CPUSet.parse_list((_tree(daemon) / path / "cpuset.cpus.effective").read_text())


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
        assert _effective(daemon, path) == pool, path
        assert not _effective(daemon, path) & exclusive
    for path in ("numad.slice/stray", "numad.slice/pod/sidecar"):
        assert _cpus(daemon, path) == pool, path
    # cgroup v2: below an isolated cgroup, bounded by it, and not written (nor one made later)
    assert _cpus(daemon, "numad.slice/stray/child") == CPUSet()
    scratch_mkdir(_tree(daemon), "numad.slice/stray/child/later")
    daemon.isolate_new(["numad.slice/stray/child/later"])  # the event its mkdir raises
    assert _cpus(daemon, "numad.slice/stray/child/later") == CPUSet()
    daemon.reconcile()
    assert _cpus(daemon, "numad.slice/stray/child/later") == CPUSet()
    assert _effective(daemon, "numad.slice/stray/child/later") == pool
    assert _cpus(daemon, "numad.slice/pod") == CPUSet()  # above a workload: untouched
    assert _cpus(daemon, "numad.slice/db/runtime-child") == CPUSet()  # db's own business
    assert {"numad.slice/stray", "numad.slice/pod/sidecar"} <= daemon.others
    assert not {p for p in daemon.others if p.startswith("numad.slice/stray/")}
    daemon.release("db")  # the pool grows: so do the isolated cgroups, and those below
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert _cpus(daemon, "numad.slice/stray") == pool
    assert _effective(daemon, "numad.slice/stray/child/later") == pool


def _watch_every_write(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, strays: list[str], held: str
) -> list[str]:
    """After each cgroup write numad makes, what each of ``strays`` runs on (the emulated
    kernel's effective set) must hold none of the exclusive CPUs that ``held`` holds in
    effect then; each breach is returned, named by the write that made it."""
    backend = daemon.isolation.cgroups
    real = backend.write
    breaches: list[str] = []

    def write(path: str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        real(path, cpus, mems)
        exclusive = _effective(daemon, held) & CPUSet.from_bits(daemon.books.cpu.exclusive)
        for stray in strays:
            if (_tree(daemon) / stray).is_dir() and _effective(daemon, stray) & exclusive:
                breaches.append(f"after writing {path}: {stray} on {_effective(daemon, stray)}")

    monkeypatch.setattr(backend, "write", write)
    return breaches


def test_admitted_below_an_isolated_cgroup_the_strays_beside_it_are_bounded_first(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workload admitted in a pod below ``kubepods``, which numad isolated (it bounded
    every pod): ``kubepods`` is above a workload now and gets its own setting back, so
    the other pods, and the pod's other container, are written first, at no instant
    running on the exclusive CPUs of another workload (cgroup v2)."""
    daemon = recorded_daemon(machines, tmp_path)
    strays = ["kubepods/pod0/c0", "kubepods/pod1/c0", "kubepods/pod1/c1"]
    for path in strays:
        scratch_mkdir(_tree(daemon), f"numad.slice/{path}")
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    daemon.reconcile()
    assert "numad.slice/kubepods" in daemon.others
    assert not {p for p in daemon.others if p.startswith("numad.slice/kubepods/")}
    others = ["numad.slice/kubepods/pod0", "numad.slice/kubepods/pod0/c0"]
    others += ["numad.slice/kubepods/pod1/c0"]
    breaches = _watch_every_write(daemon, monkeypatch, others, "numad.slice/db")
    _admit(daemon, {"name": "c1", "cgroup": "numad.slice/kubepods/pod1/c1", "cpus": 4})
    assert not breaches, breaches
    assert {"numad.slice/kubepods/pod0", "numad.slice/kubepods/pod1/c0"} <= daemon.others
    assert "numad.slice/kubepods" not in daemon.others
    assert _cpus(daemon, "numad.slice/kubepods") == CPUSet()  # its own, given back
    exclusive = CPUSet.from_bits(daemon.books.cpu.exclusive)
    for path in others:
        assert not _effective(daemon, path) & exclusive, path
    daemon.reconcile()  # the pass agrees
    assert {"numad.slice/kubepods/pod0", "numad.slice/kubepods/pod1/c0"} <= daemon.others
    assert not breaches, breaches


def test_a_workloads_cgroup_made_again_below_an_isolated_one_is_bounded_before_it_is_given_back(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``x`` bounded ``early``'s cgroup, which went: ``x`` is a stray again, isolated.
    ``early``'s cgroup is made again, and before a pass or its event sees it, ``late``
    is admitted below ``x`` too: ``x`` gets its own (empty) setting back, every CPU.
    ``early``'s new cgroup, whose file is empty (``x``'s CPUs), is written first, at no
    instant running on ``db``'s exclusive CPUs (found by the fault campaign, seed 43)."""
    daemon = recorded_daemon(machines, tmp_path)
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    early = "numad.slice/x/early"
    scratch_mkdir(_tree(daemon), early)
    _admit(daemon, {"name": "early", "cgroup": early, "cpus": 2})
    daemon.reconcile()  # seen
    shutil.rmtree(_tree(daemon) / early)
    daemon.reconcile()  # gone: held through the release grace; x is a stray again
    assert "numad.slice/x" in daemon.others
    scratch_mkdir(_tree(daemon), early)  # no pass, no event yet
    breaches = _watch_every_write(daemon, monkeypatch, [early], "numad.slice/db")
    scratch_mkdir(_tree(daemon), "numad.slice/x/late")
    _admit(daemon, {"name": "late", "cgroup": "numad.slice/x/late", "cpus": 2})
    assert not breaches, breaches
    assert "numad.slice/x" not in daemon.others
    assert _cpus(daemon, "numad.slice/x") == CPUSet()  # its own, given back
    mine = CPUSet.from_bits(daemon.books.cpu.assignments["early", "main"])
    assert _effective(daemon, early) == mine  # its own grant, in the same change


def test_after_an_upgrade_the_cgroups_an_older_numad_wrote_below_a_stray_are_given_back(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A numad before 2026-12-05 wrote every stray, nested ones too, and was killed. The
    next keeps only the outermost isolated: those below get their own setting back at
    its first pass (two levels down too), after the outermost one holds the pool."""
    daemon = recorded_daemon(machines, tmp_path)
    nested = ["numad.slice/pod", "numad.slice/pod/c", "numad.slice/pod/c/inner"]
    for path in nested:
        scratch_mkdir(_tree(daemon), path)
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    with monkeypatch.context() as old:  # every level isolated, as before
        old.setattr(others_module, "outermost", lambda paths, isolated=(): set(paths))
        daemon.reconcile()
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert [_cpus(daemon, p) for p in nested] == [pool] * 3
    new = restarted_daemon(daemon)  # killed: nothing given back; the record says what
    assert new.others >= {"numad.slice/pod"}
    assert not {p for p in new.others if p.startswith("numad.slice/pod/")}
    assert _cpus(new, "numad.slice/pod") == pool
    assert _cpus(new, "numad.slice/pod/c") == CPUSet()
    assert _cpus(new, "numad.slice/pod/c/inner") == CPUSet()
    assert _effective(new, "numad.slice/pod/c/inner") == pool


def test_on_cgroup_v1_every_cgroup_below_an_isolated_one_is_written_too(
    machines: Machines, tmp_path: Path
) -> None:
    """cgroup v1 checks a child's cpuset.cpus against its parent's (and a v1 cgroup
    with no CPUs of its own takes no task): every level is written, deepest first."""
    daemon = recorded_daemon(machines, tmp_path)
    daemon.stop()
    root = Path(str(daemon.fs.root))
    tree = root / "sys/fs/cgroup"
    online = CPUSet.from_bits(daemon.books.cpu.shared_pool | daemon.books.cpu.exclusive)
    shutil.rmtree(tree)
    nested = ["numad.slice/stray", "numad.slice/stray/child", "numad.slice/stray/child/leaf"]
    make_scratch_v1(tree, online, NodeSet.parse_list("0-1"), ["numad.slice/db", *nested])
    backend = detect_backend(tree, daemon.config.paths.managed_roots)
    v1 = Daemon(daemon.config, daemon.fs, backend, daemon.state_dir, daemon.log)
    v1.start()
    assert v1.isolation.v1
    _admit(v1, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    pool = CPUSet.from_bits(v1.books.cpu.shared_pool)
    assert set(nested) <= v1.others
    for path in nested:
        assert CPUSet.parse_list((tree / "cpuset" / path / "cpuset.cpus").read_text()) == pool


def test_a_cgroup_isolated_that_comes_to_lie_below_another_gets_its_own_setting_back(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod released: its sidecar, isolated while the pod was above a workload, now lies
    below the pod, which numad isolates; it gets its own (empty) setting back, so it
    follows the pod's as the pool changes (cgroup v2)."""
    daemon = recorded_daemon(machines, tmp_path)
    scratch_mkdir(_tree(daemon), "numad.slice/pod/sidecar")
    main = {"name": "main", "cgroup": "main", "cpus": 4}
    _admit(daemon, {"name": "pod", "cgroup": "numad.slice/pod", "containers": [main]})
    scratch_mkdir(_tree(daemon), "numad.slice/pod/main")
    daemon.reconcile()
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    assert _cpus(daemon, "numad.slice/pod/sidecar") == CPUSet.from_bits(
        daemon.books.cpu.shared_pool
    )
    breaches = _watch_every_write(
        daemon, monkeypatch, ["numad.slice/pod/sidecar"], "numad.slice/db"
    )
    daemon.release("pod")
    daemon.reconcile()
    assert not breaches, breaches  # the pod was written before the sidecar was given back
    assert "numad.slice/pod" in daemon.others
    assert "numad.slice/pod/sidecar" not in daemon.others
    assert _cpus(daemon, "numad.slice/pod/sidecar") == CPUSet()  # its own, given back
    daemon.release("db")  # the pool grows: the sidecar with it, through the pod
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert _cpus(daemon, "numad.slice/pod") == pool
    assert _effective(daemon, "numad.slice/pod/sidecar") == pool
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    exclusive = CPUSet.from_bits(daemon.books.cpu.exclusive)
    assert not _effective(daemon, "numad.slice/pod/sidecar") & exclusive
    daemon.stop()
    assert _cpus(daemon, "numad.slice/pod") == CPUSet()
    assert _cpus(daemon, "numad.slice/pod/sidecar") == CPUSet()


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


# -- the other top-level cgroups --------------------------------------------------------

TOPS = ("system.slice", "user.slice", "init.scope")


def _host_tree(machines: Machines, tmp_path: Path, *, seen: bool = True, **extra: object) -> Daemon:
    """The recorded daemon with top-level cgroups made after it started; ``seen``: and
    isolated, as the next pass does (an admission walks no tree)."""
    daemon = recorded_daemon(machines, tmp_path, dict(extra) or None)
    for path in (*TOPS, "system.slice/sshd.service"):
        scratch_mkdir(_tree(daemon), path)
    if seen:
        daemon.reconcile()
    return daemon


def test_the_other_top_level_cgroups_stay_off_exclusive_cpus(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = _host_tree(machines, tmp_path, seen=False)
    (_tree(daemon) / "user.slice/cpuset.cpus").write_text("0-11")  # the admin's own setting
    daemon.reconcile()
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    exclusive = CPUSet.from_bits(daemon.books.cpu.exclusive)
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert exclusive
    assert pool
    for top in TOPS:
        assert _cpus(daemon, top) == pool, top
        assert daemon.isolation.via(top) == "cgroupfs"
    # A child inherits: v2 never lets it use what its parent has not.
    assert _cpus(daemon, "system.slice/sshd.service") == CPUSet()
    assert "cpuset" in (_tree(daemon) / "cgroup.subtree_control").read_text().split()
    record = json.loads((daemon.state_dir / "isolation.json").read_text())["cgroups"]
    assert record["user.slice"] == {"via": "cgroupfs", "cpus": "0-11"}
    assert record["system.slice"] == {"via": "cgroupfs", "cpus": ""}
    scratch_mkdir(_tree(daemon), "machine.slice")  # a new one is isolated as it appears
    daemon.reconcile()
    assert _cpus(daemon, "machine.slice") == pool
    daemon.stop()
    assert _cpus(daemon, "system.slice") == CPUSet()
    assert _cpus(daemon, "user.slice") == CPUSet.parse_list("0-11")  # as it was, not "all"
    assert _cpus(daemon, "machine.slice") == CPUSet()
    assert json.loads((daemon.state_dir / "isolation.json").read_text())["cgroups"] == {}


def test_a_crashed_numad_leaves_the_record_and_the_next_one_gives_everything_back(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = _host_tree(machines, tmp_path, seen=False)
    (_tree(daemon) / "user.slice/cpuset.cpus").write_text("2-5")
    daemon.reconcile()
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    assert _cpus(daemon, "user.slice") != CPUSet.parse_list("2-5")
    # SIGKILL: no stop. The next numad reads what was the cgroups' own, not its own writes.
    again = restarted_daemon(daemon)
    again.reconcile()
    again.release("db")
    again.stop()
    assert _cpus(again, "user.slice") == CPUSet.parse_list("2-5")
    assert _cpus(again, "system.slice") == CPUSet()


def test_an_unreadable_record_is_kept_aside_and_shown(machines: Machines, tmp_path: Path) -> None:
    daemon = _host_tree(machines, tmp_path)
    daemon.reconcile()
    (daemon.state_dir / "isolation.json").write_text("{not json")
    again = restarted_daemon(daemon)
    assert any("isolation.json: unreadable" in p for p in again.problems)
    assert list(again.state_dir.glob("isolation.json.corrupt.*"))


def test_a_record_that_cannot_be_written_stops_the_change_not_numad(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = _host_tree(machines, tmp_path, seen=False)
    daemon.isolation.state_dir = tmp_path / "file-not-dir"  # every record write fails
    (tmp_path / "file-not-dir").write_text("")
    daemon.reconcile()
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    # The top-level cgroups were not changed (their own setting could not be kept
    # first), and the exclusive set waits: they may still run there.
    assert _cpus(daemon, "system.slice") == CPUSet()
    assert any("cannot keep its own cpuset" in p for p in daemon.problems)
    assert any("not granted yet" in p for p in daemon.problems)


class FakeSystemd:
    """Stands in for systemd's D-Bus API, which this host does not run (the VM tier
    runs the real one): it owns the units it is given and, like systemd, writes
    ``AllowedCPUs=`` into the unit's cgroup, or nothing when ``broken``. Services
    and scopes are transient (as ``systemd-run`` makes them), slices not; like
    systemd, setting a property of a slice that is not running makes its cgroup
    (src/core/dbus-slice.c: its properties' commit realizes the cgroup)."""

    def __init__(self, tree: Path, units: dict[str, str]) -> None:
        self.units = units  # name -> control group
        self.allowed_cpus: dict[str, CPUSet] = {n: CPUSet() for n in units}
        self.allowed_mems: dict[str, NodeSet] = {n: NodeSet() for n in units}
        self.calls: list[tuple[str, str]] = []
        self.tree = tree
        self.broken = False
        self.hurried: float | None = None  # numad stopped: the seconds it gave systemd
        self.stopped: set[str] = set()  # stopped, though the kernel kept the directory
        self.unloaded: set[str] = set()  # stopped and unloaded by systemd's GC
        self.refused: list[str] = []  # what systemd could not write: it logs each
        self.made_again: list[str] = []  # slices whose cgroup a call made when not running

    def unit(self, name: str) -> str | None:
        known = name in self.units and name not in self.unloaded
        return f"/org/freedesktop/systemd1/unit/{name}" if known else None

    def load(self, name: str) -> str:
        if name not in self.units:
            raise SystemdError(name, "systemd cannot load it (LoadState=not-found)")
        self.unloaded.discard(name)
        return f"/org/freedesktop/systemd1/unit/{name}"

    def running(self, name: str) -> bool:
        return name not in self.stopped and (self.tree / self.units[name].lstrip("/")).is_dir()

    def stop(self, name: str, *, unload: bool = False) -> None:
        """A stop whose cgroup the kernel would not remove (busy with exiting tasks):
        the directory stays, and systemd no longer calls it the unit's; ``unload``:
        then systemd's GC unloads the unit, as it does an unreferenced inactive one."""
        self.stopped.add(name)
        if unload:
            self.unloaded.add(name)

    def control_group(self, name: str) -> str | None:
        """As systemd: a unit has a control group only while it runs; asking about
        a unit that is not loaded is an error."""
        if name in self.unloaded:
            raise SystemdError(name, "cannot read ControlGroup: systemd has no such unit loaded")
        return self.units[name] if name in self.units and self.running(name) else None

    def slice(self, name: str) -> str:
        return self.units[name].strip("/").split("/")[-2]

    def hurry(self, seconds: float) -> None:
        self.hurried = seconds

    def transient(self, name: str) -> bool:
        if name in self.unloaded or name not in self.units:
            raise SystemdError(name, "cannot read Transient: systemd has no such unit loaded")
        return not name.endswith(".slice")

    def allowed(self, name: str) -> tuple[CPUSet, NodeSet]:
        if name in self.unloaded:
            raise SystemdError(name, "cannot read AllowedCPUs: systemd has no such unit loaded")
        return self.allowed_cpus[name], self.allowed_mems[name]

    def set_allowed(
        self, name: str, cpus: CPUSet | None, mems: NodeSet | None, *, runtime: bool = True
    ) -> None:
        assert runtime
        assert cpus is not None or mems is not None  # as the bus: None leaves one alone
        if name not in self.units:  # no unit file (a transient unit that ended): NoSuchUnit
            raise SystemdError(name, f"SetUnitProperties failed: Unit {name} not found.")
        self.calls.append((name, cpus.format_list() if cpus is not None else "-"))
        if cpus is not None:
            self.allowed_cpus[name] = cpus
        if mems is not None:
            self.allowed_mems[name] = mems
        self.unloaded.discard(name)  # loaded for the call
        if name.endswith(".slice") and not self.running(name):
            self.made_again.append(name)
            self.start(name)
        if not self.broken and self.running(name):
            self.apply(name, self.allowed_cpus[name], mems)

    def start(self, name: str) -> None:
        """A unit's start: its cgroup made, and what is set applied to it at once."""
        self.stopped.discard(name)
        self.unloaded.discard(name)
        scratch_mkdir(self.tree, self.units[name].lstrip("/"))
        self.apply(name, self.allowed_cpus[name], self.allowed_mems[name] or None)

    def apply(self, name: str, cpus: CPUSet, mems: NodeSet | None) -> None:
        path = self.units[name].lstrip("/")
        try:
            CgroupV2Backend(self.tree, [path], emulate_kernel=True).write(path, cpus, mems)
        except CgroupError as err:  # ENOSPC: systemd logs it and goes on
            self.refused.append(f"{name}: {err}")


def _tell_systemd(daemon: Daemon) -> None:
    """One round of the unit loop (``numad.daemon.loops.unit_loop``), which tells
    systemd off the daemon's lock what numad wrote into its units' cgroups."""
    assert daemon.isolation.record is not None
    daemon.isolation.send()


def _unit_told(machines: Machines, tmp_path: Path, name: str) -> tuple[Daemon, FakeSystemd]:
    """The unit ``name`` in numad.slice, isolated and told the shared pool."""
    daemon = _host_tree(machines, tmp_path)
    fake = FakeSystemd(_tree(daemon), {name: f"/numad.slice/{name}"})
    daemon.isolation.systemd = fake
    scratch_mkdir(_tree(daemon), f"numad.slice/{name}")
    daemon.reconcile()
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    _tell_systemd(daemon)
    assert fake.allowed_cpus[name] == CPUSet.from_bits(daemon.books.cpu.shared_pool)
    return daemon, fake


def _calls_under_lock(daemon: Daemon, fake: FakeSystemd) -> list[bool]:
    """Whether the daemon's lock was held, for each call to systemd from now on."""
    locked: list[bool] = []
    answer = fake.set_allowed

    def watched(name: str, cpus: CPUSet | None, mems: NodeSet | None, **kw: bool) -> None:
        locked.append(daemon.held.lock._depth > 0)  # held by anyone (only this thread runs)
        answer(name, cpus, mems, **kw)

    fake.set_allowed = watched  # type: ignore[method-assign]
    return locked


def test_units_systemd_owns_are_isolated_through_systemd(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = _host_tree(machines, tmp_path)
    units = {"system.slice": "/system.slice", "user.slice": "/user.slice"}
    fake = FakeSystemd(_tree(daemon), units)
    fake.allowed_cpus["user.slice"] = CPUSet.parse_list("0-3")  # set by the admin
    daemon.isolation.systemd = fake
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    daemon.reconcile()
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert _cpus(daemon, "system.slice") == pool  # the kernel has it first, from numad
    assert fake.allowed_cpus["system.slice"] == CPUSet()
    _tell_systemd(daemon)
    assert fake.allowed_cpus["system.slice"] == pool
    assert _cpus(daemon, "system.slice") == pool
    assert daemon.isolation.via("system.slice") == "systemd system.slice"
    assert daemon.isolation.via("init.scope") == "cgroupfs"  # not one of systemd's here
    assert _cpus(daemon, "init.scope") == pool
    daemon.stop()
    assert fake.allowed_cpus == {"system.slice": CPUSet(), "user.slice": CPUSet.parse_list("0-3")}
    assert _cpus(daemon, "init.scope") == CPUSet()


def _system_slice_told(machines: Machines, tmp_path: Path) -> tuple[Daemon, FakeSystemd, CPUSet]:
    """system.slice, with AllowedCPUs=0-23 of its own, told the shared pool by numad."""
    daemon = _host_tree(machines, tmp_path)
    fake = FakeSystemd(_tree(daemon), {"system.slice": "/system.slice"})
    own = CPUSet.parse_list("0-23")
    fake.allowed_cpus["system.slice"] = own  # set by the admin
    daemon.isolation.systemd = fake
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    _tell_systemd(daemon)
    assert fake.allowed_cpus["system.slice"] == CPUSet.from_bits(daemon.books.cpu.shared_pool)
    return daemon, fake, own


def test_a_unit_told_before_a_crash_gets_its_own_setting_back_from_the_next_numad(
    machines: Machines, tmp_path: Path
) -> None:
    daemon, fake, own = _system_slice_told(machines, tmp_path)
    again = restarted_daemon(daemon)  # numad was SIGKILLed: no stop ran
    again.isolation.systemd = fake
    again.stop()
    assert fake.allowed_cpus["system.slice"] == own
    assert json.loads((again.state_dir / "units.json").read_text())["units"] == {}


def test_a_unit_gets_its_own_setting_back_off_the_lock_when_isolation_ends(
    machines: Machines, tmp_path: Path
) -> None:
    """Isolation turned off (or partitions taking over from one by one): each cgroup
    gets its own cpuset file back at once, under the lock, and each unit its own
    AllowedCPUs= from the unit loop, after it."""
    daemon, fake, own = _system_slice_told(machines, tmp_path)
    asked = len(fake.calls)
    daemon.commits.config = replace(daemon.commits.config, isolate=False)
    daemon.commits.others.config = daemon.commits.config
    daemon.reconcile()
    assert len(fake.calls) == asked, "systemd was asked under the daemon's lock"
    assert daemon.isolation.owed()
    _tell_systemd(daemon)
    assert fake.allowed_cpus["system.slice"] == own == _cpus(daemon, "system.slice")
    assert json.loads((daemon.state_dir / "units.json").read_text())["units"] == {}
    assert not daemon.isolation.owed()


def test_at_stop_each_unit_gets_its_own_setting_back_after_the_lock(
    machines: Machines, tmp_path: Path
) -> None:
    """numad stops: the cgroups it isolated get their own cpuset files back under the
    lock, and the units their own AllowedCPUs= from the stop's last round, after it
    (before: one D-Bus call per unit under the lock)."""
    daemon, fake, own = _system_slice_told(machines, tmp_path)
    locked = _calls_under_lock(daemon, fake)
    daemon.stop()
    assert locked == [False], "systemd was asked under the daemon's lock"
    assert fake.allowed_cpus["system.slice"] == own
    assert json.loads((daemon.state_dir / "units.json").read_text())["units"] == {}


def test_a_unit_told_a_value_that_becomes_a_workload_keeps_it(
    machines: Machines, tmp_path: Path
) -> None:
    """Seen under systemd 252: had numad reset the unit's AllowedCPUs= when it became a
    workload's, systemd would find no unit in numad.slice wanting cpuset and turn the
    controller off there, taking the workload's cpuset files with it."""
    daemon = _host_tree(machines, tmp_path)
    fake = FakeSystemd(_tree(daemon), {"wl.service": "/numad.slice/wl.service"})
    daemon.isolation.systemd = fake
    scratch_mkdir(_tree(daemon), "numad.slice/wl.service")  # a unit, not declared yet
    daemon.reconcile()
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    _tell_systemd(daemon)
    assert fake.allowed_cpus["wl.service"] == CPUSet.from_bits(daemon.books.cpu.shared_pool)
    _admit(daemon, {"name": "wl", "cgroup": "numad.slice/wl.service", "cpus": 2})
    daemon.reconcile()
    _tell_systemd(daemon)
    assert fake.allowed_cpus["wl.service"], "reset: systemd may turn cpuset off"
    assert daemon.isolation.record is not None
    assert "numad.slice/wl.service" not in daemon.isolation.record.told


def test_an_isolated_unit_that_ended_is_forgotten_without_a_warning(
    machines: Machines, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A transient unit in numad.slice, told the shared pool, ends and systemd unloads
    it (seen in the VM: a podman scope, a systemd-run service): its reset is refused
    (no such unit), and numad forgets it; nothing of numad's is left to give back, so
    that is no warning."""
    daemon, fake = _unit_told(machines, tmp_path, "late.service")
    fake.stop("late.service", unload=True)
    del fake.units["late.service"]  # transient: no unit file to load it again from
    shutil.rmtree(_tree(daemon) / "numad.slice/late.service")
    daemon.reconcile()
    capsys.readouterr()
    _tell_systemd(daemon)
    logged = capsys.readouterr().out
    assert "unit_reset_skipped" in logged, logged
    assert "unit_reset_failed" not in logged, logged
    assert daemon.isolation.record is not None
    assert "numad.slice/late.service" not in daemon.isolation.record.told
    assert json.loads((daemon.state_dir / "units.json").read_text())["units"] == {}
    assert not daemon.isolation.owed()


class SlowSystemd(FakeSystemd):
    """systemd busy: the first ``set_allowed`` answers, and applies what it was sent,
    only once ``gate`` opens (as a D-Bus call queued behind systemd's work)."""

    def __init__(self, tree: Path, units: dict[str, str]) -> None:
        super().__init__(tree, units)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.stopping = threading.Event()

    def set_allowed(
        self, name: str, cpus: CPUSet | None, mems: NodeSet | None, *, runtime: bool = True
    ) -> None:
        if not self.entered.is_set():
            self.entered.set()
            for _ in range(600):  # 60 s: a bound for a hung test, not a speed goal
                if self.gate.wait(0.1):
                    break
                if self.stopping.is_set():  # as the bus does once numad hurries it
                    raise SystemdError(name, "numad is stopping: gave up waiting (injected)")
            else:
                raise AssertionError("the gate never opened")
        super().set_allowed(name, cpus, mems, runtime=runtime)

    def hurry(self, seconds: float) -> None:
        super().hurry(seconds)
        self.stopping.set()


def test_an_exclusive_set_waits_while_systemd_may_still_write_an_older_value(
    machines: Machines, tmp_path: Path
) -> None:
    """numad writes system.slice's shrink itself, at once; systemd is told after, off
    the lock. A value sent before a shrink may land after it: the CPUs it holds are
    granted only once systemd has applied the newer one."""
    daemon = _host_tree(machines, tmp_path)
    fake = SlowSystemd(_tree(daemon), {"system.slice": "/system.slice"})
    daemon.isolation.systemd = fake
    for name in ("a", "b"):
        scratch_mkdir(_tree(daemon), f"numad.slice/{name}")
    _admit(daemon, {"name": "a", "cgroup": "numad.slice/a", "cpus": 8})
    first = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    sender = threading.Thread(target=_tell_systemd, args=(daemon,))
    sender.start()  # sends `first`, and systemd sits on it
    assert fake.entered.wait(60)
    _admit(daemon, {"name": "b", "cgroup": "numad.slice/b", "cpus": 8})  # the lock is free
    b = CPUSet.from_bits(daemon.books.cpu.assignments[("b", "main")])
    assert b.issubset(first)
    assert not _cpus(daemon, "system.slice") & b  # the kernel has the shrink
    assert _cpus(daemon, "numad.slice/b") != b  # not granted: systemd may write `first`
    assert any("systemd may still write" in p for p in daemon.problems)
    assert any("not granted yet" in p for p in daemon.problems)
    fake.gate.set()  # systemd writes `first` back over the shrink, late
    sender.join(60)
    assert not sender.is_alive()
    _tell_systemd(daemon)  # the unit loop's next round: the newer value
    assert not _cpus(daemon, "system.slice") & b
    assert fake.allowed_cpus["system.slice"] == CPUSet.from_bits(daemon.books.cpu.shared_pool)
    daemon.reconcile()  # woken by the round: the grant goes through
    assert _cpus(daemon, "numad.slice/b") == b
    assert not _cpus(daemon, "system.slice") & b
    assert not any("not granted yet" in p for p in daemon.problems)


def test_what_cannot_be_moved_is_listed_not_hidden(tmp_path: Path) -> None:
    """The root cgroup's tasks, from a /proc laid out as the kernel's (proc(5))."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    root.mkdir()
    (root / "cgroup.procs").write_text("2\n15\n40\n77\n")
    tasks = {  # pid: (comm, flags, Cpus_allowed_list)
        2: ("kthreadd", 0x00208040, "0-31"),
        15: ("ksoftirqd/1", 0x04208040, "1"),
        40: ("my (odd) name", 0x00400100, "4-7"),  # a process left in the root cgroup
    }
    for pid, (comm, flags, allowed) in tasks.items():
        (proc / str(pid)).mkdir(parents=True)
        rest = " ".join(["S", "0", "0", "0", "0", "-1", str(flags)] + ["0"] * 40)
        (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {rest}\n")
        (proc / str(pid) / "status").write_text(f"Name:\t{comm}\nCpus_allowed_list:\t{allowed}\n")
    found = unmovable(root, CPUSet.parse_list("4-5"), proc)
    assert found == {
        "tasks": [
            {"pid": 2, "name": "kthreadd", "kernel_thread": True, "cpus": "0-31"},
            {"pid": 40, "name": "my (odd) name", "kernel_thread": False, "cpus": "4-7"},
        ],
        "not_shown": 1,  # pid 77: gone, or hidden by ProtectProc=invisible
    }
    assert unmovable(root, CPUSet(), proc) == {"tasks": [], "not_shown": 0}


def test_the_host_view_shows_each_isolated_cgroup_and_how(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = _host_tree(machines, tmp_path)
    daemon.isolation.systemd = FakeSystemd(_tree(daemon), {"system.slice": "/system.slice"})
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    _tell_systemd(daemon)
    view = daemon.host()
    pool = str(CPUSet.from_bits(daemon.books.cpu.shared_pool))
    assert view["isolate"] is True
    assert view["shared"] == pool
    assert {"cgroup": "system.slice", "via": "systemd system.slice", "cpus": pool} in view[
        "isolated"
    ]
    assert {"cgroup": "init.scope", "via": "cgroupfs", "cpus": pool} in view["isolated"]
    assert view["unmovable"] == {"tasks": [], "not_shown": 0}  # the scratch root has none


def test_a_cgroup_with_tasks_gets_every_cpu_back_though_v2_refuses_an_empty_cpuset(
    machines: Machines, tmp_path: Path
) -> None:
    """v2 answers ENOSPC to an empty cpuset.cpus in a cgroup with tasks (the scratch
    kernel too): systemd's own reset fails there, and systemd logged it on every
    stop, seen under the real systemd. A unit with tasks keeps every online CPU as
    its property, what its cgroup holds; one without gets its property unset."""
    daemon = _host_tree(machines, tmp_path)
    scratch_mkdir(_tree(daemon), "idle.slice")
    (_tree(daemon) / "system.slice/cgroup.procs").write_text("1\n")
    fake = FakeSystemd(_tree(daemon), {"init.scope": "/init.scope", "idle.slice": "/idle.slice"})
    (_tree(daemon) / "init.scope/cgroup.procs").write_text("1\n")
    daemon.isolation.systemd = fake
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    assert _cpus(daemon, "system.slice") == CPUSet.from_bits(daemon.books.cpu.shared_pool)
    daemon.reconcile()  # idle.slice, made after the start, is isolated too
    _tell_systemd(daemon)
    assert fake.allowed_cpus["idle.slice"] == CPUSet.from_bits(daemon.books.cpu.shared_pool)
    daemon.stop()
    online = daemon.topology.online_cpus
    assert _cpus(daemon, "system.slice") == online  # every CPU, not numad's pool
    assert _cpus(daemon, "init.scope") == online
    assert fake.allowed_cpus["init.scope"] == online  # tasks: as its cgroup holds
    assert fake.allowed_cpus["idle.slice"] == CPUSet()  # no tasks: unset, as before
    assert (_tree(daemon) / "idle.slice/cpuset.cpus").read_text().strip() == ""
    assert fake.refused == []  # nothing for systemd to fail at and log
    assert not daemon.problems


def _slice_told(machines: Machines, tmp_path: Path) -> tuple[Daemon, FakeSystemd, list[bool]]:
    """numad.slice/pod.slice, a slice unit isolated and told the shared pool; each call
    to systemd from now on notes whether the daemon's lock was held."""
    daemon, fake = _unit_told(machines, tmp_path, "pod.slice")
    locked = _calls_under_lock(daemon, fake)
    scratch_mkdir(_tree(daemon), "numad.slice/pod.slice/wl")
    return daemon, fake, locked


def _granted_below_the_slice(daemon: Daemon, fake: FakeSystemd) -> None:
    """wl holds its exclusive CPUs, pod.slice its own AllowedCPUs= (none), and no
    problem names wl."""
    wl = CPUSet.from_bits(daemon.books.cpu.assignments[("wl", "main")])
    assert _cpus(daemon, "numad.slice/pod.slice/wl") == wl
    assert fake.allowed_cpus["pod.slice"] == CPUSet()
    assert not [p for p in daemon.problems if "wl" in p]


@pytest.mark.parametrize("unit", [False, True])
def test_an_isolated_unit_above_a_new_workload_gets_its_own_setting_back_after_the_lock(
    machines: Machines, tmp_path: Path, unit: bool
) -> None:
    """A workload admitted below a unit numad isolated (told the shared pool): the
    unit gets its own AllowedCPUs= back after the lock, before the answer (before: one
    D-Bus call under the lock), and the workload its CPUs once systemd has it; one
    that is a unit itself has them from systemd, before the answer too."""
    daemon, fake, locked = _slice_told(machines, tmp_path)
    path = "numad.slice/pod.slice/wl"
    if unit:
        path += ".service"
        fake.units["wl.service"] = "/" + path
        fake.allowed_cpus["wl.service"], fake.allowed_mems["wl.service"] = CPUSet(), NodeSet()
        fake.start("wl.service")
        _admit(daemon, {"name": "wl", "unit": "wl.service", "cpus": 4})
    else:
        _admit(daemon, {"name": "wl", "cgroup": path, "cpus": 4})
    assert locked, "systemd was not asked before the answer"
    assert not any(locked), "systemd was asked under the daemon's lock"
    assert fake.allowed_cpus["pod.slice"] == CPUSet()  # its own: none
    wl = CPUSet.from_bits(daemon.books.cpu.assignments[("wl", "main")])
    assert _cpus(daemon, path) == wl
    if unit:
        assert fake.allowed_cpus["wl.service"] == wl
    assert not [p for p in daemon.problems if "wl" in p]
    assert json.loads((daemon.state_dir / "units.json").read_text())["units"] == {}


def test_a_workload_below_a_unit_systemd_has_not_given_back_waits_for_it(
    machines: Machines, tmp_path: Path
) -> None:
    """systemd failing: the unit above a new workload keeps the narrow AllowedCPUs=
    numad told it, which systemd may write again at any time, so the workload's CPUs
    wait (a health problem names the unit) and are granted once systemd has the unit's
    own value back: the round that gave it wakes a pass."""
    daemon, fake, locked = _slice_told(machines, tmp_path)
    fake.broken_calls = True  # type: ignore[attr-defined]
    answer = fake.set_allowed

    def failing(name: str, cpus: CPUSet | None, mems: NodeSet | None, **kw: bool) -> None:
        if fake.broken_calls:  # type: ignore[attr-defined]
            raise SystemdError(name, "no reply within 5 s (injected)")
        answer(name, cpus, mems, **kw)

    fake.set_allowed = failing  # type: ignore[method-assign]
    _admit(daemon, {"name": "wl", "cgroup": "numad.slice/pod.slice/wl", "cpus": 4})
    wl = CPUSet.from_bits(daemon.books.cpu.assignments[("wl", "main")])
    assert not _cpus(daemon, "numad.slice/pod.slice/wl") & wl
    waiting = [p for p in daemon.problems if p.startswith("numad.slice/pod.slice/wl:")]
    assert any("pod.slice" in p and "AllowedCPUs=" in p for p in waiting), daemon.problems
    daemon.reconcile()  # systemd still failing: the pass does not grant either
    assert not _cpus(daemon, "numad.slice/pod.slice/wl") & wl
    fake.broken_calls = False  # type: ignore[attr-defined]
    assert daemon.isolation.send(), "the give-back must wake a pass"
    assert locked, "systemd was not asked"
    assert not any(locked), "systemd was asked under the daemon's lock"
    daemon.reconcile()
    _granted_below_the_slice(daemon, fake)


def test_a_workload_whose_parent_the_unit_loop_gave_back_meanwhile_is_written_by_the_answer(
    machines: Machines, tmp_path: Path
) -> None:
    """The race: the write below the slice is deferred, then the unit loop gives the
    slice back before the admission's own round asks about it. The answer still comes
    with the workload on its CPUs (the deferral is remembered as a ``write:`` problem),
    and the loop's round says a pass is due."""
    daemon, fake, _ = _slice_told(machines, tmp_path)
    record = daemon.isolation.record
    assert record is not None
    ask, rounds = record.above, list[bool]()

    def above(path: str, *, wait: bool = False) -> str | None:
        found = ask(path, wait=wait)
        if wait and found and not rounds:  # the loop, in its own thread, at this moment
            loop = threading.Thread(target=lambda: rounds.append(daemon.isolation.send()))
            loop.start()
            loop.join(60)
        return found

    record.above = above  # type: ignore[method-assign]
    _admit(daemon, {"name": "wl", "cgroup": "numad.slice/pod.slice/wl", "cpus": 4})
    assert rounds == [True], "the loop's give-back must wake a pass"
    _granted_below_the_slice(daemon, fake)


def test_a_write_deferred_while_the_loop_gives_the_unit_back_still_wakes_a_pass(
    machines: Machines, tmp_path: Path
) -> None:
    """The other order: the workload's cgroup appears (a pass defers its write) while
    the unit loop is in the middle of giving the slice back. The round must still say
    a pass is due, or the workload waits a whole reconcile period."""
    daemon, fake, _ = _slice_told(machines, tmp_path)
    shutil.rmtree(_tree(daemon) / "numad.slice/pod.slice/wl")  # made later, by its runtime
    failing, answer = [True], fake.set_allowed

    def systemd(name: str, cpus: CPUSet | None, mems: NodeSet | None, **kw: bool) -> None:
        if failing[0]:
            raise SystemdError(name, "no reply within 5 s (injected)")
        if name == "pod.slice" and not (_tree(daemon) / "numad.slice/pod.slice/wl").exists():
            scratch_mkdir(_tree(daemon), "numad.slice/pod.slice/wl")
            daemon.reconcile()  # another thread's pass, while this call is under way
            assert any("above it" in p for p in daemon.problems), daemon.problems
        answer(name, cpus, mems, **kw)

    fake.set_allowed = systemd  # type: ignore[method-assign]
    _admit(daemon, {"name": "wl", "cgroup": "numad.slice/pod.slice/wl", "cpus": 4})
    failing[0] = False
    assert daemon.isolation.send(), "the round that gave pod.slice back must wake a pass"
    daemon.reconcile()
    wl = CPUSet.from_bits(daemon.books.cpu.assignments[("wl", "main")])
    assert _cpus(daemon, "numad.slice/pod.slice/wl") == wl


def test_a_unit_an_older_numad_told_itself_is_given_back_off_the_lock(
    machines: Machines, tmp_path: Path
) -> None:
    """numad before 2026-12 kept a unit it told in isolation.json (``"via": "systemd"``)
    and gave it back with a D-Bus call under the daemon's lock. The record takes it over
    at start, so the unit loop gives it back, after the lock."""
    daemon = _host_tree(machines, tmp_path)
    legacy = {"system.slice": {"via": "systemd", "unit": "system.slice", "cpus": "0-23"}}
    (daemon.state_dir / "isolation.json").write_text(json.dumps({"version": 1, "cgroups": legacy}))
    again = restarted_daemon(daemon)
    fake = FakeSystemd(_tree(again), {"system.slice": "/system.slice"})
    fake.allowed_cpus["system.slice"] = CPUSet.parse_list("0-3")  # what that numad told it
    again.isolation.systemd = fake
    told = json.loads((again.state_dir / "units.json").read_text())["units"]
    assert told == {"system.slice": {"unit": "system.slice", "cpus": "0-23"}}
    locked = _calls_under_lock(again, fake)
    again.commits.config = replace(again.commits.config, isolate=False)
    again.commits.others.config = again.commits.config
    again.reconcile()
    assert locked == [], "systemd was asked under the daemon's lock"
    _tell_systemd(again)
    assert locked == [False]
    assert fake.allowed_cpus["system.slice"] == CPUSet.parse_list("0-23")
    assert _cpus(again, "system.slice") == CPUSet.parse_list("0-23")
    assert json.loads((again.state_dir / "units.json").read_text())["units"] == {}
    assert json.loads((again.state_dir / "isolation.json").read_text())["cgroups"] == {}


def test_a_workloads_cgroup_made_after_its_admission_gets_its_grant_at_its_event(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``late`` is admitted before its cgroup is made (``numad admit``, then the runtime
    makes it). cgroup v2 gives a new cgroup its parent's CPUs, every CPU of
    ``numad.slice``: ``db``'s exclusive ones too. The event of its ``mkdir`` writes its
    grant at once, not the next pass (10 s later by default); before 2026-12-06 it ran
    on ``db``'s CPUs until then. Made again after it went, the same (the grant numad
    wrote to the old cgroup is not taken for the new one's)."""
    daemon = recorded_daemon(machines, tmp_path)
    _admit(daemon, {"name": "db", "cgroup": "numad.slice/db", "cpus": 8})
    _admit(daemon, {"name": "late", "cgroup": "numad.slice/late", "cpus": 2})
    mine = CPUSet.from_bits(daemon.books.cpu.assignments["late", "main"])
    for _ in range(2):
        scratch_mkdir(_tree(daemon), "numad.slice/late")
        daemon.isolate_new(["numad.slice/late"])  # the event its mkdir raises
        assert _effective(daemon, "numad.slice/late") == mine
        shutil.rmtree(_tree(daemon) / "numad.slice/late")
    scratch_mkdir(_tree(daemon), "numad.slice/shared")
    _admit(daemon, {"name": "shared", "cgroup": "numad.slice/shared/c", "cpus": "500m"})
    scratch_mkdir(_tree(daemon), "numad.slice/shared/c")
    daemon.isolate_new(["numad.slice/shared/c"])
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert _effective(daemon, "numad.slice/shared/c") == pool


def test_a_workloads_cgroup_and_the_one_above_made_again_each_at_its_event(
    machines: Machines, tmp_path: Path
) -> None:
    """The VM tier's check of a cgroup above a workload's, on a scratch tree, with the
    mkdir events and no pass between. ``holder/w`` gets its grant at its event (numad
    has seen it now); it and ``holder`` go, and ``holder`` made again is isolated at
    its event (``w`` seen, gone: held through the grace); ``holder/w`` made again is
    granted at its event, and ``holder`` has its own (empty) setting back first. The
    new ``holder`` has no cpuset enabled below it: numad enables it again for the new
    ``holder/w`` (what it did for the old one is not taken for the new one's)."""
    daemon = recorded_daemon(machines, tmp_path)
    tree = _tree(daemon)
    _admit(daemon, {"name": "holder-w", "cgroup": "numad.slice/holder/w", "cpus": 1})
    grant = CPUSet.from_bits(daemon.books.cpu.assignments["holder-w", "main"])
    for _ in range(2):
        scratch_mkdir(tree, "numad.slice/holder/w")
        daemon.isolate_new(["numad.slice/holder", "numad.slice/holder/w"])
        assert _cpus(daemon, "numad.slice/holder/w") == grant
        assert grant.issubset(_effective(daemon, "numad.slice/holder"))
        assert _effective(daemon, "numad.slice/holder/w") == grant
        shutil.rmtree(tree / "numad.slice/holder")
        scratch_mkdir(tree, "numad.slice/holder")
        daemon.isolate_new(["numad.slice/holder"])
        pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
        assert _cpus(daemon, "numad.slice/holder") == pool
