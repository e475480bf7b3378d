"""In-guest helpers: a container run by a real OCI runtime (Debian's runc), with numad's
hook as packaging/oci/numad.json installs it, on a root file system built from the
static busybox.

Used by tests/vm/guest/checks.py; runs only inside the VM. The guest's root is the
initramfs, where pivot_root is refused (EINVAL on the rootfs mount), so runc runs with
``--no-pivot`` (a move mount and chroot instead): the hook and the cgroup are the same.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[3]
HOOK_FILE = PROJECT / "packaging" / "oci" / "numad.json"
NUMAD = Path(sys.executable).parent / "numad"  # the venv's console script
BUSYBOX = Path("/bin/busybox")  # static: the harness checks it
RUNC = shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin:/bin") or "runc"
# The container's process: what the kernel allows it, then what its cgroup holds, then
# it waits for the check to say it may exit (a file the check creates in its root).
SCRIPT = (
    "grep Cpus_allowed_list /proc/self/status; "
    "echo effective: $(cat /sys/fs/cgroup/cpuset.cpus.effective); "
    "while [ ! -e /done ]; do sleep 0.2; done"
)


@dataclass(frozen=True)
class Bundle:
    id: str
    dir: Path
    cgroup: str  # relative to the cgroup root

    @property
    def rootfs(self) -> Path:
        return self.dir / "rootfs"


def version() -> str:
    out = subprocess.run([RUNC, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0]


def hooks(env: list[str]) -> dict[str, Any]:
    """The config's hooks from the shipped hooks.d file: its stages, its arguments, the
    venv's numad for its path (a real install has it at /usr/bin/numad)."""
    shipped = json.loads(HOOK_FILE.read_text())
    assert shipped["version"] == "1.0.0"
    hook = {**shipped["hook"], "path": str(NUMAD), "env": env}
    return {stage: [hook] for stage in shipped["stages"]}


def matches_when(annotations: dict[str, str]) -> bool:
    """Whether the shipped file's ``when.annotations`` select these annotations, as
    containers/common matches them (every key/value pattern pair matches some pair)."""
    wanted = json.loads(HOOK_FILE.read_text())["when"]["annotations"]
    return all(
        any(re.search(k, key) and re.search(v, value) for key, value in annotations.items())
        for k, v in wanted.items()
    )


def bundle(base: Path, cid: str, cgroup: str, annotations: dict[str, str]) -> Bundle:
    """A bundle whose root holds busybox and the few names the script calls."""
    made = Bundle(cid, base / cid, cgroup)
    bin_dir = made.rootfs / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("proc", "sys", "dev", "tmp"):
        (made.rootfs / name).mkdir()
    shutil.copy2(BUSYBOX, bin_dir / "busybox")
    for tool in ("sh", "cat", "grep", "echo", "sleep"):
        (bin_dir / tool).symlink_to("busybox")
    env = [f"PATH={Path(sys.executable).parent}:/usr/bin:/bin", "LANG=C.UTF-8"]
    env.append("PYTHONDONTWRITEBYTECODE=1")  # the project is a read-only share
    if "PYTHONPATH" in os.environ:  # a runtime passes the hook no environment of its own
        env.append(f"PYTHONPATH={os.environ['PYTHONPATH']}")
    config = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["/bin/sh", "-c", SCRIPT],
            "env": ["PATH=/bin"],
            "cwd": "/",
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": cid,
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
            },
            {
                "destination": "/sys",
                "type": "sysfs",
                "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"],
            },
            {
                "destination": "/sys/fs/cgroup",
                "type": "cgroup",
                "source": "cgroup",
                "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
            },
        ],
        "hooks": hooks(env),
        "annotations": annotations,
        "linux": {
            "cgroupsPath": f"/{cgroup}",
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "cgroup")],
            "resources": {},
        },
    }
    (made.dir / "config.json").write_text(json.dumps(config, indent=2))
    return made


def start(made: Bundle) -> subprocess.Popen[str]:
    """``runc run`` in the foreground (the container's output on our pipes)."""
    return subprocess.Popen(
        [RUNC, "run", "--no-pivot", "--bundle", str(made.dir), made.id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def finish(made: Bundle, proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    """Let the container's process exit; runc's exit status and its stderr."""
    (made.rootfs / "done").touch()
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def run(made: Bundle, timeout: float) -> subprocess.CompletedProcess[str]:
    """``runc run`` to the end (a container that is to fail before its process runs)."""
    (made.rootfs / "done").touch()
    return subprocess.run(
        [RUNC, "run", "--no-pivot", "--bundle", str(made.dir), made.id],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        text=True,
        timeout=timeout,
        check=False,
    )
