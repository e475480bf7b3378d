"""Real-kernel tests under the host's own systemd: one QEMU VM per (machine, kernel),
booted by init-systemd.sh into systemd as PID 1, running the in-guest checks of
tests/vm/guest/systemd_checks.py against numad as its real unit (systemd/numad.service
and systemd/numad.slice, unmodified, plus the drop-in below)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests.vm import harness, pace, progress
from tests.vm.topologies import MACHINES

CHECKS = "tests/vm/guest/systemd_checks.py"
MIN_CHECKS = 11
TARGET = "numad-vm.target"
OWN_UNITS = (TARGET, "numad-vm-checks.service")  # in tests/vm/systemd
CONFIG = "/run/numad-vm/numad.toml"  # written by the checks before they start numad
HOMES = (Path("/root"), Path("/home"), Path("/run/user"))  # what ProtectHome= hides
TMPS = (Path("/tmp"), Path("/var/tmp"))  # noqa: S108 - what PrivateTmp= replaces
CASES = [pytest.param(m, k, id=f"{m}-{k}") for m in ("2node", "4node") for k in harness.KERNELS]


def dropin() -> str:
    """numad.service.d/vm.conf: what differs from a real install, and why."""
    numad = Path(sys.prefix) / "bin" / "numad"
    text = (
        "# The VM's numad is the project's venv, not a package: a real install runs\n"
        "# /usr/bin/numad with /etc/numad/numad.toml.\n"
        "[Service]\n"
        "ExecStart=\n"
        f"ExecStart={numad} serve --config {CONFIG}\n"
    )
    hidden = [p for p in harness.shares() if any(p.is_relative_to(h) for h in HOMES)]
    if hidden:
        text += (
            f"# {' '.join(str(p) for p in hidden)}: under a home, which ProtectHome=yes\n"
            "# hides, so the venv's interpreter (the host's Python) is not found and the\n"
            "# start fails (203/EXEC). A real install's numad and Python live under /usr.\n"
            "# tmpfs hides every home as yes does; only these folders come back, read-only.\n"
            "# No other hardening setting differs from the unit's.\n"
            "ProtectHome=tmpfs\n"
            f"BindReadOnlyPaths={' '.join(str(p) for p in hidden)}\n"
        )
    private = [p for p in harness.shares() if any(p.is_relative_to(t) for t in TMPS)]
    if private:
        text += (
            f"# {' '.join(str(p) for p in private)}: under /tmp or /var/tmp, which\n"
            "# PrivateTmp=yes replaces with the unit's own (a clone made under /tmp, as a CI\n"
            "# run's may be): these folders come back, read-only; the rest of /tmp stays\n"
            "# private. A real install keeps nothing of numad's there.\n"
            f"BindReadOnlyPaths={' '.join(str(p) for p in private)}\n"
        )
    return text


def units() -> dict[str, str]:
    """The files init-systemd.sh copies from /vmctl/units to /run/systemd/system."""
    files = {f"units/{name}": (harness.HERE / "systemd" / name).read_text() for name in OWN_UNITS}
    for name in ("numad.service", "numad.slice"):
        files[f"units/{name}"] = (harness.PROJECT / "systemd" / name).read_text()
    files["units/numad.service.d/vm.conf"] = dropin()
    return files


@pytest.mark.vm
@pytest.mark.parametrize(("machine", "line"), CASES)
def test_numad_as_a_systemd_unit(
    vm_pace: pace.Pace,
    machine: str,
    line: str,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    # 384 MiB a node: systemd, numad and a 64 MiB service that moves between nodes.
    base = MACHINES[machine]
    nodes = tuple(replace(n, memory_mib=max(n.memory_mib, 384)) for n in base.nodes)
    topology = replace(base, nodes=nodes)
    command = [sys.executable, "-m", "pytest", CHECKS, "-p", "no:cacheprovider"]
    command += ["--noconftest", "-q", "-rfEs", "--junitxml=/vmctl/junit.xml"]
    # Boot, a watchdog restart (30 s and a start) and shutdown under TCG.
    deadline = vm_pace.deadline("systemd")
    progress.record_deadline(record_property, deadline, vm_pace.slowdown)  # for its line
    print(f"{vm_pace.describe()}: {deadline:.0f} s for this VM")
    result = harness.boot(
        harness.kernel(line),
        topology.qemu_args(),
        command,
        tmp_path,
        memory_mib=topology.memory_mib,
        files={**units(), "expected.json": json.dumps(topology.expected())},
        init=harness.HERE / "init-systemd.sh",
        append=[f"systemd.unit={TARGET}"],
        timeout=deadline,
        slowdown=vm_pace.factor,
    )
    record_property(progress.VM_SECONDS, result.seconds)  # for the line printed as it ends
    print(f"{machine} on {line} under systemd: {result.seconds:.1f} s in the VM")
    report = result.out / "junit.xml"
    journal_file = result.out / "journal.log"  # written after the checks, before poweroff
    journal = journal_file.read_text(errors="replace")[-6000:] if journal_file.is_file() else ""
    assert report.is_file(), f"the guest's pytest wrote no report:\n{result.stderr[-3000:]}"
    cases = list(ET.parse(report).getroot().iter("testcase"))  # noqa: S314 - our own guest's
    ran = sum(1 for c in cases if c.find("skipped") is None)
    figures = result.out / "figures.jsonl"
    for measured in figures.read_text().splitlines() if figures.is_file() else []:
        print(f"  {measured}")  # the measured figures: hog samples, memory moved
    assert result.rc == 0, f"in-guest checks failed:\n{result.stdout[-6000:]}\njournal:\n{journal}"
    assert ran >= MIN_CHECKS, f"only {ran} in-guest checks ran:\n{result.stdout[-3000:]}"
