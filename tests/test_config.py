"""The config's [daemon] section."""

from __future__ import annotations

import pytest

from numad.config import parse
from numad.errors import ConfigError


def test_reconcile_seconds_defaults_to_ten_and_can_be_set() -> None:
    assert parse({}).reconcile_seconds == 10.0
    assert parse({"daemon": {"reconcile-seconds": 2}}).reconcile_seconds == 2.0


@pytest.mark.parametrize("bad", [0, -1, 0.01, 7200, "10", True])
def test_reconcile_seconds_out_of_range_or_not_a_number_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="reconcile-seconds"):
        parse({"daemon": {"reconcile-seconds": bad}})
