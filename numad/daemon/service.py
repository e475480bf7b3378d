"""The daemon's side of the commands: ``numad serve`` and the offline ``numad plan``.

Edge module, imported by ``numad.cli.commands`` only when one of those runs, so that
the clients stay light. ``serve --root DIR`` runs the whole daemon on a recorded
machine: host files under DIR, and, where DIR has no cgroup hierarchy, a scratch
cgroup v2 tree under DIR/sys/fs/cgroup whose effective files the scratch backend
computes as the kernel would.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import structlog

from numad.cpuset import CPUSet, NodeSet
from numad.daemon import notify
from numad.daemon.answers import outcome_json
from numad.daemon.api import Server
from numad.daemon.config import Config, check_reserved, load
from numad.daemon.instance import acquire_host
from numad.daemon.livepage import LivePage
from numad.daemon.loops import (
    cgroup_loop,
    hotplug_loop,
    periods,
    reconcile_loop,
    unit_loop,
    watchdog_loop,
)
from numad.daemon.metrics import MetricsServer, start_serving
from numad.daemon.restore import choose_reserved
from numad.daemon.root import Daemon
from numad.daemon.watch import udev_events
from numad.errors import NumadError
from numad.host.cgroup import detect_backend
from numad.host.cgroup.events import CgroupEvents
from numad.host.scratch import make_scratch_v2
from numad.host.systemd_bus import Systemd
from numad.hostfs import HostFS
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology
from numad.topology.discover import discover
from numad.topology.model import Topology


def build(config: Config, root: str | None) -> Daemon:
    """The daemon for the host (root None) or for the recorded machine under ``root``."""
    log = structlog.get_logger("numad")
    if root is None:
        fs = HostFS("/")
        cgroups = detect_backend(Path(config.paths.cgroup_root), config.paths.managed_roots)
        # systemd's units are isolated and placed through systemd; without it, through
        # cgroupfs (and a spec cannot name a unit).
        systemd = Systemd.connect()
        log.info("isolation", isolate=config.isolate, systemd=systemd is not None)
        state_dir = Path(config.paths.state_dir)
        daemon = Daemon(config, fs, cgroups, state_dir, log, systemd=systemd)
        if systemd is not None:  # how fast systemd answers, scraped
            systemd.observe = lambda m, s: daemon.metrics.systemd_reply.labels(m).observe(s)
        return _scraped(daemon)
    base = Path(root).resolve()
    fs = HostFS(base)
    cgroup_root = base / config.paths.cgroup_root.lstrip("/")
    if not (cgroup_root / "cgroup.controllers").exists():
        topo = discover(fs)
        make_scratch_v2(
            cgroup_root,
            topo.online_cpus,
            NodeSet(n.id for n in topo.nodes if n.memory_total_kb),
            partitions=config.partitions is True,  # a kernel that offers them, if asked for
        )
    cgroups = detect_backend(cgroup_root, config.paths.managed_roots)
    paths = replace(
        config.paths,
        state_dir=str(base / config.paths.state_dir.lstrip("/")),
        socket=str(base / config.paths.socket.lstrip("/")),
        workloads_dir=str(base / config.paths.workloads_dir.lstrip("/")),
    )
    return _scraped(Daemon(replace(config, paths=paths), fs, cgroups, Path(paths.state_dir), log))


def _scraped(daemon: Daemon) -> Daemon:
    """``daemon`` with its readiness exported as numad_ready, read at each scrape."""
    daemon.metrics.ready.set_function(lambda: daemon.ready)
    return daemon


def serve(args: argparse.Namespace) -> int:
    """``numad serve``: run until SIGTERM. Every listener is bound before numad touches
    the host (a port in use fails the start with the host as found), and whatever
    ends the run gives back what numad changed."""
    config = load(args.config)
    daemon = build(config, args.root)
    # Before the socket is touched: one numad per host, whatever its state directory.
    cgroup_root = getattr(daemon.cgroups, "root", None)
    lock = acquire_host(daemon.state_dir, None if cgroup_root is None else Path(cgroup_root))
    address = f"{config.metrics_listen}:{config.metrics_port}"
    page = LivePage(daemon, enabled=config.metrics_page)
    try:
        metrics_server = daemon.metrics.listen(
            config.metrics_listen, config.metrics_port, page=page.answer
        )
    except OSError as err:
        lock.release()
        hint = "stop what listens there, or set [metrics] port (0: any free port)"
        raise NumadError(address, f"cannot listen for metrics: {err.strerror}", hint) from err
    try:
        server = Server(args.socket or daemon.config.paths.socket, daemon)
    except BaseException:
        metrics_server.server_close()
        lock.release()
        raise
    try:
        _run(args, daemon, metrics_server, server)
    finally:
        server.server_close()
        metrics_server.server_close()
        daemon.stop()  # the cgroups numad isolated get every CPU back
        lock.release()
    daemon.log.info("daemon_stopped")
    return 0


def _run(
    args: argparse.Namespace, daemon: Daemon, metrics_server: MetricsServer, server: Server
) -> None:
    """Start on the bound listeners, serve until SIGTERM, stop answering."""
    daemon.start()  # ends with the first reconcile pass
    supervisor = daemon.supervisor
    start_serving(metrics_server)
    daemon.metrics_address = f"{daemon.config.metrics_listen}:{metrics_server.server_port}"
    daemon.log.info("metrics_listening", address=daemon.metrics_address)
    stop = threading.Event()

    def shutdown(_sig: int, _frame: object) -> None:
        notify.stopping()
        stop.set()
        daemon.interrupt()
        threading.Thread(target=server.shutdown, daemon=True).start()

    def reload(_sig: int, _frame: object) -> None:
        # Re-read the workloads directory; the config's host settings (policy,
        # reserved CPUs) shape every decision made so far and need a restart.
        notify.reloading()
        threading.Thread(target=_reload, args=(daemon,), daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    signal.signal(signal.SIGHUP, reload)
    watchdog = notify.watchdog_interval()
    period, stale_after = periods(daemon.config.reconcile_seconds, watchdog)
    wake = threading.Event()  # a pass now, not at the period's end
    loops: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
        (reconcile_loop, (supervisor, daemon.reconcile, stop, period, wake)),
        (unit_loop, (supervisor, daemon.isolation, wake, stop)),
    ]
    cgroup_root = getattr(daemon.cgroups, "root", None)
    if cgroup_root is not None:
        watch = partial(CgroupEvents, Path(cgroup_root), list(daemon.config.paths.managed_roots))
        loops.append(
            (cgroup_loop, (supervisor, watch, daemon.isolate_new, stop, wake, daemon.commits))
        )
    if args.root is None:  # a recorded machine has no kernel to send uevents
        loops.append((hotplug_loop, (supervisor, udev_events, daemon.rediscover, stop)))
    if watchdog:
        loops.append((watchdog_loop, (supervisor, stop, watchdog, stale_after)))
    for target, loop_args in loops:
        threading.Thread(target=target, args=loop_args, daemon=True).start()
    daemon.log.info("api_listening", socket=server.server_address)
    notify.ready(f"{len(daemon.specs)} workloads; API on {server.server_address}")
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        stop.set()  # the loops end: nothing writes while numad gives back
        metrics_server.shutdown()


def _reload(daemon: Daemon) -> None:
    """SIGHUP's work, supervised like a loop: a fault is logged, counted and shown."""
    daemon.supervisor.run_once("reload", daemon.reload_workloads)
    notify.ready(f"{len(daemon.specs)} workloads; reloaded")


class _NoCgroups:
    """An offline plan writes nothing."""

    def exists(self, path: str) -> bool:
        return False

    def identity(self, path: str) -> int | None:
        return None

    def ensure(self, path: str) -> None:
        return None

    def write(self, path: str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        return None

    def read(self, path: str, *, mems: bool = True) -> tuple[CPUSet, NodeSet]:
        return CPUSet(), NodeSet()

    def restore_cpus(self, cpus: CPUSet) -> None:
        return None

    def descendants(self, path: str, beat: Callable[[], object] | None = None) -> list[str]:
        return []

    def processes(self, path: str) -> list[int]:
        return []

    def read_effective(self, path: str) -> tuple[CPUSet, NodeSet]:
        return CPUSet(), NodeSet()


def reserved_offline(config_path: Path | None, topo: Topology) -> CPUSet:
    """The reserved CPUs numad would choose on a fresh start on ``topo`` with the config
    at ``config_path``: what the picture of a machine without a daemon shows."""
    config = load(config_path)
    check_reserved(config, CPUSet(c.id for c in topo.all_cpus), len(topo.online_cpus))
    policy = StaticPolicy(CPUTopology.from_topology(topo), StaticOptions.parse(config.cpu_options))
    return CPUSet.from_bits(choose_reserved(config, policy, None)[0])


def nrt_offline(config_path: Path | None, root: str | None) -> dict[str, Any]:
    """This machine (the one under ``root``) as a NodeResourceTopology object, with
    nothing held: what numad would publish on a fresh start. Writes nothing."""
    with tempfile.TemporaryDirectory(prefix="numad-nrt-") as scratch:
        config = load(config_path)
        fs = HostFS(Path(root).resolve() if root else "/")
        daemon = Daemon(config, fs, _NoCgroups(), Path(scratch), structlog.get_logger("numad"))
        daemon.start()
        return daemon.nrt()


def plan_offline(
    config_path: Path | None, root: str | None, text: str, kind: str
) -> dict[str, Any]:
    """What admitting ``text`` would do on the machine under ``root`` (or this host),
    without a daemon: reads the machine and writes nothing (no cgroups; the empty
    checkpoint goes to a scratch directory)."""
    with tempfile.TemporaryDirectory(prefix="numad-plan-") as scratch:
        config = load(config_path)
        fs = HostFS(Path(root).resolve() if root else "/")
        daemon = Daemon(config, fs, _NoCgroups(), Path(scratch), structlog.get_logger("numad"))
        daemon.start()
        spec = daemon.parse(text, kind.split("/")[1])
        return {**outcome_json(daemon.plan(spec)), "notes": spec.notes()}
