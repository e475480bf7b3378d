"""Boot a real Linux kernel in QEMU with an emulated NUMA machine and run a command in it.

The recipe is the one measured in shared/reference/vm-testbed.md:

- the kernel is Debian's own, fetched with ``apt-get download`` (never installed)
  through its meta-package and cached unpacked: the plain ELF ``vmlinux`` (booted
  through its PVH entry, which saves the in-guest decompression) and the few
  modules 9p over virtio needs;
- a small initramfs (the host's static busybox, the modules, ``init.sh``) mounts the
  host's ``/usr``, ``/etc``, the Python prefix and the project read-only over 9p at
  their host paths, mounts cgroup2 (or a v1 cpuset hierarchy), runs the command with
  the host's bash and powers off;
- or (``init=`` init-systemd.sh) the same mounts, then the host's own systemd as PID 1
  with numad as its real unit (tests/vm/test_systemd_vm.py);
- the command's output and exit code come back through a writable 9p share;
- KVM when it really works (``/dev/kvm`` usable *and* vmx/svm in the CPU flags),
  otherwise TCG; a timeout per VM; no network device.

Everything here runs on the host. ``python -m tests.vm.harness --prepare`` fetches
the kernels ahead of the tests.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import gzip
import io
import json
import lzma
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import zstandard

from tests import debian

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
PACKAGES = ("qemu-system-x86", "busybox-static", "runc", "podman", "crun")
QEMU = "qemu-system-x86_64"
RUNC = "runc"  # the OCI runtime the guest runs a container with (tests/vm/guest/oci.py)
BUSYBOX = Path("/bin/busybox")
# The Debian meta-packages that name each kernel line's current image package.
KERNELS = {"6.1": "linux-image-amd64", "6.12": "linux-image-6.12-amd64"}
# 9p over virtio-PCI; virtio_pci is built in on 6.12, fscache is folded into netfs there.
# overlay: the systemd guest's writable /usr, /etc and dpkg database, where it installs
# numad's package (init-systemd.sh).
WANTED_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
MODULE_DIRS = (
    "kernel/drivers/virtio/",
    "kernel/net/9p/",
    "kernel/fs/9p/",
    "kernel/fs/netfs/",
    "kernel/fs/fscache/",
    "kernel/fs/overlayfs/",
)
PODMAN = "podman"  # with crun: the container engine of the systemd guest's podman check
VM_TIMEOUT = 300.0
DPKG_DATABASE = Path("/var/lib/dpkg")


class VMError(RuntimeError):
    """The VM could not be prepared or did not finish; the message says which and why."""


# -- what the host needs ----------------------------------------------------------------


def missing_tools() -> list[str]:
    """The Debian packages whose tools are absent."""
    missing = []
    if shutil.which(QEMU) is None:
        missing.append("qemu-system-x86")
    if not BUSYBOX.is_file() or _dynamic(BUSYBOX):
        missing.append("busybox-static")
    for tool in (RUNC, PODMAN, "crun"):
        if shutil.which(tool, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin") is None:
            missing.append(tool)
    return missing


def _dynamic(path: Path) -> bool:
    """Whether ``path`` names a program loader (PT_INTERP), which the guest lacks."""
    with path.open("rb") as f:
        return b"/lib64/ld-linux" in f.read(8192)


def install_tools() -> None:
    """Install the missing packages from Debian (root only), no service started (podman
    ships units: the host needs the programs, not their services)."""
    missing = missing_tools()
    if not missing:
        return
    debian.install(missing)


def accelerator() -> str:
    """``kvm`` where hardware virtualisation really works, else ``tcg``.

    A nested ``/dev/kvm`` without vmx/svm in the CPU flags (this CI's kind) emulates
    the guest kernel instead of running it and dies on the first cmpxchg16b.
    """
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "tcg"
    if not re.search(r"^flags\s*:.*\b(vmx|svm)\b", flags, re.MULTILINE):
        return "tcg"
    return "kvm" if os.access("/dev/kvm", os.R_OK | os.W_OK) else "tcg"


# -- the kernel -------------------------------------------------------------------------


def cache_dir() -> Path:
    """``$NUMAD_VM_CACHE``, else ``numad-vm`` in the user's cache folder."""
    if os.environ.get("NUMAD_VM_CACHE"):
        return Path(os.environ["NUMAD_VM_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numad-vm"


@dataclass(frozen=True)
class Kernel:
    line: str  # "6.1", "6.12"
    package: str  # the image package the meta-package pointed to
    vmlinux: Path
    modules: tuple[Path, ...]  # in load order


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker fetches, the others wait and reuse
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def kernel(line: str) -> Kernel:
    """The cached kernel of ``line``, fetched and unpacked on first use."""
    package = image_package(KERNELS[line])
    dest = cache_dir() / package
    with _locked(cache_dir() / ".lock"):
        complete = dest / "complete"
        if not complete.is_file() or complete.read_text() != _recipe(package):
            _unpack_kernel(package, dest)  # new, or cached with other modules
    order = (dest / "modules.load").read_text().split()
    return Kernel(line, package, dest / "vmlinux", tuple(dest / f"{m}.ko" for m in order))


def _recipe(package: str) -> str:
    """What a cached kernel was unpacked with: the package and the modules wanted."""
    return f"{package}\n{' '.join(WANTED_MODULES)}\n"


def image_package(meta: str) -> str:
    """The image package ``meta`` depends on (Debian point releases move it)."""
    for attempt in range(2):
        out = subprocess.run(
            ["apt-cache", "depends", meta], capture_output=True, text=True, check=False
        ).stdout
        found = re.search(r"Depends:\s*(linux-image-\S+)", out)
        if found:
            return found.group(1)
        if attempt == 0 and os.geteuid() == 0:
            _run(["apt-get", "update", "-qq"])  # the package lists are missing or stale
    raise VMError(f"{meta}: apt-cache names no kernel image package for it")


def _unpack_kernel(package: str, dest: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="numad-vm-deb-") as tmp:
        _run(["apt-get", "download", "-qq", package], cwd=tmp)
        debs = list(Path(tmp).glob("*.deb"))
        if len(debs) != 1:
            raise VMError(f"{package}: apt-get download left {len(debs)} .deb files")
        work = dest.with_name(dest.name + ".partial")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        modules = _extract(debs[0], work)
    (work / "modules.load").write_text("\n".join(_load_order(modules)) + "\n")
    (work / "complete").write_text(_recipe(package))
    shutil.rmtree(dest, ignore_errors=True)
    work.rename(dest)


def _extract(deb: Path, work: Path) -> dict[str, Path]:
    """Write vmlinux and the wanted modules from the package's data tarball."""
    data_name, data = _ar_member(deb.read_bytes(), "data.tar")
    modules: dict[str, Path] = {}
    builtin: set[str] = set()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            if not member.isfile():
                continue
            if re.fullmatch(r"boot/vmlinuz-.*", name):
                image = _read(tar, member)
                (work / "vmlinux").write_bytes(_vmlinux(image, name))
            elif name.endswith("/modules.builtin"):
                builtin = {Path(line).name for line in _read(tar, member).decode().split()}
            elif "/kernel/" in name and _module_wanted(name):
                raw = _read(tar, member)
                if name.endswith(".xz"):
                    raw = lzma.decompress(raw)
                elif name.endswith(".zst"):
                    raise VMError(f"{deb.name}: {name}: zstd modules are not supported")
                module = Path(name).name.split(".ko")[0].replace("-", "_")
                (work / f"{module}.ko").write_bytes(raw)
                modules[module] = work / f"{module}.ko"
    if not (work / "vmlinux").is_file():
        raise VMError(f"{deb.name}: {data_name} holds no boot/vmlinuz-*")
    for name in builtin:
        modules.pop(name.split(".ko")[0].replace("-", "_"), None)
    return modules


def _module_wanted(name: str) -> bool:
    rel = re.sub(r"^(usr/)?lib/modules/[^/]+/", "", name)
    return rel.startswith(MODULE_DIRS) and rel.endswith((".ko", ".ko.xz", ".ko.zst"))


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    assert handle is not None
    return handle.read()


def _ar_member(archive: bytes, prefix: str) -> tuple[str, bytes]:
    """The first member of a Unix ``ar`` archive (a .deb) whose name starts with ``prefix``."""
    if not archive.startswith(b"!<arch>\n"):
        raise VMError("not a Debian package (no ar magic)")
    pos = 8
    while pos + 60 <= len(archive):
        header = archive[pos : pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = archive[pos + 60 : pos + 60 + size]
        if name.startswith(prefix):
            return name, body
        pos += 60 + size + (size & 1)
    raise VMError(f"the package has no {prefix}* member")


def _vmlinux(image: bytes, name: str) -> bytes:
    """The ELF kernel inside a bzImage: its payload (xz on 6.1, zstd on 6.12), decompressed."""
    xz, zstd = image.find(b"\xfd7zXZ\x00"), image.find(b"\x28\xb5\x2f\xfd")
    elf = b""
    if xz >= 0:
        elf = lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(image[xz:])
    elif zstd >= 0:
        elf = zstandard.ZstdDecompressor().decompressobj().decompress(image[zstd:])
    if not elf.startswith(b"\x7fELF"):
        raise VMError(f"{name}: no xz or zstd payload holding an ELF image")
    return elf


def _load_order(modules: dict[str, Path]) -> list[str]:
    """The wanted modules and what they depend on, dependencies first (from ``depends=``)."""
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in order or name not in modules:
            return  # built in, or already loaded
        if name in path:
            raise VMError(f"module dependency cycle: {' -> '.join((*path, name))}")
        for dep in _depends(modules[name].read_bytes()):
            visit(dep, (*path, name))
        order.append(name)

    for wanted in WANTED_MODULES:
        visit(wanted, ())
    return order


def _depends(ko: bytes) -> list[str]:
    found = re.search(rb"(?:^|\x00)depends=([^\x00]*)\x00", ko)
    if not found or not found.group(1):
        return []
    return [d.decode().replace("-", "_") for d in found.group(1).split(b",")]


# -- the initramfs ------------------------------------------------------------------------


def initramfs(kernel: Kernel, dest: Path, init: Path = HERE / "init.sh") -> Path:
    """A gzipped newc cpio: busybox, the modules, and ``init`` (init.sh) as /init."""
    files: list[tuple[str, int, bytes]] = [
        (".vm", 0o40755, b""),
        (".vm/modules", 0o40755, b""),
        (".vm/busybox", 0o100755, BUSYBOX.read_bytes()),
        ("init", 0o100755, init.read_bytes()),
        (".vm/modules.load", 0o100644, "".join(f"{m.stem}\n" for m in kernel.modules).encode()),
    ]
    files += [(f".vm/modules/{m.name}", 0o100644, m.read_bytes()) for m in kernel.modules]
    out = io.BytesIO()
    for ino, (name, mode, data) in enumerate([*files, ("TRAILER!!!", 0, b"")], start=1):
        path = name.encode() + b"\x00"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(path), 0)
        out.write(b"070701" + b"".join(b"%08X" % f for f in fields) + path)
        out.write(b"\x00" * (-out.tell() % 4))  # the name, then the data, each 4-aligned
        out.write(data)
        out.write(b"\x00" * (-out.tell() % 4))
    dest.write_bytes(gzip.compress(out.getvalue(), compresslevel=1))
    return dest


# -- one boot ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: str
    stderr: str
    seconds: float
    out: Path  # the guest's writable share, with whatever it wrote


def shares() -> list[Path]:
    """The host folders the guest sees read-only at the same paths."""
    wanted = [Path("/usr"), Path("/etc"), PROJECT]
    if DPKG_DATABASE.is_dir():  # the systemd guest installs numad's package over it
        wanted.append(DPKG_DATABASE)
    for prefix in (sys.base_prefix, sys.prefix):
        path = Path(prefix).resolve()
        if not any(path.is_relative_to(w) for w in wanted):
            wanted.append(path)
    return wanted


def boot(
    kernel: Kernel,
    qemu_args: Sequence[str],
    command: Sequence[str],
    workdir: Path,
    *,
    memory_mib: int,
    cgroup: str = "v2",
    files: dict[str, str] | None = None,
    timeout: float = VM_TIMEOUT,
    init: Path = HERE / "init.sh",
    append: Sequence[str] = (),
    tcg_threads: str = "single",
    slowdown: float = 1.0,
) -> Result:
    """Boot ``kernel`` with ``qemu_args`` (topology), run ``command`` in the guest, power off.

    ``files`` land in the guest's ``/vmctl`` (a name may hold folders); ``init`` is the
    initramfs's /init (init-systemd.sh hands over to systemd); ``append`` adds kernel
    arguments. ``timeout`` is the wall-clock deadline for the whole boot (tests/vm/pace.py
    scales it to the host's load); ``slowdown`` reaches the guest as ``VMTEST_SLOWDOWN``,
    which its checks multiply their own waits by.
    """
    out = workdir / "vmctl"
    out.mkdir(parents=True)
    share_list = shares()
    (out / "shares").write_text(
        "".join(f"s{i} {p}\n" for i, p in enumerate(share_list)), encoding="utf-8"
    )
    (out / "cgroup").write_text(cgroup + "\n")
    for name, text in (files or {}).items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text, encoding="utf-8")
    guest_env = {
        "PATH": f"{Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # no hypothesis, xdist: seconds under TCG
        "VMTEST": "1",
        "VMTEST_OUT": "/vmctl",  # the writable share, where init mounts it
        "VMTEST_KERNEL": kernel.line,
        "VMTEST_SLOWDOWN": f"{slowdown:.2f}",
    }
    script = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in guest_env.items())
    script += f"cd {shlex.quote(str(PROJECT))}\nexec {shlex.join(command)}\n"
    (out / "cmd.sh").write_text(script, encoding="utf-8")
    initrd = initramfs(kernel, workdir / "initrd.gz", init)
    console = workdir / "console.log"
    pidfile = workdir / "qemu.pid"
    accel = accelerator()
    argv = [
        QEMU,
        "-machine", "q35",
        "-accel", "kvm" if accel == "kvm" else f"tcg,thread={tcg_threads},tb-size=256",
        "-cpu", "host" if accel == "kvm" else "max,vendor=GenuineIntel",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-nic", "none",
        "-m", f"{memory_mib}M",
        "-serial", f"file:{console}",
        "-pidfile", str(pidfile),
        "-kernel", str(kernel.vmlinux),
        "-initrd", str(initrd),
        "-append", " ".join(("console=ttyS0 panic=-1 quiet loglevel=4 mitigations=off", *append)),
        *qemu_args,
        *_share_args(out, "vmctl", readonly=False),
    ]  # fmt: skip
    for i, path in enumerate(share_list):
        argv += _share_args(path, f"s{i}", readonly=True)
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - only sets a flag before exec
    )
    try:
        qemu_out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise VMError(
            f"{kernel.package}: the VM did not power off within {timeout:.0f} s;"
            f" console tail:\n{_tail(console)}"
        ) from None
    except BaseException:  # an interrupted test run takes its VM down with it
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    seconds = time.monotonic() - started
    rc_file = out / "rc"
    if not rc_file.is_file():
        raise VMError(
            f"{kernel.package}: the guest never ran the command (QEMU exit {proc.returncode}):"
            f"\n{qemu_out.decode(errors='replace')}\nconsole tail:\n{_tail(console)}"
        )
    return Result(
        rc=int(rc_file.read_text().strip() or "-1"),
        stdout=_text(out / "stdout"),
        stderr=_text(out / "stderr"),
        seconds=seconds,
        out=out,
    )


def _die_with_parent() -> None:
    """QEMU gets SIGKILL when the test process ends, however it ends (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _share_args(path: Path, tag: str, *, readonly: bool) -> list[str]:
    fsdev = f"local,id={tag},path={path},security_model=none,multidevs=remap"
    return [
        "-fsdev",
        fsdev + (",readonly=on" if readonly else ""),
        "-device",
        f"virtio-9p-pci,fsdev={tag},mount_tag={tag},bus=pcie.0",  # never on an expander bus
    ]


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(_text(path).splitlines()[-lines:])


def _run(argv: list[str], **kwargs: object) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise VMError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.vm.harness", description=__doc__)
    parser.add_argument("--prepare", action="store_true", help="install tools, fetch kernels")
    args = parser.parse_args(argv)
    if args.prepare:
        install_tools()
        for line in KERNELS:
            k = kernel(line)
            print(json.dumps({"line": line, "package": k.package, "modules": len(k.modules)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
