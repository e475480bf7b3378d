"""numad's configuration: one TOML file, strictly validated, production defaults.

Edge module: reads the config file; everything else receives a ``Config``.
Option names follow the kubelet's where they mean the same. Unknown keys, and
values of the wrong type or outside their range, are errors naming the key
(``numad.toml [memory]: policy = 'Static': not one of static, none``).

    [topology]
    policy = "best-effort"            # none | best-effort | restricted | single-numa-node
    scope = "container"               # container | pod
    options = { "prefer-closest-numa-nodes" = "true" }   # strings or booleans; numad's
                                      # own "align-per-resource" (off): under best-effort,
                                      # CPUs and memory per device node (README)

    [cpu]
    reserved-cpus = "0,16"            # an explicit list, or:
    reserved-count = 2                # chosen by the kubelet's allocator (default 1)
    options = { "full-pcpus-only" = true }               # booleans only

    [memory]
    policy = "static"                 # static | none
    reserved = { "0" = { memory = "1Gi" } }
    pull = true                       # move an exclusive workload's pages that sit off
                                      # its CPUs' nodes there (migrate_pages), in the
                                      # background, where they fit; false: leave memory
    locality-threshold = 0.8          # a workload whose share of memory on its own
                                      # nodes stays below this is listed in health (0-1)

    [devices.gpu]                     # a device class: selectors, or addresses
    vendor = "0x10de"
    class-prefix = "0x0302"
    pick = "locality"                 # locality: a container's devices closest in the
                                      # PCIe tree (a switch, a root port) inside the
                                      # merge's nodes; index: the kubelet's order

    [paths]
    cgroup-root = "/sys/fs/cgroup"
    managed-roots = ["numad.slice"]   # a root taken out keeps its workloads held, their
                                      # cgroups unwritten, numad not ready (README)
    state-dir = "/var/lib/numad"
    socket = "/run/numad/numad.sock"
    workloads-dir = "/etc/numad/workloads.d"

    [daemon]
    reconcile-seconds = 10            # how often cpusets are read back and repaired (0.1-3600)
    release-grace-seconds = 30        # how long a workload's cgroups must have been gone
                                      # before it is released, so a unit restart keeps its
                                      # placement (0-86400)

    [metrics]
    listen = "127.0.0.1"
    port = 9477                       # 0: any free port (shown in /v1/health)
    page = false                      # also serve the live page at / and its data at
                                      # /state.json: every workload, cgroup and placement,
                                      # to whoever can reach the port (any local user on
                                      # loopback); /metrics is served either way

    [host]
    isolate = true                    # cgroups in the managed roots that are no
                                      # workload's run on the shared pool (and reserved
                                      # CPUs), never on exclusive CPUs; given every CPU
                                      # back when numad stops
    partitions = "auto"               # with isolate: make each exclusive set a cgroup v2
                                      # remote partition, which keeps every other cgroup
                                      # off it with no write to any; dissolved when numad
                                      # stops. "auto": where the kernel offers them (6.11
                                      # or later) and numad holds CAP_SYS_ADMIN, else one
                                      # by one; true: asked for (a problem where refused);
                                      # false: one by one always
    irq-affinity = false              # move interrupts off exclusive CPUs too, their
                                      # own affinity given back on stop (the unit then
                                      # needs ReadWritePaths=/proc/irq)
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from numad import defaults
from numad.cpuset import CPUSet, digits
from numad.daemon.selectors import hex_id, pci_address, pci_ids
from numad.errors import ConfigError
from numad.placement.managers.cpu.static import CPUOption
from numad.placement.managers.device import DeviceClass, Pick
from numad.placement.policy import OPTIONS, Policy
from numad.placement.scope import Scope

DEFAULT_PATH = Path("/etc/numad/numad.toml")
_SECTIONS = {"topology", "cpu", "memory", "devices", "paths", "daemon", "metrics", "host"}
_KEYS = {
    "topology": {"policy", "scope", "options"},
    "cpu": {"reserved-cpus", "reserved-count", "options"},
    "memory": {"policy", "reserved", "pull", "locality-threshold"},
    "paths": {"cgroup-root", "managed-roots", "state-dir", "socket", "workloads-dir"},
    "daemon": {"reconcile-seconds", "release-grace-seconds"},
    "host": {"isolate", "partitions", "irq-affinity"},
    "metrics": {"listen", "port", "page"},
}
_DEVICE_KEYS = {"vendor", "device", "class-prefix", "driver", "addresses", "pick"}
_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}

_E = TypeVar("_E", bound=StrEnum)
_S = TypeVar("_S", str, None)


class MemoryPolicy(StrEnum):
    """The memory manager's policies, spelled as the kubelet's."""

    STATIC = "static"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Paths:
    cgroup_root: str = defaults.CGROUP_ROOT
    managed_roots: tuple[str, ...] = (defaults.MANAGED_ROOT,)
    state_dir: str = defaults.STATE_DIR
    socket: str = defaults.SOCKET
    workloads_dir: str = defaults.WORKLOADS_DIR


@dataclass(frozen=True, slots=True)
class Config:
    policy: Policy = Policy.BEST_EFFORT
    scope: Scope = Scope.CONTAINER
    topology_options: Mapping[str, str] = field(default_factory=dict)
    reserved_cpus: str | None = None
    reserved_count: int = 1
    cpu_options: Mapping[str, bool] = field(default_factory=dict)
    memory_static: bool = True
    memory_reserved: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    device_classes: tuple[DeviceClass, ...] = ()
    paths: Paths = field(default_factory=Paths)
    metrics_listen: str = "127.0.0.1"
    metrics_port: int = 9477
    metrics_page: bool = False  # the live page and /state.json: opt-in
    reconcile_seconds: float = 10.0
    release_grace_seconds: float = 30.0
    isolate: bool = True
    partitions: bool | None = None  # None: "auto", where offered and permitted
    irq_affinity: bool = False
    memory_pull: bool = True
    locality_threshold: float = 0.8
    source: str = "config"  # the file, for errors found once the machine is known


_DEFAULT = Config()


def load(path: Path | None) -> Config:
    """The config at ``path``; the defaults when ``path`` is None or the default file is absent."""
    if path is None:
        if not DEFAULT_PATH.exists():
            return Config()
        path = DEFAULT_PATH
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(str(path), f"cannot read: {err.strerror}") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(str(path), f"not valid TOML: {err}") from err
    return parse(raw, str(path))


def parse(raw: Mapping[str, Any], source: str = "config") -> Config:
    top = _Table(raw, source)
    top.only(_SECTIONS)
    section = {name: top.table(name) for name in sorted(_SECTIONS)}
    for name, keys in _KEYS.items():
        section[name].only(keys)
    topology, cpu, memory = section["topology"], section["cpu"], section["memory"]
    daemon, metrics, d = section["daemon"], section["metrics"], _DEFAULT
    topology_options, cpu_options = topology.table("options"), cpu.table("options")
    topology_options.only(set(OPTIONS), "option")
    cpu_options.only({o.value for o in CPUOption}, "option")
    return Config(
        policy=topology.choice("policy", d.policy),
        scope=topology.choice("scope", d.scope),
        topology_options={k: topology_options.option(k) for k in topology_options.values},
        reserved_cpus=_reserved_cpus(cpu),
        reserved_count=cpu.integer("reserved-count", d.reserved_count, 0),
        cpu_options={k: cpu_options.boolean(k) for k in cpu_options.values},
        memory_static=memory.choice("policy", MemoryPolicy.STATIC) is MemoryPolicy.STATIC,
        memory_reserved=_reserved(memory.table("reserved")),
        device_classes=_classes(section["devices"]),
        paths=_paths(section["paths"]),
        metrics_listen=metrics.string("listen", d.metrics_listen),
        metrics_port=metrics.integer("port", d.metrics_port, 0, 65535),
        metrics_page=metrics.boolean("page", d.metrics_page),
        reconcile_seconds=daemon.seconds("reconcile-seconds", d.reconcile_seconds, 0.1, 3600),
        release_grace_seconds=daemon.seconds(
            "release-grace-seconds", d.release_grace_seconds, 0, 86400
        ),
        isolate=section["host"].boolean("isolate", d.isolate),
        partitions=section["host"].auto("partitions"),
        irq_affinity=section["host"].boolean("irq-affinity", d.irq_affinity),
        memory_pull=memory.boolean("pull", d.memory_pull),
        locality_threshold=memory.fraction("locality-threshold", d.locality_threshold),
        source=source,
    )


def check_reserved(config: Config, cpus: CPUSet, online: int) -> None:
    """The reserved CPUs against the machine: every listed CPU exists (online or
    not); a count is at most the online CPUs."""
    where = f"{config.source} [cpu]"
    if config.reserved_cpus is not None:
        missing = CPUSet.parse_list(config.reserved_cpus) - cpus
        if missing:
            raise ConfigError(
                where,
                f"reserved-cpus = {config.reserved_cpus!r}: "
                + (
                    f"CPU {missing.format_list()} does not exist on this machine"
                    if len(missing) == 1
                    else f"CPUs {missing.format_list()} do not exist on this machine"
                ),
                f"its CPUs are {cpus.format_list()}",
            )
    elif config.reserved_count > online:
        raise ConfigError(
            where,
            f"reserved-count = {config.reserved_count}: this machine has {online} online CPUs",
            f"reserve from 0 to {online}",
        )


@dataclass(frozen=True, slots=True)
class _Table:
    """One TOML table and its name in errors; one typed reader per kind of value."""

    values: Mapping[str, Any]
    source: str
    name: str = ""  # "" for the file's top level, "cpu.options" for a nested table

    @property
    def where(self) -> str:
        return f"{self.source} [{self.name}]" if self.name else self.source

    def fail(self, key: str, problem: str, hint: str | None = None) -> ConfigError:
        return ConfigError(self.where, f"{key} = {self.values[key]!r}: {problem}", hint)

    def only(self, allowed: set[str], what: str = "key") -> None:
        unknown = sorted(set(self.values) - allowed)
        if unknown:
            raise ConfigError(
                self.where,
                f"unknown {what} {unknown[0]!r}",
                f"known {what}s: {', '.join(sorted(allowed))}",
            )

    def table(self, key: str) -> _Table:
        value = self.values.get(key, {})
        if not isinstance(value, Mapping):
            raise self.fail(key, "not a table")
        return _Table(value, self.source, f"{self.name}.{key}" if self.name else key)

    def boolean(self, key: str, default: bool = False) -> bool:
        value = self.values.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, "not a boolean", "write true or false, without quotes")
        return value

    def auto(self, key: str) -> bool | None:
        """true, false, or "auto" (the default): None."""
        value = self.values.get(key, "auto")
        if value == "auto":
            return None
        if not isinstance(value, bool):
            raise self.fail(key, 'not true, false or "auto"')
        return value

    def choice(self, key: str, default: _E) -> _E:
        kind = type(default)
        value = self.values.get(key, default)
        allowed = [member.value for member in kind]
        if not isinstance(value, str) or value not in allowed:
            raise self.fail(key, f"not one of {', '.join(allowed)}")
        return kind(value)

    def integer(self, key: str, default: int, lo: int, hi: int | None = None) -> int:
        value = self.values.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < lo
            or (hi is not None and value > hi)
        ):
            bounds = f"from {lo} to {hi}" if hi is not None else f"of {lo} or more"
            raise self.fail(key, f"not a whole number {bounds}")
        return value

    def seconds(self, key: str, default: float, lo: float, hi: float) -> float:
        value = self.values.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
            raise self.fail(key, f"not a number of seconds from {lo:g} to {hi:g}")
        return float(value)

    def fraction(self, key: str, default: float) -> float:
        value = self.values.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise self.fail(key, "not a fraction from 0 to 1")
        return float(value)

    def string(self, key: str, default: _S) -> str | _S:
        if key not in self.values:
            return default
        value = self.values[key]
        if not isinstance(value, str):
            raise self.fail(key, "not a string")
        return value

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.values.get(key, default)
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(key, "not an array of non-empty strings")
        return tuple(value)

    def option(self, key: str) -> str:
        """A kubelet option's value: a string, or a boolean as "true"/"false"."""
        value = self.values[key]
        if isinstance(value, bool):
            return str(value).lower()
        if not isinstance(value, str):
            raise self.fail(key, "not a string or a boolean")
        return value


def _reserved_cpus(cpu: _Table) -> str | None:
    text = cpu.string("reserved-cpus", None)
    if text is not None:
        try:
            CPUSet.parse_list(text)
        except ValueError as err:
            raise cpu.fail(
                "reserved-cpus", str(err), 'use the kernel list format, like "0,16"'
            ) from err
    return text


def _paths(raw: _Table) -> Paths:
    d = _DEFAULT.paths
    return Paths(
        cgroup_root=raw.string("cgroup-root", d.cgroup_root),
        managed_roots=raw.strings("managed-roots", d.managed_roots),
        state_dir=raw.string("state-dir", d.state_dir),
        socket=raw.string("socket", d.socket),
        workloads_dir=raw.string("workloads-dir", d.workloads_dir),
    )


def quantity(value: object, where: str) -> int:
    """Bytes from an int or a binary-suffixed string ("1Gi")."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        for unit, factor in _UNITS.items():
            if value.endswith(unit) and digits(value[: -len(unit)]):
                return int(value[: -len(unit)]) * factor
        if digits(value):
            return int(value)
    raise ConfigError(where, f"{value!r} is not a quantity", "use bytes or a suffix like 1Gi")


def _reserved(raw: _Table) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    for node, amounts in raw.values.items():
        where = f"{raw.source} [memory.reserved.{node}]"
        if not digits(str(node)) or not isinstance(amounts, Mapping):
            raise ConfigError(where, "must be a NUMA node id mapped to a table of amounts")
        out[int(node)] = {str(r): quantity(v, f"{where} {r}") for r, v in amounts.items()}
    return out


def _classes(raw: _Table) -> tuple[DeviceClass, ...]:
    classes = []
    for name in raw.values:
        sel = raw.table(name)
        sel.only(_DEVICE_KEYS)
        if not set(sel.values) - {"pick"}:
            raise ConfigError(
                sel.where,
                "selects nothing",
                "give vendor, device, class-prefix, driver or addresses",
            )
        where = sel.where
        vendor, device = pci_ids(where, sel.string("vendor", None), sel.string("device", None))
        prefix = sel.string("class-prefix", None)
        classes.append(
            DeviceClass(
                name=str(name),
                vendor=vendor,
                device=device,
                class_prefix=None if prefix is None else hex_id(f"{where} class-prefix", prefix, 6),
                driver=sel.string("driver", None),
                addresses=tuple(pci_address(where, a) for a in sel.strings("addresses", ())),
                pick=sel.choice("pick", Pick.LOCALITY),
            )
        )
    return tuple(classes)
