"""The VM deadlines from a calibration (tests/vm/pace.py): a pure function of the
slowdown, checked on given slowdowns; no timing is asserted here."""

from __future__ import annotations

import pytest

from tests.vm import pace
from tests.vm.pace import MARGIN, MAX_SLOWDOWN, QUIET_SECONDS, REFERENCE_SECONDS, Pace


def _at(slowdown: float) -> Pace:
    return Pace(wall_seconds=slowdown * REFERENCE_SECONDS, cpu_seconds=REFERENCE_SECONDS)


@pytest.mark.parametrize(
    ("slowdown", "factor"),
    [
        pytest.param(0.5, 1.0, id="faster-host-keeps-the-quiet-margin"),
        pytest.param(1.0, 1.0, id="quiet"),
        pytest.param(1.6, 1.6, id="two-cpu-hogs-on-two-cores"),
        pytest.param(3.0, 3.0, id="heavily-loaded"),
        pytest.param(50.0, MAX_SLOWDOWN, id="capped-so-a-hung-guest-still-ends"),
    ],
)
@pytest.mark.parametrize("kind", sorted(QUIET_SECONDS))
def test_deadlines_scale_with_the_slowdown(kind: str, slowdown: float, factor: float) -> None:
    given = _at(slowdown)
    assert given.slowdown == pytest.approx(slowdown)
    assert given.factor == pytest.approx(factor)
    assert given.deadline(kind) == pytest.approx(QUIET_SECONDS[kind] * factor * MARGIN)


@pytest.mark.parametrize("kind", sorted(QUIET_SECONDS))
def test_never_below_the_quiet_time_times_the_margin(kind: str) -> None:
    floor = QUIET_SECONDS[kind] * MARGIN
    slowdowns = [0.1, 0.99, 1.0, 1.01, 2.0, 7.5]
    deadlines = [_at(s).deadline(kind) for s in slowdowns]
    assert min(deadlines) == pytest.approx(floor)
    assert deadlines == sorted(deadlines)  # more load never shortens one
    assert max(deadlines) == pytest.approx(floor * MAX_SLOWDOWN)


def test_the_runc_guest_gets_its_extra_quiet_time_scaled_too() -> None:
    loaded = _at(2.0)
    extra = loaded.deadline("busybox", runc=True) - loaded.deadline("busybox")
    assert extra == pytest.approx(pace.RUNC_SECONDS * 2.0 * MARGIN)


def test_the_description_names_the_figures() -> None:
    assert _at(2.0).describe() == (
        f"pace 2.00x (work {2 * REFERENCE_SECONDS:.2f} s, CPU {REFERENCE_SECONDS:.2f} s;"
        f" reference {REFERENCE_SECONDS:.2f} s)"
    )


def test_a_short_measurement_gives_a_pace() -> None:
    measured = pace.measure(rounds=1, steps=1000)  # the work runs; its figure is not judged
    assert measured.wall_seconds > 0
    assert measured.cpu_seconds >= 0
