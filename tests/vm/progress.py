"""A line per VM as it finishes: name, seconds, result.

A VM test runs for minutes; under ``pytest -q -n auto`` the progress line sits at
``[99%]`` meanwhile, and pytest-xdist captures what a worker prints. So the
line is written by the process that owns the terminal: the controller under
xdist (the reports reach it through ``pytest_runtest_logreport``), the only
process otherwise. A VM test puts the seconds its VM ran under ``VM_SECONDS``
with ``record_property``; a VM that never finished has only the test's time.
Before it boots, it records its deadline and the host's pace it came from
(``VM_DEADLINE``, ``VM_PACE``: tests/vm/pace.py), so a CI log shows both.
Which tests are VM tests the autouse fixture ``_tag_vm_tests`` records (the
``vm`` marker), since the controller has only reports, not the tests.
``tests/conftest.py`` installs this for the whole suite, since the controller
never loads ``tests/vm/conftest.py`` when it collects nothing itself.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

VM_SECONDS = "vm_seconds"
VM_DEADLINE = "vm_deadline"  # the seconds the VM was given
VM_PACE = "vm_pace"  # the host's slowdown the deadline was scaled by
VM_TEST = "vm_test"  # set on every test marked vm (a report's keywords also name folders)
MARKER = "vm"


@pytest.fixture(autouse=True)
def _tag_vm_tests(request: pytest.FixtureRequest) -> None:
    """Marks a vm test's reports (tests/vm/conftest.py imports this fixture)."""
    if request.node.get_closest_marker(MARKER) is not None:
        request.node.user_properties.append((VM_TEST, True))


class VMProgress:
    """The plugin: one terminal line per VM test's outcome."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not dict(report.user_properties).get(VM_TEST) or not _finished(report):
            return
        terminal = self._config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            # After the test's own progress letter (or verbose PASSED), on a line of its own.
            terminal.write("\n")
            terminal.write_line(line(report))


def _finished(report: pytest.TestReport) -> bool:
    """The call's report, or the one that ended the test before its call ran; not a
    skip for want of QEMU (those are listed once at the end as usual)."""
    if report.when == "call":
        return True
    return report.when == "setup" and report.failed


def line(report: pytest.TestReport) -> str:
    """``VM test_numad_on_a_real_kernel[2node-6.1]: passed, the VM ran 143.2 s (deadline
    282 s at pace 1.00x), test 150.8 s``."""
    name = report.nodeid.split("::")[-1]
    properties = dict(report.user_properties)
    seconds = properties.get(VM_SECONDS)
    deadline, pace = properties.get(VM_DEADLINE), properties.get(VM_PACE)
    given = ""
    if isinstance(deadline, int | float) and isinstance(pace, int | float):
        given = f"deadline {float(deadline):.0f} s at pace {float(pace):.2f}x"
    if isinstance(seconds, int | float):
        took = f"the VM ran {float(seconds):.1f} s" + (f" ({given})" if given else "")
    else:
        took = "no VM time (it did not finish" + (f"; {given})" if given else ")")
    return f"VM {name}: {report.outcome}, {took}, test {report.duration:.1f} s"


def record_deadline(
    record_property: Callable[[str, object], None], deadline: float, pace: float
) -> None:
    """Record a VM's deadline and the pace it came from, before it boots: for its line."""
    record_property(VM_DEADLINE, deadline)
    record_property(VM_PACE, pace)


def install(config: pytest.Config) -> None:
    """Register the plugin where it can write: never on an xdist worker."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(VMProgress(config), "numad-vm-progress")
