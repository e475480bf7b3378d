"""No traceback, ever: every command's error paths end in one ``numad: ...`` line and a
documented exit status (numad.cli.main's docstring: 0 done, 1 error, 2 usage, 3 rejected).

Error paths covered (in-process through ``numad.cli.main.main`` unless marked subprocess):

usage errors (exit 2; the usage of the command concerned, then ``numad: [COMMAND: ]...``):
  no command; ``numad --bogus`` (unrecognized, not "COMMAND required"); an unknown
  command; ``--bogus`` after every subcommand (its own usage, never the top-level one);
  a missing SPEC (plan), NAME (show, explain) or OUT (record-fixture); a NAME that is
  no workload name ('', x/y, ..); ``--cpus x`` / ``--cpus 0`` / ``--memory lots`` /
  ``--device gpu`` / ``--device gpu=two`` / ``--device gpu=0`` / a class given twice
  (run, admit --unit); run without a command; run --name that is no workload name
  (``../x``, checked before it becomes a directory); admit with neither or both of
  SPEC and --unit, ``--unit`` without ``--cpus``, ``--cpus`` beside a SPEC; release
  with neither or both of NAME and --unit; topology ``--fixture`` with ``--root`` or
  ``--auto``.
errors (exit 1, one line naming the subject):
  a missing spec file (plan, admit); a directory as spec; a spec that is not UTF-8; an
  unknown spec format; a spec with a wrong type (cpus = [1]: the error names the
  workload; name = 1: it names the file); plan and serve ``--root`` that is no
  directory; plan with a config of a bad value, an unknown option, reserved CPUs the
  machine lacks; a dead socket (the path exists, nobody listens) and a missing socket
  for list, show, explain, release, host, admit, run, plan and ``topology --nrt``;
  release --unit of a unit no workload holds (stand-in daemon); ``topology --root``
  missing; ``--fixture`` of a file that is no archive; an unknown bundled machine;
  record-fixture into a missing directory; ``serve`` with a missing config, a config of
  a bad value, reserved CPUs the machine lacks (subprocess); an unexpected exception
  inside a command (one ``internal error`` line); Ctrl-C (130).
closed stdout (subprocess, stdout a pipe whose reader is gone): a long answer
  (topology) and a client's (list against a stand-in daemon): exit 1, nothing on
  stderr; --help: exit 0, nothing on stderr (argparse drops help it cannot write).
real exits (subprocess): usage 2, error 1, rejected 3 (plan of 64 CPUs on 32).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from numad import defaults
from numad.cli import main as cli
from numad.cli.main import DEFAULT_MACHINE, main
from tests.conftest import Machines
from tests.fake_daemon import Answers, FakeDaemon

Capture = pytest.CaptureFixture[str]
MACHINE = "32intel64-2p8co2t+8ve"
COMMANDS = sorted(
    next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
)


def _run(capsys: Capture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out
    return code, out, err


def _error(capsys: Capture, argv: list[str], subject: str, problem: str) -> None:
    """Exit 1, nothing on stdout, one line ``numad: SUBJECT...PROBLEM`` on stderr."""
    code, out, err = _run(capsys, *argv)
    assert (code, out) == (1, ""), err
    assert err.count("\n") == 1, err
    assert err.startswith(f"numad: {subject}"), err
    assert problem in err, err


def _usage(capsys: Capture, argv: list[str], command: str, problem: str) -> None:
    """Exit 2: the command's usage, then one ``numad: COMMAND: PROBLEM`` line."""
    code, out, err = _run(capsys, *argv)
    assert (code, out) == (2, ""), err
    *usage, last = err.splitlines()
    assert usage[0].startswith(f"usage: numad {command}".rstrip() + " "), err
    assert all(not line.startswith("numad:") for line in usage), err
    assert last.startswith(f"numad: {command + ': ' if command else ''}"), err
    assert problem in last, err


# -- usage errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "command", "problem"),
    [
        pytest.param([], "", "give a COMMAND", id="no-command"),
        pytest.param(["--bogus"], "", "unrecognized arguments: --bogus", id="top-bogus"),
        pytest.param(["frobnicate"], "", "invalid choice: 'frobnicate'", id="unknown-command"),
        pytest.param(["plan"], "plan", "required: SPEC", id="plan-no-spec"),
        pytest.param(["show"], "show", "required: NAME", id="show-no-name"),
        pytest.param(["explain"], "explain", "required: NAME", id="explain-no-name"),
        pytest.param(["show", ""], "show", "'' is not a workload name", id="show-empty-name"),
        pytest.param(["explain", "x/y"], "explain", "'x/y' is not a workload", id="name-slash"),
        pytest.param(["release", ".."], "release", "'..' is not a workload", id="name-dots"),
        pytest.param(["record-fixture"], "record-fixture", "required: OUT", id="record-no-out"),
        pytest.param(["run", "--cpus", "x", "--", "true"], "run", "'x' is not a CPU", id="cpus-x"),
        pytest.param(["run", "--cpus", "0", "--", "true"], "run", "'0' is not a CPU", id="cpus-0"),
        pytest.param(
            ["run", "--memory", "lots", "--", "true"], "run", "'lots' is not a size", id="memory"
        ),
        pytest.param(
            ["run", "--device", "gpu", "--", "true"], "run", "'gpu': give CLASS=N", id="dev-no-n"
        ),
        pytest.param(
            ["run", "--device", "gpu=two", "--", "true"],
            "run",
            "'gpu=two': give CLASS=N",
            id="device-word",
        ),
        pytest.param(
            ["run", "--device", "gpu=0", "--", "true"], "run", "'gpu=0': give CLASS=N", id="dev-0"
        ),
        pytest.param(
            ["run", "--device", "gpu=1", "--device", "gpu=2", "--", "true"],
            "run",
            "--device: gpu given twice",
            id="device-twice",
        ),
        pytest.param(["run", "--cpus", "2"], "run", "give a command after --", id="run-no-cmd"),
        pytest.param(
            ["run", "--name", "../x", "--", "true"],
            "run",
            "--name: '../x' is not a workload name",
            id="run-name-escapes",
        ),
        pytest.param(["run", "--cpus", "2", "--"], "run", "give a command", id="run-empty-cmd"),
        pytest.param(["admit"], "admit", "give a SPEC file or --unit", id="admit-neither"),
        pytest.param(
            ["admit", "x.toml", "--unit", "x.service"], "admit", "one of them", id="admit-both"
        ),
        pytest.param(
            ["admit", "--unit", "x.service"], "admit", "--unit needs --cpus", id="unit-no-cpus"
        ),
        pytest.param(
            ["admit", "x.toml", "--cpus", "2"], "admit", "--cpus goes with --unit", id="spec-cpus"
        ),
        pytest.param(
            ["admit", "--unit", "x.service", "--cpus", "two"],
            "admit",
            "'two' is not a CPU",
            id="unit-cpus-word",
        ),
        pytest.param(["release"], "release", "give a NAME or --unit", id="release-neither"),
        pytest.param(
            ["release", "db", "--unit", "db.service"], "release", "one of them", id="release-both"
        ),
        pytest.param(
            ["topology", "--fixture", DEFAULT_MACHINE, "--root", "/"],
            "topology",
            "--fixture: not allowed with argument --root",
            id="fixture-root",
        ),
        pytest.param(
            ["topology", "--fixture", DEFAULT_MACHINE, "--auto"],
            "topology",
            "not allowed with argument --fixture",
            id="fixture-auto",
        ),
    ],
)
def test_usage_errors(capsys: Capture, argv: list[str], command: str, problem: str) -> None:
    _usage(capsys, argv, command, problem)


POSITIONAL = {
    "plan": ["x.toml"],
    "show": ["x"],
    "explain": ["x"],
    "resize": ["x"],
    "record-fixture": ["x.tgz"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_option_shows_the_commands_own_usage(capsys: Capture, command: str) -> None:
    argv = [command, *POSITIONAL.get(command, []), "--bogus"]
    _usage(capsys, argv, command, "unrecognized arguments: --bogus")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help_and_sockets_say_their_default(capsys: Capture, command: str) -> None:
    parser = next(
        a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices[command]
    assert parser.description, command
    for action in parser._actions:
        assert action.help, f"{command} {action.option_strings or action.dest}: no help"
        if "--socket" in action.option_strings:
            assert defaults.SOCKET in action.help, command
    code, out, _ = _run(capsys, command, "--help")
    assert code == 0
    assert out.startswith(f"usage: numad {command}")


# -- errors naming their subject -----------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "dir.toml").mkdir()
    (tmp_path / "latin1.toml").write_bytes(b'name = "caf\xe9"\n')
    (tmp_path / "spec.txt").write_text("cpus = 1\n")
    (tmp_path / "lots.toml").write_text('name = "lots"\ncgroup = "numad.slice/lots"\ncpus = [1]\n')
    (tmp_path / "nameless.json").write_text('{"name": 1, "cpus": 1}')
    (tmp_path / "big.toml").write_text('name = "big"\ncgroup = "numad.slice/big"\ncpus = 64\n')
    (tmp_path / "notar.tar.gz").write_text("hello\n")
    (tmp_path / "policy.toml").write_text('[topology]\npolicy = "Static"\n')
    (tmp_path / "option.toml").write_text('[cpu]\noptions = { "bogus" = true }\n')
    (tmp_path / "reserved.toml").write_text('[cpu]\nreserved-cpus = "0,99"\n')
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(tmp_path / "dead.sock"))  # bound, never listening, closed: refused
    dead.close()
    return tmp_path


def test_missing_and_unreadable_specs(capsys: Capture, files: Path) -> None:
    for command in ("plan", "admit"):
        _error(capsys, [command, str(files / "nosuch.toml")], f"{files}/nosuch.toml", "cannot read")
    _error(capsys, ["plan", str(files / "dir.toml")], f"{files}/dir.toml", "Is a directory")
    _error(capsys, ["plan", str(files / "latin1.toml")], f"{files}/latin1.toml", "not UTF-8")
    _error(capsys, ["plan", str(files / "spec.txt")], f"{files}/spec.txt", "unknown spec format")


def test_offline_plan_errors(capsys: Capture, files: Path, machines: Machines) -> None:
    root = str(machines.root(MACHINE))
    spec = str(files / "big.toml")
    lots = str(files / "lots.toml")
    _error(capsys, ["plan", lots, "--root", root], "lots: cpus: an array is not a number", "")
    nameless = str(files / "nameless.json")  # no workload to name: the file, not "spec"
    _error(capsys, ["plan", nameless, "--root", root], f"{nameless}: name: expected a name", "")
    _error(capsys, ["serve", "--root", str(files / "no")], f"{files}/no", "not a directory")
    _error(capsys, ["plan", spec, "--root", str(files / "no")], f"{files}/no", "not a directory")
    for config, subject, problem in (
        ("policy.toml", "[topology]", "policy = 'Static': not one of none, best-effort"),
        ("option.toml", "[cpu.options]", "unknown option 'bogus'; known options: align-by"),
        ("reserved.toml", "[cpu]", "reserved-cpus = '0,99': CPU 99 does not exist"),
    ):
        where = f"{files / config} {subject}"
        _error(
            capsys, ["plan", spec, "--root", root, "--config", str(files / config)], where, problem
        )


CLIENTS = [
    pytest.param(["list"], id="list"),
    pytest.param(["show", "db"], id="show"),
    pytest.param(["explain", "db"], id="explain"),
    pytest.param(["release", "db"], id="release"),
    pytest.param(["release", "--unit", "db.service"], id="release-unit"),
    pytest.param(["resize", "db", "--cpus", "2"], id="resize"),
    pytest.param(["host"], id="host"),
    pytest.param(["admit", "--unit", "db.service", "--cpus", "2"], id="admit-unit"),
    pytest.param(["run", "--cpus", "1", "--", "true"], id="run"),
]


@pytest.mark.parametrize("argv", CLIENTS)
def test_a_dead_socket(capsys: Capture, files: Path, argv: list[str]) -> None:
    dead = str(files / "dead.sock")
    _error(
        capsys, [argv[0], "--socket", dead, *argv[1:]], dead, "cannot connect: Connection refused"
    )


@pytest.mark.parametrize("argv", CLIENTS)
def test_a_missing_socket(capsys: Capture, files: Path, argv: list[str]) -> None:
    gone = str(files / "gone.sock")
    _error(capsys, [argv[0], "--socket", gone, *argv[1:]], gone, "cannot connect: No such file")


def test_a_dead_socket_for_a_plan_and_the_nrt_object(capsys: Capture, files: Path) -> None:
    dead = str(files / "dead.sock")
    _error(capsys, ["plan", str(files / "big.toml"), "--socket", dead], dead, "Connection refused")
    _error(capsys, ["topology", "--nrt", "--socket", dead], dead, "Connection refused")


def test_admit_of_a_spec_file_to_a_dead_socket(capsys: Capture, files: Path) -> None:
    dead = str(files / "dead.sock")
    _error(capsys, ["admit", str(files / "big.toml"), "--socket", dead], dead, "refused")


def test_release_of_a_unit_nobody_holds(capsys: Capture, tmp_path: Path) -> None:
    with FakeDaemon(tmp_path / "fake.sock", {("GET", "/v1/workloads"): (200, {"workloads": []})}):
        _error(
            capsys,
            ["release", "--unit", "db.service", "--socket", str(tmp_path / "fake.sock")],
            "db.service",
            "no workload holds this unit",
        )


def test_topology_and_fixture_errors(capsys: Capture, files: Path, machines: Machines) -> None:
    _error(capsys, ["topology", "--root", str(files / "no")], f"{files}/no", "not a directory")
    archive = str(files / "notar.tar.gz")
    _error(capsys, ["topology", "--fixture", archive], archive, "not a recorded archive")
    _error(capsys, ["topology", "--fixture", "nope"], "nope", "no such recorded machine")
    target = str(files / "no" / "x.tar.gz")
    root = str(machines.root("2arm-2c"))
    _error(capsys, ["record-fixture", target, "--root", root], target, "cannot create")


def test_an_unexpected_exception_is_one_line(
    capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last resort: a fault numad did not foresee still ends in one line."""

    def broken(_args: argparse.Namespace) -> int:
        raise KeyError("oops")

    def interrupted(_args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_topology", broken)
    _error(capsys, ["topology"], "internal error: KeyError: 'oops'", "please report it")
    monkeypatch.setattr(cli, "_topology", interrupted)
    assert _run(capsys, "topology") == (130, "", "")


# -- whole processes: serve, a closed stdout, real exit statuses -------------------------------


def _numad(*argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "numad", *argv],
        capture_output="stdout" not in kw,
        stderr=subprocess.PIPE if "stdout" in kw else None,
        text=True,
        check=False,
        timeout=60,
        **kw,
    )


def test_serve_with_a_bad_config(files: Path, machines: Machines, tmp_path: Path) -> None:
    root = tmp_path / "machine"
    subprocess.run(["cp", "-a", str(machines.root(MACHINE)), str(root)], check=True)
    for config, where, problem in (
        ("nosuch.toml", "", "cannot read: No such file or directory"),
        ("policy.toml", " [topology]", "policy = 'Static': not one of"),
        ("reserved.toml", " [cpu]", "CPU 99 does not exist on this machine; its CPUs are 0-31"),
    ):
        done = _numad("serve", "--root", str(root), "--config", str(files / config))
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr
        last = done.stderr.splitlines()[-1]  # after the start-up log lines, if any
        assert last.startswith(f"numad: {files / config}{where}: "), done.stderr
        assert problem in last, done.stderr


def _closed_pipe() -> int:
    read, write = os.pipe()
    os.close(read)
    return write


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        pytest.param(["topology", "--fixture", DEFAULT_MACHINE], 1, id="topology"),
        # argparse drops help it cannot write (its _print_message ignores OSError)
        pytest.param(["plan", "--help"], 0, id="help"),
    ],
)
def test_a_closed_stdout_ends_quietly(argv: list[str], status: int) -> None:
    write = _closed_pipe()
    try:
        done = _numad(*argv, stdout=write)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (status, "")


def test_a_closed_stdout_for_a_client(tmp_path: Path) -> None:
    answers: Answers = {("GET", "/v1/workloads"): (200, {"workloads": []})}
    with FakeDaemon(tmp_path / "fake.sock", answers):
        write = _closed_pipe()
        try:
            done = _numad("list", "--json", "--socket", str(tmp_path / "fake.sock"), stdout=write)
        finally:
            os.close(write)
    assert (done.returncode, done.stderr) == (1, "")


def test_real_exit_statuses(files: Path, machines: Machines) -> None:
    usage = _numad("topology", "--bogus")
    assert usage.returncode == 2
    assert usage.stderr.splitlines()[-1] == "numad: topology: unrecognized arguments: --bogus"
    error = _numad("plan", str(files / "nosuch.toml"))
    assert error.returncode == 1
    assert error.stderr == f"numad: {files}/nosuch.toml: cannot read: No such file or directory\n"
    rejected = _numad("plan", str(files / "big.toml"), "--root", str(machines.root(MACHINE)))
    assert (rejected.returncode, rejected.stderr) == (3, "")  # and no start-up log lines
    assert rejected.stdout.startswith("big.toml: rejected\n")
    plan = _numad("plan", "--json", str(files / "big.toml"), "--root", str(machines.root(MACHINE)))
    assert json.loads(plan.stdout)["admitted"] is False
