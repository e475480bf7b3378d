"""Units numad isolated, over their lives: stopped, started again, left on every CPU.

systemd stands in as ``FakeSystemd`` (tests/host/test_isolation.py; the VM tier
runs the real one): like systemd, it makes a slice's cgroup when a property of the
slice is set while it is not running, and it keeps a unit's runtime property while
the unit is stopped.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from numad.cpuset import CPUSet, NodeSet
from numad.daemon.root import Daemon
from numad.host import durable
from numad.host.systemd_bus import SystemdError
from numad.host.unit_record import FILE
from tests.conftest import Machines, restarted_daemon
from tests.host.test_isolation import _admit, _cpus, _slice_told, _tell_systemd, _tree, _unit_told

SLICE = "numad.slice/pod.slice"


def _told(daemon: Daemon) -> dict[str, dict[str, str]]:
    record = daemon.isolation.record
    assert record is not None
    return dict(record.told)


def test_a_stopped_slice_is_not_made_again_and_gets_its_own_back_when_it_runs_again(
    machines: Machines, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a slice told the shared pool was stopped; the unit loop gave it its
    own AllowedCPUs= back, and systemd, loading the slice for the call, made its
    cgroup again (seen in the VM: then one warning a second once systemd unloaded
    it). Now nothing is sent to a unit whose cgroup is gone; a slice is not transient,
    so systemd keeps the pool in /run for it, and numad keeps its record: started
    again, isolated again, its own is still none, and that is what it gets back."""
    daemon, fake = _unit_told(machines, tmp_path, "pod.slice")
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    fake.stop("pod.slice")
    shutil.rmtree(_tree(daemon) / SLICE)
    daemon.reconcile()
    capsys.readouterr()
    _tell_systemd(daemon)
    assert fake.made_again == []
    assert not (_tree(daemon) / SLICE).exists()
    assert "unit_reset_deferred" in capsys.readouterr().out
    assert _told(daemon)[SLICE]["cpus"] == ""  # kept, for when it runs again
    assert json.loads((daemon.state_dir / FILE).read_text())["units"][SLICE]["cpus"] == ""
    assert not daemon.isolation.owed()  # not retried while it does not run
    fake.start("pod.slice")  # systemd applies the pool it still holds
    assert _cpus(daemon, SLICE) == pool
    daemon.reconcile()
    _tell_systemd(daemon)
    assert _told(daemon)[SLICE]["cpus"] == ""  # not the pool systemd held for it
    daemon.stop()
    assert fake.allowed_cpus["pod.slice"] == CPUSet()  # its own: none
    assert fake.made_again == []


def test_a_slice_numad_left_on_every_cpu_is_isolated_again_with_its_own_setting(
    machines: Machines, tmp_path: Path
) -> None:
    """A slice with tasks above a new workload gets its own setting (none) back as
    every CPU, since the kernel keeps a cgroup with tasks from emptying its cpuset.
    Before: once the workload left and the slice was isolated again, every CPU was
    read as its own, in both records; it then named exclusive CPUs, and partitions
    kept it isolated one by one. Now its own is still none."""
    daemon, fake, _ = _slice_told(machines, tmp_path)
    (_tree(daemon) / SLICE / "cgroup.procs").write_text("1\n")
    _admit(daemon, {"name": "wl", "cgroup": f"{SLICE}/wl", "cpus": 4})
    online = daemon.topology.online_cpus
    assert _cpus(daemon, SLICE) == online
    assert fake.allowed_cpus["pod.slice"] == online
    daemon.release("wl")
    daemon.reconcile()  # a stray again
    _tell_systemd(daemon)
    assert _cpus(daemon, SLICE) == CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert daemon.isolation.originals[SLICE]["cpus"] == ""
    assert _told(daemon)[SLICE]["cpus"] == ""
    saved = json.loads((daemon.state_dir / "isolation.json").read_text())
    assert saved["cgroups"][SLICE]["cpus"] == ""
    assert saved["left"] == {}


def test_saves_of_the_unit_record_from_two_threads_keep_the_newer(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record is saved from the daemon's thread and the unit loop's. Before, one
    took its copy, the other saved a newer one, and the first's older copy was
    written last (and their temp files clashed: seen in the VM, ENOENT on rename)."""
    daemon, _ = _unit_told(machines, tmp_path, "pod.slice")
    record = daemon.isolation.record
    assert record is not None
    written = durable.write_file
    inside = threading.Event()
    other: list[threading.Thread] = []

    def write_file(directory: Path, name: str, data: bytes, **kw: str) -> None:
        if not other:  # the first save, between its copy and its write: a second one
            other.append(threading.Thread(target=record._forget, args=(SLICE,)))
            other[0].start()
            inside.wait(0.5)  # the second's whole save, had it not to wait
        else:
            inside.set()
        written(directory, name, data, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr("numad.host.unit_record.write_file", write_file)
    record._save()  # still lists pod.slice
    other[0].join(10)
    assert json.loads((daemon.state_dir / FILE).read_text())["units"] == {}


def test_a_cgroup_whose_unit_systemd_unloaded_is_asked_about_once(
    machines: Machines, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The unit loop remembers which unit owns each isolated cgroup. Before: when
    systemd unloaded that unit while its cgroup stayed (seen in the VM, a slice made
    again), each round asked for an AllowedCPUs= systemd no longer had: a warning a
    second (101 in one boot). Now a failed call asks whether systemd still has the
    unit; it does not, so the next round finds the cgroup no unit's, and stops."""
    daemon, fake = _unit_told(machines, tmp_path, "pod.slice")
    record = daemon.isolation.record
    assert record is not None
    record._forget(SLICE)  # given back, as before the slice was made again
    record.units[SLICE] = "pod.slice"  # what the loop remembered (the VM's state)
    fake.stop("pod.slice", unload=True)  # the cgroup stays
    _admit(daemon, {"name": "more", "cgroup": "numad.slice/more", "cpus": 2})  # a new pool
    capsys.readouterr()
    _tell_systemd(daemon)
    assert capsys.readouterr().out.count("unit_record_failed") == 1
    for _ in range(3):
        _tell_systemd(daemon)
    assert "unit_record_failed" not in capsys.readouterr().out
    assert not [p for p in daemon.problems if SLICE in p]
    assert not daemon.isolation.owed()


def test_a_unit_left_on_every_cpu_is_not_reset_by_the_next_numad(
    machines: Machines, tmp_path: Path
) -> None:
    """A unit left on every CPU (tasks) stays in units.json, its own none. Seen in the
    VM: the next numad gave it back in its first round, before it knew the online
    CPUs, so it asked systemd to reset AllowedCPUs=, which the kernel refused
    (ENOSPC) and systemd logged. Now the record knows them from the first pass."""
    daemon, fake, _ = _slice_told(machines, tmp_path)
    (_tree(daemon) / SLICE / "cgroup.procs").write_text("1\n")
    _admit(daemon, {"name": "wl", "cgroup": f"{SLICE}/wl", "cpus": 4})
    online = daemon.topology.online_cpus
    assert fake.allowed_cpus["pod.slice"] == online
    assert _told(daemon)[SLICE]["cpus"] == ""
    again = restarted_daemon(daemon)  # as after a SIGKILL: wl is still admitted
    again.isolation.systemd = fake
    again.reconcile()
    _tell_systemd(again)
    assert fake.refused == []
    assert fake.allowed_cpus["pod.slice"] == online
    assert ("pod.slice", "") not in fake.calls


def test_a_unit_stopped_while_systemd_writes_its_value_is_no_warning(
    machines: Machines, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seen in the VM: a slice stopped while the unit loop waited for systemd to write
    the pool numad sent it; reading its cgroup then failed ("the cgroup is gone"),
    logged as a warning with a problem. Its unit stopped: nothing is owed to it, so
    that is neither, and the slice is not made again."""
    daemon, fake = _unit_told(machines, tmp_path, "pod.slice")
    answer = fake.set_allowed

    def stopped_meanwhile(name: str, cpus: CPUSet | None, mems: object, **kw: bool) -> None:
        answer(name, cpus, mems, **kw)  # type: ignore[arg-type]
        if name == "pod.slice":
            fake.stop("pod.slice")
            shutil.rmtree(_tree(daemon) / SLICE)

    fake.set_allowed = stopped_meanwhile  # type: ignore[method-assign]
    _admit(daemon, {"name": "more", "cgroup": "numad.slice/more", "cpus": 2})  # a new pool
    capsys.readouterr()
    _tell_systemd(daemon)
    assert "unit_record_failed" not in capsys.readouterr().out
    assert not [p for p in daemon.problems if SLICE in p]
    assert not daemon.isolation.owed()
    daemon.reconcile()
    _tell_systemd(daemon)
    assert fake.made_again == []


def test_a_slice_unloaded_while_its_give_back_fails_is_given_its_own_back_later(
    machines: Machines, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A slice told the shared pool stops, its cgroup kept by the kernel, and systemd
    unloads it; numad's stop sends its own back, and the call fails (no reply). A slice
    is not transient: systemd keeps the pool in /run for its next load. Before, numad
    forgot it there (systemd has no such unit), and the pool stayed: a later numad read
    it as the slice's own. Now the record keeps it, and a later numad gives its own
    (none) back."""
    daemon, fake = _unit_told(machines, tmp_path, "pod.slice")
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert fake.allowed_cpus["pod.slice"] == pool
    fake.stop("pod.slice", unload=True)  # the directory stays
    answer = fake.set_allowed
    failed: list[str] = []

    def no_reply(name: str, cpus: CPUSet | None, mems: NodeSet | None, **kw: bool) -> None:
        if name == "pod.slice" and not failed:
            failed.append(name)
            raise SystemdError(name, "no reply to SetUnitProperties within 5 s")
        answer(name, cpus, mems, **kw)

    fake.set_allowed = no_reply  # type: ignore[method-assign]
    capsys.readouterr()
    daemon.stop()
    logged = capsys.readouterr().out
    assert failed == ["pod.slice"]
    assert "unit_reset_deferred" in logged, logged
    assert "unit_reset_failed" not in logged, logged
    assert json.loads((daemon.state_dir / FILE).read_text())["units"][SLICE]["cpus"] == ""
    assert fake.allowed_cpus["pod.slice"] == pool  # what systemd keeps for it meanwhile
    fake.start("pod.slice")
    again = restarted_daemon(daemon)
    again.isolation.systemd = fake
    again.reconcile()
    _tell_systemd(again)
    assert _told(again)[SLICE]["cpus"] == ""  # its own, not the pool it was left with
    again.stop()
    assert fake.allowed_cpus["pod.slice"] == CPUSet()  # its own: none
