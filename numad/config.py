"""numad's configuration: one TOML file, strictly validated, production defaults.

Edge module: reads the config file; everything else receives a ``Config``.
Option names follow the kubelet's where they mean the same. Unknown keys are
errors naming the key.

    [topology]
    policy = "best-effort"            # none | best-effort | restricted | single-numa-node
    scope = "container"               # container | pod
    options = { "prefer-closest-numa-nodes" = "true" }

    [cpu]
    reserved-cpus = "0,16"            # an explicit list, or:
    reserved-count = 2                # chosen by the kubelet's allocator (default 1)
    options = { "full-pcpus-only" = true }

    [memory]
    policy = "static"                 # static | none
    reserved = { "0" = { memory = "1Gi" } }

    [devices.gpu]                     # a device class: selectors, or addresses
    vendor = "0x10de"
    class-prefix = "0x0302"

    [paths]
    cgroup-root = "/sys/fs/cgroup"
    managed-roots = ["numad.slice"]
    state-dir = "/var/lib/numad"
    socket = "/run/numad/numad.sock"
    workloads-dir = "/etc/numad/workloads.d"

    [daemon]
    reconcile-seconds = 10            # how often cpusets are read back and repaired

    [metrics]
    listen = "127.0.0.1"
    port = 9477                       # 0: any free port (shown in /v1/health)
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from numad import defaults
from numad.errors import ConfigError
from numad.managers.device import DeviceClass
from numad.policy import Policy
from numad.scope import Scope

DEFAULT_PATH = Path("/etc/numad/numad.toml")
_SECTIONS = {"topology", "cpu", "memory", "devices", "paths", "daemon", "metrics"}
_KEYS = {
    "topology": {"policy", "scope", "options"},
    "cpu": {"reserved-cpus", "reserved-count", "options"},
    "memory": {"policy", "reserved"},
    "paths": {"cgroup-root", "managed-roots", "state-dir", "socket", "workloads-dir"},
    "daemon": {"reconcile-seconds"},
    "metrics": {"listen", "port"},
}
_DEVICE_KEYS = {"vendor", "device", "class-prefix", "driver", "addresses"}
_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


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
    reconcile_seconds: float = 10.0


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
    _only(raw, _SECTIONS, source)
    for section, keys in _KEYS.items():
        _only(_table(raw, section, source), keys, f"{source} [{section}]")
    topology, cpu = _table(raw, "topology", source), _table(raw, "cpu", source)
    memory, paths = _table(raw, "memory", source), _table(raw, "paths", source)
    metrics = _table(raw, "metrics", source)
    reconcile = _table(raw, "daemon", source).get("reconcile-seconds", 10.0)
    if (
        isinstance(reconcile, bool)
        or not isinstance(reconcile, int | float)
        or not (0.1 <= reconcile <= 3600)
    ):
        raise ConfigError(
            f"{source} [daemon]", f"reconcile-seconds = {reconcile!r}: give 0.1 to 3600 seconds"
        )
    try:
        return Config(
            policy=Policy(topology.get("policy", Policy.BEST_EFFORT)),
            scope=Scope(topology.get("scope", Scope.CONTAINER)),
            topology_options={
                str(k): str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in _table(topology, "options", source).items()
            },
            reserved_cpus=cpu.get("reserved-cpus"),
            reserved_count=int(cpu.get("reserved-count", 1)),
            cpu_options={str(k): bool(v) for k, v in _table(cpu, "options", source).items()},
            memory_static=memory.get("policy", "static") == "static",
            memory_reserved=_reserved(_table(memory, "reserved", source), source),
            device_classes=_classes(_table(raw, "devices", source), source),
            paths=_paths(paths),
            metrics_listen=str(metrics.get("listen", "127.0.0.1")),
            metrics_port=int(metrics.get("port", 9477)),
            reconcile_seconds=float(reconcile),
        )
    except (ValueError, TypeError) as err:
        raise ConfigError(source, f"invalid value: {err}") from err


def _paths(raw: Mapping[str, Any]) -> Paths:
    default = Paths()
    return Paths(
        cgroup_root=str(raw.get("cgroup-root", default.cgroup_root)),
        managed_roots=tuple(raw.get("managed-roots", default.managed_roots)),
        state_dir=str(raw.get("state-dir", default.state_dir)),
        socket=str(raw.get("socket", default.socket)),
        workloads_dir=str(raw.get("workloads-dir", default.workloads_dir)),
    )


def _table(raw: Mapping[str, Any], key: str, source: str) -> Mapping[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(source, f"{key} must be a table")
    return value


def _only(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(
            where, f"unknown key {unknown[0]!r}", f"known keys: {', '.join(sorted(allowed))}"
        )


def quantity(value: object, where: str) -> int:
    """Bytes from an int or a binary-suffixed string ("1Gi")."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        for unit, factor in _UNITS.items():
            if value.endswith(unit) and value[: -len(unit)].isdigit():
                return int(value[: -len(unit)]) * factor
        if value.isdigit():
            return int(value)
    raise ConfigError(where, f"{value!r} is not a quantity", "use bytes or a suffix like 1Gi")


def _reserved(raw: Mapping[str, Any], source: str) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    for node, amounts in raw.items():
        where = f"{source} [memory.reserved.{node}]"
        if not str(node).isdigit() or not isinstance(amounts, Mapping):
            raise ConfigError(where, "must be a NUMA node id mapped to a table of amounts")
        out[int(node)] = {str(r): quantity(v, f"{where} {r}") for r, v in amounts.items()}
    return out


def _classes(raw: Mapping[str, Any], source: str) -> tuple[DeviceClass, ...]:
    classes = []
    for name, sel in raw.items():
        where = f"{source} [devices.{name}]"
        if not isinstance(sel, Mapping):
            raise ConfigError(where, "must be a table of selectors")
        _only(sel, _DEVICE_KEYS, where)
        if not sel:
            raise ConfigError(
                where, "selects nothing", "give vendor, device, class-prefix, driver or addresses"
            )
        classes.append(
            DeviceClass(
                name=str(name),
                vendor=sel.get("vendor"),
                device=sel.get("device"),
                class_prefix=sel.get("class-prefix"),
                driver=sel.get("driver"),
                addresses=tuple(str(a).lower() for a in sel.get("addresses", ())),
            )
        )
    return tuple(classes)
