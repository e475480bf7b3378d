"""IRQ affinity off exclusive CPUs ([host] irq-affinity): on the recorded 2-socket machine
with a /proc/irq laid out as the kernel's under the scratch root (the host's own
interrupts are never touched; the VM tier has real ones)."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

import pytest

from numad.cpuset import CPUSet
from numad.daemon.root import Daemon
from numad.host import durable, irqs, isolation_file
from tests.conftest import Machines, recorded_daemon

IRQS = {"1": "0-31", "9": "4", "24": "0-3", "30": "8-11"}  # irq: its own affinity


def _proc_irq(daemon: Daemon) -> Path:
    proc = Path(str(daemon.fs.root)) / "proc/irq"
    for irq, cpus in IRQS.items():
        (proc / irq).mkdir(parents=True, exist_ok=True)
        (proc / irq / "smp_affinity_list").write_text(cpus + "\n")
    (proc / "default_smp_affinity").write_text("ffffffff\n")
    # Interrupt 40 is one the kernel will not move (the write fails).
    (proc / "40").mkdir(exist_ok=True)
    (proc / "40/real").write_text("0-31\n")
    (proc / "40/smp_affinity_list").symlink_to("real")
    return proc


def _affinity(proc: Path, irq: str) -> CPUSet:
    return CPUSet.parse_list((proc / irq / "smp_affinity_list").read_text())


def _admit(daemon: Daemon, name: str, cpus: int) -> None:
    spec = {"name": name, "cgroup": f"numad.slice/{name}", "cpus": cpus}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted


def test_interrupts_leave_exclusive_cpus_and_get_their_own_affinity_back(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path, {"host": {"irq-affinity": True}})
    proc = _proc_irq(daemon)
    _admit(daemon, "db", 8)
    exclusive = CPUSet.from_bits(daemon.books.cpu.exclusive)
    pool = CPUSet.from_bits(daemon.books.cpu.shared_pool)
    for irq, own in IRQS.items():
        now = _affinity(proc, irq)
        assert not now & exclusive, irq
        assert now == ((CPUSet.parse_list(own) - exclusive) or pool), irq
    default = int((proc / "default_smp_affinity").read_text(), 16)
    assert not CPUSet.from_bits(default) & exclusive
    view = daemon.host()["irqs"]
    assert view["enabled"] is True
    assert "40" in view["unmovable"]  # listed, not hidden
    daemon.release("db")  # back toward their own affinity as CPUs return to the pool
    assert _affinity(proc, "1") == CPUSet.parse_list("0-31") - CPUSet.from_bits(
        daemon.books.cpu.exclusive
    )
    _admit(daemon, "db", 8)
    daemon.stop()
    for irq, own in IRQS.items():
        assert _affinity(proc, irq) == CPUSet.parse_list(own), irq
    assert (proc / "default_smp_affinity").read_text().strip() == "ffffffff"
    assert json.loads((daemon.state_dir / "irqs.json").read_text())["irqs"] == {}


def test_interrupts_are_left_alone_by_default(machines: Machines, tmp_path: Path) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    proc = _proc_irq(daemon)
    _admit(daemon, "db", 8)
    for irq, own in IRQS.items():
        assert _affinity(proc, irq) == CPUSet.parse_list(own)
    assert not (daemon.state_dir / "irqs.json").exists()
    assert os.readlink(proc / "40/smp_affinity_list") == "real"


def test_a_full_state_disk_at_stop_still_gives_every_interrupt_back(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: clearing the isolation record on a full disk raised out of the stop,
    and the interrupts kept numad's affinity."""
    daemon = recorded_daemon(machines, tmp_path, {"host": {"irq-affinity": True}})
    proc = _proc_irq(daemon)
    _admit(daemon, "db", 8)
    assert _affinity(proc, "1") != CPUSet.parse_list(IRQS["1"])
    full = partial(durable.write_file, syscalls=durable.Syscalls.injecting(durable.Fault.ENOSPC))
    monkeypatch.setattr(isolation_file, "write_file", full)
    monkeypatch.setattr(irqs, "write_file", full)
    daemon.stop()
    for irq, own in IRQS.items():
        assert _affinity(proc, irq) == CPUSet.parse_list(own), irq
