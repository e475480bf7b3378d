"""``numad resize`` (text, --json, a refusal's exit status 3 and line, usage errors) and
``--movable`` on ``admit --unit`` and ``run``, against a stand-in daemon; the OCI hook's
``numad.io/movable`` annotation; movable in ``show`` and ``list`` text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from numad.cli import textout
from numad.cli.main import main, parser
from numad.cli.oci_hook import Container, workload_request
from numad.cli.run import spec_of
from numad.errors import SpecError
from tests.fake_daemon import Answers, FakeDaemon

Capture = pytest.CaptureFixture[str]

SHOWN: dict[str, Any] = {
    "name": "db",
    "cgroup": "numad.slice/db",
    "movable": True,
    "state": "placed",
    "containers": {
        "main": {
            "cgroup": "numad.slice/db",
            "cpus": "2-3,18-19",
            "exclusive": True,
            "mems": "0",
            "devices": {},
        }
    },
}


def _run(capsys: Capture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_resize_prints_what_changed_then_the_workload(capsys: Capture, tmp_path: Path) -> None:
    answer = {"resized": "main", "added": "3,19", "removed": "", "workload": SHOWN}
    refusal = {
        "error": {
            "code": "resize_refused",
            "message": "db: not resized: no room on node 0: 1 free, 2 more asked;"
            " the workload is not movable",
        }
    }
    answers: Answers = {("PATCH", "/v1/workloads/db"): (200, answer)}
    sock = ["--socket", str(tmp_path / "fake.sock")]
    with FakeDaemon(tmp_path / "fake.sock", answers) as fake:
        code, out, err = _run(capsys, "resize", "db", "--cpus", "4", "--memory", "2Gi", *sock)
        assert (code, err) == (0, "")
        assert out.splitlines() == [
            "db: resized; cpus 3,19 added",
            "db: placed",
            "  cgroup    numad.slice/db",
            "  movable   numad may move it to admit another workload",
            "  container main",
            "    cgroup   numad.slice/db",
            "    cpus     2-3,18-19 (exclusive)",
            "    memory   node 0",
            "    devices  -",
        ]
        code, out, _ = _run(capsys, "resize", "db", "--cpus", "4", "--json", *sock)
        assert json.loads(out) == answer
        fake.answers[("PATCH", "/v1/workloads/db")] = (409, refusal)
        code, out, err = _run(capsys, "resize", "db", "--cpus", "8", "--container", "main", *sock)
        assert (code, err) == (3, "")
        assert out == refusal["error"]["message"] + "\n"
        fake.answers[("PATCH", "/v1/workloads/db")] = (
            400,
            {"error": {"code": "bad_request", "message": "db: which one?; its containers: a, b"}},
        )
        code, _, err = _run(capsys, "resize", "db", "--cpus", "8", *sock)
        assert (code, err) == (1, "numad: db: which one?; its containers: a, b\n")
    assert [r[2] for r in fake.requests] == [
        {"cpus": 4, "memory": "2Gi"},
        {"cpus": 4},
        {"cpus": 8, "container": "main"},
        {"cpus": 8},
    ]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        pytest.param(["resize", "db"], "give --cpus, --memory or both", id="nothing"),
        pytest.param(["resize", "db", "--cpus", "2.5"], "is not a CPU count", id="fraction"),
        pytest.param(["resize", "db", "--memory", "lots"], "is not a size", id="memory"),
        pytest.param(["resize", "--cpus", "2"], "required: NAME", id="no-name"),
    ],
)
def test_resize_usage_errors(capsys: Capture, argv: list[str], words: str) -> None:
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert words in err.splitlines()[-1]
    assert err.splitlines()[-1].startswith("numad: resize: ")


def test_movable_on_admit_unit_and_run(capsys: Capture, tmp_path: Path) -> None:
    shown = {**SHOWN, "unit": "db.service"}
    answers: Answers = {("POST", "/v1/workloads"): (201, {"admitted": True, "workload": shown})}
    sock = ["--socket", str(tmp_path / "fake.sock")]
    with FakeDaemon(tmp_path / "fake.sock", answers) as fake:
        argv = ["admit", "--unit", "db.service", "--cpus", "2", "--movable", *sock]
        code, _, _ = _run(capsys, *argv)
        assert code == 0
    assert fake.requests[0][2] == {"unit": "db.service", "cpus": 2, "movable": True}
    spec = tmp_path / "db.toml"
    spec.write_text('name = "db"\ncgroup = "numad.slice/db"\ncpus = 2\n')
    code, _, err = _run(capsys, "admit", str(spec), "--movable")
    assert code == 2
    assert "--movable goes with --unit" in err
    args = parser().parse_args(["run", "--cpus", "2", "--movable", "--name", "r1"])
    assert spec_of(args)["movable"] is True
    args = parser().parse_args(["run", "--cpus", "2", "--name", "r1"])
    assert "movable" not in spec_of(args)


@pytest.mark.parametrize(
    ("value", "movable"),
    [pytest.param("true", True, id="true"), pytest.param("false", False, id="false")],
)
def test_the_oci_annotation_asks_movable(value: str, movable: bool) -> None:
    notes = {"numad.io/cpus": "2", "numad.io/movable": value}
    asked = workload_request(Container("c1", "created", 1, "/b", notes, {}))
    assert asked == {"cpus": "2", "movable": movable}


def test_the_oci_annotation_refuses_other_words() -> None:
    notes = {"numad.io/cpus": "2", "numad.io/movable": "yes"}
    with pytest.raises(SpecError, match=r"numad\.io/movable: 'yes' is invalid"):
        workload_request(Container("c1", "created", 1, "/b", notes, {}))


def test_list_shows_a_movable_column_only_where_one_is_movable() -> None:
    fixed = {**SHOWN, "name": "web", "movable": False}
    assert textout.table([fixed])[0].split() == [
        "NAME", "STATE", "CONTAINER", "CPUS", "MEMORY", "DEVICES", "CGROUP"
    ]  # fmt: skip
    rows = textout.table([SHOWN, fixed])
    assert rows[0].split()[-1] == "MOVABLE"
    assert [r.split()[-1] for r in rows[1:]] == ["yes", "no"]
    assert "movable" not in "\n".join(textout.workload(fixed))
