"""The daemon's commands: ``serve`` and the clients ``admit``, ``release``, ``resize``,
``list``, ``show``, ``explain``, ``plan``, ``host``, ``run``.

Edge module, registered by ``numad.cli.main``. Each client prints text for people
(``numad.cli.textout``) and, with ``--json``, the daemon's answer exactly. ``serve
--root DIR`` runs the whole daemon on a recorded machine (``numad.daemon.service``); its
clients then talk to DIR/run/numad/numad.sock.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from numad import defaults
from numad.cli import textout
from numad.cli.client import APIError, request
from numad.cli.pictures import from_daemon as picture_of_daemon
from numad.cli.pictures import write as write_picture
from numad.cli.run import REJECTED, WORKLOAD_NAME, run_command, spec_of, workload_path
from numad.cpuset import digits
from numad.errors import ConfigError, HostFileError, NumadError, SpecError
from numad.log import configure as configure_logging
from numad.workload.quantity import quantity

_FORMATS = {
    ".json": "application/json",
    ".toml": "application/toml",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
}
SOCKET_HELP = (
    f"the daemon's API socket (default {defaults.SOCKET}; "
    f"for serve --root DIR: DIR{defaults.SOCKET})"
)


def add_commands(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the daemon", description="Run the numad daemon.")
    serve.add_argument(
        "--config", type=Path, help="config file (default /etc/numad/numad.toml, if present)"
    )
    serve.add_argument(
        "--root", metavar="DIR", help="run on the (recorded) machine under DIR, scratch cgroups"
    )
    serve.add_argument(
        "--socket",
        metavar="PATH",
        help=f"the API socket to listen on (default: [paths] socket, {defaults.SOCKET})",
    )
    serve.set_defaults(command=_serve)

    admit = _client(sub, "admit", "admit a workload: a spec file, or a systemd unit by name")
    admit.add_argument(
        "spec",
        nargs="?",
        type=Path,
        metavar="SPEC",
        help="a workload spec (.toml, .json) or a Pod manifest (.yaml); or, instead, --unit",
    )
    admit.add_argument("--unit", help="admit this systemd unit (e.g. db.service) with the options")
    _request_options(admit, cpus_default=None, name_default="from the unit's name")
    admit.set_defaults(command=_admit)

    plan = _client(sub, "plan", "show what admitting a spec would do (admits nothing)")
    plan.add_argument(
        "spec", type=Path, metavar="SPEC", help="a workload spec (.toml, .json) or a Pod manifest"
    )
    plan.add_argument(
        "--root", metavar="DIR", help="plan offline on the (recorded) machine under DIR"
    )
    plan.add_argument("--config", type=Path, help="config file for an offline plan")
    plan.add_argument(
        "--offline",
        action="store_true",
        help="plan without the daemon, on this host (or --root) with its config (or --config)",
    )
    plan.set_defaults(command=_plan)

    release = _client(sub, "release", "release a workload: its CPUs, memory and devices")
    release.add_argument(
        "name", nargs="?", type=_workload, metavar="NAME", help="the workload (or --unit)"
    )
    release.add_argument("--unit", help="release the workload of this systemd unit")
    release.set_defaults(command=_release)
    for name, helptext, command in (
        ("show", "show a workload: each container's CPUs, memory nodes, devices", _show),
        ("explain", "explain why a workload was placed where it is", _explain),
    ):
        p = _client(sub, name, helptext)
        p.add_argument("name", type=_workload, metavar="NAME", help="the workload")
        if name == "show":
            p.add_argument(
                "--svg",
                metavar="FILE",
                type=Path,
                help="also write a picture (SVG) of the machine and who holds each CPU to FILE",
            )
        p.set_defaults(command=command)
    resize = _client(sub, "resize", "resize a workload's container in place: CPUs, memory")
    resize.description = (
        "Resize a workload's container in place. Growing keeps every CPU it holds and adds"
        " the free ones nearest them (same core, same L3 group, same NUMA node, then, under"
        " best-effort or none, other nodes); shrinking keeps a compact subset. Memory stays"
        " on its nodes. All or nothing: refused (exit status 3), nothing changes."
    )
    resize.add_argument("name", type=_workload, metavar="NAME", help="the workload")
    resize.add_argument(
        "--cpus", type=_count, metavar="N", help="exclusive CPUs it holds after the resize"
    )
    resize.add_argument("--memory", type=_memory, metavar="SIZE", help="its memory, like 4Gi")
    resize.add_argument(
        "--container", metavar="C", help="the container (default: its only app container)"
    )
    resize.set_defaults(command=_resize)
    _client(sub, "list", "list admitted workloads").set_defaults(command=_list)
    host = _client(sub, "host", "show host isolation: isolated cgroups, what cannot be moved")
    host.set_defaults(command=_host)

    run = sub.add_parser(
        "run",
        help="run a command in a transient workload, released when it exits",
        description="Admit a transient workload, run CMD in its cgroup, release it when "
        "CMD exits (or numad run is interrupted); exit with CMD's status.",
        usage="numad run [-h] [--cpus N] [--memory SIZE] [--device CLASS=N]\n"
        "                 [--policy POLICY] [--name NAME] [--movable] [--socket PATH]\n"
        "                 -- CMD [ARG ...]",
    )
    _request_options(run, cpus_default=1, name_default="run-PID")
    run.add_argument("--socket", metavar="PATH", help=SOCKET_HELP)
    run.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command, after --, as given"
    )
    run.set_defaults(command=run_command)


def _client(sub: Any, name: str, helptext: str) -> argparse.ArgumentParser:
    described = helptext[0].upper() + helptext[1:] + "."
    p: argparse.ArgumentParser = sub.add_parser(name, help=helptext, description=described)
    p.add_argument("--socket", metavar="PATH", help=SOCKET_HELP)
    p.add_argument("--json", action="store_true", help="print the daemon's answer as JSON")
    return p


def _request_options(
    p: argparse.ArgumentParser, cpus_default: int | None, name_default: str
) -> None:
    p.add_argument(
        "--cpus",
        type=_cpus,
        default=cpus_default,
        metavar="N",
        help="N exclusive CPUs, or a share of the pool like 500m"
        + (f" (default {cpus_default})" if cpus_default else ""),
    )
    p.add_argument("--memory", type=_memory, metavar="SIZE", help="memory, like 4Gi")
    p.add_argument(
        "--device",
        type=_device,
        action="append",
        default=[],
        metavar="CLASS=N",
        help="N devices of a class from the config (repeatable)",
    )
    p.add_argument(
        "--policy",
        help="the topology policy for this workload: none, best-effort, restricted or "
        "single-numa-node (default: the host's)",
    )
    p.add_argument("--name", help=f"the workload's name (default: {name_default})")
    p.add_argument(
        "--movable",
        action="store_true",
        help="numad may move its exclusive CPUs and memory to other CPUs or nodes that meet"
        " its policy, to admit another workload (re-placement is not built yet)",
    )


def _cpus(text: str) -> int | str:
    if digits(text) and int(text) > 0:
        return int(text)
    if text.endswith("m") and digits(text[:-1]) and int(text[:-1]) > 0:
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a CPU count; give N exclusive CPUs (4) or a share like 500m"
    )


def _count(text: str) -> int:
    if digits(text):
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not a CPU count; give a whole number")


def _memory(text: str) -> str:
    size = quantity(text)
    if size is None or size <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; give bytes, or 512Mi, 4Gi")
    return text


def _workload(text: str) -> str:
    if not WORKLOAD_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a workload name ({WORKLOAD_NAME.pattern})"
        )
    return text


def _device(text: str) -> tuple[str, int]:
    name, sep, count = text.partition("=")
    if not (sep and name and digits(count) and int(count) > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: give CLASS=N, a device class and a count")
    return name, int(count)


def _socket(args: argparse.Namespace) -> str:
    return str(getattr(args, "socket", None) or defaults.SOCKET)


def _say(args: argparse.Namespace, answer: Any, lines: Sequence[str]) -> None:
    """The daemon's answer as JSON with --json, else the text lines."""
    if getattr(args, "json", False):
        print(json.dumps(answer, indent=2))
    else:
        print("\n".join(lines))


# -- serve, admit, plan -------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    # The daemon's side is imported only by serve and an offline plan: a client
    # (admit, list, release...) starts without numpy, the managers or the server.
    from numad.daemon.service import serve  # noqa: PLC0415

    _check_root(args.root)
    return serve(args)


def _read_spec(path: Path) -> tuple[str, str]:
    kind = _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(str(path), "unknown spec format", "use .toml, .json or .yaml")
    try:
        return path.read_text(encoding="utf-8"), kind
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), "not UTF-8 text") from err
    except OSError as err:
        raise HostFileError(str(path), f"cannot read: {err.strerror or err}") from err


def _admit(args: argparse.Namespace) -> int:
    if (args.spec is None) == (args.unit is None):
        args.usage_error("give a SPEC file or --unit UNIT (one of them)")
    if args.spec is not None:
        options = ("cpus", "memory", "device", "policy", "name", "movable")
        given = [o for o in options if getattr(args, o)]
        if given:
            args.usage_error(f"--{given[0]} goes with --unit; a spec file says it itself")
        text, kind = _read_spec(args.spec)
        subject = args.spec.name
    else:
        if args.cpus is None:
            args.usage_error("--unit needs --cpus")
        text, kind = json.dumps(spec_of(args, unit=args.unit)), "application/json"
        subject = args.name or args.unit
    try:
        with _named(args.spec):
            answer = request(_socket(args), "POST", "/v1/workloads", text, content_type=kind)
    except APIError as err:
        if err.status != 409 or err.body.get("error", {}).get("code") == "conflict":
            raise  # not a rejection: a name already admitted, an invalid spec, ...
        error = err.body.get("error", {})
        _say(args, err.body, textout.rejected(_rejected_name(error, subject), error))
        return REJECTED
    _say(args, answer, textout.admitted(answer))
    return 0


@contextlib.contextmanager
def _named(path: Path | None) -> Iterator[None]:
    """An error in a spec file names the file (the daemon, given text, says "spec")."""
    try:
        yield
    except NumadError as err:
        text = err.problem if isinstance(err, APIError) else str(err)
        if path is None or not text.startswith("spec: "):
            raise
        raise SpecError(str(path), text.removeprefix("spec: ")) from err


def _check_root(root: str | None) -> None:
    if root is not None and not os.path.isdir(root):
        raise HostFileError(root, "is not a directory", "give the root of a (recorded) tree")


def _rejected_name(error: dict[str, Any], fallback: str) -> str:
    """The workload a 409 rejection names (its message starts ``NAME: rejected``)."""
    head = str(error.get("message", "")).split(": rejected", 1)
    return head[0] if len(head) == 2 else fallback


def _plan(args: argparse.Namespace) -> int:
    text, kind = _read_spec(args.spec)
    offline = args.offline or args.root is not None or args.config is not None
    if offline and args.socket is not None:
        args.usage_error("--socket asks a daemon: leave it out to plan offline")
    if not offline and args.socket is None and not os.path.exists(_socket(args)):
        offline = True  # said on stderr: the answer is not the daemon's
        print(
            f"numad: no daemon at {_socket(args)}: planning offline for this host", file=sys.stderr
        )
    if not offline:  # a --socket given must answer: its error names it
        with _named(args.spec):
            result = request(_socket(args), "POST", "/v1/plan", text, content_type=kind)
    else:
        _check_root(args.root)
        configure_logging(quiet=True)  # an offline start logs; the plan is the answer
        from numad.daemon.service import plan_offline  # noqa: PLC0415 - as in _serve

        with _named(args.spec):
            result = plan_offline(args.config, args.root, text, kind)
    _say(args, result, textout.plan(args.spec.name, result))
    return 0 if result["admitted"] else REJECTED


# -- release, show, explain, list, host ---------------------------------------------------------


def _release(args: argparse.Namespace) -> int:
    if (args.name is None) == (args.unit is None):
        args.usage_error("give a NAME or --unit UNIT (one of them)")
    name = args.name if args.unit is None else _of_unit(_socket(args), args.unit)
    answer = request(_socket(args), "DELETE", workload_path(name))
    _say(args, answer, [f"{name}: released"])
    return 0


def _of_unit(socket: str, unit: str) -> str:
    """The workload that holds ``unit``."""
    for w in request(socket, "GET", "/v1/workloads").get("workloads", []):
        if w.get("unit") == unit:
            return str(w["name"])
    raise NumadError(unit, "no workload holds this unit", "numad list shows the workloads")


def _resize(args: argparse.Namespace) -> int:
    if args.cpus is None and args.memory is None:
        args.usage_error("give --cpus, --memory or both")
    body = {"cpus": args.cpus, "memory": args.memory, "container": args.container}
    text = json.dumps({k: v for k, v in body.items() if v is not None})
    try:
        answer = request(_socket(args), "PATCH", workload_path(args.name), text)
    except APIError as err:
        if err.status != 409:
            raise
        _say(args, err.body, [str(err.body.get("error", {}).get("message", err.problem))])
        return REJECTED
    _say(args, answer, textout.resized(answer))
    return 0


def _show(args: argparse.Namespace) -> int:
    answer = request(_socket(args), "GET", workload_path(args.name))
    _say(args, answer, textout.workload(answer))
    if args.svg is not None:  # after the show: an unknown name fails before a file is made
        picture = picture_of_daemon(_socket(args), f"numad: {args.name}", highlight=args.name)
        write_picture(args.svg, picture)
    return 0


def _explain(args: argparse.Namespace) -> int:
    answer = request(_socket(args), "GET", workload_path(args.name) + "/explain")
    _say(args, answer, textout.explanation(answer))
    return 0


def _list(args: argparse.Namespace) -> int:
    answer = request(_socket(args), "GET", "/v1/workloads")
    _say(args, answer, textout.table(answer.get("workloads", [])))
    return 0


def _host(args: argparse.Namespace) -> int:
    answer = request(_socket(args), "GET", "/v1/host")
    _say(args, answer, textout.host(answer))
    return 0
