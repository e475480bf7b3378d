"""Resize in place through the daemon (``PATCH /v1/workloads/NAME``): end to end against
a real ``numad serve`` on the recorded 2-socket machine (grow, shrink, the cgroup files
after, the checkpoint across a restart, a kill between the checkpoint and the cgroup
writes), and in process: a refusal leaves the checkpoint and every cgroup file byte for
byte as they were, memory through the memory manager, the counter, movable kept in the
checkpoint (and an older checkpoint without it read as not movable)."""

from __future__ import annotations

import json
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from numad.cli.client import APIError
from numad.cpuset import CPUSet
from numad.daemon import state
from numad.daemon.root import Daemon
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines, recorded_daemon, restarted_daemon
from tests.daemon.test_daemon_e2e import (
    ONLINE,
    RESERVED,
    Numad,
    _check_invariants,
    _spec,
    numad,
)

__all__ = ["numad"]  # the fixture, imported for pytest

NODES = (CPUSet.parse_list("0-7,16-23"), CPUSet.parse_list("8-15,24-31"))  # the recording's


def _node_of(cpus: CPUSet) -> CPUSet:
    return next(node for node in NODES if cpus.issubset(node))


def _cpus(answer: dict[str, Any], container: str = "main") -> CPUSet:
    return CPUSet.parse_list(answer["containers"][container]["cpus"])


def test_grow_and_shrink_over_the_api(numad: Numad) -> None:
    numad.call("POST", "/v1/workloads", _spec("web", "500m"))
    db = _cpus(numad.call("POST", "/v1/workloads", _spec("db", 4, movable=True)))
    grown = numad.call("PATCH", "/v1/workloads/db", {"cpus": 6})
    big = _cpus(grown)
    assert len(big) == 6
    assert db.issubset(big)  # every CPU it had
    assert big.issubset(_node_of(db))  # single-numa-node: on its node
    assert CPUSet.parse_list(grown["added"]) == big - db
    assert grown["workload"]["movable"] is True
    assert numad.cpus_of("numad.slice/db") == big
    assert numad.cpus_of("numad.slice/web") == ONLINE - big  # the pool shrank
    _check_invariants(numad)

    small = _cpus(numad.call("PATCH", "/v1/workloads/db", {"cpus": 2, "container": "main"}))
    assert len(small) == 2
    assert small.issubset(big)
    assert numad.cpus_of("numad.slice/db") == small
    assert numad.cpus_of("numad.slice/web") == ONLINE - small  # the pool grew back
    _check_invariants(numad)

    numad.stop(signal.SIGKILL)  # the checkpoint holds the new size
    numad.start()
    shown = numad.call("GET", "/v1/workloads/db")
    assert _cpus(shown) == small
    assert shown["movable"] is True
    _check_invariants(numad)


def test_a_refused_resize_answers_409_and_changes_nothing(numad: Numad) -> None:
    numad.call("POST", "/v1/workloads", _spec("db", 4))
    checkpoint = numad.root / "var/lib/numad/checkpoint.json"
    before = checkpoint.read_bytes(), numad.cpus_of("numad.slice/db")
    with pytest.raises(APIError) as refused:
        numad.call("PATCH", "/v1/workloads/db", {"cpus": 20})  # more than node 0 has
    assert refused.value.status == 409
    error = refused.value.body["error"]
    assert error["code"] == "resize_refused"
    node = _node_of(numad.cpus_of("numad.slice/db"))
    free = len(node - RESERVED) - 4
    which = "node 0" if node == NODES[0] else "node 1"
    assert error["message"] == (
        f"db: not resized: no room on {which}: {free} free, 16 more asked; the workload is"
        " not movable"
    )
    assert (checkpoint.read_bytes(), numad.cpus_of("numad.slice/db")) == before


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        pytest.param("db", {"cpus": "4"}, 400, "cpus: give a whole number", id="cpus-text"),
        pytest.param("db", {"cpus": -1}, 400, "cpus: give a whole number", id="cpus-negative"),
        pytest.param("db", {"memory": "lots"}, 400, "memory: give bytes", id="memory-text"),
        pytest.param("db", {"gpus": 1}, 400, "unknown field 'gpus'", id="unknown-field"),
        pytest.param("db", {}, 400, "give a JSON object", id="empty"),
        pytest.param("db", {"container": "main"}, 400, "give cpus, memory", id="nothing"),
        pytest.param("db", {"cpus": 2, "container": "x"}, 400, "its containers: main", id="no-c"),
        pytest.param("nosuch", {"cpus": 2}, 404, "no such workload", id="no-workload"),
        pytest.param("web", {"cpus": 2}, 409, "runs on the shared pool", id="qos-change"),
    ],
)
def test_bad_resizes_get_4xx(
    numad: Numad, path: str, body: dict[str, Any], status: int, words: str
) -> None:
    numad.call("POST", "/v1/workloads", _spec("db", 4))
    numad.call("POST", "/v1/workloads", _spec("web", "500m"))
    with pytest.raises(APIError) as bad:
        numad.call("PATCH", f"/v1/workloads/{path}", body)
    assert bad.value.status == status
    assert words in bad.value.body["error"]["message"]
    _check_invariants(numad)


@pytest.mark.parametrize("point", ["resize:after-checkpoint", "resize:after-shared"])
def test_killed_during_a_resize(numad: Numad, point: str) -> None:
    """Killed between the checkpoint and the cgroup writes: the resize stands (it was
    checkpointed) and the next start writes the cgroups; no CPU is in two sets."""
    numad.call("POST", "/v1/workloads", _spec("web", "500m"))
    numad.call("POST", "/v1/workloads", _spec("db", 4))
    numad.stop()
    numad.start(crash_at=point)
    with pytest.raises(Exception):  # noqa: B017, PT011 - the daemon dies mid-request
        numad.call("PATCH", "/v1/workloads/db", {"cpus": 8})
    assert numad.proc is not None
    assert numad.proc.wait(timeout=20) == 137
    numad.start()
    assert len(_cpus(numad.call("GET", "/v1/workloads/db"))) == 8
    _check_invariants(numad)


# -- in process -----------------------------------------------------------------------------


def _files(daemon: Daemon) -> dict[str, bytes]:
    """The checkpoint and every cpuset file of the scratch cgroup tree."""
    root = Path(str(daemon.fs.root))
    tree = root / "sys/fs/cgroup"
    out = {str(p.relative_to(tree)): p.read_bytes() for p in sorted(tree.rglob("cpuset.*"))}
    out["checkpoint"] = (daemon.state_dir / state.FILE).read_bytes()
    return out


def _admit(daemon: Daemon, spec: dict[str, Any]) -> None:
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted


def test_refusals_leave_checkpoint_and_cgroups_byte_for_byte(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    scratch_mkdir(Path(str(daemon.fs.root)) / "sys/fs/cgroup", "numad.slice/web")
    _admit(daemon, _spec("db", 6))
    _admit(daemon, _spec("web", "500m"))
    before, books = _files(daemon), daemon.books
    for name, body in (
        ("db", {"cpus": 20}),  # more than a node has
        ("db", {"cpus": 0}),
        ("web", {"cpus": 1}),
        ("db", {"cpus": 4, "memory": "1Gi"}),  # no memory manager: nothing to hold it
    ):
        status, answer = daemon.resize(name, json.dumps(body).encode())
        if body.get("memory"):
            assert status == 200  # without a memory manager, memory is the spec's alone
            assert daemon.specs["db"].containers[0].memory["memory"] == 1 << 30
            continue
        assert status == 409, answer
        assert _files(daemon) == before
        assert daemon.books is books
    metric = daemon.metrics.resizes
    assert metric.labels("refused")._value.get() == 3
    assert metric.labels("resized")._value.get() == 1


def test_memory_resizes_through_the_memory_manager(machines: Machines, tmp_path: Path) -> None:
    daemon = recorded_daemon(machines, tmp_path, {"memory": {"policy": "static"}})
    _admit(daemon, _spec("db", 2, memory="1Gi"))
    mems = daemon.show("db")["containers"]["main"]["mems"]
    status, answer = daemon.resize("db", b'{"memory": "3Gi"}')
    assert status == 200, answer
    blocks = daemon.books.memory.blocks[("db", "main")]
    assert sum(b.size for b in blocks) == 3 << 30
    assert answer["containers"]["main"]["mems"] == mems  # its node, as before
    status, answer = daemon.resize("db", b'{"memory": "100Ti"}')
    assert status == 409
    assert f"no room on node {mems}:" in answer["error"]["message"]
    new = restarted_daemon(daemon, {"memory": {"policy": "static"}})
    assert sum(b.size for b in new.books.memory.blocks[("db", "main")]) == 3 << 30


def test_movable_is_kept_in_the_checkpoint_and_old_ones_read_as_fixed(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    _admit(daemon, _spec("db", 2, movable=True))
    record = state.read(daemon.state_dir)[0]
    assert record is not None
    assert record.workloads["db"].spec["movable"] is True
    # A checkpoint written before the field existed: its spec has no "movable".
    path = daemon.state_dir / state.FILE
    old = state.decode(path.read_bytes(), "checkpoint")
    spec = {k: v for k, v in old.workloads["db"].spec.items() if k != "movable"}
    workloads = {"db": replace(old.workloads["db"], spec=spec)}
    path.write_bytes(state.encode(replace(old, workloads=workloads)))
    new = restarted_daemon(daemon)
    assert new.specs["db"].movable is False
    assert new.show("db")["movable"] is False
    assert len(CPUSet.parse_list(new.show("db")["containers"]["main"]["cpus"])) == 2


def test_a_grown_workload_whose_device_class_left_is_refused_with_nothing_changed(
    machines: Machines, tmp_path: Path
) -> None:
    """db, movable, holds a vector engine; the engine left, then its class left the
    config and numad restarted: db is back on its record, its request naming a class
    there is none of. Grown past its node's room it would be re-placed, and placing it
    again raises: 409, and every file as it was. Before, the error escaped the resize
    (found by the fault campaign, seed 36)."""
    ve = {"devices": {"ve": {"class-prefix": "0x0b40"}}}
    daemon = recorded_daemon(machines, tmp_path, ve)
    _admit(daemon, _spec("db", 4, devices={"ve": 1}, movable=True))
    (address,) = daemon.books.devices.held[("db", "main")]["ve"]
    (Path(str(daemon.fs.root)) / "sys/bus/pci/devices" / address).unlink()
    daemon.rediscover()
    new = restarted_daemon(daemon)  # no [devices] now
    _admit(new, _spec("web", 10))  # db's node has 14 free CPUs: 2 left
    before = _files(new)
    status, answer = new.resize("db", json.dumps({"cpus": 8}).encode())
    assert status == 409, answer
    assert _files(new) == before
