"""systemd units by name: a spec's ``unit`` is resolved through systemd, placed as the
unit's runtime AllowedCPUs=/AllowedMemoryNodes=, and followed across stops and starts.

systemd is the FAKE of tests/test_isolation.py (no systemd runs on this host): it
owns the units it is given, has a control group only while a unit runs, and writes
what is set into the unit's scratch cgroup as systemd would, also on each start.
The real systemd does this in the VM tier (tests/vm/guest/systemd_checks.py)."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from numad.cpuset import CPUSet, NodeSet
from numad.daemon.root import Daemon
from numad.errors import SpecError
from numad.host import workload_units
from numad.host.scratch import scratch_mkdir
from numad.host.systemd_bus import SystemdError
from numad.workload.spec import parse_spec
from numad.workload.units import check_unit, slice_cgroup, workload_name
from tests.conftest import Machines, recorded_daemon, restarted_daemon
from tests.host.test_isolation import FakeSystemd, SlowSystemd

ROOTS = {"paths": {"managed-roots": ["numad.slice", "db.slice"]}}
UNITS = {
    "pg.service": "/db.slice/pg.service",
    "web.service": "/system.slice/web.service",
    "cache.service": "/db.slice/cache.service",
}


def _tree(daemon: Daemon) -> Path:
    return Path(str(daemon.fs.root)) / "sys/fs/cgroup"


def _held(daemon: Daemon, path: str) -> tuple[CPUSet, NodeSet]:
    cgroup = _tree(daemon) / path
    return (
        CPUSet.parse_list((cgroup / "cpuset.cpus").read_text()),
        NodeSet.parse_list((cgroup / "cpuset.mems").read_text()),
    )


def _daemon(machines: Machines, tmp_path: Path, *running: str) -> tuple[Daemon, FakeSystemd]:
    daemon = recorded_daemon(machines, tmp_path, ROOTS)
    fake = FakeSystemd(_tree(daemon), dict(UNITS))
    daemon.isolation.systemd = fake
    for unit in running:
        fake.start(unit)
    return daemon, fake


def _admit(daemon: Daemon, **spec: object) -> str:
    outcome = daemon.admit(daemon.parse(json.dumps(spec), "json"))
    assert outcome.admitted, outcome.detail
    return str(spec.get("name") or workload_name(str(spec["unit"])))


def _placement(daemon: Daemon, name: str) -> tuple[CPUSet, NodeSet]:
    shown = daemon.show(name)["containers"]["main"]
    return CPUSet.parse_list(shown["cpus"]), NodeSet.parse_list(shown["mems"])


def test_unit_names_and_slice_paths() -> None:
    assert workload_name("postgresql.service") == "postgresql.service"
    assert workload_name("getty@tty1.service") == "getty-tty1.service"
    assert workload_name("Run-U2.scope") == "run-u2.scope"
    assert len(workload_name("a" * 80 + ".service")) == 63
    assert slice_cgroup("system.slice") == "system.slice"
    assert slice_cgroup("a-b-c.slice") == "a.slice/a-b.slice/a-b-c.slice"
    assert slice_cgroup("-.slice") == ""
    for bad in ("pg", "pg.slice", "../pg.service", "pg service.service", 7, "-x.service"):
        with pytest.raises(SpecError, match="unit"):
            check_unit(bad, "w")


def test_a_spec_names_a_unit_instead_of_a_cgroup() -> None:
    spec = parse_spec('unit = "pg.service"\ncpus = 4\nmemory = "1Gi"\n', "toml")
    assert (spec.name, spec.unit, spec.cgroup) == ("pg.service", "pg.service", "")
    named = parse_spec('name = "db"\nunit = "pg.service"\ncpus = 4\n', "toml")
    assert (named.name, named.unit) == ("db", "pg.service")
    resolved = parse_spec(
        json.dumps({**named.to_dict(), "cgroup": "numad.slice/pg.service"}), "json"
    )
    assert resolved.to_dict() == {**named.to_dict(), "cgroup": "numad.slice/pg.service"}
    with pytest.raises(SpecError, match="missing"):
        parse_spec("cpus = 4\n", "toml")  # neither a name nor a unit


def test_a_unit_admitted_by_name_is_placed_through_systemd(
    machines: Machines, tmp_path: Path
) -> None:
    daemon, fake = _daemon(machines, tmp_path, "pg.service")
    name = _admit(daemon, unit="pg.service", cpus=4, memory="256Mi")
    shown = daemon.show(name)
    assert (shown["unit"], shown["cgroup"]) == ("pg.service", "db.slice/pg.service")
    assert shown["via"] == "systemd pg.service"
    cpus, mems = _placement(daemon, name)
    assert len(cpus) == 4
    assert fake.allowed("pg.service") == (cpus, mems)  # systemctl show tells the truth
    assert _held(daemon, "db.slice/pg.service") == (cpus, mems)


def test_a_unit_is_followed_across_stop_and_start(machines: Machines, tmp_path: Path) -> None:
    daemon, fake = _daemon(machines, tmp_path, "pg.service")
    now = [0.0]
    daemon.clock = lambda: now[0]
    name = _admit(daemon, unit="pg.service", cpus=4)
    placed = _placement(daemon, name)
    shutil.rmtree(_tree(daemon) / "db.slice/pg.service")  # the unit stops
    for _ in range(3):
        now[0] += daemon.config.release_grace_seconds + 1
        daemon.reconcile()
    assert name in daemon.specs  # a stopped unit is still the workload
    fake.start("pg.service")  # systemd applies what numad set, before any process runs
    assert _held(daemon, "db.slice/pg.service") == placed
    daemon.reconcile()
    assert _placement(daemon, name) == placed
    assert not daemon.problems


@pytest.mark.parametrize("unload", [False, True], ids=["loaded", "unloaded"])
def test_a_cgroup_left_behind_by_a_stop_is_not_the_units(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unload: bool
) -> None:
    """systemd applies nothing to a directory the kernel kept at a stop: numad must not
    wait on it (each pass would stall APPLY_SECONDS and flag a failed write), nor fail
    to ask about a unit systemd has unloaded since (both seen on Linux 6.12)."""
    daemon, fake = _daemon(machines, tmp_path, "pg.service")
    name = _admit(daemon, unit="pg.service", cpus=4)
    placed = _placement(daemon, name)
    monkeypatch.setattr(workload_units, "APPLY_SECONDS", 0.0)
    fake.stop("pg.service", unload=unload)
    (_tree(daemon) / "db.slice/pg.service/cpuset.cpus").write_text("")  # the kernel's own
    daemon.enforcer.written.clear()  # every cgroup written again, as after a restart
    daemon.reconcile()
    daemon.isolation.send()  # the unit loop's round: a preset, no wait on the directory
    daemon.reconcile()  # the directory is known as not the unit's: nothing asked again
    assert not daemon.isolation.owed()
    assert not daemon.problems, daemon.problems
    assert fake.allowed("pg.service") == placed
    fake.start("pg.service")
    assert _held(daemon, "db.slice/pg.service") == placed


def test_a_unit_admitted_while_stopped_starts_on_its_placement(
    machines: Machines, tmp_path: Path
) -> None:
    daemon, fake = _daemon(machines, tmp_path)
    name = _admit(daemon, unit="cache.service", cpus=2, memory="64Mi")
    assert daemon.show(name)["cgroup"] == "db.slice/cache.service"  # from its Slice=
    placed = _placement(daemon, name)
    assert fake.allowed("cache.service") == placed  # preset while it does not run
    fake.start("cache.service")
    assert _held(daemon, "db.slice/cache.service") == placed


def test_a_released_unit_leaves_the_exclusive_cpus_and_its_settings_go(
    machines: Machines, tmp_path: Path
) -> None:
    daemon, fake = _daemon(machines, tmp_path, "pg.service")
    name = _admit(daemon, unit="pg.service", cpus=4)
    exclusive, _ = _placement(daemon, name)
    daemon.release(name)
    for node, cpus in enumerate((14, 16)):  # every CPU pg.service had is exclusive again
        _admit(daemon, name=f"n{node}", cgroup=f"numad.slice/n{node}", cpus=cpus)
    daemon.reconcile()
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert not pool & exclusive
    assert fake.allowed("pg.service")[0] == pool  # still running: the shared pool
    assert _held(daemon, "db.slice/pg.service")[0] == pool
    shutil.rmtree(_tree(daemon) / "db.slice/pg.service")  # stopped for good
    told = len(fake.calls)
    daemon.reconcile()  # the pass its removal wakes: the reset asked for there
    assert len(fake.calls) == told  # not under the daemon's lock: by the unit loop
    assert daemon.isolation.owed()
    daemon.isolation.send()
    assert fake.allowed("pg.service") == (CPUSet(), NodeSet())  # a restart is unpinned
    assert not daemon.isolation.owed()


def _until(done: Callable[[], bool], what: str) -> None:
    """Wait for another thread; 60 s bounds a hung test, it is no speed goal."""
    for _ in range(600):
        if done():
            return
        threading.Event().wait(0.1)
    raise AssertionError(f"never: {what}")


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    answers: list[object] = []
    thread = threading.Thread(target=lambda: answers.append(call()), daemon=True)
    thread.start()
    return thread, answers


def test_systemd_places_a_unit_after_the_lock_and_a_grant_waits_for_its_shrink(
    machines: Machines, tmp_path: Path
) -> None:
    """Before: a unit's placement was set over D-Bus, and waited on until systemd wrote
    it, under the daemon's lock: a slow systemd held up every request and pass. Now
    the enforcer only asks, and the request tells systemd after the lock. Here systemd
    holds each call at a gate (SlowSystemd): meanwhile the lock is free, another
    admission is answered, and CPUs the unit gives up at its release are granted to
    no one until systemd has written its new value."""
    daemon = recorded_daemon(machines, tmp_path, ROOTS)
    slow = SlowSystemd(_tree(daemon), dict(UNITS))
    daemon.isolation.systemd = slow
    slow.start("pg.service")
    for name in ("web", "n0", "n1"):
        scratch_mkdir(_tree(daemon), f"numad.slice/{name}")
    admission, answers = _in_thread(
        lambda: daemon.admit(daemon.parse('{"unit": "pg.service", "cpus": 4}', "json"))
    )
    _until(slow.entered.is_set, "numad asked systemd")
    assert daemon.held.lock.acquire(timeout=30), "the lock is held while systemd works"
    daemon.held.lock.release()
    _admit(daemon, name="web", cgroup="numad.slice/web", cpus=2)  # answered meanwhile
    assert admission.is_alive()  # pg's answer waits for systemd, not the lock
    slow.gate.set()
    admission.join(60)
    placed = _placement(daemon, "pg.service")
    assert [getattr(a, "admitted", None) for a in answers] == [True]
    assert slow.allowed("pg.service") == _held(daemon, "db.slice/pg.service") == placed
    assert not daemon.problems, daemon.problems

    daemon.release("web")
    slow.entered.clear()
    slow.gate.clear()  # the release's shrink to the shared pool is held at the gate
    release, _ = _in_thread(lambda: daemon.release("pg.service"))
    _until(slow.entered.is_set, "numad asked systemd for the shrink")
    takers = [  # every CPU pg.service had is asked for again
        _in_thread(partial(_admit, daemon, name=n, cgroup=f"numad.slice/{n}", cpus=c))
        for n, c in (("n0", 14), ("n1", 16))
    ]
    _until(lambda: {"n0", "n1"} <= daemon.specs.keys(), "both admissions committed")
    for name in ("n0", "n1"):
        granted = _held(daemon, f"numad.slice/{name}")[0]
        assert not granted & _held(daemon, "db.slice/pg.service")[0], name
    assert any(
        "not granted yet: db.slice/pg.service may still run there" in p for p in daemon.problems
    )
    slow.gate.set()
    for thread in [release] + [t for t, _ in takers]:
        thread.join(60)
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert _held(daemon, "db.slice/pg.service")[0] == slow.allowed("pg.service")[0] == pool
    for name in ("n0", "n1"):
        assert _held(daemon, f"numad.slice/{name}")[0] == _placement(daemon, name)[0]
    assert not pool & placed[0]
    assert not daemon.problems, daemon.problems


def test_a_released_unit_whose_file_is_gone_is_not_reset_forever(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unit's file removed after its release: systemd refuses the reset of a unit it
    does not know; numad drops it (nothing is left to reset) instead of a health problem
    and a D-Bus call every second for good."""
    daemon, fake = _daemon(machines, tmp_path, "pg.service")
    _admit(daemon, unit="pg.service", cpus=4)
    daemon.release("pg.service")
    shutil.rmtree(_tree(daemon) / "db.slice/pg.service")
    del fake.units["pg.service"]  # stopped, and its file removed: systemd forgot it

    def refuse(name: str, *_: object, **__: object) -> None:
        raise SystemdError(name, "Unit pg.service not found (injected)")

    monkeypatch.setattr(fake, "set_allowed", refuse)
    daemon.reconcile()
    assert daemon.isolation.owed()
    daemon.isolation.send()
    assert not daemon.isolation.owed()
    assert not daemon.problems, daemon.problems


def test_the_movers_mems_write_to_a_unit_is_made_through_systemd_at_once(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory mover narrows a unit's mems on its own thread, off the daemon's lock:
    the write, Deferred to systemd under the lock, is sent there and then, not failed
    (a failed move would be a health problem and a write again). systemd then holds the
    unit's CPUs as before, so the enforcer's next write asks nothing more."""
    daemon, fake = _daemon(machines, tmp_path, "pg.service")
    _admit(daemon, unit="pg.service", cpus=4)
    path = "db.slice/pg.service"
    cpus, mems = _placement(daemon, "pg.service")
    writes: list[Callable[[], None]] = []
    daemon.migrations.make_narrow = lambda write, *_, **__: writes.append(write)
    monkeypatch.setattr(daemon.migrations.mover, "submit", lambda *_: None)  # run here
    daemon.migrations.narrow(path, NodeSet([1]), mems | NodeSet([1]))
    (write,) = writes
    write()  # the mover's narrowing write
    assert fake.allowed("pg.service") == (cpus, NodeSet([1])) == _held(daemon, path)
    asked = len(fake.calls)
    daemon.isolation.write(path, cpus, NodeSet([1]))  # the enforcer's: already held
    assert len(fake.calls) == asked
    assert not daemon.isolation.owed()


def test_a_unit_survives_a_numad_restart(machines: Machines, tmp_path: Path) -> None:
    daemon, fake = _daemon(machines, tmp_path, "pg.service")
    name = _admit(daemon, unit="pg.service", cpus=4)
    placed = _placement(daemon, name)
    daemon.stop()
    again = restarted_daemon(daemon, ROOTS)
    again.isolation.systemd = fake
    again.reconcile()
    assert again.specs[name].unit == "pg.service"
    assert _placement(again, name) == placed
    assert again.isolation.via("db.slice/pg.service") == "systemd pg.service"
    assert fake.allowed("pg.service") == placed


def test_a_unit_whose_slice_left_the_managed_roots_keeps_its_placement(
    machines: Machines, tmp_path: Path
) -> None:
    """db.slice taken out of [paths] managed-roots: numad tells systemd nothing more
    about pg.service (it keeps the placement systemd applies at each start) until
    its release, which gives it the shared pool, through systemd, as any release."""
    daemon, fake = _daemon(machines, tmp_path, "pg.service")
    name = _admit(daemon, unit="pg.service", cpus=4)
    placed = _placement(daemon, name)
    daemon.stop()
    again = restarted_daemon(daemon, {"paths": {"managed-roots": ["numad.slice"]}})
    again.isolation.systemd = fake
    told = len(fake.calls)
    again.reconcile()
    fake.stop("pg.service")
    fake.start("pg.service")  # systemd applies what it was told before
    again.reconcile()
    assert not again.ready
    assert f"workload {name}: its cgroup db.slice/pg.service is outside" in again.problems[0]
    assert fake.calls[told:] == []
    assert fake.allowed("pg.service") == placed
    assert _held(again, "db.slice/pg.service") == placed
    again.release(name)
    pool = CPUSet.from_bits(again.books.cpu.shared_pool)
    assert again.ready
    assert fake.allowed("pg.service")[0] == pool


@pytest.mark.parametrize(
    ("unit", "systemd", "message"),
    [
        ("web.service", True, "web.service runs in system.slice, outside the managed roots"),
        ("nosuch.service", True, "cannot find nosuch.service's cgroup"),
        ("pg.service", False, "numad has no connection to systemd"),
    ],
)
def test_a_unit_numad_cannot_place_is_refused_by_name(
    machines: Machines, tmp_path: Path, unit: str, systemd: bool, message: str
) -> None:
    daemon, _ = _daemon(machines, tmp_path, "pg.service", "web.service")
    if not systemd:
        daemon.isolation.systemd = None
    with pytest.raises(SpecError, match=message):
        daemon.admit(daemon.parse(json.dumps({"unit": unit, "cpus": 2}), "json"))
    assert not daemon.specs


def test_a_given_cgroup_must_be_the_units(machines: Machines, tmp_path: Path) -> None:
    daemon, _ = _daemon(machines, tmp_path, "pg.service")
    spec = {"unit": "pg.service", "cgroup": "numad.slice/db", "cpus": 2}
    with pytest.raises(SpecError, match=r"numad.slice/db is not pg.service's cgroup"):
        daemon.admit(daemon.parse(json.dumps(spec), "json"))
