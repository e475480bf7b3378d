"""The checks every spec shape shares (``Reader``), and the reading of numad's own
shape in ``native`` and ``container``; ``numad.workload.pod`` reads Pods with it.

Names and cgroup paths are checked before anything uses them, and every cgroup
stays inside a managed root (DESIGN section 5, invariant 5). Bad input becomes a
``SpecError`` naming the workload (or the input) and the field (invariant 6).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

from numad.errors import SpecError
from numad.placement.managers.cpu.state import ContainerKind
from numad.placement.managers.memory import MEMORY, hugepage_resource
from numad.placement.policy import Policy
from numad.workload.decode import member, show, type_name
from numad.workload.quantity import EXACT, exact_number, is_whole, page_size
from numad.workload.shape import (
    DEFAULT_CONTAINER,
    HUGEPAGES,
    MAX_BYTES,
    MAX_CGROUP_PATH,
    MAX_CPUS,
    MAX_DEVICES,
    ContainerSpec,
    WorkloadSpec,
    frozen,
)
from numad.workload.units import check_unit, workload_name

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_NAME_HINT = "use 1 to 63 of a-z 0-9 . _ -, starting with a letter or digit"
# A path component: the characters systemd allows in unit names, plus the
# backslash of systemd's escapes; "." and ".." are refused on their own.
_COMPONENT = re.compile(r"[A-Za-z0-9_.:@+-]{1,255}")
PATH_HINT = "give a relative path of names, like numad.slice/db.service"
_DEVICE_CLASS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,252}")
_CPU_TEXT = re.compile(r"(?P<number>[0-9]{1,12}(?:\.[0-9]{1,12})?)(?P<milli>m?)")
_CPUS_HINT = 'use an integer for exclusive CPUs, or "500m" or 0.5 for the shared pool'
_BYTES_HINT = "use bytes or a suffix like 32Gi"
_TOP_FIELDS = (
    "name",
    "cgroup",
    "unit",
    "policy",
    "transient",
    "movable",
    "containers",
    "cpus",
    "memory",
    "devices",
)
_CONTAINER_FIELDS = ("name", "cgroup", "kind", "cpus", "memory", "devices")
_RESOURCE_FIELDS = frozenset({"cpus", "memory", "devices"})
_POLICIES = frozenset(p.value for p in Policy)
_KINDS = frozenset(k.value for k in ContainerKind)


def path_problem(path: str) -> str | None:
    """What is wrong with a relative cgroup path; NUL and backslash fail the charset."""
    if not path or len(path) > MAX_CGROUP_PATH:
        return f"{show(path)} is empty or longer than {MAX_CGROUP_PATH} characters"
    if path.startswith("/"):
        return f"{show(path)} is absolute"
    parts = path.split("/")
    bad = next((p for p in parts if p in ("", ".", "..") or not _COMPONENT.fullmatch(p)), None)
    if bad in ("", ".", ".."):
        return f"{show(path)} has an empty, '.' or '..' component"
    if bad is not None:
        return f"{show(path)}: {show(bad)} has characters outside A-Z a-z 0-9 _ . : @ + -"
    return None


@dataclass(frozen=True, slots=True)
class Reader:
    """The checks every spec shape shares; ``subject`` names the workload (or, until
    its name is read, the input) in every error."""

    subject: str
    roots: tuple[str, ...]
    device_classes: frozenset[str] | None

    def fail(self, where: str, problem: str, hint: str | None = None) -> SpecError:
        return SpecError(self.subject, f"{where}: {problem}", hint)

    def table(self, value: object, where: str) -> dict[str, object]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a table, got {type_name(value)}")
        out: dict[str, object] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise self.fail(where, f"field name {show(key)} is not a string")
            out[key] = item
        return out

    def required(self, doc: Mapping[str, object], key: str, where: str) -> object:
        if key not in doc:
            raise self.fail(member(where, key), "missing")
        return doc[key]

    def known(self, doc: Mapping[str, object], where: str, fields: Sequence[str]) -> None:
        for key in doc:
            if key in fields or key.startswith(HUGEPAGES):
                continue
            close = difflib.get_close_matches(key, fields, n=1)
            known = f"known: {', '.join(fields)}, hugepages-<size>"
            hint = f"did you mean {close[0]}?" if close else known
            raise self.fail(
                member(where, key), f"unknown field in {where or 'the top level'}", hint
            )

    def name(self, value: object, where: str) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"expected a name, got {type_name(value)}")
        if not _NAME.fullmatch(value):
            raise self.fail(where, f"{show(value)} is not a valid name", _NAME_HINT)
        return value

    def path(self, value: object, where: str) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"expected a cgroup path, got {type_name(value)}")
        problem = path_problem(value)
        if problem:
            raise self.fail(where, problem, PATH_HINT)
        return value

    def workload_cgroup(self, value: object, where: str) -> str:
        path = self.path(value, where)
        if not any(path.startswith(f"{root}/") for root in self.roots):
            roots = " or ".join(self.roots) or "a managed root (none are configured)"
            raise self.fail(
                where, f"{show(path)} is outside the managed roots", f"put it in {roots}"
            )
        return path

    def policy(self, value: object, where: str) -> Policy:
        if isinstance(value, str) and value in _POLICIES:
            return Policy(value)
        choices = ", ".join(p.value for p in Policy)
        raise self.fail(where, f"{show(value)} is not a topology policy", f"use one of {choices}")

    def flag(self, value: object, where: str, *, text: bool = False) -> bool:
        """A true/false field; with ``text`` (an annotation's value), "true"/"false"."""
        if isinstance(value, bool) and not text:
            return value
        if text and value in ("true", "false"):
            return value == "true"
        wanted = '"true" or "false"' if text else "true or false"
        raise self.fail(where, f"expected {wanted}, got {show(value)}")

    # -- numad's own shape ---------------------------------------------------------------

    def native(self, doc: Mapping[str, object]) -> WorkloadSpec:
        unit = check_unit(doc["unit"], self.subject) if "unit" in doc else None
        if unit is not None and "name" not in doc:
            name = workload_name(unit)
        else:
            name = self.name(self.required(doc, "name", ""), "name")
        r = replace(self, subject=name)
        r.known(doc, "", _TOP_FIELDS)
        if unit is None or "cgroup" in doc:  # a unit's is systemd's: the daemon asks it
            cgroup = r.workload_cgroup(r.required(doc, "cgroup", ""), "cgroup")
        else:
            cgroup = ""
        policy = r.policy(doc["policy"], "policy") if "policy" in doc else None
        transient = doc.get("transient", False)
        if not isinstance(transient, bool):
            raise r.fail("transient", f"expected true or false, got {type_name(transient)}")
        if transient and unit is not None:
            raise r.fail("transient", "a unit is not transient", "systemd releases its cgroup")
        movable = r.flag(doc.get("movable", False), "movable")
        if "containers" not in doc:
            main = r.resources(doc, "", DEFAULT_CONTAINER, "", ContainerKind.APP)
            return WorkloadSpec(name, cgroup, policy, (main,), unit, transient, movable)
        beside = [k for k in doc if k in _RESOURCE_FIELDS or k.startswith(HUGEPAGES)]
        if beside:
            raise r.fail(member("", beside[0]), "not allowed beside containers", "move it into one")
        items = doc["containers"]
        if not isinstance(items, list) or not items:
            raise r.fail(
                "containers",
                f"expected a non-empty array of tables, got {type_name(items, empty=True)}",
            )
        wheres = [f"containers[{i}]" for i in range(len(items))]
        containers = tuple(r.container(item, w) for item, w in zip(items, wheres, strict=True))
        r.check_containers(containers, wheres)
        return WorkloadSpec(name, cgroup, policy, containers, unit, transient, movable)

    def container(self, value: object, where: str) -> ContainerSpec:
        doc = self.table(value, where)
        self.known(doc, where, _CONTAINER_FIELDS)
        name = self.name(self.required(doc, "name", where), f"{where}.name")
        cgroup = self.path(doc.get("cgroup", name), f"{where}.cgroup")
        raw_kind = doc.get("kind", ContainerKind.APP.value)
        if not isinstance(raw_kind, str) or raw_kind not in _KINDS:
            choices = ", ".join(k.value for k in ContainerKind)
            raise self.fail(f"{where}.kind", f"{show(raw_kind)} is not a kind", f"use {choices}")
        return self.resources(doc, where, name, cgroup, ContainerKind(raw_kind))

    def resources(
        self, doc: Mapping[str, object], where: str, name: str, cgroup: str, kind: ContainerKind
    ) -> ContainerSpec:
        cpus = self.cpus(doc["cpus"], member(where, "cpus")) if "cpus" in doc else (0, 0)
        memory: dict[str, int] = {}
        if "memory" in doc:
            memory[MEMORY] = self.size(doc["memory"], member(where, "memory"))
        for key in sorted(k for k in doc if k.startswith(HUGEPAGES)):
            resource, amount = self.hugepages(key, doc[key], member(where, key), pages=True)
            if resource in memory:
                raise self.fail(member(where, key), f"names the same page size as {resource}")
            memory[resource] = amount
        devices = self.devices(doc["devices"], member(where, "devices")) if "devices" in doc else {}
        return ContainerSpec(name, cgroup, *cpus, frozen(memory), frozen(devices), kind)

    def cpus(self, value: object, where: str) -> tuple[int, int]:
        """(exclusive CPUs, shared millicpus): 4 and "4" are exclusive, 0.5 and "500m" shared."""
        millis: Decimal | None = None
        milli_form = False
        if isinstance(value, str):
            match = _CPU_TEXT.fullmatch(value)
            if match:
                milli_form = bool(match["milli"])
                millis = Decimal(match["number"]) * (1 if milli_form else 1000)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            amount = exact_number(value)
            millis = None if amount is None else EXACT.multiply(amount, Decimal(1000))
        if millis is None:
            raise self.fail(where, f"{show(value)} is not a number of CPUs", _CPUS_HINT)
        if not 0 < millis <= MAX_CPUS * 1000:
            raise self.fail(
                where,
                f"{show(value)} is out of range",
                f"ask for more than 0 and at most {MAX_CPUS} CPUs",
            )
        if not is_whole(millis):
            raise self.fail(where, f"{show(value)} is finer than a millicpu", _CPUS_HINT)
        if not milli_form and millis % 1000 == 0:
            return int(millis) // 1000, 0
        return 0, int(millis)

    def size(self, value: object, where: str, *, unit: str = "bytes") -> int:
        amount = exact_number(value)
        if amount is None:
            raise self.fail(where, f"{show(value)} is not a quantity", _BYTES_HINT)
        if amount <= 0:
            raise self.fail(where, f"{show(value)} is not positive", "leave the field out instead")
        if amount > MAX_BYTES:
            raise self.fail(where, f"{show(value)} is more than 2^63-1 {unit}")
        if not is_whole(amount):
            raise self.fail(where, f"{show(value)} is not a whole number of {unit}", _BYTES_HINT)
        return int(amount)

    def hugepages(self, key: str, value: object, where: str, *, pages: bool) -> tuple[str, int]:
        """The resource name and bytes; with ``pages`` an integer counts pages."""
        page = page_size(key.removeprefix(HUGEPAGES))
        if page is None:
            raise self.fail(where, "not a hugepage size", "write hugepages-2Mi or hugepages-1Gi")
        resource = hugepage_resource(page // 1024)
        if pages and isinstance(value, int) and not isinstance(value, bool):
            if not 0 < value <= MAX_BYTES // page:
                raise self.fail(where, f"{show(value)} pages is out of range")
            return resource, value * page
        if pages and not isinstance(value, str):
            raise self.fail(where, f"expected a page count or a quantity, got {type_name(value)}")
        amount = self.size(value, where)
        if amount % page:
            size = resource.removeprefix(HUGEPAGES)
            raise self.fail(
                where,
                f"{show(value)} is not a multiple of the {size} page size",
                f"ask for whole pages: an integer count, or a multiple of {size}",
            )
        return resource, amount

    def devices(self, value: object, where: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for cls, count in sorted(self.table(value, where).items()):
            at = member(where, cls)
            self.device_class(cls, at)
            if type(count) is not int or not 0 < count <= MAX_DEVICES:
                hint = f"use an integer from 1 to {MAX_DEVICES}"
                raise self.fail(at, f"{show(count)} is not a device count", hint)
            out[cls] = count
        return out

    def device_class(self, name: str, where: str) -> None:
        if self.device_classes is None:
            if not _DEVICE_CLASS.fullmatch(name):
                raise self.fail(where, f"{show(name)} is not a device class name")
        elif name not in self.device_classes:
            known = ", ".join(sorted(self.device_classes)) or "none are configured"
            raise self.fail(where, f"unknown device class {show(name)}", f"known: {known}")

    def check_containers(self, containers: Sequence[ContainerSpec], wheres: Sequence[str]) -> None:
        names: dict[str, str] = {}
        cgroups: dict[str, str] = {}
        for c, where in zip(containers, wheres, strict=True):
            if c.name in names:
                raise self.fail(f"{where}.name", f"{show(c.name)} is taken by {names[c.name]}")
            if c.cgroup in cgroups:
                raise self.fail(f"{where}.cgroup", f"{show(c.cgroup)} is {cgroups[c.cgroup]}'s")
            names[c.name] = cgroups[c.cgroup] = where
        for c, where in zip(containers, wheres, strict=True):
            parts = c.cgroup.split("/")
            for outer in ("/".join(parts[:i]) for i in range(1, len(parts))):
                if outer in cgroups:
                    problem = f"{show(c.cgroup)} is inside {cgroups[outer]}'s cgroup"
                    raise self.fail(f"{where}.cgroup", problem, "give containers sibling cgroups")
        if all(c.kind is not ContainerKind.APP for c in containers):
            raise self.fail("containers", "no app container", 'give one container kind "app"')
