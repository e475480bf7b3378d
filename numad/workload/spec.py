"""Workload specs: numad's own shape (TOML, JSON, YAML), and the checks it shares
with Kubernetes Pod manifests (read by ``numad.workload.pod``).

The input edge of admission. Text is parsed once, here, into a validated
``WorkloadSpec``: ``numad.workload.decode`` turns text (or the file ``load_spec`` names)
into a document, and ``Reader`` checks it. Touches no file itself. Names and
cgroup paths are checked before anything uses them, and every cgroup stays
inside a managed root (DESIGN section 5, invariant 5). Bad input of any shape
becomes a ``SpecError`` naming the workload (or the file) and the field
(invariant 6). ``Reader`` holds the checks both shapes share, and in
``native`` and ``container`` the reading of numad's own shape.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any

from numad.errors import ConfigError, SpecError
from numad.placement.admission import ContainerRequest, WorkloadRequest
from numad.placement.managers.cpu.state import ContainerKind
from numad.placement.managers.memory import MEMORY, hugepage_resource
from numad.placement.policy import Policy
from numad.workload.decode import Format, check_length, decode, member, read_text, show, type_name
from numad.workload.quantity import EXACT, exact_number, is_whole, page_size
from numad.workload.units import check_unit, workload_name

MAX_CPUS = 4096
MAX_BYTES = (1 << 63) - 1
MAX_DEVICES = 1 << 16
MAX_CGROUP_PATH = 1024
DEFAULT_MANAGED_ROOTS = ("numad.slice",)
DEFAULT_CONTAINER = "main"

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_NAME_HINT = "use 1 to 63 of a-z 0-9 . _ -, starting with a letter or digit"
# Directory names as systemd units and plain tools spell them, without the
# backslash of systemd's escapes; "." and ".." are refused on their own.
_COMPONENT = re.compile(r"[A-Za-z0-9_.:@+-]{1,255}")
_PATH_HINT = "give a relative path of names, like numad.slice/db.service"
_DEVICE_CLASS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,252}")
_CPU_TEXT = re.compile(r"(?P<number>[0-9]{1,12}(?:\.[0-9]{1,12})?)(?P<milli>m?)")
_CPUS_HINT = 'use an integer for exclusive CPUs, or "500m" or 0.5 for the shared pool'
_BYTES_HINT = "use bytes or a suffix like 32Gi"
HUGEPAGES = "hugepages-"
_TOP_FIELDS = ("name", "cgroup", "unit", "policy", "containers", "cpus", "memory", "devices")
_CONTAINER_FIELDS = ("name", "cgroup", "kind", "cpus", "memory", "devices")
_RESOURCE_FIELDS = frozenset({"cpus", "memory", "devices"})
_POLICIES = frozenset(p.value for p in Policy)
_KINDS = frozenset(k.value for k in ContainerKind)


def frozen(values: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(sorted(values.items())))


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    name: str
    cgroup: str  # relative to the workload's cgroup; "" is the workload cgroup itself
    exclusive_cpus: int = 0
    shared_millicpus: int = 0  # a request on the shared pool (pinned to the whole pool)
    memory: Mapping[str, int] = field(default_factory=lambda: frozen({}))  # resource -> bytes
    devices: Mapping[str, int] = field(default_factory=lambda: frozen({}))  # class -> count
    kind: ContainerKind = ContainerKind.APP


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str
    cgroup: str  # relative to the cgroup root, inside a managed root
    policy: Policy | None
    containers: tuple[ContainerSpec, ...]
    unit: str | None = None  # a systemd unit: cgroup is its cgroup ("" until resolved)

    def container_cgroup(self, container: ContainerSpec) -> str:
        """The container's cgroup, relative to the cgroup root."""
        return f"{self.cgroup}/{container.cgroup}" if container.cgroup else self.cgroup

    def to_request(self) -> WorkloadRequest:
        return WorkloadRequest(
            self.name,
            tuple(
                ContainerRequest(c.name, c.exclusive_cpus, dict(c.memory), dict(c.devices), c.kind)
                for c in self.containers
            ),
            self.policy,
        )

    def to_dict(self) -> dict[str, Any]:
        """The spec in its own JSON shape: ``parse_spec`` reads it back to an equal spec."""
        out: dict[str, Any] = {"name": self.name}
        if self.unit is not None:
            out["unit"] = self.unit
        if self.cgroup:
            out["cgroup"] = self.cgroup
        if self.policy is not None:
            out["policy"] = self.policy.value
        only = self.containers[0] if len(self.containers) == 1 else None
        default = (DEFAULT_CONTAINER, "", ContainerKind.APP)
        if only and (only.name, only.cgroup, only.kind) == default:
            return out | _resources_dict(only)
        out["containers"] = [
            {"name": c.name, "cgroup": c.cgroup, "kind": c.kind.value, **_resources_dict(c)}
            for c in self.containers
        ]
        return out


def _resources_dict(c: ContainerSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if c.exclusive_cpus:
        out["cpus"] = c.exclusive_cpus
    elif c.shared_millicpus:
        out["cpus"] = f"{c.shared_millicpus}m"
    for resource, amount in c.memory.items():
        # Memory in bytes, hugepages as a page count (the spec's integer form).
        page = page_size(resource.removeprefix(HUGEPAGES)) if resource != MEMORY else None
        out[resource] = amount // page if page else amount
    if c.devices:
        out["devices"] = dict(c.devices)
    return out


def load_spec(
    path: Path,
    *,
    managed_roots: Sequence[str] = DEFAULT_MANAGED_ROOTS,
    device_classes: Collection[str] | None = None,
) -> WorkloadSpec:
    """Read and parse a spec file; the format comes from its suffix."""
    text, fmt = read_text(path)
    return parse_spec(
        text, fmt, managed_roots=managed_roots, device_classes=device_classes, source=str(path)
    )


def parse_spec(
    text: str,
    fmt: Format,
    *,
    managed_roots: Sequence[str] = DEFAULT_MANAGED_ROOTS,
    device_classes: Collection[str] | None = None,
    source: str = "spec",
) -> WorkloadSpec:
    """A validated spec from TOML, JSON or YAML text; YAML and JSON may be a v1 Pod.

    ``source`` names the input in errors until the workload's name is known.
    Bad managed roots are the caller's ``ConfigError``; anything wrong with the
    text is a ``SpecError``.
    """
    check_length(text, source)
    classes = None if device_classes is None else frozenset(device_classes)
    reader = Reader(source, _roots(managed_roots), classes)
    doc = reader.table(decode(text, fmt, source), "top level")
    if fmt != "toml" and ("apiVersion" in doc or "kind" in doc):
        # numad.workload.pod builds on this module's Reader, so it is imported only here.
        from numad.workload.pod import read_pod  # noqa: PLC0415

        return read_pod(reader, doc)
    return reader.native(doc)


def _roots(managed_roots: Sequence[str]) -> tuple[str, ...]:
    roots = tuple(r.strip("/") for r in managed_roots)
    for root in roots:
        problem = _path_problem(root)
        if problem:
            raise ConfigError("managed-roots", problem, _PATH_HINT)
    return roots


def _path_problem(path: str) -> str | None:
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
        problem = _path_problem(value)
        if problem:
            raise self.fail(where, problem, _PATH_HINT)
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
        if "containers" not in doc:
            main = r.resources(doc, "", DEFAULT_CONTAINER, "", ContainerKind.APP)
            return WorkloadSpec(name, cgroup, policy, (main,), unit)
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
        return WorkloadSpec(name, cgroup, policy, containers, unit)

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
