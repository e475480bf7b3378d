"""Real-kernel tests: one QEMU VM per (machine, kernel), each running the in-guest
checks of tests/vm/guest/checks.py against numad on the real /sys and cgroups."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.vm import harness, pace, progress
from tests.vm.topologies import MACHINES

CHECKS = "tests/vm/guest/checks.py"
CASES = [
    *(pytest.param(m, k, "v2", id=f"{m}-{k}") for m in MACHINES for k in harness.KERNELS),
    pytest.param("2node", "6.1", "v1", id="2node-6.1-cgroup-v1"),
]
# The one boot that also runs a container with runc through numad's OCI hook
# (guest/oci.py): a boot of its own would cost minutes of CI for seconds of checks.
OCI_CASE = ("2node", "6.12", "v2")
OCI_CHECKS = (
    "test_a_runc_container_runs_on_the_cpuset_numad_decided",
    "test_a_runc_container_numad_rejects_fails_with_numads_reason",
)
# The boots that kill numad mid-admission (three numad starts, 45-50 s a boot under
# TCG): what a crash leaves depends on the kernel line and the cgroup version, so
# each of those once, on the 2-node machine; the other machines' boots skip it.
CRASH_CASES = {("2node", line, "v2") for line in harness.KERNELS} | {("2node", "6.1", "v1")}
CRASH_CHECK = "test_sigkill_in_the_middle_of_admissions_keeps_every_invariant"


@pytest.mark.vm
@pytest.mark.parametrize(("machine", "line", "cgroup"), CASES)
def test_numad_on_a_real_kernel(
    vm_pace: pace.Pace,
    machine: str,
    line: str,
    cgroup: str,
    tmp_path: Path,
    *,
    record_property: Callable[[str, object], None],
) -> None:
    topology = MACHINES[machine]
    oci = (machine, line, cgroup) == OCI_CASE
    crash = (machine, line, cgroup) in CRASH_CASES
    expected = {**topology.expected(), "cgroup": cgroup, "oci": oci, "crash": crash}
    command = [sys.executable, "-m", "pytest", CHECKS, "-p", "no:cacheprovider"]
    command += ["--noconftest", "-q", "-rfEs", "--junitxml=/vmctl/junit.xml"]
    deadline = vm_pace.deadline("busybox", runc=oci)
    progress.record_deadline(record_property, deadline, vm_pace.slowdown)  # for its line
    print(f"{vm_pace.describe()}: {deadline:.0f} s for this VM")
    result = harness.boot(
        harness.kernel(line),
        topology.qemu_args(),
        command,
        tmp_path,
        memory_mib=topology.memory_mib,
        cgroup=cgroup,
        files={"expected.json": json.dumps(expected)},
        timeout=deadline,
        slowdown=vm_pace.factor,
    )
    record_property(progress.VM_SECONDS, result.seconds)  # for the line printed as it ends
    print(f"{machine} on {line} ({cgroup}): {result.seconds:.1f} s in the VM")
    report = result.out / "junit.xml"
    assert report.is_file(), f"the guest's pytest wrote no report:\n{result.stderr[-3000:]}"
    tree = ET.parse(report)  # noqa: S314 - written by our own guest
    suite = tree.getroot().find("testsuite")
    assert suite is not None
    ran = int(suite.get("tests", 0)) - int(suite.get("skipped", 0))
    serve_log = (result.out / "serve.log").read_text(errors="replace")[-3000:]
    assert result.rc == 0, (
        f"in-guest checks failed:\n{result.stdout[-6000:]}\nnumad serve's log:\n{serve_log}"
    )
    assert ran >= 8, f"only {ran} in-guest checks ran:\n{result.stdout[-3000:]}"
    passed = {
        case.get("name")
        for case in suite.iter("testcase")
        if not any(case.find(tag) is not None for tag in ("skipped", "failure", "error"))
    }
    if crash:
        assert CRASH_CHECK in passed, f"the crash check did not pass:\n{result.stdout[-3000:]}"
    if oci:
        assert set(OCI_CHECKS) <= passed, f"the runc checks did not pass:\n{result.stdout[-3000:]}"
        print(f"runc in the guest: {(result.out / 'oci.json').read_text()}")
