"""Exclusive sets as cgroup v2 remote partitions (issue 23, ``[host] partitions``).

On the recorded 2-socket machine with a scratch v2 tree whose emulated kernel offers
remote partitions (``numad.host.cgroup.partitions``: 6.11's rules). The kernel part
is emulated here; the VM tier's 6.12 kernel is the real one.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from numad.cli import textout
from numad.cpuset import CPUSet
from numad.daemon.root import Daemon
from numad.errors import CgroupError
from numad.host.cgroup import v2
from numad.host.cgroup.partitions import REGISTRY
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines, recorded_daemon, restarted_daemon

PARTITIONS = {"host": {"partitions": True}}


def _tree(daemon: Daemon) -> Path:
    return Path(str(daemon.fs.root)) / "sys/fs/cgroup"


def _effective(daemon: Daemon, path: str) -> CPUSet:
    return CPUSet.parse_list((_tree(daemon) / path / "cpuset.cpus.effective").read_text())


def _partitions(daemon: Daemon) -> dict[str, CPUSet]:
    """The valid partitions, as the emulated kernel keeps them."""
    file = _tree(daemon) / REGISTRY
    if not file.exists():
        return {}
    parts = json.loads(file.read_text())["partitions"]
    return {p: CPUSet.parse_list(c) for p, c in parts.items()}


def _admit(daemon: Daemon, name: str, cgroup: str, cpus: int) -> bool:
    spec = {"name": name, "cgroup": cgroup, "cpus": cpus}
    return daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted


def _with_db(machines: Machines, tmp_path: Path) -> tuple[Daemon, CPUSet]:
    """A daemon with partitions and db admitted: db's partition's CPUs."""
    daemon = recorded_daemon(machines, tmp_path, PARTITIONS)
    assert _admit(daemon, "db", "numad.slice/db", 4)
    return daemon, _partitions(daemon)["numad.slice/db"]


def _written(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every cgroup file numad writes from now on (the v2 backend's one writer)."""
    files: list[str] = []
    real = v2.CgroupV2Backend._write

    def counted(self: v2.CgroupV2Backend, cg: Any, file: Path, value: str) -> None:
        files.append(f"{cg}/{file.name}")
        real(self, cg, file, value)

    monkeypatch.setattr(v2.CgroupV2Backend, "_write", counted)
    return files


def test_a_grant_is_a_partition_and_no_other_cgroup_is_written(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = recorded_daemon(machines, tmp_path, PARTITIONS)
    tree = _tree(daemon)
    strays = [f"numad.slice/stray{i}" for i in range(200)]
    for path in strays:
        scratch_mkdir(tree, path)
    daemon.reconcile()
    files = _written(monkeypatch)
    assert _admit(daemon, "db", "numad.slice/db", 4)
    cpus = _partitions(daemon)["numad.slice/db"]
    assert len(cpus) == 4
    # The admission wrote the workload's cgroup and the level above it, nothing else.
    assert {f.rsplit("/", 1)[0] for f in files} <= {"numad.slice/db", "numad.slice"}
    assert "numad.slice/db/cpuset.cpus.partition" in files
    for path in strays:
        assert not _effective(daemon, path) & cpus, path
    # A cgroup made now is off them from its mkdir: no event, no pass.
    scratch_mkdir(tree, "numad.slice/late")
    assert not _effective(daemon, "numad.slice/late") & cpus
    assert _effective(daemon, "numad.slice/db") == cpus
    assert not (daemon.state_dir / "isolation.json").exists()  # nothing isolated one by one
    shown = daemon.host()
    assert shown["isolated"] == []
    assert shown["partitions"] == [
        {"cgroup": "numad.slice/db", "cpus": str(cpus), "exclusive": str(cpus), "state": "root"}
    ]
    daemon.release("db")
    assert _partitions(daemon) == {}
    assert _effective(daemon, "numad.slice/late").issuperset(cpus)
    assert daemon.enforcer.partitions is not None
    assert daemon.enforcer.partitions.backend.partition("numad.slice")[0] == CPUSet()
    assert not [p for p in daemon.problems if "partition" in p]


class Crash(BaseException):
    """numad killed between two partition writes (no numad code catches it)."""


def _crash_after(daemon: Daemon, writes: int) -> None:
    """Make the daemon's partition writes raise ``Crash`` after ``writes`` more."""
    assert daemon.enforcer.partitions is not None
    backend = daemon.enforcer.partitions.backend
    left = [writes]
    for name in ("write_exclusive", "write_partition"):
        real = getattr(backend, name)

        def armed(path: str, value: Any, real: Any = real) -> None:
            if left[0] == 0:
                raise Crash
            left[0] -= 1
            real(path, value)

        setattr(backend, name, armed)


def test_grants_move_between_pods_in_a_seeded_simulation(
    machines: Machines, tmp_path: Path
) -> None:
    """Admissions and releases in three pods, drawn from a seed, with numad killed
    between two partition writes now and then and started again on the same files.
    After every step (and a pass, after a restart) the kernel's partitions are exactly
    the exclusive grants, no other cgroup runs on them, every level above names
    exactly the grants below it, and no write failed."""
    daemon = recorded_daemon(machines, tmp_path, PARTITIONS)
    tree = _tree(daemon)
    pods = ["numad.slice/pa", "numad.slice/pb", "numad.slice/pc"]
    for pod in pods:
        scratch_mkdir(tree, f"{pod}/stray")
    rng = random.Random(23)  # noqa: S311 - a seeded simulation, not a secret
    crashes = 0
    later: list[str] = []  # admitted before their cgroup was made
    foreign: list[str] = []  # cgroups whose owner names CPUs in their cpuset.cpus
    for step in range(200):
        if rng.random() < 0.15:
            _crash_after(daemon, rng.randint(0, 4))
        live = {n: s.cgroup for n, s in daemon.specs.items()}
        try:
            if rng.random() < 0.08:
                foreign.append(_foreign(tree, rng.choice(pods), step, busy=rng.random() < 0.5))
                daemon.isolate_new([foreign[-1]])  # the event its mkdir raises
            elif live and (rng.random() < 0.45 or len(live) >= 6):
                daemon.release(rng.choice(sorted(live)))
            elif later and rng.random() < 0.3:  # a unit started after its admission
                cgroup = later.pop(rng.randrange(len(later)))
                scratch_mkdir(tree, cgroup)
                daemon.isolate_new([cgroup])
            else:
                name = f"w{step}"
                cgroup = f"{rng.choice(pods)}/{name}"
                if rng.random() < 0.3:
                    later.append(cgroup)
                else:
                    scratch_mkdir(tree, cgroup)
                _admit(daemon, name, cgroup, rng.choice([1, 2, 3, 5]))
        except Crash:
            crashes += 1
            daemon = restarted_daemon(daemon, PARTITIONS)  # the killed one is dropped
            daemon.reconcile()
        _check_partitions(daemon, pods, step, foreign)
    assert crashes >= 10
    assert len(daemon.specs) >= 1
    assert len(foreign) >= 10
    daemon.stop()  # each foreign cgroup's own setting back, once no partition stands
    for path in foreign:
        assert (tree / path / "cpuset.cpus").read_text().strip() == _FOREIGN[path], path


_FOREIGN: dict[str, str] = {}  # a foreign cgroup -> what its owner wrote


def _foreign(tree: Path, pod: str, step: int, *, busy: bool) -> str:
    """A cgroup made beside the workloads by another owner, who names every CPU in
    its cpuset.cpus, or (the kernel refusing that beside a partition holding some)
    the CPUs it runs on now; with a task in it where ``busy``."""
    path = f"{pod}/foreign{step}"
    scratch_mkdir(tree, path)
    if busy:
        (tree / path / "cgroup.procs").write_text(f"{4000 + step}\n")
    owner = v2.CgroupV2Backend(tree, ["numad.slice"], emulate_kernel=True)
    try:
        owner.write(path, _ONLINE, None)
    except CgroupError:
        owner.write(path, owner.read_effective(path)[0], None)
    _FOREIGN[path] = (tree / path / "cpuset.cpus").read_text().strip()
    return path


_ONLINE = CPUSet(range(32))  # the 2-socket recording's


def _check_partitions(
    daemon: Daemon, pods: list[str], step: int, foreign: list[str] | None = None
) -> None:
    """Each admitted workload's CPUs are a partition: its cgroup's, or numad's holding
    cgroup's while its cgroup is not there; nothing else is one, and no stray nor
    ``foreign`` cgroup runs on them."""
    parts = daemon.enforcer.partitions
    assert parts is not None
    backend = parts.backend
    tree = _tree(daemon)
    there = {s.cgroup for s in daemon.specs.values() if (tree / s.cgroup).is_dir()}
    grants = {p: CPUSet.from_bits(daemon.enforcer.grants[p]) for p in there}
    booked = CPUSet()  # the CPUs of those whose cgroup is not there, from the books
    for name, spec in daemon.specs.items():
        if spec.cgroup not in there:
            booked |= CPUSet.parse_list(daemon.show(name)["containers"]["main"]["cpus"])
    if booked:
        grants[parts.holder] = booked
    assert _partitions(daemon) == grants, step
    taken = CPUSet()
    for cpus in grants.values():
        assert cpus
        assert not taken & cpus
        taken |= cpus
    for path in foreign or []:
        assert not _effective(daemon, path) & taken, (step, path)
    for pod in pods:
        assert not _effective(daemon, f"{pod}/stray") & taken, (step, pod)
        below = CPUSet()
        for cgroup, cpus in grants.items():
            if cgroup.startswith(pod + "/"):
                below |= cpus
        assert backend.partition(pod)[0] == below, (step, pod)
    assert backend.partition("numad.slice")[0] == taken, step
    bad = [p for p in daemon.problems if "partition" in p or "write" in p or "grant" in p]
    assert not bad, (step, bad)


def test_numad_stopping_dissolves_its_partitions_and_a_restart_makes_them_again(
    machines: Machines, tmp_path: Path
) -> None:
    daemon, cpus = _with_db(machines, tmp_path)
    daemon.stop()
    assert _partitions(daemon) == {}
    assert daemon.enforcer.partitions is not None
    assert daemon.enforcer.partitions.backend.partition("numad.slice")[0] == CPUSet()
    assert (_tree(daemon) / "numad.slice/db/cpuset.cpus").read_text().strip() != ""
    again = restarted_daemon(daemon, PARTITIONS)
    assert _partitions(again) == {"numad.slice/db": cpus}


def test_by_default_numad_makes_partitions_where_the_kernel_offers_them(
    machines: Machines, tmp_path: Path
) -> None:
    """``[host] partitions`` left out ("auto"): on a kernel that offers them the grants
    are partitions, and ``numad host`` says so; ``false`` dissolves them at the start
    and isolates one by one, and says why."""
    daemon, cpus = _with_db(machines, tmp_path)  # the tree's kernel offers them
    daemon.stop()
    auto = restarted_daemon(daemon)
    assert _partitions(auto) == {"numad.slice/db": cpus}
    shown = auto.host()
    assert shown["isolating"] == "partitions"
    assert "isolation  partitions" in textout.host(shown)
    assert f"  numad.slice/db  cpus {cpus}  root" in textout.host(shown)
    auto.stop()
    off = restarted_daemon(auto, {"host": {"partitions": False}})
    assert _partitions(off) == {}
    assert off.host()["isolating"] == "one by one: [host] partitions = false"
    assert not [p for p in off.problems if "partition" in p]


def test_by_default_a_kernel_without_partitions_is_isolated_one_by_one_and_no_problem(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)  # a scratch tree of a kernel without them
    scratch_mkdir(_tree(daemon), "numad.slice/stray")
    daemon.reconcile()
    assert _admit(daemon, "db", "numad.slice/db", 4)
    shown = daemon.host()
    assert shown["isolating"].startswith("one by one: this kernel offers no cpuset partitions")
    assert [i["cgroup"] for i in shown["isolated"]] == ["numad.slice/stray"]
    assert shown["partitions"] == []
    assert not [p for p in daemon.problems if "partition" in p]
    isolate_off = restarted_daemon(daemon, {"host": {"isolate": False}})
    assert isolate_off.host()["isolating"] == "off"


def test_a_partition_undone_by_another_writer_is_made_again_by_the_next_pass(
    machines: Machines, tmp_path: Path
) -> None:
    daemon, cpus = _with_db(machines, tmp_path)
    assert daemon.enforcer.partitions is not None
    daemon.enforcer.partitions.backend.write_partition("numad.slice/db", "member")
    assert _partitions(daemon) == {}
    daemon.reconcile()
    assert _partitions(daemon) == {"numad.slice/db": cpus}
    value = daemon.metrics.registry.get_sample_value("numad_drift_repairs_total")
    assert value == 1


def test_a_partition_the_kernel_refuses_is_a_problem_naming_the_cgroup(
    machines: Machines, tmp_path: Path
) -> None:
    """A sibling that names the CPUs as its own exclusive ones (an admin's partition):
    the grant is reported, not taken for done."""
    daemon = recorded_daemon(machines, tmp_path, PARTITIONS)
    tree = _tree(daemon)
    scratch_mkdir(tree, "numad.slice/theirs")
    backend = daemon.enforcer.partitions.backend if daemon.enforcer.partitions else None
    assert backend is not None
    every = _effective(daemon, "numad.slice")
    backend.write_exclusive("numad.slice", every - CPUSet([0]))
    backend.write_exclusive("numad.slice/theirs", every - CPUSet([0]))
    assert _admit(daemon, "db", "numad.slice/db", 4)  # committed: the grant is retried
    problems = [p for p in daemon.problems if "numad.slice/db" in p]
    assert problems, daemon.problems
    assert "numad.slice/db" not in _partitions(daemon)


def test_a_kernel_without_partitions_is_named_in_health_and_strays_are_isolated(
    machines: Machines, tmp_path: Path
) -> None:
    """Asked for on a tree whose kernel offers none (made before, without them)."""
    daemon = recorded_daemon(machines, tmp_path)
    daemon.stop()
    again = restarted_daemon(daemon, PARTITIONS)
    assert again.enforcer.partitions is None
    assert [p for p in again.problems if "offers no cpuset partitions" in p]
    scratch_mkdir(_tree(again), "numad.slice/stray")
    again.reconcile()
    assert _admit(again, "db", "numad.slice/db", 4)
    granted = _effective(again, "numad.slice/db")
    assert not _effective(again, "numad.slice/stray") & granted


@pytest.mark.parametrize("pass_between", [False, True])
def test_a_workload_cgroup_made_again_is_a_partition_at_once(
    machines: Machines, tmp_path: Path, pass_between: bool
) -> None:
    """A workload unit restarted: its cgroup is removed (the kernel ends the partition)
    and made again as a plain member. The event that reports it makes it a partition
    again, with or without a pass in between (which finds the cgroup gone and has
    numad's holding cgroup hold its CPUs meanwhile)."""
    daemon = recorded_daemon(machines, tmp_path, PARTITIONS)
    tree = _tree(daemon)
    assert _admit(daemon, "db", "numad.slice/db", 4)
    cpus = _partitions(daemon)["numad.slice/db"]
    shutil.rmtree(tree / "numad.slice/db")
    if pass_between:
        daemon.reconcile()
        assert "numad.slice/db" not in daemon.enforcer.grants
    scratch_mkdir(tree, "numad.slice/db")
    assert daemon.enforcer.partitions is not None
    holder = daemon.enforcer.partitions.holder
    # The pass found db's cgroup gone: numad's holding cgroup took its CPUs.
    assert _partitions(daemon) == ({holder: cpus} if pass_between else {})
    if pass_between:
        assert not _effective(daemon, "numad.slice/db") & cpus
    daemon.isolate_new(["numad.slice/db"])
    assert _partitions(daemon) == {"numad.slice/db": cpus}
    assert not [p for p in daemon.problems if "partition" in p or "write" in p]


def test_partitions_the_kernel_refuses_numad_turn_to_isolation_one_by_one(
    machines: Machines, tmp_path: Path
) -> None:
    """A kernel that says ``root invalid (Enable partition not permitted)`` (numad lacks
    CAP_SYS_ADMIN, as under the package's unit without a drop-in; stood in for here,
    the VM tier meets the real one): numad dissolves what it made, says why in health
    and isolates every other cgroup one by one in the same admission."""
    daemon = recorded_daemon(machines, tmp_path, PARTITIONS)
    tree = _tree(daemon)
    scratch_mkdir(tree, "numad.slice/stray")
    daemon.reconcile()
    parts = daemon.enforcer.partitions
    assert parts is not None
    backend: Any = parts.backend
    real_partition, real_write = backend.partition, backend.write_partition

    def partition(path: str) -> tuple[CPUSet, str]:
        cpus, state = real_partition(path)
        if path.count("/") >= 1 and state == "member" and cpus:
            return cpus, "root invalid (Enable partition not permitted)"
        return cpus, state

    backend.partition = partition
    backend.write_partition = lambda path, state: (
        None if state == "root" else real_write(path, state)
    )
    assert _admit(daemon, "db", "numad.slice/db", 4)
    assert daemon.enforcer.partitions is None
    refused = [p for p in daemon.problems if "CAP_SYS_ADMIN" in p]
    assert refused, daemon.problems
    granted = _effective(daemon, "numad.slice/db")
    assert len(granted) == 4
    assert not _effective(daemon, "numad.slice/stray") & granted  # written one by one
    assert CPUSet.parse_list((tree / "numad.slice/stray/cpuset.cpus").read_text())
    assert real_partition("numad.slice")[0] == CPUSet()
    assert real_partition("numad.slice/db") == (CPUSet(), "member")
    assert daemon.host()["partitions"] == []
    assert [i["cgroup"] for i in daemon.host()["isolated"]].count("numad.slice/stray") == 1


def test_a_workload_not_there_yet_has_its_cpus_held_until_its_cgroup_appears(
    machines: Machines, tmp_path: Path
) -> None:
    """A workload admitted before its cgroup exists (a unit not started) has no cgroup
    to partition: numad's holding cgroup holds its CPUs, so no other cgroup runs on
    them meanwhile, and gives them up to the workload's cgroup when it appears."""
    daemon = recorded_daemon(machines, tmp_path, PARTITIONS)
    tree = _tree(daemon)
    scratch_mkdir(tree, "numad.slice/stray")
    assert _admit(daemon, "later", "numad.slice/later", 3)
    parts = daemon.enforcer.partitions
    assert parts is not None
    held = _partitions(daemon)
    assert list(held) == [parts.holder]
    assert len(held[parts.holder]) == 3
    assert not _effective(daemon, "numad.slice/stray") & held[parts.holder]
    scratch_mkdir(tree, "numad.slice/later")
    daemon.isolate_new(["numad.slice/later"])
    assert _partitions(daemon) == {"numad.slice/later": held[parts.holder]}
    assert not _effective(daemon, "numad.slice/stray") & held[parts.holder]
    assert not [p for p in daemon.problems if "partition" in p or "grant" in p or "write" in p]
    daemon.release("later")
    assert _partitions(daemon) == {}


def test_partitions_left_by_a_killed_numad_are_dissolved_when_it_starts_without_them(
    machines: Machines, tmp_path: Path
) -> None:
    """numad killed with partitions made (a workload's and the holding cgroup's), then
    started with ``partitions = false``: it dissolves them at start, so no CPU stays
    out of the cgroups it now isolates one by one."""
    daemon, cpus = _with_db(machines, tmp_path)
    tree = _tree(daemon)
    scratch_mkdir(tree, "numad.slice/stray")
    assert _admit(daemon, "later", "numad.slice/later", 2)
    assert daemon.enforcer.partitions is not None
    holder = daemon.enforcer.partitions.holder
    assert set(_partitions(daemon)) == {"numad.slice/db", holder}
    again = restarted_daemon(
        daemon, {"host": {"partitions": False}}
    )  # the killed one is dropped: nothing dissolved
    assert again.enforcer.partitions is None
    assert _partitions(again) == {}
    backend = v2.CgroupV2Backend(tree, ["numad.slice"], emulate_kernel=True)
    assert backend.partition("numad.slice") == (CPUSet(), "member")
    assert backend.partition(holder) == (CPUSet(), "member")
    assert _effective(again, "numad.slice/db") == cpus  # its own cpuset.cpus, as granted
    assert not _effective(again, "numad.slice/stray") & cpus  # isolated one by one


def test_a_cgroup_that_cannot_be_given_back_is_retried_alone_each_pass(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """numad killed while isolating 50 strays one by one, started again with nothing to
    isolate one by one (partitions, or here isolation off: both give every isolated
    cgroup back at each pass). One cannot be given back (its cpuset file is not a
    file): the record keeps that one only, and each later pass retries it alone.
    Before, one failure kept the whole record and every pass rewrote all of them under
    the lock (the VM's 6.12 boot with partitions: 985 cgroups, 5.6 s, every pass)."""
    daemon = recorded_daemon(machines, tmp_path)
    tree = _tree(daemon)
    strays = [f"numad.slice/stray{i}" for i in range(50)]
    for path in strays:
        scratch_mkdir(tree, path)
    daemon.reconcile()
    assert _admit(daemon, "db", "numad.slice/db", 4)
    stuck = tree / strays[7] / "cpuset.cpus"
    stuck.unlink()
    stuck.mkdir()  # not a regular file: the emulated kernel refuses to write it
    again = restarted_daemon(daemon, {"host": {"isolate": False}})  # the first: killed
    assert set(again.isolation.originals) == {strays[7]}
    files = _written(monkeypatch)
    again.reconcile()
    assert {f.rsplit("/", 1)[0] for f in files} == {strays[7]}
    assert set(again.isolation.originals) == {strays[7]}


def test_a_cgroup_beside_a_partition_naming_its_cpus_is_isolated_and_the_partition_made(
    machines: Machines, tmp_path: Path
) -> None:
    """The kernel leaves a partition invalid while a cgroup beside it names its CPUs in
    its own cpuset.cpus (the VM's 6.12: ``root invalid (Cpu list in cpuset.cpus not
    exclusive)``): numad isolates that cgroup one by one and makes the partition in the
    same admission; the cgroup gets its own setting back when numad stops."""
    daemon = recorded_daemon(machines, tmp_path, PARTITIONS)
    tree = _tree(daemon)
    scratch_mkdir(tree, "numad.slice/foreign")
    every = _effective(daemon, "numad.slice/foreign")
    (tree / "numad.slice/foreign/cpuset.cpus").write_text(every.format_list())  # its owner's
    daemon.reconcile()
    assert _admit(daemon, "db", "numad.slice/db", 4)
    cpus = _partitions(daemon)["numad.slice/db"]
    assert len(cpus) == 4
    assert not _effective(daemon, "numad.slice/foreign") & cpus
    assert [i["cgroup"] for i in daemon.host()["isolated"]] == ["numad.slice/foreign"]
    assert not [p for p in daemon.problems if "partition" in p or "write" in p], daemon.problems
    daemon.reconcile()  # kept isolated while the partition stands, and nothing else
    assert _partitions(daemon) == {"numad.slice/db": cpus}
    assert [i["cgroup"] for i in daemon.host()["isolated"]] == ["numad.slice/foreign"]
    daemon.stop()
    assert _partitions(daemon) == {}
    assert CPUSet.parse_list((tree / "numad.slice/foreign/cpuset.cpus").read_text()) == every


def test_turning_to_partitions_keeps_busy_cgroups_isolated_that_cannot_inherit_again(
    machines: Machines, tmp_path: Path
) -> None:
    """numad isolated cgroups one by one, then starts with partitions (the VM's 6.12:
    giving a stray with tasks every CPU back, as v2 refuses it an empty cpuset.cpus,
    left the partition beside it invalid): one with tasks stays isolated on the shared
    pool while partitions stand; one without tasks inherits its parent's again, with
    no write of every CPU first."""
    offering = recorded_daemon(machines, tmp_path, PARTITIONS)  # a tree that offers them
    offering.stop()
    daemon = restarted_daemon(offering, {"host": {"partitions": False}})
    tree = _tree(daemon)
    for name in ("busy", "idle"):
        scratch_mkdir(tree, f"numad.slice/{name}")
    (tree / "numad.slice/busy/cgroup.procs").write_text("4242\n")
    daemon.reconcile()
    assert _admit(daemon, "db", "numad.slice/db", 4)
    again = restarted_daemon(daemon, PARTITIONS)
    cpus = _partitions(again)["numad.slice/db"]
    assert len(cpus) == 4
    assert not [p for p in again.problems if "partition" in p or "write" in p], again.problems
    assert [i["cgroup"] for i in again.host()["isolated"]] == ["numad.slice/busy"]
    assert not _effective(again, "numad.slice/busy") & cpus
    assert again.enforcer.partitions is not None
    assert again.enforcer.partitions.clashes == set()  # kept, not given every CPU and found
    assert (tree / "numad.slice/idle/cpuset.cpus").read_text().strip() == ""
    again.stop()
    assert _partitions(again) == {}
    busy = CPUSet.parse_list((tree / "numad.slice/busy/cpuset.cpus").read_text())
    assert busy.issuperset(cpus)  # every CPU again, once no partition stands beside it
