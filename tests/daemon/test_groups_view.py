"""Each device's CPUs and memory in what a user reads (issue 27 item 3): ``show`` (the
API's GET /v1/workloads/NAME) and the plan and admit answers give a container with
devices a ``groups`` list, kept from the books across a restart; its text form; the
option align-per-resource read from the config and reaching the engine.

An in-process daemon on the recorded 2-socket machine (``recorded_daemon``: its 8
vector engines all on node 0), best-effort, with the memory manager on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from numad.cli import textout
from numad.cpuset import CPUSet
from numad.daemon.answers import outcome_json
from numad.daemon.root import Daemon
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines, recorded_daemon, restarted_daemon

GIB = 1 << 30
NODE0 = CPUSet.parse_list("0-7,16-23")
CONFIG: dict[str, Any] = {
    "topology": {"policy": "best-effort", "options": {"align-per-resource": True}},
    "memory": {"policy": "static"},
    "devices": {"vector-engine": {"class-prefix": "0x0b40"}},
}
DB = {"name": "db", "cgroup": "numad.slice/db", "cpus": 4, "memory": "2Gi"}
WEB = {"name": "web", "cgroup": "numad.slice/web", "cpus": 2}


def _spec(daemon: Daemon, spec: dict[str, Any]) -> Any:
    return daemon.parse(json.dumps(spec), "json")


def test_show_and_plan_say_which_cpus_and_memory_go_with_each_device(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path, CONFIG)
    assert daemon.held.engine.options.align_per_resource
    db = {**DB, "devices": {"vector-engine": 2}}
    planned = outcome_json(daemon.plan(_spec(daemon, db)))
    assert daemon.admit(_spec(daemon, db)).admitted
    scratch_mkdir(Path(str(daemon.fs.root)) / "sys/fs/cgroup", "numad.slice/web")
    assert daemon.admit(_spec(daemon, WEB)).admitted
    shown = daemon.show("db")["containers"]["main"]
    engines = shown["devices"]["vector-engine"]
    cpus = CPUSet.parse_list(shown["cpus"])
    assert len(cpus) == 4
    assert cpus.issubset(NODE0)
    groups = shown["groups"]
    assert [g["device"] for g in groups] == engines  # both on node 0: by address
    for g in groups:
        assert set(g) == {"class", "device", "node", "cpus", "memory", "local"}
        assert (g["class"], g["node"], g["memory"], g["local"]) == (
            "vector-engine",
            0,
            GIB,
            True,
        )
        assert len(CPUSet.parse_list(g["cpus"])) == 2
    assert CPUSet.parse_list(groups[0]["cpus"]) | CPUSet.parse_list(groups[1]["cpus"]) == cpus
    assert planned["containers"]["main"]["groups"] == groups  # the plan said so before
    # No devices, no groups; the keys that were there stay as they were.
    assert "groups" not in daemon.show("web")["containers"]["main"]
    assert set(shown) == {"cgroup", "cpus", "exclusive", "mems", "devices", "groups"}
    # A held workload's plan, and the same after a restart (from the checkpoint's books).
    again = outcome_json(daemon.plan(_spec(daemon, db)))
    assert again["already"]
    assert again["containers"]["main"]["groups"] == groups
    daemon.stop()
    restarted = restarted_daemon(daemon, CONFIG)
    try:
        assert restarted.show("db")["containers"]["main"]["groups"] == groups
        lines = textout.workload(restarted.show("db"))
        for g in groups:
            assert (
                f"    with vector-engine {g['device']} (node 0): cpus {g['cpus']}, memory 1Gi"
                in (lines)
            )
    finally:
        restarted.stop()


def test_a_device_group_without_cpus(machines: Machines, tmp_path: Path) -> None:
    """A shared-pool container with a device: its group has no CPUs and is not local."""
    daemon = recorded_daemon(machines, tmp_path, CONFIG)
    try:
        spec = {**WEB, "cpus": "500m", "devices": {"vector-engine": 1}}
        assert daemon.admit(_spec(daemon, spec)).admitted
        (group,) = daemon.show("web")["containers"]["main"]["groups"]
        assert (group["cpus"], group["local"], group["memory"]) == ("", False, 0)
        line = textout.workload(daemon.show("web"))[-1]
        assert line == f"    with vector-engine {group['device']} (node 0): cpus -"
    finally:
        daemon.stop()


def test_the_text_of_groups() -> None:
    """Groups as ``show`` and ``plan`` print them: memory only where there is some, and
    CPUs off the device's node said."""
    placed = {
        "cpus": "1-3",
        "mems": "0-1",
        "devices": {"gpu": ["0000:1b:00.0", "0000:9d:00.0"]},
        "groups": [
            {
                "class": "gpu",
                "device": "0000:1b:00.0",
                "node": 0,
                "cpus": "1-2",
                "memory": GIB,
                "local": True,
            },
            {
                "class": "gpu",
                "device": "0000:9d:00.0",
                "node": 1,
                "cpus": "3",
                "memory": 0,
                "local": False,
            },
        ],
    }
    expected = [
        "with gpu 0000:1b:00.0 (node 0): cpus 1-2, memory 1Gi",
        "with gpu 0000:9d:00.0 (node 1): cpus 3, some CPUs off node 1",
    ]
    shown = textout.workload({"name": "w", "containers": {"main": placed}})
    assert shown[-2:] == [f"    {line}" for line in expected]
    answer = {
        "admitted": True,
        "explanation": "admitted on nodes 0-1",
        "containers": {"main": placed},
    }
    assert textout.plan("w", answer)[-2:] == [f"    {line}" for line in expected]
