"""The tools' installs start no service (tests/debian.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import debian


def test_a_policy_is_in_place_during_the_block_and_gone_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = tmp_path / "policy-rc.d"
    monkeypatch.setattr(debian, "POLICY_RC", policy)
    with debian.no_services_started():
        said = subprocess.run([str(policy), "numad", "start"], check=False)
        assert said.returncode == 101  # invoke-rc.d's "action forbidden"
    assert not policy.exists()


def test_a_policy_already_there_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = tmp_path / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")  # a container image's own
    monkeypatch.setattr(debian, "POLICY_RC", policy)
    with pytest.raises(RuntimeError), debian.no_services_started():
        raise RuntimeError("the install failed")
    assert policy.read_text() == "#!/bin/sh\nexit 101\n"
