"""``numad demo``: the whole daemon on a bundled recorded 2-socket machine, in one command.

Edge module. Unpacks the recording into a scratch directory, starts
``numad serve --root`` there (a scratch cgroup v2 tree stands in for
/sys/fs/cgroup), creates three workload cgroups the way a service manager
would, admits sample workloads through the API, prints what each got and what
the cgroup files now say, shows an explained rejection, and stops the daemon.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

from numad.cli import textout
from numad.cli.client import APIError, request
from numad.errors import NumadError
from numad.host.scratch import scratch_mkdir
from numad.topology.record import load_fixture

MACHINE = "32intel64-2p8co2t+8ve"
CONFIG = """\
[topology]
policy = "single-numa-node"
[cpu]
reserved-count = 2
[memory]
policy = "none"
[devices.vector-engine]
class-prefix = "0x0b40"
[metrics]
port = 0  # any free port on loopback
"""
SAMPLES: list[dict[str, Any]] = [
    {
        "name": "inference",
        "cgroup": "numad.slice/inference",
        "cpus": 4,
        "devices": {"vector-engine": 2},
    },
    {"name": "batch", "cgroup": "numad.slice/batch", "cpus": 8},
    {"name": "web", "cgroup": "numad.slice/web", "cpus": "500m"},
]
TOO_BIG = {"name": "huge", "cgroup": "numad.slice/huge", "cpus": 20}


def add_demo(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="run the daemon on a bundled 2-socket machine and admit samples",
        description="Run numad serve on a bundled recorded 2-socket machine with a scratch "
        "cgroup tree, admit sample workloads, show a rejection; nothing on the host is touched.",
    )
    demo.set_defaults(command=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    """The demo in a scratch directory, which is removed whatever happens."""
    scratch = Path(tempfile.mkdtemp(prefix="numad-demo-"))
    try:
        return _demo(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _demo(scratch: Path) -> int:
    with resources.as_file(
        resources.files("numad").joinpath("data", f"{MACHINE}.tar.bz2")
    ) as archive:
        root = load_fixture(archive, scratch)
    (scratch / "numad.toml").write_text(CONFIG)
    socket = str(scratch / "numad.sock")
    print(f"numad demo: recorded machine {MACHINE} under {root}")
    server = subprocess.Popen(  # noqa: S603 - our own interpreter running numad
        [
            sys.executable,
            "-m",
            "numad",
            "serve",
            "--root",
            str(root),
            "--config",
            str(scratch / "numad.toml"),
            "--socket",
            socket,
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(scratch / "numad.log", "w"),  # noqa: SIM115 - the child owns it
    )
    try:
        _wait(socket)
        cgroups = root / "sys" / "fs" / "cgroup"
        for sample in [*SAMPLES, TOO_BIG]:
            scratch_mkdir(cgroups, sample["cgroup"])
        for sample in SAMPLES:
            answer = request(socket, "POST", "/v1/workloads", json.dumps(sample))
            why = [f"  {part}" for part in answer["explanation"].split("; ")]
            print("\n" + "\n".join([*textout.admitted(answer), *why]))
        try:
            request(socket, "POST", "/v1/workloads", json.dumps(TOO_BIG))
        except APIError as err:  # the request, what each node has free, and why not
            print("\n" + "\n".join(textout.rejected("huge", err.body["error"])))
        print("\ncpusets as the kernel would show them (cpuset.cpus.effective):")
        for sample in [*SAMPLES, TOO_BIG]:
            effective = (cgroups / sample["cgroup"] / "cpuset.cpus.effective").read_text().strip()
            print(f"  {sample['cgroup']:<24} {effective}")
    except (NumadError, OSError) as err:
        print(f"numad demo: {err}", file=sys.stderr)
        _print_log_tail(scratch / "numad.log")  # the scratch directory goes with the log
        return 1
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return 0


def _print_log_tail(log: Path, lines: int = 20) -> None:
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    if tail:
        print("numad demo: the daemon's last log lines:", *tail, sep="\n  ", file=sys.stderr)


def _wait(socket: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if request(socket, "GET", "/v1/health", timeout=2).get("ready"):
                return
        except NumadError:
            time.sleep(0.1)
    raise NumadError("numad serve", "did not become ready within 30 s")
