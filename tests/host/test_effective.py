"""Effective cpusets: numad reads back what the kernel applies after each write and
reports a cgroup whose effective set differs (the scratch tree emulates the kernel's
masking by the parent's effective set)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from numad.cpuset import CPUSet, NodeSet
from numad.daemon.root import Daemon
from numad.errors import CgroupError
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines, recorded_daemon

MACHINE = "32intel64-2p8co2t+8ve"
RESERVED = CPUSet.parse_list("0,16")  # two reserved CPUs chosen by count
DB = "numad.slice/db"


def _admit_db(daemon: Daemon) -> CPUSet:
    spec = {"name": "db", "cgroup": DB, "cpus": 4}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
    return CPUSet.from_bits(daemon.books.cpu.assignments[("db", "main")])


def _effective(daemon: Daemon, path: str) -> CPUSet:
    return daemon.cgroups.read_effective(path)[0]


def _not_effective(daemon: Daemon) -> float | None:
    return daemon.metrics.registry.get_sample_value("numad_cgroup_not_effective_total")


def _problems(daemon: Daemon, path: str) -> list[str]:
    return [p for p in daemon.problems if p.startswith(f"{path}:")]


def test_a_cpuset_the_kernel_masks_is_reported_until_it_applies(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    # Another writer narrows the managed root to the reserved CPUs: no exclusive
    # CPU is inside it, so db's effective set falls back to the parent's.
    daemon.cgroups.write("numad.slice", RESERVED, None)
    with capture_logs() as logs:
        wanted = _admit_db(daemon)
    assert (tmp_path / "machine/sys/fs/cgroup" / DB / "cpuset.cpus").read_text().strip() == (
        wanted.format_list()
    )  # the write itself succeeded
    assert _effective(daemon, DB) == RESERVED
    assert _problems(daemon, DB) == [
        f"{DB}: the kernel applies cpus {RESERVED.format_list()} mems 0-1, not cpus"
        f" {wanted.format_list()} (CPUs outside the parent's cpuset, or a node without memory)"
    ]
    assert _not_effective(daemon) == 1
    assert DB not in daemon.written
    (event,) = [e for e in logs if e["event"] == "cpuset_not_effective"]
    assert event["log_level"] == "error"
    assert event["cgroup"] == DB
    assert event["wanted_cpus"] == wanted.format_list()
    assert event["effective_cpus"] == RESERVED.format_list()
    assert event["effective_mems"] == "0-1"

    daemon.reconcile()  # written and checked again, still one problem line
    assert len(_problems(daemon, DB)) == 1
    assert _not_effective(daemon) == 2

    daemon.cgroups.write("numad.slice", CPUSet(), None)  # widened again: inherit all
    daemon.reconcile()
    assert _effective(daemon, DB) == wanted
    assert _problems(daemon, DB) == []
    assert _not_effective(daemon) == 2
    assert DB in daemon.written


def test_an_effective_cpuset_is_not_reported(machines: Machines, tmp_path: Path) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    wanted = _admit_db(daemon)
    daemon.reconcile()
    assert _effective(daemon, DB) == wanted
    assert daemon.problems == []
    assert _not_effective(daemon) == 0


def test_a_failed_readback_counts_as_a_failed_write(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = recorded_daemon(machines, tmp_path)

    def unreadable(path: str) -> tuple[CPUSet, NodeSet]:
        raise CgroupError(path, "reading the effective cpuset failed")

    monkeypatch.setattr(daemon.cgroups, "read_effective", unreadable)
    with capture_logs() as logs:
        _admit_db(daemon)
    assert daemon.metrics.registry.get_sample_value("numad_cgroup_write_errors_total") == 1
    assert any(e["event"] == "cgroup_write_failed" and e["cgroup"] == DB for e in logs)
    assert DB not in daemon.written


def test_a_write_the_kernel_masks_is_not_mistaken_for_drift(
    machines: Machines, tmp_path: Path
) -> None:
    """A shared cgroup written while its parent is narrowed holds numad's new pool but
    not its effective set; the next pass must not count numad's own write as drift."""
    daemon = recorded_daemon(machines, tmp_path)
    scratch_mkdir(tmp_path / "machine/sys/fs/cgroup", "numad.slice/web")
    web = {"name": "web", "cgroup": "numad.slice/web", "cpus": "500m"}
    assert daemon.admit(daemon.parse(json.dumps(web), "json")).admitted
    assert "numad.slice/web" in daemon.written  # effective: remembered
    daemon.cgroups.write("numad.slice", RESERVED, None)
    _admit_db(daemon)  # the pool shrinks; the kernel masks it to the reserved CPUs
    daemon.reconcile()
    assert daemon.metrics.registry.get_sample_value("numad_drift_repairs_total") == 0
