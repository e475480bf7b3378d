"""The VM tier: skipped with the reason where QEMU or a kernel cannot be had, except in
CI (``CI`` set), where ``.ci/run`` installs what it needs and a skip would hide a gap."""

from __future__ import annotations

import os
import platform

import pytest

from tests.vm import harness, pace
from tests.vm.progress import _tag_vm_tests

__all__ = ["_tag_vm_tests"]  # an autouse fixture: a line per VM as it finishes


@pytest.fixture(scope="session")
def vm_ready() -> None:
    reason = _unavailable()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"the VM tier must run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def vm_pace(vm_ready: None) -> pace.Pace:
    """This host's pace, measured once per session (and xdist worker) as the VM tier
    starts on it: the VM deadlines scale by it (tests/vm/pace.py)."""
    return pace.measure()


def _unavailable() -> str | None:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return "the VM tier boots x86_64 Debian kernels on a Linux x86_64 host"
    missing = harness.missing_tools()
    if missing:
        return (
            f"Debian packages {', '.join(missing)} are missing"
            " (scripts/check installs them when run as root)"
        )
    try:
        for line in harness.KERNELS:
            harness.kernel(line)
    except (harness.VMError, OSError) as err:
        return f"no Debian kernel to boot: {err}"
    return None
