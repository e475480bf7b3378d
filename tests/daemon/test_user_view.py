"""What a user reads (issue 25 items 1-5): every container explained, no silent
fallback, the cgroup's state said, one vocabulary, numad run honest about a
scratch tree.

An in-process daemon on the recorded 2-socket machine (``recorded_daemon``: a
scratch cgroup v2 tree), its answers shaped as the API shapes them
(``numad.daemon.answers``) and printed as the clients print them
(``numad.cli.textout``); the client's own paths through ``numad.cli.main``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from numad.cli import textout
from numad.cli.main import main
from numad.cli.run import on_cgroupfs
from numad.daemon.answers import outcome_json
from numad.daemon.config import parse
from numad.daemon.root import Daemon
from numad.errors import ConfigError
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines, recorded_daemon

POD = {
    "name": "pod",
    "cgroup": "numad.slice/pod",
    "containers": [
        {"name": "a", "cgroup": "a", "cpus": 4},
        {"name": "b", "cgroup": "b", "cpus": 2},
    ],
}


def _spec(daemon: Daemon, spec: dict[str, Any]) -> Any:
    return daemon.parse(json.dumps(spec), "json")


def _tree(daemon: Daemon) -> Path:
    return Path(str(daemon.fs.root)) / "sys/fs/cgroup"


# -- 1. every container explained ---------------------------------------------------------


def test_plan_and_explain_explain_every_container(machines: Machines, tmp_path: Path) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    planned = outcome_json(daemon.plan(_spec(daemon, POD)))
    assert [e["container"] for e in planned["explained"]] == ["a", "b"]
    text = textout.plan("pod", planned)
    assert "  a: admitted on node 0 (preferred, policy single-numa-node)" in text
    assert "    a asks for 4 exclusive CPUs" in text
    assert "    b asks for 2 exclusive CPUs" in text
    assert sum(line.strip().startswith("placed: cpus ") for line in text) == 2
    for name in ("a asks for", "b asks for"):
        assert name in planned["explanation"]  # the whole text names both too

    scratch_mkdir(_tree(daemon), "numad.slice/pod/a")
    assert daemon.admit(_spec(daemon, POD)).admitted
    explained = daemon.explain("pod")
    assert [e["container"] for e in explained["explained"]] == ["a", "b"]
    lines = textout.explanation({"name": "pod", **explained})
    assert "  b: admitted on node 0 (preferred, policy single-numa-node)" in lines


def test_plan_of_an_admitted_workload_says_so_and_shows_what_it_holds(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    spec = {"name": "db", "cgroup": "numad.slice/db", "cpus": 4}
    held = daemon.admit(_spec(daemon, spec)).placements["main"].cpus
    planned = outcome_json(daemon.plan(_spec(daemon, spec)))
    assert (planned["admitted"], planned["already"]) == (True, True)
    assert planned["containers"]["main"]["cpus"] == held.format_list()
    text = textout.plan("db", planned)
    assert text[1] == "  admitted already (numad release frees it); it holds:"
    assert f"  main: cpus {held.format_list()}, memory any node" in text


def test_a_rejected_container_is_explained_with_those_decided_before_it(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    spec = {**POD, "containers": [POD["containers"][0], {"name": "b", "cgroup": "b", "cpus": 20}]}
    answer = outcome_json(daemon.plan(_spec(daemon, spec)))
    assert not answer["admitted"]
    assert [e["container"] for e in answer["explained"]] == ["a", "b"]
    lines = textout.rejected("pod", answer)
    assert lines[1] == "  container b cannot be placed"
    assert "  b: rejected: cpu has no preferred NUMA placement (policy single-numa-node)" in lines
    assert "    node 0 has 10 CPUs free" in lines  # what b met: a's 4 taken of node 0's 14


# -- 2. no silent fallback ------------------------------------------------------------------


def test_a_socket_given_that_does_not_answer_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "db.toml"
    spec.write_text('name = "db"\ncgroup = "numad.slice/db"\ncpus = 2\n')
    dead = tmp_path / "dead.sock"
    assert main(["plan", str(spec), "--socket", str(dead)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"numad: {dead}: cannot connect"), err


@pytest.mark.parametrize(
    ("given", "vendor", "device"),
    [
        pytest.param({"vendor": "1bcf:001c"}, "0x1bcf", "0x001c", id="as-topology-prints"),
        pytest.param({"vendor": "1BCF"}, "0x1bcf", None, id="without-0x"),
        pytest.param({"vendor": "0x1bcf", "device": "1c"}, "0x1bcf", "0x001c", id="short"),
    ],
)
def test_a_device_selector_is_read_as_sysfs_writes_it(
    given: dict[str, str], vendor: str, device: str | None
) -> None:
    config = parse({"devices": {"ve": given}})
    (ve,) = config.device_classes
    assert (ve.vendor, ve.device) == (vendor, device)


@pytest.mark.parametrize(
    ("given", "subject"),
    [
        pytest.param({"vendor": "zz"}, "[devices.ve] vendor", id="not-hex"),
        pytest.param({"vendor": "0x12345"}, "[devices.ve] vendor", id="too-long"),
        pytest.param({"vendor": "1bcf:001c", "device": "0x0001"}, "[devices.ve] device", id="two"),
        pytest.param({"class-prefix": "0x0g"}, "[devices.ve] class-prefix", id="class"),
        pytest.param({"addresses": ["3b:00"]}, "[devices.ve] addresses", id="address"),
    ],
)
def test_a_bad_device_selector_is_a_config_error_naming_the_key(
    given: dict[str, Any], subject: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse({"devices": {"ve": given}})
    assert str(err.value).startswith(f"config {subject}: "), str(err.value)


def test_a_class_that_selects_no_device_is_a_health_problem_and_said_in_a_plan(
    machines: Machines, tmp_path: Path
) -> None:
    devices = {"devices": {"ve": {"vendor": "1bcf"}, "none": {"vendor": "abcd"}}}
    daemon = recorded_daemon(machines, tmp_path, devices)
    assert daemon.problems == ["device class none: vendor 0xabcd selects no device on this machine"]
    asks = {"name": "x", "cgroup": "numad.slice/x", "cpus": 2, "devices": {"none": 1}}
    answer = outcome_json(daemon.plan(_spec(daemon, asks)))
    assert "none: its selector matches no device on this machine" in answer["explanation"]
    assert "anywhere" not in answer["explanation"]
    ve = outcome_json(daemon.plan(_spec(daemon, {**asks, "devices": {"ve": 1}})))
    assert ve["admitted"]  # vendor "1bcf", no 0x, selects the vector engines


@pytest.mark.parametrize(
    ("cpus", "note"),
    [
        pytest.param(2.5, "x: 2.5 CPUs is not a whole number", id="fraction"),
        pytest.param("100000m", "x: 100000m is written in millicpus (write 100", id="millis"),
    ],
)
def test_a_request_that_runs_on_the_shared_pool_says_so(
    machines: Machines, tmp_path: Path, cpus: object, note: str
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    spec = _spec(daemon, {"name": "x", "cgroup": "numad.slice/x", "cpus": cpus})
    (said,) = spec.notes()
    assert said.startswith(note)
    assert said.endswith("it runs on the shared pool, not on CPUs of its own")
    answer = {**outcome_json(daemon.plan(spec)), "notes": spec.notes()}
    assert f"  note: {said}" in textout.plan("x", answer)
    for plain in (3, "500m", 0.5):  # exclusive, or plainly the pool: nothing to say
        assert _spec(daemon, {"name": "y", "cgroup": "numad.slice/y", "cpus": plain}).notes() == []


# -- 3. the cgroup's state ------------------------------------------------------------------


def test_a_workload_without_its_cgroup_is_said_to_wait_and_one_gone_to_be_released(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path, {"daemon": {"release-grace-seconds": 30}})
    now = [100.0]
    daemon.clock = lambda: now[0]
    spec = {"name": "late", "cgroup": "numad.slice/late", "cpus": 2}
    assert daemon.admit(_spec(daemon, spec)).admitted
    shown = daemon.show("late")
    assert shown["state"] == "waiting for its cgroup"
    said = textout.admitted({"workload": shown})
    assert said[1].startswith("warning: its cgroup numad.slice/late does not exist yet")
    daemon.reconcile()
    assert any(p.startswith("late: waiting for its cgroup") for p in daemon.problems)

    scratch_mkdir(_tree(daemon), "numad.slice/late")
    daemon.reconcile()
    assert daemon.show("late")["state"] == "placed"
    assert not any(p.startswith("late:") for p in daemon.problems)

    shutil.rmtree(_tree(daemon) / "numad.slice/late")
    daemon.reconcile()  # the grace starts
    now[0] += 12
    assert daemon.show("late")["state"] == "cgroup gone, released in 18 s"
    assert any("late: its cgroup numad.slice/late is gone" in p for p in daemon.problems)
    now[0] += 18
    daemon.reconcile()
    assert "late" not in daemon.specs
    assert not any(p.startswith("late:") for p in daemon.problems)


# -- 4. one vocabulary ----------------------------------------------------------------------


def test_memory_not_pinned_and_the_shared_pool_have_one_word_each(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    scratch_mkdir(_tree(daemon), "numad.slice/web")
    for spec in (
        {"name": "db", "cgroup": "numad.slice/db", "cpus": 2},
        {"name": "web", "cgroup": "numad.slice/web", "cpus": "500m"},
    ):
        daemon.admit(_spec(daemon, spec))
    texts = [
        *textout.table(daemon.list_all()),
        *textout.workload(daemon.show("web")),
        *textout.admitted({"workload": daemon.show("db")}),
    ]
    joined = "\n".join(texts)
    assert "any node" in joined
    assert "shared pool" in joined
    for other in (" mems ", "(shared)", "{0", "NUMA nodes {", " any,", "shared CPUs"):
        assert other not in joined, (other, joined)


# -- 5. numad run on a scratch tree ---------------------------------------------------------


def test_a_scratch_tree_is_no_cgroup_filesystem(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/sda1 / ext4 rw 0 0\n"
        "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n"
        "cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
        "cgroup2 /mnt/v2 cgroup2 rw 0 0\n"
    )
    assert on_cgroupfs(Path("/sys/fs/cgroup"), mounts)  # v1: a controller inside it
    assert on_cgroupfs(Path("/sys/fs/cgroup/cpuset/numad.slice"), mounts)
    assert on_cgroupfs(Path("/mnt/v2"), mounts)
    assert not on_cgroupfs(tmp_path / "machine/sys/fs/cgroup", mounts)
