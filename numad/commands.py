"""The daemon's commands: ``serve`` and the clients ``admit``, ``release``, ``list``,
``show``, ``explain``, ``plan``, ``run``.

Edge module, registered by ``numad.cli``. ``serve --root DIR`` runs the whole
daemon on a recorded machine: host files under DIR, and, where DIR has no
cgroup hierarchy, a scratch cgroup v2 tree under DIR/sys/fs/cgroup whose
effective files the scratch backend computes as the kernel would.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from numad import defaults
from numad.api.client import request
from numad.errors import ConfigError
from numad.picture.remote import from_daemon as picture_of_daemon
from numad.picture.remote import write as write_picture

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
        if name == "show":
            p.add_argument(
                "--svg",
                metavar="FILE",
                type=Path,
                help="also write a picture (SVG) of the machine and who holds each CPU to FILE",
            )
        p.set_defaults(command=_by_name, verb=name)
    lst = sub.add_parser("list", help="list admitted workloads")
    lst.add_argument("--socket", help="API socket path")
    lst.set_defaults(command=_list)
    host = sub.add_parser(
        "host", help="show host isolation: isolated cgroups and what cannot be moved"
    )
    host.add_argument("--socket", help="API socket path")
    host.set_defaults(command=_host)
    run = sub.add_parser("run", help="admit a transient workload and run a command in it")
    run.add_argument("--cpus", type=int, default=1)
    run.add_argument("--memory", default=None)
    run.add_argument("--device", action="append", default=[], metavar="CLASS=N")
    run.add_argument("--socket", help="API socket path")
    run.add_argument("--name", help="the workload's name (default run-PID)")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    run.set_defaults(command=_run)


def _socket(args: argparse.Namespace) -> str:
    return str(getattr(args, "socket", None) or defaults.SOCKET)


# -- clients ------------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    # The daemon's side is imported only by serve and an offline plan: a client
    # (admit, list, release...) starts without numpy, the managers or the server.
    from numad.service import serve  # noqa: PLC0415

    return serve(args)


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
        from numad.service import plan_offline  # noqa: PLC0415 - as in _serve

        result = plan_offline(args.config, args.root, text, kind)
    if args.json:
        _print(result)
    else:
        print(result["explanation"] or result["detail"])
        for name, c in result["containers"].items():
            cpus, mems = c["cpus"] or "(shared pool)", c["mems"] or "(any)"
            print(f"  {name}: cpus {cpus} mems {mems} devices {c['devices']}")
    return 0 if result["admitted"] else 3


def _by_name(args: argparse.Namespace) -> int:
    if args.verb == "release":
        _print(request(_socket(args), "DELETE", f"/v1/workloads/{args.name}"))
    elif args.verb == "explain":
        _print(request(_socket(args), "GET", f"/v1/workloads/{args.name}/explain"))
    else:
        _print(request(_socket(args), "GET", f"/v1/workloads/{args.name}"))
    if getattr(args, "svg", None) is not None:  # after the show: an unknown name fails first
        write_picture(args.svg, picture_of_daemon(_socket(args), f"numad: {args.name}"))
    return 0


def _host(args: argparse.Namespace) -> int:
    _print(request(_socket(args), "GET", "/v1/host"))
    return 0


def _list(args: argparse.Namespace) -> int:
    _print(request(_socket(args), "GET", "/v1/workloads"))
    return 0


def _run(args: argparse.Namespace) -> int:
    """Admit a transient workload, run the command in its cgroup, release it when the
    command exits (also when it fails), and exit with the command's status."""
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd  # an inner "--" is the command's
    if not cmd:
        raise SystemExit("numad run: give a command after --")
    name = args.name or f"run-{os.getpid()}"
    spec: dict[str, Any] = {
        "name": name,
        "cgroup": f"{defaults.MANAGED_ROOT}/{name}",
        "cpus": args.cpus,
    }
    if args.memory:
        spec["memory"] = args.memory
    if args.device:
        spec["devices"] = {k: int(v) for k, v in (d.split("=", 1) for d in args.device)}
    health = request(_socket(args), "GET", "/v1/health")
    cgroup = Path(health.get("cgroup_root") or defaults.CGROUP_ROOT) / spec["cgroup"]
    made = not cgroup.is_dir()
    if made:  # as a service manager would; removed again when the command is done
        cgroup.mkdir(parents=True)
    try:
        admitted = request(_socket(args), "POST", "/v1/workloads", json.dumps(spec))
    except BaseException:
        _remove(cgroup, made)
        raise
    placed = admitted["containers"]["main"]
    print(f"numad: {name}: cpus {placed['cpus'] or 'shared'}; running {cmd[0]}", file=sys.stderr)
    sys.stderr.flush()
    try:
        status = _child(cgroup, cmd)
    finally:
        request(_socket(args), "DELETE", f"/v1/workloads/{name}")
        _remove(cgroup, made)
        print(f"numad: {name}: released", file=sys.stderr)
    return status


def _child(cgroup: Path, cmd: list[str]) -> int:
    """Run ``cmd`` in ``cgroup`` (it joins before exec); its exit status, 128+N for a
    signal N. SIGINT, SIGTERM and SIGHUP are passed on to it."""
    pid = os.fork()
    if pid == 0:
        try:
            (cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")
            os.execvp(cmd[0], cmd)  # noqa: S606 - the user's command
        except OSError as err:
            print(f"numad: {cmd[0]}: {err.strerror}", file=sys.stderr)
        os._exit(127)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, _frame: os.kill(pid, n))
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _remove(cgroup: Path, made: bool) -> None:
    if made:
        with contextlib.suppress(OSError):  # still in use, or a scratch tree's files
            cgroup.rmdir()
