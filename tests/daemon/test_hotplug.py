"""Hotplug: a fixture tree mutated between discoveries, and a simulated event source."""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from numad.cpuset import CPUSet, NodeSet
from numad.daemon import watch
from numad.daemon.root import Daemon
from numad.daemon.watch import Event, debounce, netlink_source
from tests.conftest import Machines, recorded_daemon

MACHINE = "32intel64-2p8co2t+8ve"  # node 0: CPUs 0-7,16-23; vector engines on node 0
NODE0 = CPUSet.parse_list("0-7,16-23")


def _daemon(machines: Machines, tmp_path: Path) -> Daemon:
    daemon = recorded_daemon(machines, tmp_path, {"devices": {"ve": {"class-prefix": "0x0b40"}}})
    spec = {"name": "db", "cgroup": "numad.slice/db", "cpus": 4, "devices": {"ve": 1}}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
    return daemon


def _root(daemon: Daemon) -> Path:
    return Path(str(daemon.fs.root))


def _held(daemon: Daemon) -> CPUSet:
    return CPUSet.from_bits(daemon.books.cpu.assignments[("db", "main")])


def test_a_cpu_going_offline_under_an_assignment_is_replaced(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = _daemon(machines, tmp_path)
    before = _held(daemon)
    victim = before.max()
    online = CPUSet.parse_list("0-31") - CPUSet([victim])
    (_root(daemon) / "sys/devices/system/cpu/online").write_text(online.format_list() + "\n")
    changes = daemon.rediscover()
    after = _held(daemon)
    assert len(after) == 4
    assert victim not in after
    assert after.issubset(NODE0)  # the replacement is on the same node
    assert (before - CPUSet([victim])).issubset(after)  # the other CPUs stay
    assert any("reassigned" in c for c in changes)
    cgroup = _root(daemon) / "sys/fs/cgroup/numad.slice/db/cpuset.cpus"
    assert CPUSet.parse_list(cgroup.read_text()) == after


def test_no_free_cpu_to_replace_it_flags_the_container(machines: Machines, tmp_path: Path) -> None:
    daemon = _daemon(machines, tmp_path)
    before = _held(daemon)
    victim = before.max()
    # Only db's CPUs and the reserved ones stay online: nothing free to take over.
    online = (before | CPUSet([0, 16])) - CPUSet([victim])
    (_root(daemon) / "sys/devices/system/cpu/online").write_text(online.format_list() + "\n")
    changes = daemon.rediscover()
    assert _held(daemon) == before - CPUSet([victim])
    assert any("flagged" in c for c in changes)
    assert any("flagged" in p for p in daemon.problems)


def test_cpus_coming_online_join_the_shared_pool(machines: Machines, tmp_path: Path) -> None:
    daemon = _daemon(machines, tmp_path)
    cpu_online = _root(daemon) / "sys/devices/system/cpu/online"
    cpu_online.write_text("0-30\n")
    daemon.rediscover()
    assert 31 not in CPUSet.from_bits(daemon.books.cpu.shared_pool)
    cpu_online.write_text("0-31\n")
    daemon.rediscover()
    assert 31 in CPUSet.from_bits(daemon.books.cpu.shared_pool)


def test_a_device_leaving_is_dropped_and_flagged(machines: Machines, tmp_path: Path) -> None:
    daemon = _daemon(machines, tmp_path)
    (address,) = daemon.books.devices.held[("db", "main")]["ve"]
    (_root(daemon) / "sys/bus/pci/devices" / address).unlink()
    changes = daemon.rediscover()
    assert daemon.books.devices.held[("db", "main")]["ve"] == ()
    assert any(address in c and "flagged" in c for c in changes)
    assert daemon.books.devices.inventory.classes["ve"]  # the other engines are still there


def test_a_flagged_container_is_given_the_cpus_it_lacks_once_they_are_free(
    machines: Machines, tmp_path: Path
) -> None:
    """db is short of a CPU (none was free when one of its went offline). Before, it
    stayed short until numad restarted; now the next rediscovery with a free CPU on its
    node gives it one, and the flag goes. Never the shared pool's last, and never of
    another node."""
    daemon = _daemon(machines, tmp_path)
    before = _held(daemon)
    victim = before.max()
    cpu_online = _root(daemon) / "sys/devices/system/cpu/online"
    cpu_online.write_text(((before | CPUSet([0, 16])) - CPUSet([victim])).format_list() + "\n")
    daemon.rediscover()
    assert _held(daemon) == before - CPUSet([victim])
    spare = (NODE0 - before - CPUSet([0, 16])).min()
    cpu_online.write_text((before - CPUSet([victim]) | CPUSet([spare])).format_list() + "\n")
    changes = daemon.rediscover()  # reserved offline: the spare is the pool's last
    assert _held(daemon) == before - CPUSet([victim]), changes
    assert any(p.startswith("db/main: cpus") for p in daemon.problems)
    back = NODE0 - CPUSet([victim])  # node 0 back but the victim; node 1 offline
    cpu_online.write_text(back.format_list() + "\n")
    changes = daemon.rediscover()
    after = _held(daemon)
    assert len(after) == 4, changes
    assert (before - CPUSet([victim])).issubset(after)
    assert after.issubset(NODE0)
    assert any(c.startswith("db/main: short of 1 cpus; given") for c in changes), changes
    assert not [p for p in daemon.problems if p.startswith("db/main: cpus")], daemon.problems
    cgroup = _root(daemon) / "sys/fs/cgroup/numad.slice/db/cpuset.cpus"
    assert CPUSet.parse_list(cgroup.read_text()) == after


def test_a_replacement_never_takes_the_shared_pools_last_cpu(
    machines: Machines, tmp_path: Path
) -> None:
    """The reserved CPUs go offline with one of db's; one free CPU of its node is left,
    the whole shared pool. Taking it would leave every other cgroup no CPU to run on
    (and db's grant waiting on them for good: found by the fault campaign, seed 108):
    db is flagged instead, and the pool keeps it."""
    daemon = _daemon(machines, tmp_path)
    before = _held(daemon)
    victim, spare = before.max(), (NODE0 - before - CPUSet([0, 16])).min()
    online = (before | CPUSet([spare])) - CPUSet([victim])  # reserved 0 and 16 offline
    (_root(daemon) / "sys/devices/system/cpu/online").write_text(online.format_list() + "\n")
    changes = daemon.rediscover()
    assert _held(daemon) == before - CPUSet([victim])
    assert CPUSet.from_bits(daemon.books.cpu.shared_pool) == CPUSet([spare])
    assert any("shared pool's last" in c and "flagged" in c for c in changes), changes
    assert any(p.startswith("db/main: cpus") for p in daemon.problems)


def test_a_container_short_of_cpus_that_loses_its_device_shows_both_until_released(
    machines: Machines, tmp_path: Path
) -> None:
    """Each flag is a problem of its own: before, the device's replaced the CPUs' (one
    problem per container), and db's shortfall went unsaid (found by the fault
    campaign, seed 125). Released, db's flags go with it."""
    daemon = _daemon(machines, tmp_path)
    before = _held(daemon)
    victim = before.max()
    online = (before | CPUSet([0, 16])) - CPUSet([victim])  # nothing free to take over
    (_root(daemon) / "sys/devices/system/cpu/online").write_text(online.format_list() + "\n")
    daemon.rediscover()
    (address,) = daemon.books.devices.held[("db", "main")]["ve"]
    (_root(daemon) / "sys/bus/pci/devices" / address).unlink()
    daemon.rediscover()
    flags = [p for p in daemon.problems if p.startswith("db/main:")]
    assert len(flags) == 2, daemon.problems
    assert any(f"cpus {victim} went offline" in p for p in flags)
    assert any(f"device {address} (ve) left" in p for p in flags)
    daemon.release("db")
    assert not [p for p in daemon.problems if p.startswith("db/")], daemon.problems


def test_events_are_debounced_into_bursts() -> None:
    def source() -> Iterator[Event]:
        for i in range(5):  # a hot-add brings several events at once
            yield ("cpu", f"online-{i}")
        time.sleep(0.5)
        yield ("pci", "remove")

    bursts: list[list[Event]] = []
    debounce(source(), bursts.append, quiet=0.2)
    assert [len(b) for b in bursts] == [5, 1]
    assert bursts[1] == [("pci", "remove")]


def test_a_node_appearing_joins_the_merge_and_the_pool(machines: Machines, tmp_path: Path) -> None:
    daemon = _daemon(machines, tmp_path)
    node_online = _root(daemon) / "sys/devices/system/node/online"
    node_online.write_text("0\n")  # node 1 gone (its CPUs then sit on no node)
    daemon.rediscover()
    assert daemon.engine.machine.nodes == NodeSet([0])
    assert CPUSet.from_bits(daemon.books.cpu.online).issubset(NODE0)
    node_online.write_text("0-1\n")  # and back
    daemon.rediscover()
    assert daemon.engine.machine.nodes == NodeSet([0, 1])
    assert CPUSet.from_bits(daemon.books.cpu.shared_pool).issuperset(
        CPUSet.parse_list("8-15,24-31")
    )
    spec = {"name": "web", "cgroup": "numad.slice/web", "cpus": 8}
    outcome = daemon.admit(daemon.parse(json.dumps(spec), "json"))
    assert outcome.admitted  # 8 CPUs on one node: node 1 is usable again


def test_the_netlink_source_is_udev_only_where_udev_runs(tmp_path: Path) -> None:
    control = tmp_path / "control"
    assert netlink_source(control) == "kernel"  # no udev daemon: raw kernel uevents
    control.touch()  # udevd's control socket
    assert netlink_source(control) == "udev"


@pytest.mark.parametrize("udev_runs", [False, True])
def test_udev_events_listens_to_the_source_that_delivers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, udev_runs: bool
) -> None:
    control = tmp_path / "control"
    if udev_runs:
        control.touch()
    sources: list[str] = []
    events = iter(  # None: a message libudev filtered out, which must not end the stream
        [
            SimpleNamespace(subsystem="cpu", action="online"),
            None,
            SimpleNamespace(subsystem="node", action="add"),
        ]
    )

    def from_netlink(context: object, source: str = "udev") -> Any:
        sources.append(source)
        return SimpleNamespace(filter_by=lambda subsystem: None, poll=lambda: next(events))

    fake = SimpleNamespace(Context=object, Monitor=SimpleNamespace(from_netlink=from_netlink))
    monkeypatch.setitem(sys.modules, "pyudev", fake)
    monkeypatch.setattr(watch, "UDEV_CONTROL", control)
    assert list(itertools.islice(watch.udev_events(), 2)) == [("cpu", "online"), ("node", "add")]
    assert sources == ["udev" if udev_runs else "kernel"]
