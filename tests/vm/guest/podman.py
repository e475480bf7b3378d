"""In-guest helpers: containers started by Debian's podman (4.3, with crun), the way an
operator starts them, with numad's hook loaded by podman itself from the hooks folder
numad's package installs it in (/usr/share/containers/oci/hooks.d/numad.json).

Used by tests/vm/guest/systemd_checks.py; runs only inside the VM. The image is made
with ``podman import`` from a root file system built here from the static busybox (no
registry, no network). Two settings differ from a host's, both forced by the guest:
its root is the initramfs, where pivot_root is refused (EINVAL), so podman is told
``no_pivot_root`` (crun then moves the mount and chroots: the hook and the cgroup are
the same); and its storage uses the ``vfs`` driver, because the initramfs holds no
overlay upper layer.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

BUSYBOX = Path("/bin/busybox")  # static: the harness checks it
IMAGE = "localhost/numad-vmtest:1"
HOOKS_DIR = Path("/usr/share/containers/oci/hooks.d")  # podman's default, the package's
# The container's process: what the kernel allows it, then it waits for the check to
# say it may exit (``podman exec`` makes the file).
SCRIPT = "grep Cpus_allowed_list /proc/self/status; while [ ! -e /done ]; do sleep 0.2; done"


def podman(*args: str, timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``podman ARGS`` with the guest's two settings (the module's docstring says why)."""
    proc = subprocess.run(
        ["podman", "--storage-driver=vfs", *args],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CONTAINERS_CONF": str(_conf())},
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}")
    return proc


def _conf() -> Path:
    conf = Path("/run/numad-vmtest/containers.conf")
    if not conf.is_file():
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("[engine]\nno_pivot_root = true\n")
    return conf


def version(timeout: float) -> str:
    return podman("--version", timeout=timeout).stdout.strip()


def image(work: Path, timeout: float) -> str:
    """The test image, imported from a tarball of busybox and the names the script calls."""
    root = work / "rootfs"
    shutil.rmtree(root, ignore_errors=True)
    (root / "bin").mkdir(parents=True)
    for name in ("proc", "sys", "dev", "tmp"):
        (root / name).mkdir()
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    for tool in ("sh", "cat", "grep", "echo", "sleep", "touch"):
        (root / "bin" / tool).symlink_to("busybox")
    tarball = work / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(root, arcname=".")
    podman("import", str(tarball), IMAGE, timeout=timeout)
    return IMAGE


def run_argv(
    name: str, annotations: dict[str, str], *, detach: bool, runtime: str = "crun"
) -> list[str]:
    """``podman run`` of the test image in numad.slice (a managed root): crun, podman's
    default runtime, unless said."""
    argv = ["run", "--name", name, "--runtime", runtime, "--network", "none"]
    argv += ["--cgroup-parent", "numad.slice"]
    for key, value in annotations.items():
        argv += ["--annotation", f"{key}={value}"]
    argv += ["--detach"] if detach else ["--rm"]
    return [*argv, IMAGE, "/bin/sh", "-c", SCRIPT]
