"""Debian packages the test tools need, installed with no service started.

``install`` is the one way the ``--prepare`` steps (scripts/check, as root) install
them: the package lists refreshed, no recommends, no prompt, no service started.

Debian's maintainer scripts start a package's services at once unless
``/usr/sbin/policy-rc.d`` says no (exit 101). The tests need programs (promtool,
podman, lintian), never their services on the host: while ``no_services_started`` is
active such a file is in place (the one already there is kept, as on a container
image that ships one).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import pytest

POLICY_RC = Path("/usr/sbin/policy-rc.d")
DENY_ALL = "#!/bin/sh\n# numad's tests: no service starts while their tools install\nexit 101\n"


@contextmanager
def no_services_started() -> Iterator[None]:
    """Installs in this block start no service (root only)."""
    own_policy = not POLICY_RC.exists()
    if own_policy:
        POLICY_RC.write_text(DENY_ALL)
        POLICY_RC.chmod(0o755)
    try:
        yield
    finally:
        if own_policy:
            POLICY_RC.unlink()


class InstallError(RuntimeError):
    """apt-get failed; the message has its command, status and stderr."""


def install(packages: Sequence[str], timeout: float = 1800) -> None:
    """``apt-get install`` the ``packages`` (root only), no service started."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with no_services_started():
        for argv in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        ):
            done = subprocess.run(
                argv, capture_output=True, text=True, env=env, timeout=timeout, check=False
            )
            if done.returncode != 0:
                problem = f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}"
                raise InstallError(problem)


def missing(what: str, test: str) -> NoReturn:
    """A tool ``test`` needs is ``what`` is missing: a skip saying so, or, in CI (``CI``
    set, where every tool is installed by scripts/check), a failure, since a skip
    there would hide a check that never ran."""
    if os.environ.get("CI"):
        pytest.fail(f"{test} must run in CI: {what}")
    pytest.skip(what)
