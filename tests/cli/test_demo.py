"""``numad demo`` end to end: it runs the daemon, admits its samples, and leaves nothing
in its temporary directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _demo(tmp: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp), **extra}
    return subprocess.run(
        [sys.executable, "-m", "numad", "demo"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_demo_removes_its_scratch_directory(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = _demo(tmp)
    assert done.returncode == 0, done.stderr
    assert "\nbatch: admitted; main: cpus " in done.stdout
    assert "numad.slice/inference" in done.stdout
    assert list(tmp.iterdir()) == []


def test_a_failed_demo_removes_it_too(tmp_path: Path) -> None:
    """A daemon that dies during the first admission (numad's crash seam) fails the
    demo, which shows the daemon's log and still removes its scratch directory."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = _demo(tmp, NUMAD_TEST_CRASH_AT="admit:after-checkpoint")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "numad demo: " in done.stderr
    assert "the daemon's last log lines" in done.stderr
    assert list(tmp.iterdir()) == []
