"""Restart repair (numad.daemon.restore): a recorded workload whose CPU went offline
while numad was stopped is repaired in place, not admitted again from scratch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from numad.cpuset import CPUSet
from numad.daemon.root import Daemon
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines, recorded_daemon, restarted_daemon

NODE0 = CPUSet.parse_list("0-7,16-23")


def _admit(daemon: Daemon, name: str, cpus: int) -> CPUSet:
    scratch_mkdir(Path(str(daemon.fs.root)) / "sys/fs/cgroup", f"numad.slice/{name}")
    spec = {"name": name, "cgroup": f"numad.slice/{name}", "cpus": cpus}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
    return _held(daemon, name)


def _held(daemon: Daemon, name: str) -> CPUSet:
    return CPUSet.from_bits(daemon.books.cpu.assignments.get((name, "main"), 0))


def test_a_restart_repair_keeps_every_cpu_still_usable(machines: Machines, tmp_path: Path) -> None:
    """db holds CPUs that a fresh admission would not pick (a, admitted first and
    released, left the lowest free); one of them goes offline while numad is down.
    The repair keeps the three still usable and adds one of node 0; admitting db
    again from scratch would take a's old CPUs instead."""
    daemon = recorded_daemon(machines, tmp_path)
    freed = _admit(daemon, "a", 4)
    before = _admit(daemon, "db", 4)
    shutil.rmtree(Path(str(daemon.fs.root)) / "sys/fs/cgroup/numad.slice/a")
    daemon.release("a")
    fresh = daemon.plan(daemon.parse('{"name": "x", "cgroup": "numad.slice/x", "cpus": 4}', "json"))
    assert fresh.placements["main"].cpus == freed
    assert not freed & before  # the premise: a fresh admission picks other CPUs
    victim = before.max()
    online = Path(str(daemon.fs.root)) / "sys/devices/system/cpu/online"
    online.write_text((CPUSet.parse_list("0-31") - CPUSet([victim])).format_list() + "\n")
    daemon.stop()
    again = restarted_daemon(daemon)
    after = _held(again, "db")
    assert (before - CPUSet([victim])).issubset(after)
    assert len(after) == 4
    assert victim not in after
    assert after.issubset(NODE0)
    cgroup = Path(str(again.fs.root)) / "sys/fs/cgroup/numad.slice/db/cpuset.cpus"
    assert CPUSet.parse_list(cgroup.read_text()) == after


def test_a_hotplug_repair_keeps_every_cpu_still_usable(machines: Machines, tmp_path: Path) -> None:
    """The same while numad runs: rediscovery replaces only the CPU that left."""
    daemon = recorded_daemon(machines, tmp_path)
    freed = _admit(daemon, "a", 4)
    before = _admit(daemon, "db", 4)
    shutil.rmtree(Path(str(daemon.fs.root)) / "sys/fs/cgroup/numad.slice/a")
    daemon.release("a")
    assert not freed & before
    victim = before.max()
    online = Path(str(daemon.fs.root)) / "sys/devices/system/cpu/online"
    online.write_text((CPUSet.parse_list("0-31") - CPUSet([victim])).format_list() + "\n")
    daemon.rediscover()
    after = _held(daemon, "db")
    assert (before - CPUSet([victim])).issubset(after)
    assert len(after) == 4
    assert victim not in after
    assert after.issubset(NODE0)
