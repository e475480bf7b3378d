"""Real-kernel tests under the host's own systemd: one QEMU VM per (machine, kernel),
booted by init-systemd.sh into systemd as PID 1, running the in-guest checks of
tests/vm/guest/systemd_checks.py against numad installed from its Debian package
(``scripts/package``, built once per test run by tests/packaging/build.py) and run as
the package's unit, unmodified. Podman's checks run in one boot (PODMAN_CASE)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests.packaging import build
from tests.vm import harness, pace, progress
from tests.vm.topologies import MACHINES

CHECKS = "tests/vm/guest/systemd_checks.py"
MIN_CHECKS = 12
TARGET = "numad-vm.target"
OWN_UNITS = (TARGET, "numad-vm-checks.service")  # in tests/vm/systemd
# Debian 12's podman (4.3, crun) on Debian 12's kernel: one boot (its checks took 54 s
# of a 437 s boot here, and 47 s of 247 s once the hog ran only while sampled).
PODMAN_CASE = "2node-6.1"
CASES = [pytest.param(m, k, id=f"{m}-{k}") for m in ("2node", "4node") for k in harness.KERNELS]


def units() -> dict[str, str]:
    """The files init-systemd.sh copies from /vmctl/units to /run/systemd/system: the
    test's own; numad's unit and slice come with its package."""
    return {f"units/{name}": (harness.HERE / "systemd" / name).read_text() for name in OWN_UNITS}


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
    package = build.deb()
    assert package.is_relative_to(harness.PROJECT), package
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
        files={
            **units(),
            "expected.json": json.dumps(topology.expected()),
            "deb": str(package),  # under the project: the guest sees it at the same path
            **({"podman": "1"} if f"{machine}-{line}" == PODMAN_CASE else {}),
        },
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
