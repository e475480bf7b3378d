"""The collection order: VM boots first, longest kind first (tests/vm/schedule.py)."""

from __future__ import annotations

import pytest

from tests.vm import schedule

pytest_plugins = ["pytester"]


def test_the_suite_is_collected_with_the_systemd_boots_then_the_busybox_boots_first(
    request: pytest.FixtureRequest,
) -> None:
    items = request.session.items
    kinds = [schedule.expected_seconds(item) for item in items]
    vm = [k for k in kinds if k]
    if not vm:
        pytest.skip("only part of the suite was collected (no VM test in this run)")
    assert kinds[: len(vm)] == sorted(vm, reverse=True), "a VM test after a shorter one"
    assert not any(kinds[len(vm) :]), "a VM test after the rest of the suite"
    assert kinds[0] > kinds[len(vm) - 1] or len(set(vm)) == 1


def test_sorting_keeps_each_group_in_collection_order(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "import pytest\n"
        "from tests.vm import schedule\n"
        "def pytest_collection_modifyitems(items):\n"
        "    schedule.vm_first(items)\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'vm: a boot')\n"
    )
    pytester.makepyfile(
        test_a="def test_1(): pass\ndef test_2(): pass\n",
        test_systemd_vm=(
            "import pytest\n@pytest.mark.vm\ndef test_s1(): pass\n"
            "@pytest.mark.vm\ndef test_s2(): pass\n"
        ),
        test_vm="import pytest\n@pytest.mark.vm\ndef test_b1(): pass\ndef test_plain(): pass\n",
    )
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    names = [line.rpartition("::")[2] for line in result.outlines if "::" in line]
    assert names == ["test_s1", "test_s2", "test_b1", "test_1", "test_2", "test_plain"]
