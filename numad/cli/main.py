"""The ``numad`` command line.

Edge: parses arguments, runs one stage and prints its result. Host files are
read only through a ``HostFS`` (``--root`` re-roots them); bundled recorded
machines are package data found with importlib.resources.

No input ends in a traceback: every error is one line on stderr,
``numad: <subject>: <what happened>[; <what to do>]``. Exit status:

    0  done (``plan``: the spec would be admitted)
    1  an error: a file, the daemon's socket, the daemon's answer, the machine
    2  a usage error: the command's usage, then one ``numad: COMMAND: ...`` line
    3  rejected: ``plan``, ``admit`` or ``run`` of a workload the machine cannot hold now,
       or a ``resize`` refused
    130  interrupted (Ctrl-C)

``numad run`` exits with its command's status (128+N for a signal N). A
reader that closes stdout early (``numad list | head -1``) ends numad quietly
with status 1. Red Hat numad's ``-w`` keeps its own contract (numad.cli.redhat).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn, TypeAlias

from numad import __version__, defaults
from numad.cli import redhat
from numad.cli.client import APIError, request
from numad.cli.commands import add_commands
from numad.cli.demo import add_demo
from numad.cli.oci_hook import add_oci_hook
from numad.cli.pictures import from_daemon as picture_of_daemon
from numad.cli.pictures import write as write_picture
from numad.errors import FixtureError, HostFileError, NumadError
from numad.hostfs import HostFS
from numad.log import configure as configure_logging
from numad.topology.archive import ArchiveFS, cached_fixture
from numad.topology.discover import discover
from numad.topology.model import Topology
from numad.topology.picture import Holders, svg
from numad.topology.record import load_fixture, record_fixture
from numad.topology.render import to_json, to_text

# The machine `topology --auto` shows where the host has no NUMA to show.
DEFAULT_MACHINE = "32intel64-2p8co2t+8ve"
NODE_DIR = "/sys/devices/system/node"
_BUNDLED_SUFFIX = ".tar.bz2"

_Command = Callable[[argparse.Namespace], int]


def main(argv: list[str] | None = None) -> int:
    """Run ``numad`` with ``argv`` (default: the process arguments); return the exit status."""
    configure_logging()
    argv = sys.argv[1:] if argv is None else argv
    if redhat.is_redhat(argv):  # Red Hat numad's command line (libvirt runs numad -w)
        configure_logging(quiet=True)
        return redhat.main(argv)
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`numad topology | head`): stop quietly, and keep
        # the interpreter from complaining while it flushes stdout at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # noqa: BLE001 - the CLI's edge: one line, never a traceback
        _fail(err)
        return 1


def _main(argv: list[str]) -> int:
    try:
        args = _parse(parser(), argv)
        command: _Command = args.command
        status = command(args)
    except SystemExit as done:  # --help, or a usage error already printed
        status = done.code if isinstance(done.code, int) else 2
    sys.stdout.flush()  # a closed stdout fails here, not in the interpreter's exit
    return status


def _fail(err: Exception) -> None:
    """One line on stderr for an error: numad's own, the OS's, or a bug."""
    if isinstance(err, APIError):
        line = err.problem  # the daemon's message names its subject (the workload, ...)
    elif isinstance(err, NumadError):
        line = str(err)
    elif isinstance(err, OSError):
        subject = err.filename if err.filename is not None else type(err).__name__
        line = f"{subject}: {err.strerror or err}"
    else:
        line = f"internal error: {type(err).__name__}: {err}; please report it"
    with contextlib.suppress(OSError, ValueError):
        print(f"numad: {' '.join(line.splitlines())}", file=sys.stderr)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The arguments; a usage error shows the usage of the command it is about."""
    argv, tail = _command_tail(argv)
    args, extras = parser.parse_known_args(argv)
    if not hasattr(args, "command"):
        parser.error(
            f"unrecognized arguments: {' '.join(extras)}"
            if extras
            else "give a COMMAND (numad --help lists them)"
        )
    if extras:
        args.usage_error(f"unrecognized arguments: {' '.join(extras)}")
    if getattr(args, "fixture", None) is not None and getattr(args, "root", None) is not None:
        args.usage_error("argument --fixture: not allowed with argument --root")
    if tail is not None:
        args.cmd = tail
    return args


def _command_tail(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``numad run OPTIONS -- CMD...``: CMD exactly as given (argparse drops every
    ``--`` in it), split off before parsing."""
    if argv[:1] == ["run"] and "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, None


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors ending in one ``numad: COMMAND: ...`` line."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        command = self.prog.removeprefix("numad").strip()
        self.exit(2, f"numad: {command + ': ' if command else ''}{message}\n")


def parser() -> argparse.ArgumentParser:
    """numad's command line; scripts/package makes numad(8) and its completion from it."""
    top = _Parser(
        prog="numad",
        description="A NUMA resource manager for Linux hosts.",
        epilog="Exit status: 0 done, 1 error, 2 usage error, 3 rejected (plan, admit, run,"
        " resize)."
        " Red Hat numad's placement advice, as libvirt asks for it: numad -w NCPUS[:MB]"
        " prints the NUMA nodes that best fit a guest of NCPUS vCPUs and MB MiB (advice:"
        " nothing is admitted).",
    )
    top.add_argument("--version", action="version", version=f"numad {__version__}")
    sub = top.add_subparsers(title="commands", metavar="COMMAND")
    _add_topology(sub)
    _add_record(sub)
    add_commands(sub)
    add_demo(sub)
    add_oci_hook(sub)
    for command in sub.choices.values():  # an unknown option is reported with its command
        command.set_defaults(usage_error=command.error)
    return top


# argparse names the type of add_subparsers() only privately, and it is generic
# only to type checkers: a string keeps it out of the runtime.
_Subparsers: TypeAlias = "argparse._SubParsersAction[_Parser]"


def _add_topology(sub: _Subparsers) -> None:
    topo = sub.add_parser(
        "topology",
        help="show the machine as discovery sees it",
        description="Show the machine as discovery sees it: a tree for people, or JSON.",
    )
    topo.add_argument(
        "--root", metavar="DIR", help="read host files under DIR instead of / (a recorded tree)"
    )
    topo.add_argument("--json", action="store_true", help="print JSON instead of the tree")
    topo.add_argument(
        "--svg",
        metavar="FILE",
        type=Path,
        help="write a picture (SVG) of the machine to FILE, every CPU coloured by who holds"
        " it: the running daemon's holders, or, with --root/--fixture/--auto/--config or"
        " no daemon, the machine as on a fresh start (the config's reserved CPUs)",
    )
    topo.add_argument(
        "--nrt",
        action="store_true",
        help="print this host as a NodeResourceTopology object (topology.node.k8s.io/v1alpha2,"
        " JSON): from the running daemon with what it holds, else as on a fresh start",
    )
    topo.add_argument(
        "--config",
        type=Path,
        help="config file for --nrt and --svg without a daemon (policy, reserved CPUs)",
    )
    topo.add_argument(
        "--socket",
        metavar="PATH",
        help=f"the daemon's socket for --nrt (default {defaults.SOCKET})",
    )
    source = topo.add_mutually_exclusive_group()
    source.add_argument(
        "--fixture",
        metavar="NAME",
        help=f"show a bundled recorded machine (e.g. {DEFAULT_MACHINE}) or a recorded archive",
    )
    source.add_argument(
        "--auto",
        action="store_true",
        help=f"show the host, or {DEFAULT_MACHINE} where the host has fewer than 2 NUMA nodes",
    )
    topo.set_defaults(command=_topology)


def _add_record(sub: _Subparsers) -> None:
    rec = sub.add_parser(
        "record-fixture",
        help="record the host files discovery reads into an archive",
        description="Record exactly the host files discovery reads into OUT (.tar.gz), "
        "for bug reports and tests.",
    )
    rec.add_argument("out", metavar="OUT", type=Path, help="the archive to write (.tar.gz)")
    rec.add_argument("--root", metavar="DIR", help="read host files under DIR instead of /")
    rec.set_defaults(command=_record)


# -- topology ---------------------------------------------------------------------


def _topology(args: argparse.Namespace) -> int:
    if args.nrt:
        configure_logging(quiet=True)  # an offline start logs; the object is the answer
        print(json.dumps(_nrt(args), indent=2))
        return 0
    if args.svg is not None:
        return _svg(args)
    if args.fixture is not None:
        topo = _recorded_machine(args.fixture)
    elif args.auto:
        topo = _host_or_default(_root(args.root))
    else:
        topo = discover(HostFS(_root(args.root)))
    if args.json:
        print(json.dumps(to_json(topo), indent=2, sort_keys=False))
    else:
        print(to_text(topo), end="")
    return 0


def _svg(args: argparse.Namespace) -> int:
    """The picture: the running daemon's, else the machine as on a fresh start (the
    config's reserved CPUs, nothing held), as with --nrt."""
    socket = args.socket or defaults.SOCKET
    offline = args.fixture is not None or args.root is not None or args.auto
    offline = offline or args.config is not None
    if not offline and os.path.exists(socket):
        text = picture_of_daemon(socket)
    else:
        title = ""
        if args.fixture is not None:
            topo = _recorded_machine(args.fixture)
            title = Path(args.fixture).name.split(".tar")[0]
        elif args.auto:
            topo = _host_or_default(_root(args.root))
        else:
            topo = discover(HostFS(_root(args.root)))
        from numad.daemon.service import reserved_offline  # noqa: PLC0415 - as in _nrt

        text = svg(topo, Holders(reserved=reserved_offline(args.config, topo)), title)
    write_picture(args.svg, text)
    print(f"{args.svg}: {len(text)} bytes")
    return 0


def _nrt(args: argparse.Namespace) -> dict[str, Any]:
    """From the running daemon, or offline on the host, a root or a recorded machine."""
    socket = args.socket or defaults.SOCKET
    offline = args.fixture is not None or args.root is not None or args.config is not None
    if not offline and os.path.exists(socket):
        return request(socket, "GET", "/v1/nrt")
    from numad.daemon.service import nrt_offline  # noqa: PLC0415 - the daemon's side, offline only

    if args.fixture is None:
        return nrt_offline(args.config, args.root)
    with _unpacked(args.fixture) as root:
        found = nrt_offline(args.config, str(root))
    found["metadata"]["name"] = Path(args.fixture).name.split(".tar")[0]  # not this host's
    return found


def _host_or_default(root: str) -> Topology:
    """The host's topology, unless it has no NUMA to show; then the default machine."""
    fs = HostFS(root)
    if not fs.is_dir(NODE_DIR):
        reason = f"this host has no {NODE_DIR} (a kernel without NUMA support)"
    else:
        topo = discover(fs)
        if len(topo.nodes) > 1:
            return topo
        reason = f"this host has {len(topo.nodes)} NUMA node"
    print(
        f"numad: {reason}; showing the recorded machine {DEFAULT_MACHINE} instead",
        file=sys.stderr,
    )
    return _recorded_machine(DEFAULT_MACHINE)


def _recorded_machine(name: str) -> Topology:
    """Discover a bundled machine by name, or a recorded archive by path.

    An archive given by path is read in memory (writing its thousands of files
    out and removing them again took seconds); a bundled machine is unpacked
    once into the user's cache, where discovery reads it fastest.
    """
    if Path(name).is_file():
        return discover(ArchiveFS(Path(name)))
    with _unpacked(name) as root:
        return discover(HostFS(root))


@contextlib.contextmanager
def _unpacked(name: str) -> Iterator[Path]:
    """The root of a recorded machine on disk: its entry in the user's cache,
    else (no cache to use) a scratch copy for the call."""
    with _archive(name) as archive:
        cache, root = _cache_dir(), None
        # An unusable cache costs time, not the answer: then unpack as below,
        # which names the archive if the fault is the archive's.
        with contextlib.suppress(FixtureError):
            root = None if cache is None else cached_fixture(archive, cache)
        if root is not None:
            yield root
            return
        with tempfile.TemporaryDirectory(prefix="numad-fixture-") as scratch:
            yield load_fixture(archive, Path(scratch))


def _cache_dir() -> Path | None:
    """Where bundled machines stay unpacked: $XDG_CACHE_HOME/numad/machines, else
    ~/.cache/numad/machines; None without a home to put it in."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):  # the XDG spec: a relative value is to be ignored
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return Path(base, "numad", "machines")


@contextlib.contextmanager
def _archive(name: str) -> Iterator[Path]:
    path = Path(name)
    if path.is_file():
        yield path
        return
    data = resources.files("numad").joinpath("data")
    bundled = data.joinpath(name + _BUNDLED_SUFFIX)
    if "/" in name or not bundled.is_file():
        known = ", ".join(bundled_machines()) or "none"
        raise FixtureError(name, "no such recorded machine", f"bundled machines: {known}")
    with resources.as_file(bundled) as real:
        yield real


def bundled_machines() -> tuple[str, ...]:
    """Names of the recorded machines shipped with numad."""
    data = resources.files("numad").joinpath("data")
    return tuple(
        sorted(
            e.name.removesuffix(_BUNDLED_SUFFIX)
            for e in data.iterdir()
            if e.name.endswith(_BUNDLED_SUFFIX)
        )
    )


# -- record-fixture ----------------------------------------------------------------


def _record(args: argparse.Namespace) -> int:
    fs = HostFS(_root(args.root), record=True)
    discover(fs)
    count = record_fixture(fs, args.out)
    print(f"{args.out}: {count} entries")
    return 0


def _root(root: str | None) -> str:
    if root is None:
        return "/"
    if not os.path.isdir(root):
        raise HostFileError(root, "is not a directory", "give the root of a (recorded) tree")
    return root
