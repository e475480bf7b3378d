"""Moves to admit through the daemon: end to end against a real ``numad serve`` on the
recorded 2-socket machine (single-numa-node, CPUs 0 and 16 reserved: 14 CPUs free on
node 0, 16 on node 1), and in process for the counters, memory and a resize that
re-places a movable workload.

The scene: db (4 CPUs) and web (6) on node 0, batch (12) on node 1: 4 CPUs free on
each node; big asks 8, which fits only once db moves to node 1."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from numad.cli.client import APIError
from numad.cpuset import CPUSet
from numad.daemon import admissions, moving, resizes
from numad.daemon.root import Daemon
from numad.host.scratch import scratch_mkdir
from numad.placement import moves
from numad.placement.admission import Outcome
from tests.conftest import Machines, recorded_daemon, restarted_daemon
from tests.daemon.test_daemon_e2e import Numad, _check_invariants, _spec, numad
from tests.daemon.test_resize import NODES

__all__ = ["numad"]  # the fixture, imported for pytest


def _cpus(answer: dict[str, Any], container: str = "main") -> CPUSet:
    return CPUSet.parse_list(answer["containers"][container]["cpus"])


def _scene(numad: Numad, *, movable: bool) -> CPUSet:
    """db, web, batch admitted; db's CPUs."""
    db = _cpus(numad.call("POST", "/v1/workloads", _spec("db", 4, movable=movable)))
    numad.call("POST", "/v1/workloads", _spec("web", 6))
    batch = _cpus(numad.call("POST", "/v1/workloads", _spec("batch", 12)))
    assert db.issubset(NODES[0])
    assert batch.issubset(NODES[1])
    return db


def test_a_rejection_names_the_fixed_workload_whose_move_would_admit_it(numad: Numad) -> None:
    _scene(numad, movable=False)
    checkpoint = numad.root / "var/lib/numad/checkpoint.json"
    before = checkpoint.read_bytes()
    with pytest.raises(APIError) as rejected:
        numad.call("POST", "/v1/workloads", _spec("big", 8))
    assert rejected.value.status == 409
    body = rejected.value.body
    text = json.dumps(body)
    assert "moving db would admit it, but it is not movable" in text, body
    assert checkpoint.read_bytes() == before
    _check_invariants(numad)


def test_a_movable_workload_is_moved_to_admit_another(numad: Numad) -> None:
    db = _scene(numad, movable=True)
    checkpoint = numad.root / "var/lib/numad/checkpoint.json"
    before = checkpoint.read_bytes()
    planned = numad.call("POST", "/v1/plan", _spec("big", 8))
    assert planned["admitted"] is True
    assert "would move db from node 0 to node 1, no memory to migrate" in planned["explanation"]
    assert [m["workload"] for m in planned["moves"]] == ["db"]
    assert checkpoint.read_bytes() == before  # a plan commits nothing
    assert numad.cpus_of("numad.slice/db") == db

    answer = numad.call("POST", "/v1/workloads", _spec("big", 8))
    big = _cpus(answer)
    (move,) = answer["moves"]
    moved = CPUSet.parse_list(move["to"]["cpus"])
    assert CPUSet.parse_list(move["from"]["cpus"]) == db
    assert db.issubset(big)  # big has the CPUs db left
    assert big.issubset(NODES[0])
    assert moved.issubset(NODES[1])
    assert numad.cpus_of("numad.slice/db") == moved
    assert numad.cpus_of("numad.slice/big") == big
    shown = numad.call("GET", "/v1/workloads/db")
    assert _cpus(shown) == moved
    explained = numad.call("GET", "/v1/workloads/big/explain")["explanation"]
    assert "moved db from node 0 to node 1" in explained
    _check_invariants(numad)

    numad.stop(signal.SIGKILL)  # one checkpoint holds both changes
    numad.start()
    assert _cpus(numad.call("GET", "/v1/workloads/db")) == moved
    assert _cpus(numad.call("GET", "/v1/workloads/big")) == big
    _check_invariants(numad)


def _admit(daemon: Daemon, spec: dict[str, Any]) -> dict[str, Any]:
    _admit_outcome(daemon, spec)
    return daemon.show(spec["name"])


def _admit_outcome(daemon: Daemon, spec: dict[str, Any]) -> Outcome:
    scratch_mkdir(Path(str(daemon.fs.root)) / "sys/fs/cgroup", spec["cgroup"])
    outcome = daemon.admit(daemon.parse(json.dumps(spec), "json"))
    assert outcome.admitted, outcome.explanation
    return outcome


def _counts(daemon: Daemon) -> tuple[float, float, float]:
    m = daemon.metrics
    return (
        m.moves._value.get(),
        m.admitted_by_moves._value.get(),
        m.moved_bytes._value.get(),
    )


def test_moves_are_counted_and_memory_follows(machines: Machines, tmp_path: Path) -> None:
    """With the memory manager: db's memory block moves to node 1 with it (its mems
    follow), the bytes counted are its resident ones (none touched here: its block's)."""
    daemon = recorded_daemon(machines, tmp_path, {"memory": {"policy": "static"}})
    _admit(daemon, _spec("db", 4, movable=True, memory="1Gi"))
    _admit(daemon, _spec("web", 6))
    _admit(daemon, _spec("batch", 12))
    assert _counts(daemon) == (0, 0, 0)
    shown = _admit(daemon, _spec("big", 8))
    db = daemon.show("db")["containers"]["main"]
    assert db["mems"] == "1"
    assert CPUSet.parse_list(db["cpus"]).issubset(NODES[1])
    assert _counts(daemon) == (1, 1, 1 << 30)  # no numa_stat in a scratch tree: the block
    assert shown["containers"]["main"]["mems"] == ""  # big asked no memory
    new = restarted_daemon(daemon, {"memory": {"policy": "static"}})
    assert new.show("db")["containers"]["main"]["mems"] == "1"


def test_a_grown_movable_workload_is_re_placed(machines: Machines, tmp_path: Path) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    _admit(daemon, _spec("db", 4, movable=True))
    _admit(daemon, _spec("web", 6))  # node 0: 4 free; node 1: 16
    status, answer = daemon.resize("db", b'{"cpus": 12}')
    assert status == 200, answer
    cpus = CPUSet.parse_list(answer["containers"]["main"]["cpus"])
    assert len(cpus) == 12
    assert cpus.issubset(NODES[1])
    assert [m["workload"] for m in answer["moves"]] == ["db"]
    assert CPUSet.parse_list(answer["added"]) == cpus  # all new: it moved
    assert len(CPUSet.parse_list(answer["removed"])) == 4
    _admit(daemon, _spec("fixed", 2))
    status, answer = daemon.resize("fixed", b'{"cpus": 12}')  # not movable: refused
    assert status == 409
    assert "the workload is not movable" in answer["error"]["message"]


def test_the_search_for_moves_runs_after_the_lock_and_a_stale_plan_is_not_committed(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search runs with the daemon's lock free (another thread takes it meanwhile).
    A change that lands during the search (web released) makes its plan stale: the
    admission decides again on what holds now (big fits plainly: db is not moved, web
    stays released), never commits the plan made on the old books."""
    daemon = recorded_daemon(machines, tmp_path)
    _admit(daemon, _spec("db", 4, movable=True))
    _admit(daemon, _spec("web", 6))
    _admit(daemon, _spec("batch", 12))
    db = daemon.show("db")["containers"]["main"]["cpus"]
    real = moving.search
    free: list[bool] = []

    def racing(*args: Any) -> Any:
        taken = threading.Thread(target=lambda: free.append(_takes(daemon.held.lock)))
        taken.start()
        taken.join()
        found = real(*args)
        if len(free) == 1:
            daemon.release("web")  # lands between the search and its commit
        return found

    monkeypatch.setattr(admissions, "search", racing)
    big = _admit_outcome(daemon, _spec("big", 8))
    assert free == [True]  # one search, made with the lock free
    assert "web" not in daemon.specs
    assert daemon.show("db")["containers"]["main"]["cpus"] == db  # no move needed now
    assert not big.moves
    assert _counts(daemon) == (0, 0, 0)
    taken = CPUSet()
    for name in daemon.specs:
        cpus = CPUSet.parse_list(daemon.show(name)["containers"]["main"]["cpus"])
        assert not cpus & taken, name
        taken |= cpus


def test_a_plan_that_stays_stale_is_made_under_the_lock_at_last(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every search outrun by another change (a stand-in for a busy host): after
    ``SEARCHES`` of them the admission decides under the lock, and its plan commits."""
    daemon = recorded_daemon(machines, tmp_path)
    for spec in (_spec("db", 4, movable=True), _spec("web", 6), _spec("batch", 12)):
        _admit(daemon, spec)
    real = moving.search
    searched = [0]

    def outrun(*args: Any) -> Any:
        searched[0] += 1
        with daemon.held.lock:
            daemon.held.specs = dict(daemon.held.specs)  # a commit that changed nothing
        return real(*args)

    monkeypatch.setattr(admissions, "search", outrun)
    big = _admit_outcome(daemon, _spec("big", 8))
    assert searched[0] == admissions.SEARCHES
    assert [m.workload for m in big.moves] == ["db"]
    assert _counts(daemon)[:2] == (1, 1)


def _takes(lock: Any) -> bool:
    """Whether another thread can take ``lock`` at once."""
    if not lock.acquire(blocking=False):
        return False
    lock.release()
    return True


def test_a_resize_searches_after_the_lock_and_a_stale_plan_is_not_committed(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """db grows to 12 CPUs, which node 0 cannot give it beside web: its re-placement is
    searched with the lock free. web's release lands meanwhile, so the plan (db to node
    1) is stale: db grows in place on node 0 instead, keeping every CPU it had."""
    daemon = recorded_daemon(machines, tmp_path)
    _admit(daemon, _spec("db", 4, movable=True))
    _admit(daemon, _spec("web", 6))
    db = CPUSet.parse_list(daemon.show("db")["containers"]["main"]["cpus"])
    real = moves.replace_grown
    free: list[bool] = []

    def racing(*args: Any) -> Any:
        taken = threading.Thread(target=lambda: free.append(_takes(daemon.held.lock)))
        taken.start()
        taken.join()
        found = real(*args)
        if len(free) == 1:
            daemon.release("web")
        return found

    monkeypatch.setattr(resizes, "replace_grown", racing)
    status, answer = daemon.resize("db", b'{"cpus": 12}')
    assert status == 200, answer
    assert free == [True]
    cpus = CPUSet.parse_list(answer["containers"]["main"]["cpus"])
    assert len(cpus) == 12
    assert db.issubset(cpus)
    assert cpus.issubset(NODES[0])
    assert not answer["moves"]
    assert "web" not in daemon.specs


@pytest.mark.parametrize("movable", [True, False])
def test_three_moves_admit_and_the_hint_for_fixed_ones_stays_with_single_moves(
    machines: Machines, tmp_path: Path, movable: bool
) -> None:
    """w (5) and a, b, c (1 each) on node 0: 6 CPUs free; batch (13) on node 1: 3 free.
    big asks 9: only a, b and c moved together to node 1 make room (w does not fit
    there). Movable, they are moved; fixed, the rejection names no workload (the hint
    tries single moves only, and none would do)."""
    daemon = recorded_daemon(machines, tmp_path)
    for name, cpus in (("w", 5), ("a", 1), ("b", 1), ("c", 1), ("batch", 13)):
        _admit(daemon, _spec(name, cpus, movable=movable and name in "abc"))
    held = {n: _cpus(daemon.show(n)) for n in ("w", "a", "b", "c", "batch")}
    assert all(held[n].issubset(NODES[0]) for n in "wabc")
    assert held["batch"].issubset(NODES[1])
    scratch_mkdir(Path(str(daemon.fs.root)) / "sys/fs/cgroup", "numad.slice/big")
    outcome = daemon.admit(daemon.parse(json.dumps(_spec("big", 9)), "json"))
    if not movable:
        assert not outcome.admitted
        assert outcome.unmovable == ()
        assert outcome.move_lines() == ()
        return
    assert outcome.admitted, outcome.explanation
    assert sorted(m.workload for m in outcome.moves) == ["a", "b", "c"]
    assert all(_cpus(daemon.show(n)).issubset(NODES[1]) for n in "abc")
    assert _cpus(daemon.show("big")).issubset(NODES[0])
    assert _cpus(daemon.show("w")) == held["w"]


def test_a_fixed_workload_whose_device_class_left_does_not_fail_a_rejection(
    machines: Machines, tmp_path: Path
) -> None:
    """db asked for a vector engine; the engine left (db keeps its CPUs, holding none),
    then its class left the config and numad restarted: db comes back placed on its
    record, its request naming a class there is none of. big's rejection searches the
    moves of fixed workloads for its hint, and placing db again raises there. Before,
    that error was big's answer ("device class ve: no such class", though big asks for
    no device; found by the fault campaign, seed 103); now db is passed over and big is
    rejected as the machine stands."""
    ve = {"devices": {"ve": {"class-prefix": "0x0b40"}}}
    daemon = recorded_daemon(machines, tmp_path, ve)
    _admit(daemon, _spec("db", 4, devices={"ve": 1}))
    (address,) = daemon.books.devices.held[("db", "main")]["ve"]
    (Path(str(daemon.fs.root)) / "sys/bus/pci/devices" / address).unlink()
    daemon.rediscover()
    db = _cpus(daemon.show("db"))
    new = restarted_daemon(daemon)  # no [devices] now
    assert "unplaced" not in json.dumps(new.show("db"))
    assert _cpus(new.show("db")) == db
    _admit(new, _spec("web", 6))
    _admit(new, _spec("batch", 12))  # node 0: db and web, 4 free; node 1: batch, 4 free
    scratch_mkdir(Path(str(new.fs.root)) / "sys/fs/cgroup", "numad.slice/big")
    outcome = new.admit(new.parse(json.dumps(_spec("big", 8)), "json"))
    assert not outcome.admitted
    assert "db" not in outcome.unmovable
    assert _cpus(new.show("db")) == db
