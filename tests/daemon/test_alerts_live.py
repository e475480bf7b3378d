"""A real Prometheus server scrapes a live numad and answers every query of the dashboard
(dashboards/numad.json) and every expression of the alerting rules
(dashboards/numad-alerts.yml) through its HTTP API.

The server is Debian's ``/usr/bin/prometheus`` (the package ``python -m tests.promtool
--prepare`` installs with its service off), run here as a child of the test on loopback,
with its own config and TSDB under ``tmp_path``, scraping every second; it is killed when
the test ends, whatever happens. numad is the in-process daemon of ``recorded_daemon``
(a recorded 2-socket machine, a scratch cgroup tree), its metrics listener on a free
loopback port, driven until every panel has something to show. Without the server the
test skips, except in CI (``CI`` set).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from numad.daemon.root import Daemon
from numad.host.scratch import scratch_mkdir
from numad.host.systemd_bus import Systemd
from tests import debian
from tests.conftest import Machines, recorded_daemon
from tests.daemon.test_alerts import RULES, alert_rules
from tests.daemon.test_dashboard import DASHBOARD, panels
from tests.host.test_migration import MIB, Pages
from tests.host.test_systemd_bus import FakeSystemd

T = TypeVar("T")
SCRAPE_SECONDS = 1
SCRAPES = 2  # rate() needs two samples in its window
TARGET_SYNC = 5  # seconds: Prometheus hands new targets to its scrape loops on this tick
# A Prometheus that is not answering after this long is broken, not slow: an upper bound
# for the start, which is timed; the waits after it are derived from that time.
START_BOUND = 120.0


@pytest.fixture
def server_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        debian.missing(
            "prometheus is missing (Debian's prometheus; scripts/check installs it as root)",
            "the live Prometheus test",
        )
    return found


@pytest.fixture
def driven(machines: Machines, tmp_path: Path) -> Iterator[tuple[Daemon, str]]:
    """A live numad that has done what every panel shows, and its metrics address."""
    daemon = recorded_daemon(machines, tmp_path / "numad", {"memory": {"policy": "static"}})
    server, _thread = daemon.metrics.serve("127.0.0.1", 0)
    try:
        _drive(daemon, tmp_path)
        yield daemon, f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        daemon.stop()


def _drive(daemon: Daemon, tmp_path: Path) -> None:
    """Admissions exclusive and shared, a rejection, a release, memory moved home and its
    locality measured, a reconcile pass, and a systemd call timed."""
    # A scratch tree has no pages: memory.numa_stat as the kernel would report it, the
    # pages on node 1 until the mems write moves them (tests/host/test_migration.py).
    daemon.migrations.read_anon = Pages(daemon, 64 * MIB, home=1)
    daemon.migrations.emulated = False
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    for name in ("web", "batch"):
        scratch_mkdir(tree, f"numad.slice/{name}")

    def admit(name: str, cpus: int | str, **extra: str) -> bool:
        spec = {"name": name, "cgroup": f"numad.slice/{name}", "cpus": cpus, **extra}
        return daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted

    assert admit("db", 4, memory="1Gi")  # exclusive CPUs and memory on one node
    assert admit("web", "500m")  # the shared pool
    assert not admit("big", 20)  # more CPUs than a node holds: rejected
    assert admit("batch", 2)
    daemon.release("batch")
    assert daemon.migrations.mover.drain(30), "the mover did not finish db's pages"
    daemon.reconcile()  # a pass: drift read back, locality measured
    assert daemon.show("db")["memory"]["locality"] == 1.0
    # numad talks to systemd only on a host (service.build, root None); here its own
    # D-Bus client asks a stand-in for systemd, timed into the histogram as build wires it.
    fake = FakeSystemd(tmp_path / "systemd", {"numad.slice": "/numad.slice"})
    try:
        bus = Systemd.connect(fake.address, timeout=5.0)
        assert bus is not None
        with bus:
            bus.observe = lambda m, s: daemon.metrics.systemd_reply.labels(m).observe(s)
            bus.unit("numad.slice")
    finally:
        fake.close()


@dataclass
class Prometheus:
    address: str  # host:port
    process: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, **params: str) -> Any:
        """The ``data`` of an API answer; an error answer fails the test with its text."""
        query = urllib.parse.urlencode(params)
        url = f"http://{self.address}{path}?{query}"
        try:
            with urllib.request.urlopen(url, timeout=30) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as err:
            body = json.loads(err.read() or b"{}")
        if body.get("status") != "success":
            pytest.fail(f"prometheus {path} {params}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        result = data["result"]
        assert isinstance(result, list), f"{expr}: a {data['resultType']}, not a vector"
        return result

    def ready(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"prometheus exited {self.process.returncode}: {self.log.read_text()}")
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=5) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        assert isinstance(port, int)
        return port


@pytest.fixture
def prometheus(
    server_binary: str, driven: tuple[Daemon, str], tmp_path: Path
) -> Iterator[tuple[Prometheus, float]]:
    """The server, answering, and how long it took to start (the calibration)."""
    config = {  # JSON is YAML
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "numad", "static_configs": [{"targets": [driven[1]]}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))
    log = tmp_path / "prometheus.log"
    port = _free_port()
    argv = [
        server_binary,
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    server = Prometheus(f"127.0.0.1:{port}", process, log)
    try:
        _wait("prometheus to answer /-/ready", server.ready, started + START_BOUND)
        yield server, time.monotonic() - started
    finally:
        process.kill()
        process.wait(timeout=30)


def _wait(what: str, found: Callable[[], T | None], deadline: float) -> T:
    """Poll ``found`` until it gives something, or fail at ``deadline`` (monotonic)."""
    while True:
        value = found()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited for {what}: not there by the deadline")
        time.sleep(0.2)


def substitutions(dashboard: dict[str, Any], server: Prometheus) -> list[dict[str, str]]:
    """Values for every variable the dashboard's queries may use, one dict per view:
    the instance chosen in the picker, and All (its ``allValue``)."""
    seconds = _range_seconds(dashboard["time"]["from"])
    # Grafana's built-ins: $__interval is the range over the ~1000 points of a panel
    # (at least a scrape); $__rate_interval is max($__interval + scrape, 4 x scrape).
    interval = max(SCRAPE_SECONDS, seconds // 1000)
    builtins = {
        "__interval": f"{interval}s",
        "__interval_ms": str(interval * 1000),
        "__rate_interval": f"{max(interval + SCRAPE_SECONDS, 4 * SCRAPE_SECONDS)}s",
        "__range": f"{seconds}s",
        "__range_s": str(seconds),
        "__range_ms": str(seconds * 1000),
    }
    chosen, every = dict(builtins), dict(builtins)
    for variable in dashboard["templating"]["list"]:
        name, kind = variable["name"], variable["type"]
        if kind == "datasource":
            continue  # names the data source; no query may use it
        assert kind == "query", f"variable {name}: type {kind} is not known to this test"
        found = re.fullmatch(r"label_values\((\w+), *(\w+)\)", variable["definition"])
        assert found, f"variable {name}: {variable['definition']} is not known to this test"
        metric, label = found.groups()
        values = server.get(f"/api/v1/label/{label}/values", **{"match[]": metric})
        assert values, f"variable {name}: {variable['definition']} has no value"
        # Grafana escapes each value for a regex (a backslash doubled in PromQL's string).
        escaped = [re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\\\1", value) for value in values]
        chosen[name] = f"({'|'.join(escaped)})"
        every[name] = variable.get("allValue") or chosen[name]
    return [chosen, every]


def _range_seconds(since: str) -> int:
    found = re.fullmatch(r"now-(\d+)([smhd])", since)
    assert found, f"time range from {since} is not known to this test"
    return int(found[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[found[2]]


def substituted(expr: str, values: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        return values.get(match[1] or match[2], match[0])

    done = re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)
    assert "$" not in done, f"{expr}: a variable left unsubstituted in {done}"
    return done


def _scraped(server: Prometheus, rules: int) -> dict[str, float] | None:
    """The figures once every target was scraped SCRAPES times and every rule evaluated."""
    scrapes = server.query(f'count_over_time(up{{job="numad"}}[1m]) >= {SCRAPES}')
    groups = server.get("/api/v1/rules")["groups"]
    evaluated = [r for g in groups for r in g["rules"] if r["health"] != "unknown"]
    if not scrapes or len(evaluated) < rules:
        return None
    samples = server.query('scrape_samples_scraped{job="numad"}')
    return {"scrapes": float(scrapes[0]["value"][1]), "samples": float(samples[0]["value"][1])}


def test_prometheus_evaluates_every_dashboard_query_and_rule(
    prometheus: tuple[Prometheus, float], record_property: Callable[[str, object], None]
) -> None:
    server, start = prometheus
    began = time.monotonic()
    rules = alert_rules()
    # The first scrape waits for the scrape manager's first target sync (a 5 s tick);
    # the rest of the wait scales with this host's pace, as the server's start showed it.
    budget = 3 * (TARGET_SYNC + SCRAPES * SCRAPE_SECONDS) + 20 * start
    figures = _wait(
        f"{SCRAPES} scrapes and {len(rules)} rules evaluated within {budget:.0f} s",
        lambda: _scraped(server, len(rules)),
        began + budget,
    )
    waited = time.monotonic() - began
    (target,) = server.get("/api/v1/targets")["activeTargets"]
    assert target["health"] == "up", target

    loaded = {r["name"]: r for g in server.get("/api/v1/rules")["groups"] for r in g["rules"]}
    assert set(loaded) == {rule["alert"] for rule in rules}
    broken = {name: r.get("lastError") for name, r in loaded.items() if r["health"] != "ok"}
    assert not broken, broken

    dashboard = json.loads(DASHBOARD.read_text())
    views = substitutions(dashboard, server)
    queries = 1  # the instance variable's values
    empty: list[str] = []
    for panel in panels(dashboard):
        for target_ in panel.get("targets", []):
            for values in views:
                queries += 1
                if not server.query(substituted(target_["expr"], values)):
                    empty.append(f"{panel['title']} ({target_['refId']}: {target_['expr']})")
    assert not empty, "panels whose query returns no series:\n" + "\n".join(sorted(set(empty)))
    for rule in rules:
        queries += 1
        # A healthy numad: every rule's expression evaluates, and none has a fault to show.
        assert server.query(rule["expr"]) == [], rule["alert"]
    assert server.query("numad_ready")[0]["value"][1] == "1"

    took = time.monotonic() - began
    line = (
        f"prometheus: started in {start:.1f} s; {figures['scrapes']:.0f} scrapes of"
        f" {figures['samples']:.0f} series; {queries} queries evaluated"
        f" ({len(rules)} rules loaded, health ok); scrapes waited {waited:.1f} s"
        f" (bound {budget:.0f} s), {took:.1f} s in all"
    )
    print(line)
    record_property("prometheus_check", line)
