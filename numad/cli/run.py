"""``numad run``: a command in a transient workload, released when it exits.

Edge module, registered by ``numad.cli.commands``. Admits the workload through the
daemon's API, makes its cgroup directory where the service manager would have
(and removes it again), runs the command there with its argv untouched, and
releases the workload when the command exits, fails to start, or numad run is
signalled (SIGINT, SIGTERM, SIGHUP are passed on to the command while it runs). The
command learns which CPUs and memory go with each of its devices from variables
(``device_env``).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import quote

from numad import defaults
from numad.cli import textout
from numad.cli.client import APIError, request
from numad.errors import NumadError
from numad.host.cgroup.hierarchy import SCRATCH_MARKER, KernelMutex, is_scratch

REJECTED = 3  # the exit status of a rejection (numad.cli.main's docstring lists them all)
# numad.workload.spec's name rule, repeated: the client does not import the managers
# numad.workload.spec brings, and run makes the cgroup directory before the daemon sees the name.
WORKLOAD_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


def workload_path(name: str) -> str:
    """The API path of a workload (any name quoted: the daemon answers 404, not a bad URL)."""
    return f"/v1/workloads/{quote(name, safe='')}"


def spec_of(args: argparse.Namespace, **where: str) -> dict[str, Any]:
    """A spec from the command's options (absent ones left out)."""
    devices: dict[str, int] = {}
    for name, count in args.device:
        if name in devices:
            args.usage_error(f"argument --device: {name} given twice")
        devices[name] = count
    spec: dict[str, Any] = {**where, "cpus": args.cpus}
    optional = {"memory": args.memory, "devices": devices, "policy": args.policy}
    spec |= {k: v for k, v in optional.items() if v}
    if args.name:
        spec["name"] = args.name
    if getattr(args, "movable", False):
        spec["movable"] = True
    return spec


class _Signalled(Exception):  # noqa: N818 - not an error: numad run was told to stop
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_WAITED = (*_FORWARDED, signal.SIGCHLD)  # what numad run waits for while the command runs


def run_command(args: argparse.Namespace) -> int:
    """Admit a transient workload, run the command in its cgroup, release it when the
    command exits, fails to start or numad run is signalled, remove the cgroup
    directory it made (also on a rejection), and exit with the command's status."""
    if not args.cmd:
        args.usage_error("give a command after --")
    name = args.name or f"run-{os.getpid()}"
    if not WORKLOAD_NAME.fullmatch(name):  # checked before the name becomes a directory
        args.usage_error(
            f"argument --name: {name!r} is not a workload name ({WORKLOAD_NAME.pattern})"
        )
    spec = spec_of(args, cgroup=f"{defaults.MANAGED_ROOT}/{name}")
    spec["name"] = name
    spec["transient"] = True  # released by the daemon if numad run dies before its release
    socket = str(args.socket or defaults.SOCKET)
    try:
        health = request(socket, "GET", "/v1/health")
    except APIError as err:  # not ready (503) still says where the cgroup tree is
        health = err.body
    root = Path(health.get("cgroup_root") or defaults.CGROUP_ROOT)
    cgroup = root / spec["cgroup"]

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        raise _Signalled(signum)  # before the command runs; then _child passes them on

    before = {sig: signal.signal(sig, on_signal) for sig in _FORWARDED}
    made = held = False
    try:
        made = not cgroup.is_dir()
        if made:  # as a service manager would; removed again when the command is done
            cgroup.mkdir(parents=True)
        held = True  # from here a signal may come between the daemon's admission and its answer
        try:
            answer = request(socket, "POST", "/v1/workloads", json.dumps(spec))
        except APIError as err:
            held = False  # the daemon said no: nothing admitted under this name by us
            if err.status != 409 or err.body.get("error", {}).get("code") == "conflict":
                raise
            print("\n".join(textout.rejected(name, err.body.get("error", {}))), file=sys.stderr)
            return REJECTED
        placed = answer["containers"].get("main", {})
        where = textout.placement(placed)
        if not on_cgroupfs(root):
            where += (
                f" (not enforced: {root} is no cgroup filesystem, nothing confines the command)"
            )
        print(f"numad: {name}: {where}; running {args.cmd[0]}", file=sys.stderr)
        sys.stderr.flush()
        return _child(cgroup, args.cmd, device_env(placed))
    except _Signalled as stop:
        return 128 + stop.signum
    finally:
        for sig in _FORWARDED:  # the cleanup runs to its end
            signal.signal(sig, signal.SIG_IGN)
        _end(socket, name, (root, cgroup), held=held, made=made)
        for sig, handler in before.items():
            signal.signal(sig, handler)


def on_cgroupfs(path: Path, mounts: Path = Path("/proc/self/mounts")) -> bool:
    """Whether ``path`` is a cgroup hierarchy: it lies on a cgroup filesystem (v2, or a
    v1 controller), or holds one (v1's tmpfs with a mount per controller). A scratch
    tree (``numad serve --root``) is neither."""
    real = os.path.realpath(path).rstrip("/") or "/"
    below = real.rstrip("/") + "/"
    holder, kind = "", ""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return True  # not known: no warning rather than a false one
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point, fstype = fields[1].replace("\\040", " "), fields[2]
        cgroupfs = fstype in {"cgroup", "cgroup2"}
        if cgroupfs and point.startswith(below):
            return True  # a controller mounted inside it
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(
            holder
        ):
            holder, kind = point, fstype
    return kind in {"cgroup", "cgroup2"}


def _end(socket: str, name: str, where: tuple[Path, Path], *, held: bool, made: bool) -> None:
    """Release the workload (if it may be admitted) and remove the cgroup numad run made."""
    if held:
        try:
            request(socket, "DELETE", workload_path(name))
            print(f"numad: {name}: released", file=sys.stderr)
        except APIError as err:
            if err.status != 404:  # 404: interrupted before the daemon admitted it
                print(f"numad: {err}", file=sys.stderr)
        except NumadError as err:
            print(f"numad: {err}; {name} may still be admitted", file=sys.stderr)
    if made:
        _remove(where[1], where[0])


def device_env(placed: Mapping[str, Any]) -> dict[str, str]:
    """The command's variables for its devices' groups (the admit answer's ``groups``),
    so it can pin a thread per device: per class ``NUMAD_GPU_COUNT``, and per device,
    numbered in the groups' order within its class, ``NUMAD_GPU_0_DEVICE`` (the PCI
    address), ``_NODE``, ``_CPUS`` (a CPU list, empty for none) and ``_MEMORY`` (bytes
    on its node). The class name upper-cased, anything but letters and digits as _."""
    env: dict[str, str] = {}
    counts: dict[str, int] = {}
    for group in placed.get("groups") or ():
        name = _ENV_UNSAFE.sub("_", str(group.get("class", "")).upper())
        index = counts.get(name, 0)
        counts[name] = index + 1
        prefix = f"NUMAD_{name}_{index}_"
        env[prefix + "DEVICE"] = str(group.get("device", ""))
        env[prefix + "NODE"] = str(group.get("node", ""))
        env[prefix + "CPUS"] = str(group.get("cpus", ""))
        env[prefix + "MEMORY"] = str(group.get("memory", 0))
    for name, count in counts.items():
        env[f"NUMAD_{name}_COUNT"] = str(count)
    return env


_ENV_UNSAFE = re.compile(r"[^A-Z0-9]")


def _child(cgroup: Path, cmd: list[str], env: Mapping[str, str] | None = None) -> int:
    """Run ``cmd`` in ``cgroup`` (it joins before exec), with ``env`` added to its
    environment; its exit status, 128+N for a signal N. SIGINT, SIGTERM and SIGHUP are
    passed on to it while it runs."""
    # Blocked from before the fork until the command has ended, and taken one by one
    # (``_wait``): a handler could not stop a waitpid that a signal came just before
    # (under two CPU hogs 1 signalled run in 80: the signal waited 30 s for the command).
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
    # An inherited SIG_IGN for SIGCHLD would reap the command unseen and send no SIGCHLD.
    chld_ignored = signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        pid = os.fork()
    except OSError:
        _restore(old, chld_ignored=chld_ignored)
        raise
    if pid == 0:
        for sig in _FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        # The command gets numad run's mask and SIGCHLD, with what is passed on unblocked.
        _restore(old - set(_FORWARDED), chld_ignored=chld_ignored)
        try:
            (cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")
            os.environ.update(env or {})  # the child's own copy
            os.execvp(cmd[0], cmd)  # noqa: S606 - the user's command
        except OSError as err:
            print(f"numad: {cmd[0]}: {err.strerror}", file=sys.stderr)
        os._exit(127)
    try:
        return _wait(pid)
    finally:
        # One that came after the command ended is dropped (SIG_IGN discards a pending
        # signal), not raised into the cleanup; the caller restores the handlers.
        for sig in _FORWARDED:
            signal.signal(sig, signal.SIG_IGN)
        _restore(old, chld_ignored=chld_ignored)


def _restore(mask: set[int | signal.Signals], *, chld_ignored: bool) -> None:
    """The signal mask numad run was given, and SIGCHLD's SIG_IGN if it had one."""
    if chld_ignored:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _wait(pid: int) -> int:
    """The command's status once it has ended; meanwhile each signal of ``_FORWARDED``
    is passed on to it. They and SIGCHLD are blocked: each waits, pending, for
    ``sigwaitinfo``, however it falls between the steps, so none is lost."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code
        signum = signal.sigwaitinfo(_WAITED).si_signo
        if signum != signal.SIGCHLD:
            os.kill(pid, signum)


def _remove(cgroup: Path, root: Path) -> None:
    """Remove a cgroup directory numad run made. In cgroupfs its files go with it; in a
    scratch tree (``serve --root``) they are plain files, removed first, under the
    emulated kernel's lock (the daemon may be writing the files it emulates). One left
    behind is said, with why, never passed over in silence."""
    try:
        cgroup.rmdir()
    except OSError as err:
        if err.errno != errno.ENOTEMPTY or any(p.is_dir() for p in cgroup.iterdir()):
            print(f"numad: {cgroup}: not removed: {err.strerror}", file=sys.stderr)
            return
        if not is_scratch(root):
            print(f"numad: {cgroup}: not removed: {err.strerror}", file=sys.stderr)
            return
        with KernelMutex(root / SCRATCH_MARKER):
            try:
                for p in cgroup.iterdir():
                    p.unlink()
                cgroup.rmdir()
            except OSError as left:
                print(f"numad: {cgroup}: not removed: {left.strerror}", file=sys.stderr)
