"""The daemon's commands: ``serve`` and the clients ``admit``, ``release``, ``list``,
``show``, ``explain``, ``plan``, ``run``.

Edge module, registered by ``numad.cli``. ``serve --root DIR`` runs the whole
daemon on a recorded machine: host files under DIR, and, where DIR has no
cgroup hierarchy, a scratch cgroup v2 tree under DIR/sys/fs/cgroup whose
effective files the scratch backend computes as the kernel would.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from numad import notify
from numad.api.client import request
from numad.api.server import Server, outcome_json
from numad.cgroup import detect_backend, make_scratch_v2
from numad.config import Config, Paths, load
from numad.cpuset import CPUSet, NodeSet
from numad.daemon import Daemon
from numad.errors import ConfigError, NumadError
from numad.hostfs import HostFS
from numad.topology.discover import discover
from numad.watch import debounce, udev_events

RECONCILE_SECONDS = 10.0
_FORMATS = {
    ".json": "application/json",
    ".toml": "application/toml",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
}


def add_commands(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the daemon", description="Run the numad daemon.")
    serve.add_argument("--config", type=Path, help="config file (default /etc/numad/numad.toml)")
    serve.add_argument("--root", metavar="DIR", help="run on the (recorded) machine under DIR")
    serve.add_argument("--socket", help="API socket path")
    serve.set_defaults(command=_serve)

    for name, helptext in (
        ("admit", "admit a workload spec"),
        ("plan", "show what admitting a spec would do"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument(
            "spec", type=Path, help="a workload spec (.toml, .json) or a Pod manifest (.yaml)"
        )
        p.add_argument("--socket", help="API socket path")
        if name == "plan":
            p.add_argument("--root", metavar="DIR", help="plan offline on the machine under DIR")
            p.add_argument("--config", type=Path, help="config file for an offline plan")
            p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(command=_admit if name == "admit" else _plan)
    for name, helptext in (
        ("release", "release a workload"),
        ("show", "show a workload"),
        ("explain", "explain a workload's placement"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("name")
        p.add_argument("--socket", help="API socket path")
        p.set_defaults(command=_by_name, verb=name)
    lst = sub.add_parser("list", help="list admitted workloads")
    lst.add_argument("--socket", help="API socket path")
    lst.set_defaults(command=_list)
    run = sub.add_parser("run", help="admit a transient workload and run a command in it")
    run.add_argument("--cpus", type=int, default=1)
    run.add_argument("--memory", default=None)
    run.add_argument("--device", action="append", default=[], metavar="CLASS=N")
    run.add_argument("--socket", help="API socket path")
    run.add_argument("--name", help="the workload's name (default run-PID)")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    run.set_defaults(command=_run)


def _socket(args: argparse.Namespace) -> str:
    return str(getattr(args, "socket", None) or Config().paths.socket)


# -- serve ----------------------------------------------------------------------------------


def build(config: Config, root: str | None) -> Daemon:
    """The daemon for the host (root None) or for the recorded machine under ``root``."""
    log = structlog.get_logger("numad")
    if root is None:
        fs = HostFS("/")
        cgroups = detect_backend(Path(config.paths.cgroup_root), config.paths.managed_roots)
        return Daemon(config, fs, cgroups, Path(config.paths.state_dir), log)
    base = Path(root).resolve()
    fs = HostFS(base)
    cgroup_root = base / config.paths.cgroup_root.lstrip("/")
    if not (cgroup_root / "cgroup.controllers").exists():
        topo = discover(fs)
        make_scratch_v2(
            cgroup_root, topo.online_cpus, NodeSet(n.id for n in topo.nodes if n.memory_total_kb)
        )
    cgroups = detect_backend(cgroup_root, config.paths.managed_roots)
    paths = replace(
        config.paths,
        state_dir=str(base / config.paths.state_dir.lstrip("/")),
        socket=str(base / config.paths.socket.lstrip("/")),
        workloads_dir=str(base / config.paths.workloads_dir.lstrip("/")),
    )
    return Daemon(replace(config, paths=paths), fs, cgroups, Path(paths.state_dir), log)


def _serve(args: argparse.Namespace) -> int:
    config = load(args.config)
    daemon = build(config, args.root)
    daemon.start()  # ends with the first reconcile pass
    metrics_server, _ = daemon.metrics.serve(config.metrics_listen, config.metrics_port)
    daemon.metrics_address = f"{config.metrics_listen}:{metrics_server.server_port}"
    daemon.log.info("metrics_listening", address=daemon.metrics_address)
    server = Server(args.socket or daemon.config.paths.socket, daemon)
    stop = threading.Event()

    def shutdown(_sig: int, _frame: object) -> None:
        notify.stopping()
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    def reload(_sig: int, _frame: object) -> None:
        # Re-read the workloads directory; the config's host settings (policy,
        # reserved CPUs) shape every decision made so far and need a restart.
        notify.reloading()
        threading.Thread(target=_reload, args=(daemon,), daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    signal.signal(signal.SIGHUP, reload)
    threading.Thread(target=_reconcile_loop, args=(daemon, stop), daemon=True).start()
    if args.root is None:  # a recorded machine has no kernel to send uevents
        threading.Thread(target=_hotplug_loop, args=(daemon, stop), daemon=True).start()
    interval = notify.watchdog_interval()
    if interval:
        threading.Thread(target=_watchdog_loop, args=(stop, interval), daemon=True).start()
    daemon.log.info("api_listening", socket=server.server_address)
    notify.ready(f"{len(daemon.specs)} workloads; API on {server.server_address}")
    server.serve_forever(poll_interval=0.5)
    server.server_close()
    metrics_server.shutdown()
    daemon.log.info("daemon_stopped")
    return 0


def _reload(daemon: Daemon) -> None:
    daemon.reload_workloads()
    notify.ready(f"{len(daemon.specs)} workloads; reloaded")


def _reconcile_loop(daemon: Daemon, stop: threading.Event) -> None:
    while not stop.wait(RECONCILE_SECONDS):
        daemon.reconcile()
        notify.status(f"{len(daemon.specs)} workloads; last reconcile {time.strftime('%H:%M:%S')}")


def _hotplug_loop(daemon: Daemon, stop: threading.Event) -> None:
    try:
        debounce(udev_events(), lambda _burst: daemon.rediscover(), stop=stop)
    except (OSError, ImportError, NumadError) as err:  # no netlink access: run without hotplug
        daemon.log.warning("hotplug_unavailable", problem=str(err))


def _watchdog_loop(stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        notify.watchdog()


# -- clients ------------------------------------------------------------------------------------


def _read_spec(path: Path) -> tuple[str, str]:
    kind = _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(str(path), "unknown spec format", "use .toml, .json or .yaml")
    return path.read_text(encoding="utf-8"), kind


def _print(data: dict[str, Any]) -> None:
    print(json.dumps(data, indent=2))


def _admit(args: argparse.Namespace) -> int:
    text, kind = _read_spec(args.spec)
    _print(request(_socket(args), "POST", "/v1/workloads", text, content_type=kind))
    return 0


def _plan(args: argparse.Namespace) -> int:
    text, kind = _read_spec(args.spec)
    if args.root is None and args.config is None and os.path.exists(_socket(args)):
        result = request(_socket(args), "POST", "/v1/plan", text, content_type=kind)
    else:
        with tempfile.TemporaryDirectory(prefix="numad-plan-") as scratch:
            # An offline plan reads the machine and writes nothing: no cgroups,
            # and its (empty) checkpoint goes to a scratch directory.
            config = load(args.config)
            fs = HostFS(Path(args.root).resolve() if args.root else "/")
            daemon = Daemon(config, fs, _NoCgroups(), Path(scratch), structlog.get_logger("numad"))
            daemon.start()
            result = outcome_json(daemon.plan(daemon.parse(text, kind.split("/")[1])))
    if args.json:
        _print(result)
    else:
        print(result["explanation"] or result["detail"])
        for name, c in result["containers"].items():
            cpus, mems = c["cpus"] or "(shared pool)", c["mems"] or "(any)"
            print(f"  {name}: cpus {cpus} mems {mems} devices {c['devices']}")
    return 0 if result["admitted"] else 3


class _NoCgroups:
    """An offline plan writes nothing."""

    def exists(self, path: str) -> bool:
        return False

    def ensure(self, path: str) -> None:
        return None

    def write(self, path: str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        return None

    def read(self, path: str) -> tuple[CPUSet, NodeSet]:
        return CPUSet(), NodeSet()

    def read_effective(self, path: str) -> tuple[CPUSet, NodeSet]:
        return CPUSet(), NodeSet()


def _by_name(args: argparse.Namespace) -> int:
    if args.verb == "release":
        _print(request(_socket(args), "DELETE", f"/v1/workloads/{args.name}"))
    elif args.verb == "explain":
        _print(request(_socket(args), "GET", f"/v1/workloads/{args.name}/explain"))
    else:
        _print(request(_socket(args), "GET", f"/v1/workloads/{args.name}"))
    return 0


def _list(args: argparse.Namespace) -> int:
    _print(request(_socket(args), "GET", "/v1/workloads"))
    return 0


def _run(args: argparse.Namespace) -> int:
    cmd = [c for c in args.cmd if c != "--"]
    if not cmd:
        raise SystemExit("numad run: give a command after --")
    name = args.name or f"run-{os.getpid()}"
    spec: dict[str, Any] = {
        "name": name,
        "cgroup": f"{Paths().managed_roots[0]}/{name}",
        "cpus": args.cpus,
    }
    if args.memory:
        spec["memory"] = args.memory
    if args.device:
        spec["devices"] = {k: int(v) for k, v in (d.split("=", 1) for d in args.device)}
    # Join the cgroup first, so that the daemon applies the cpuset at admission.
    health = request(_socket(args), "GET", "/v1/health")
    procs = (
        Path(health.get("cgroup_root") or Config().paths.cgroup_root)
        / spec["cgroup"]
        / "cgroup.procs"
    )
    if not procs.parent.is_dir():
        procs.parent.mkdir(parents=True)
    procs.write_text(f"{os.getpid()}\n")
    admitted = request(_socket(args), "POST", "/v1/workloads", json.dumps(spec))
    placed = admitted["containers"]["main"]
    print(f"numad: {name}: cpus {placed['cpus'] or 'shared'}; exec {cmd[0]}", file=sys.stderr)
    sys.stderr.flush()
    os.execvp(cmd[0], cmd)  # noqa: S606 - `numad run` replaces itself with the user's command
    return 0  # not reached
