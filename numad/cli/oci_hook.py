"""``numad oci-hook``: containers admitted through an OCI runtime hook.

Edge module, registered by ``numad.cli.main``; a client of the daemon's API, kept as
light as the other clients (no managers, no numpy: it runs on every container
start). The runtime runs it as a ``createRuntime`` hook (or the older
``prestart``) and as a ``poststop`` hook, with the container's OCI state on
stdin. It reads the bundle's ``config.json`` and the container process's
``/proc/PID/cgroup`` (through a ``HostFS``: ``--root`` re-roots it), admits the
container through the daemon before its process runs, and releases it after.
It writes no host file: the daemon applies the cpuset.

The request: the ``numad.io/`` annotations, each falling back to the cgroup
limits (the CPU quota when it is a whole number of CPUs, the kubelet's
Guaranteed rule; the memory limit). A container numad cannot place fails to
start with one line saying why, or runs unplaced (``--on-reject run``).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numad import defaults
from numad.cli import journal, textout
from numad.cli.client import APIError, request
from numad.errors import CgroupError, ConfigError, NumadError, SpecError, WorkloadError
from numad.hostfs import HostFS, read_regular
from numad.workload.quantity import is_whole, quantity
from numad.workload.units import slice_cgroup

PREFIX = "numad.io/"
JOURNAL_ID = "numad-oci-hook"  # journalctl -t numad-oci-hook
KEYS = ("cpus", "memory", "devices", "policy", "on-reject", "movable")
FAIL, RUN = "fail", "run"
CREATE_STAGES = ("createRuntime", "prestart")  # both run in the runtime's namespaces
POSTSTOP = "poststop"
DEFAULT_PERIOD = 100_000  # microseconds, the kernel's cpu.max default
_MAX_STATE = 1 << 20
_MAX_CONFIG = 16 << 20  # a bundle's config.json larger than this is not one
_MAX_REASON = 600
_CPUS_HINT = 'use a whole number of CPUs, or "500m" for the shared pool'
_CPUS = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,12})?m?")
_DEVICE = re.compile(r"(?P<cls>[A-Za-z0-9][A-Za-z0-9._/-]{0,252})=(?P<count>[0-9]{1,6})")
_NOT_NAME = re.compile(r"[^a-z0-9._-]+")
_SYSTEMD = re.compile(r"(?P<slice>[^:/]*):(?P<prefix>[^:/]*):(?P<name>[^:/]+)")


@dataclass(frozen=True, slots=True)
class Container:
    """What the runtime tells about one container: its state and its bundle's config."""

    id: str
    status: str
    pid: int
    bundle: str
    annotations: Mapping[str, str]
    config: Mapping[str, Any]

    @property
    def subject(self) -> str:
        return f"container {self.id[:12]}"

    @property
    def workload(self) -> str:
        """The workload's name: ``oci-`` and the id. An id that is not a name as it
        stands (upper case, other characters) or does not fit one is folded or cut (to
        its first 12 characters, as docker shortens them) and gets a hash of the whole
        id: ``Web`` and ``web`` are two workloads."""
        clean = _NOT_NAME.sub("-", self.id.lower()).strip("-._")
        if clean == self.id and len(clean) <= 59:
            return f"oci-{clean}"
        digest = hashlib.sha256(self.id.encode()).hexdigest()[:10]
        return f"oci-{clean[:12] if len(clean) > 48 else clean}-{digest}".replace("--", "-")

    def section(self, *keys: str) -> Mapping[str, Any]:
        """A table of ``config.json`` (``linux``, ``resources``, ...), empty where absent."""
        found: Any = self.config
        for key in keys:
            found = found.get(key) if isinstance(found, Mapping) else None
        return found if isinstance(found, Mapping) else {}


def add_oci_hook(sub: Any) -> None:
    hook = sub.add_parser(
        "oci-hook",
        help="admit and release containers as an OCI runtime hook",
        description="An OCI runtime hook (createRuntime, poststop): reads the container's "
        "state on stdin, admits it through the running daemon from its numad.io/ "
        "annotations or its cgroup limits, and releases it when it stops.",
    )
    hook.add_argument(
        "--stage",
        choices=("auto", *CREATE_STAGES, POSTSTOP),
        default="auto",
        help="the hook stage (default auto: poststop when the state's status is stopped,"
        " else createRuntime)",
    )
    hook.add_argument(
        "--on-reject",
        choices=(FAIL, RUN),
        default=FAIL,
        help="when numad cannot place a container (rejected, invalid, daemon down): fail"
        " its start (default) or run it unplaced; the annotation numad.io/on-reject wins",
    )
    hook.add_argument(
        "--socket", metavar="PATH", help=f"the daemon's API socket (default {defaults.SOCKET})"
    )
    hook.add_argument(
        "--root",
        metavar="DIR",
        default="/",
        help="read /proc/PID/cgroup under DIR instead of / (a scratch tree, for tests)",
    )
    hook.set_defaults(command=_hook)


def _hook(args: argparse.Namespace) -> int:
    _Journal.socket = Path(args.root) / journal.SOCKET.relative_to("/")
    try:
        container = read_container(sys.stdin.read(_MAX_STATE + 1))
    except NumadError as err:  # no container to name yet: the hook's own choice applies
        return refuse("oci-hook", args.on_reject, str(err))
    socket = str(args.socket or defaults.SOCKET)
    stage = args.stage
    if stage == "auto":
        stage = POSTSTOP if container.status == "stopped" else CREATE_STAGES[0]
    if stage == POSTSTOP:
        return release(container, socket)
    mode = on_reject(container, args.on_reject)
    try:
        return admit(container, socket, HostFS(args.root))
    except APIError as err:
        return refuse(container.subject, mode, _answer(err))
    except NumadError as err:
        return refuse(container.subject, mode, str(err))


# -- input ----------------------------------------------------------------------------------


def read_container(text: str) -> Container:
    """The container from its OCI state (``text``) and its bundle's ``config.json``; the
    config's annotations first, the state's over them (some runtimes leave them out)."""
    subject = "OCI state on stdin"
    if len(text) > _MAX_STATE:
        raise ConfigError(subject, f"longer than {_MAX_STATE} bytes")
    state = _json_object(text, subject)
    cid, bundle, status = state.get("id"), state.get("bundle"), state.get("status", "")
    if not isinstance(cid, str) or not cid:
        raise ConfigError(subject, "no container id", "a runtime passes the state as JSON")
    if not isinstance(bundle, str) or not bundle.startswith("/"):
        raise ConfigError(subject, f"container {cid[:12]}: no absolute bundle path")
    pid, path = state.get("pid", 0), Path(bundle, "config.json")
    try:  # O_NONBLOCK: a FIFO in its place is refused, not waited on
        data = read_regular(path, _MAX_CONFIG)
    except OSError as err:
        raise ConfigError(str(path), f"cannot read: {err.strerror}") from err
    if len(data) > _MAX_CONFIG:
        raise ConfigError(str(path), f"longer than {_MAX_CONFIG} bytes")
    config = _json_object(data.decode("utf-8", errors="replace"), str(path))
    annotations = {**_strings(config.get("annotations")), **_strings(state.get("annotations"))}
    status = status if isinstance(status, str) else ""
    return Container(
        cid, status, pid if type(pid) is int and pid > 0 else 0, bundle, annotations, config
    )


def _json_object(text: str, subject: str) -> dict[str, Any]:
    try:
        found = json.loads(text)
    except ValueError as err:
        raise ConfigError(subject, f"not JSON: {err}") from err
    if not isinstance(found, dict):
        raise ConfigError(subject, "not a JSON object")
    return found


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def on_reject(container: Container, default: str) -> str:
    """What to do with a container numad cannot place: its annotation, else the hook's."""
    chosen = container.annotations.get(PREFIX + "on-reject", default)
    if chosen not in (FAIL, RUN):
        problem = f"annotation {PREFIX}on-reject: {chosen!r} is not {FAIL} or {RUN}"
        raise SpecError(container.subject, problem)
    return chosen


# -- the request ------------------------------------------------------------------------------


def workload_request(container: Container) -> dict[str, Any] | str:
    """The spec's resources and policy, or why the container is not placed (it runs on
    the shared pool)."""
    notes = container.annotations
    _check_keys(container)
    text = notes.get(PREFIX + "cpus")
    cpus: str | int
    if text is not None:
        if not _CPUS.fullmatch(text):
            raise _bad(container, "cpus", text, _CPUS_HINT)
        cpus = text
    else:
        quota = _whole_cpus(container.section("linux", "resources", "cpu"))
        if isinstance(quota, str):
            return quota
        cpus = quota
    spec: dict[str, Any] = {"cpus": cpus}
    memory = notes.get(PREFIX + "memory")
    if memory is not None:
        amount = quantity(memory)
        if amount is None or amount <= 0 or not is_whole(amount):
            raise _bad(container, "memory", memory, "use bytes or a suffix like 32Gi")
        spec["memory"] = memory
    else:
        limit = container.section("linux", "resources", "memory").get("limit")
        if type(limit) is int and limit > 0:
            spec["memory"] = limit
    if PREFIX + "devices" in notes:
        spec["devices"] = _devices(container, notes[PREFIX + "devices"])
    if PREFIX + "policy" in notes:
        spec["policy"] = notes[PREFIX + "policy"]  # the daemon names the policies
    if (movable := notes.get(PREFIX + "movable")) is not None:
        if movable not in ("true", "false"):
            raise _bad(container, "movable", movable, 'use "true" or "false"')
        spec["movable"] = movable == "true"
    return spec


def _check_keys(container: Container) -> None:
    for key in container.annotations:
        field = key.removeprefix(PREFIX)
        if key.startswith(PREFIX) and field not in KEYS:
            close = difflib.get_close_matches(field, KEYS, n=1)
            hint = f"did you mean {PREFIX}{close[0]}?" if close else f"known: {', '.join(KEYS)}"
            raise SpecError(container.subject, f"annotation {key}: unknown to numad", hint)


def _whole_cpus(cpu: Mapping[str, Any]) -> int | str:
    """Whole CPUs from the CFS quota, or why there are none."""
    quota, period = cpu.get("quota"), cpu.get("period") or DEFAULT_PERIOD
    if type(quota) is not int or quota <= 0 or type(period) is not int or period <= 0:
        return f"no {PREFIX}cpus annotation and no cpu quota (it runs on the shared pool)"
    if quota % period:
        return (
            f"cpu quota {quota}/{period} is {quota / period:g} CPUs, not a whole number"
            " (it runs on the shared pool)"
        )
    return quota // period


def _devices(container: Container, text: str) -> dict[str, int]:
    devices: dict[str, int] = {}
    for item in text.split(","):
        match = _DEVICE.fullmatch(item.strip())
        if match is None or int(match["count"]) == 0 or match["cls"] in devices:
            raise _bad(container, "devices", text, "write CLASS=COUNT pairs: gpu=1,nic=2")
        devices[match["cls"]] = int(match["count"])
    return devices


def _bad(container: Container, key: str, value: str, hint: str) -> SpecError:
    return SpecError(container.subject, f"annotation {PREFIX}{key}: {value!r} is invalid", hint)


# -- the cgroup -------------------------------------------------------------------------------


def container_cgroup(container: Container, fs: HostFS) -> str:
    """The container's cgroup relative to the cgroup root: where its process is, else
    where ``linux.cgroupsPath`` says the runtime puts it."""
    if container.pid:
        text = fs.read_optional(f"/proc/{container.pid}/cgroup")
        found = None if text is None else _from_proc(text)
        if found:
            return found
    path = container.section("linux").get("cgroupsPath")
    found = _from_cgroups_path(path) if isinstance(path, str) and path else None
    if not found:
        raise CgroupError(
            container.subject,
            "no cgroup to place: no process to read /proc/PID/cgroup from"
            " and no linux.cgroupsPath in config.json",
        )
    return found


def _from_proc(text: str) -> str | None:
    """The cpuset hierarchy's path on a v1 (hybrid) host, else the unified one."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
        if hierarchy == "0" and not controllers:
            paths.setdefault("unified", path)
        elif "cpuset" in controllers.split(","):
            paths["cpuset"] = path
    found = paths.get("cpuset", paths.get("unified"))
    return found.strip("/") if found else None


def _from_cgroups_path(path: str) -> str:
    """A cgroupfs path, or systemd's ``slice:prefix:name`` as runc and crun expand it
    (``machine-x.slice`` is ``machine.slice/machine-x.slice``; the unit is a scope)."""
    match = _SYSTEMD.fullmatch(path)
    if match is None:
        return path.strip("/")
    name = match["name"]
    unit = name if name.endswith(".slice") else f"{match['prefix']}-{name}.scope".lstrip("-")
    return "/".join(p for p in (slice_cgroup(match["slice"] or "system.slice"), unit) if p)


# -- admit and release ----------------------------------------------------------------------


def admit(container: Container, socket: str, fs: HostFS) -> int:
    wanted = workload_request(container)
    if isinstance(wanted, str):
        say(f"numad: {container.subject}: not placed: {wanted}")
        return 0
    name = container.workload
    # transient: released by the daemon once its cgroup stays empty, if poststop never runs
    spec = {"name": name, "cgroup": container_cgroup(container, fs), "transient": True, **wanted}
    if not os.path.exists(socket):
        raise NumadError(socket, "the numad socket is absent", "is `numad serve` running?")
    body = json.dumps(spec)
    try:
        placed = request(socket, "POST", "/v1/workloads", body)
    except APIError as err:
        if err.body.get("error", {}).get("code") != "conflict":
            raise
        _release_stale(name, spec["cgroup"], socket)  # a restart that missed its poststop
        placed = request(socket, "POST", "/v1/workloads", body)
    main: dict[str, Any] = next(iter(placed.get("containers", {}).values()), {})
    say(f"numad: {container.subject}: admitted as {name}: {textout.placement(main)}")
    return 0


def _answer(err: APIError) -> str:
    """The daemon's reason, and where the operator can widen the managed roots."""
    text = str(err.body.get("error", {}).get("message") or err)
    if "outside the managed roots" in text:
        text += " (or add its parent to [paths] managed-roots in numad.toml)"
    return text


def _release_stale(name: str, cgroup: str, socket: str) -> None:
    """Release an admission of the same name for this same cgroup; one for another cgroup
    keeps its name, and this container is not placed."""
    held = request(socket, "GET", f"/v1/workloads/{name}").get("cgroup")
    if held != cgroup:
        raise WorkloadError(name, f"the name is held by cgroup {held}", f"numad release {name}")
    request(socket, "DELETE", f"/v1/workloads/{name}")


def release(container: Container, socket: str) -> int:
    """Release the container's workload; one already gone (or never admitted) is fine.
    One of the same name on another cgroup is left alone."""
    name = container.workload
    if not os.path.exists(socket):
        say(f"numad: {container.subject}: not released: {socket} is absent", journal.ERR)
        return 0
    try:
        held = request(socket, "GET", f"/v1/workloads/{name}").get("cgroup")
        path = container.section("linux").get("cgroupsPath")
        expected = _from_cgroups_path(path) if isinstance(path, str) and path else held
        if held != expected:
            left = f"{name} is on cgroup {held}, not {expected}; left in place"
            say(f"numad: {container.subject}: {left}")
            return 0
        request(socket, "DELETE", f"/v1/workloads/{name}")
    except APIError as err:
        if err.status == 404:
            return 0
        raise
    say(f"numad: {container.subject}: released {name}")
    return 0


def refuse(subject: str, mode: str, reason: str) -> int:
    """A container numad cannot place: one line, then fail its start or let it run."""
    reason = _one_line(reason)
    if mode == RUN:
        say(f"numad: {subject}: not placed: {reason}; running it unplaced", journal.ERR)
        return 0
    say(
        f"numad: {subject}: not placed: {reason}; failing its start"
        f" ({PREFIX}on-reject=run starts it unplaced)",
        journal.ERR,
    )
    return 1


class _Journal:
    socket = journal.SOCKET  # the one under --root (a scratch tree's, in tests)


def say(line: str, priority: int = journal.INFO) -> None:
    """One line on stderr (runc shows it in its error) and in the journal (crun drops
    a hook's output: numad.cli.journal)."""
    print(line, file=sys.stderr)
    journal.send(JOURNAL_ID, line, priority, _Journal.socket)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 3] + "..."
