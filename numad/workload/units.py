"""systemd units as workloads: a spec's ``unit = "postgresql.service"``.

A unit's control group is systemd's to make: it exists while the unit runs and
is made again, at the same path, on every start. numad asks systemd for the path
(the unit's ControlGroup while it runs; else its Slice, whose path systemd
derives from the name, see systemd.slice(5)), keeps the workload across stops
and starts, and writes its placement as the unit's runtime AllowedCPUs= and
AllowedMemoryNodes= (numad.host.isolation), so systemd applies it from the first
instant of every start and ``systemctl show`` tells the truth.
"""

from __future__ import annotations

import re
from typing import Protocol

from numad.errors import NumadError, SpecError

# systemd's unit name characters (unit_name_is_valid: VALID_CHARS plus "@" of a
# template instance); the types a workload can be: the ones with processes.
UNIT_TYPES = (".service", ".scope")
_UNIT = re.compile(r"[A-Za-z0-9:_.\\@-]{1,250}")
_UNIT_HINT = "name a loaded or installed .service or .scope unit, like postgresql.service"
MAX_NAME = 63


class Units(Protocol):
    """What numad asks systemd (numad.host.systemd_bus.Systemd)."""

    def load(self, name: str) -> str: ...
    def control_group(self, name: str) -> str | None: ...
    def slice(self, name: str) -> str: ...


def check_unit(value: object, subject: str) -> str:
    """A unit name as a spec gives it."""
    if not isinstance(value, str):
        raise SpecError(subject, f"unit: expected a unit name, got {type(value).__name__}")
    if not (_UNIT.fullmatch(value) and value.endswith(UNIT_TYPES) and value[0] not in ".-@"):
        raise SpecError(subject, f"unit: {value!r} is not a service or scope unit", _UNIT_HINT)
    return value


def workload_name(unit: str) -> str:
    """The workload's name when the spec gives only the unit: the unit's name in
    lower case, each character a name cannot hold made "-" (``getty@tty1.service``
    is ``getty-tty1.service``), at most 63 characters kept from the end."""
    name = re.sub(r"[^a-z0-9._-]", "-", unit.lower())[-MAX_NAME:]
    return name.lstrip("._-") or "unit"


def slice_cgroup(name: str) -> str:
    """The cgroup path systemd gives slice ``name``, relative to the root: each
    dash-separated prefix is a parent slice (``a-b.slice`` is ``a.slice/a-b.slice``);
    ``-.slice`` is the root itself."""
    if name == "-.slice":
        return ""
    stem = name.removesuffix(".slice")
    parts = stem.split("-")
    return "/".join(f"{'-'.join(parts[: i + 1])}.slice" for i in range(len(parts)))


def resolve(systemd: Units | None, unit: str, subject: str, roots: tuple[str, ...]) -> str:
    """The unit's cgroup, relative to the cgroup root, checked to be inside a
    managed root; whether or not it runs now."""
    if systemd is None:
        raise SpecError(
            subject,
            f"unit: cannot place {unit}: numad has no connection to systemd",
            "give the workload's cgroup instead, or run numad under systemd",
        )
    try:
        systemd.load(unit)
        path = systemd.control_group(unit)
        if path is None:  # not running: where systemd will make it
            path = "/".join(p for p in (slice_cgroup(systemd.slice(unit)), unit) if p)
    except NumadError as err:
        raise SpecError(subject, f"unit: cannot find {unit}'s cgroup: {err}") from err
    path = path.strip("/")
    if not any(path.startswith(f"{root}/") for root in roots):
        slice_ = path.rpartition("/")[0] or "the root"
        raise SpecError(
            subject,
            f"unit: {unit} runs in {slice_}, outside the managed roots ({', '.join(roots)})",
            f'add "{slice_}" to [paths] managed-roots, or give the unit Slice=numad.slice',
        )
    return path
