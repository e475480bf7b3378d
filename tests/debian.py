"""Debian packages the test tools need, installed with no service started.

Debian's maintainer scripts start a package's services at once unless
``/usr/sbin/policy-rc.d`` says no (exit 101). The tests need programs (promtool,
podman, lintian), never their services on the host: while ``no_services_started`` is
active such a file is in place (the one already there is kept, as on a container
image that ships one).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
