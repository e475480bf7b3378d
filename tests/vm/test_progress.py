"""The VM tier's progress lines, checked on a tiny suite of fake VM tests run by a real
pytest, with and without xdist: no VM boots here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vm.progress import VM_DEADLINE, VM_PACE, VM_SECONDS

PROJECT = Path(__file__).resolve().parent.parent.parent

CONFTEST = """\
import pytest

from tests.vm import progress
from tests.vm.progress import _tag_vm_tests


def pytest_configure(config):
    config.addinivalue_line("markers", "vm: a fake VM test")
    progress.install(config)


@pytest.fixture
def no_qemu():
    pytest.skip("qemu-system-x86 is missing")
"""

FAKE_VMS = f"""\
import time

import pytest


@pytest.mark.vm
@pytest.mark.parametrize("name", ["2node-6.1", "4node-6.12"])
def test_boot(name, record_property):
    if name == "4node-6.12":
        record_property("{VM_DEADLINE}", 564.0)
        record_property("{VM_PACE}", 2.0)
    record_property("{VM_SECONDS}", 12.5 if name == "2node-6.1" else 80.25)
    assert name == "2node-6.1", "in-guest checks failed"


@pytest.mark.vm
def test_never_finished():
    raise TimeoutError("the VM did not power off within 300 s")


@pytest.mark.vm
def test_hung(record_property):
    record_property("{VM_DEADLINE}", 846.4)
    record_property("{VM_PACE}", 1.004)
    raise TimeoutError("the VM did not power off within 846 s")


@pytest.mark.vm
def test_without_qemu(no_qemu):
    pass


def test_not_a_vm():
    pass
"""


def _run(tmp_path: Path, *args: str) -> str:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_fake_vms.py").write_text(FAKE_VMS)
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # two fake VMs fail
    return done.stdout


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("-n", "1"), id="xdist-controller"),
        pytest.param(("-p", "no:xdist"), id="serial"),
    ],
)
def test_each_vm_is_reported_as_it_finishes(tmp_path: Path, args: tuple[str, ...]) -> None:
    out = _run(tmp_path, *args)
    lines = [line for line in out.splitlines() if line.startswith("VM ")]
    assert sorted(line.rsplit(", test ", 1)[0] for line in lines) == [
        "VM test_boot[2node-6.1]: passed, the VM ran 12.5 s",
        "VM test_boot[4node-6.12]: failed, the VM ran 80.2 s (deadline 564 s at pace 2.00x)",
        "VM test_hung: failed, no VM time (it did not finish; deadline 846 s at pace 1.00x)",
        "VM test_never_finished: failed, no VM time (it did not finish)",
    ]
    for line in lines:  # the test's own time follows
        assert line.rsplit(", test ", 1)[1].endswith(" s")
    # Printed as each VM ends, before pytest's summary, and once (never by a worker).
    assert out.index("VM test_never_finished") < out.index("short test summary")
