"""The checkpoint: atomic, checksummed, versioned; an unreadable one is kept aside."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numad.cpuset import CPUSet
from numad.daemon import state
from numad.errors import CheckpointError
from numad.host import durable
from numad.hostfs import HostFS
from numad.placement.admission import Books, ContainerRequest, Engine, WorkloadRequest, admit
from numad.placement.managers.cpu.state import CPUState
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology
from numad.placement.managers.device import DeviceInventory, DeviceState
from numad.placement.managers.memory import MemoryState, MemoryTable
from numad.placement.policy import Machine
from numad.topology.discover import discover
from tests.conftest import DAEMON_MACHINE, Machines

RECORD = state.Record(
    spec={"name": "db", "cgroup": "numad.slice/db", "cpus": 4},
    cpus={"main": "1-2,17-18"},
    memory={"main": [["memory", [0], [[0, 1073741824]]]]},
    devices={"main": {"vector-engine": ["0000:1b:00.0"]}},
)
CHECKPOINT = state.Checkpoint("0,16", {"db": RECORD})
# Larger than CHECKPOINT, so a write cut short is visible in what is left.
UNPLACED = state.Record({"name": "web"}, unplaced="cpus 5 went offline while numad was stopped")
NEXT = state.Checkpoint(
    "0,16", {"db": RECORD, "web": UNPLACED}, ("numad.slice/old.service",), "cpus=0,16"
)


def test_round_trip(tmp_path: Path) -> None:
    state.write(tmp_path, CHECKPOINT)
    loaded, problem = state.read(tmp_path)
    assert problem is None
    assert loaded is not None
    assert loaded.reserved == "0,16"
    assert dict(loaded.workloads) == {"db": RECORD}
    assert state.restore_blocks(loaded.workloads["db"].memory["main"])[0].split == ((0, 1 << 30),)
    assert [p.name for p in tmp_path.iterdir()] == [state.FILE]  # no temp file left behind


def test_missing_checkpoint_is_a_fresh_start(tmp_path: Path) -> None:
    assert state.read(tmp_path) == (None, None)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        pytest.param(lambda b: b[: len(b) // 2], "unreadable", id="truncated"),
        pytest.param(
            lambda b: b.replace(b"1-2,17-18", b"1-3,17-18"), "checksum mismatch", id="edited"
        ),
        pytest.param(
            lambda b: b.replace(b'"version": 1', b'"version": 9'), "unknown version 9", id="version"
        ),
        pytest.param(
            lambda b: b.replace(b'"version": 1', b'"version": true'),
            "unknown version True",
            id="version-bool",
        ),
        pytest.param(lambda _b: b"\x00\xff garbage", "unreadable", id="garbage"),
        pytest.param(lambda _b: b"[]", "unreadable", id="wrong-shape"),
        pytest.param(
            lambda _b: b'{"version": 1, "body": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "unreadable: RecursionError",
            id="deep-nesting",
        ),
        pytest.param(
            lambda b: b.replace(b"1073741824", b"1" * 5000), "unreadable", id="huge-integer"
        ),
        pytest.param(
            lambda _b: b" " * (state.MAX_BYTES + 1), "larger than 16777216 bytes", id="too-large"
        ),
    ],
)
def test_unreadable_checkpoint_is_kept_aside(
    tmp_path: Path, damage: Callable[[bytes], bytes], problem: str
) -> None:
    state.write(tmp_path, CHECKPOINT)
    target = tmp_path / state.FILE
    original = target.read_bytes()
    target.write_bytes(damage(original))
    loaded, why = state.read(tmp_path)
    assert loaded is None
    assert why is not None
    assert problem in why
    _assert_kept_aside(tmp_path, damage(original))


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_checkpoint_that_is_no_file_is_kept_aside_not_waited_on(
    tmp_path: Path, kind: str
) -> None:
    """Before: a FIFO named checkpoint.json hung the start in open() (no writer ever
    comes), and a directory stopped numad ("cannot read: Is a directory")."""
    target = tmp_path / state.FILE
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
        (target / "inside").write_text("kept\n")
    answer: list[tuple[object, str | None]] = []
    reader = threading.Thread(target=lambda: answer.append(state.read(tmp_path)), daemon=True)
    reader.start()
    reader.join(30)  # a bound for a hung test: the blocking open waits forever
    if reader.is_alive():  # let it go (a writer ends the open) before failing
        os.close(os.open(target, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading the checkpoint waits on the FIFO")
    (loaded, why) = answer[0]
    assert loaded is None
    assert why is not None
    assert ("a FIFO" if kind == "fifo" else "a directory") + ", not a regular file" in why
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(f"{state.FILE}.corrupt.")]
    assert len(kept) == 1
    assert kept[0].is_fifo() if kind == "fifo" else (kept[0] / "inside").read_text() == "kept\n"
    assert not target.exists()
    state.write(tmp_path, CHECKPOINT)  # and the next commit has its place
    assert state.read(tmp_path)[0] == CHECKPOINT


def _assert_kept_aside(directory: Path, data: bytes) -> None:
    kept = [p for p in directory.iterdir() if p.name.startswith(f"{state.FILE}.corrupt.")]
    assert len(kept) == 1
    assert kept[0].read_bytes() == data  # nothing lost
    assert not (directory / state.FILE).exists()


def test_checksum_covers_every_field(tmp_path: Path) -> None:
    state.write(tmp_path, NEXT)
    for key in ("reserved", "reserved_from", "orphans"):
        doc = json.loads((tmp_path / state.FILE).read_text())
        doc["body"][key] = ["x"] if key == "orphans" else "0"
        with pytest.raises(CheckpointError, match="checksum mismatch"):
            state.decode(json.dumps(doc).encode(), "test")


def test_write_failure_names_the_file(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the directory should be")
    with pytest.raises(CheckpointError, match=r"state/checkpoint.json: cannot create the state"):
        state.write(blocker, CHECKPOINT)


# -- new fields, and the files written before them ----------------------------------------


def test_unplaced_workloads_and_reserved_from_round_trip(tmp_path: Path) -> None:
    state.write(tmp_path, NEXT)
    assert state.read(tmp_path) == (NEXT, None)
    body = json.loads((tmp_path / state.FILE).read_bytes())["body"]
    assert body["reserved_from"] == "cpus=0,16"
    assert body["workloads"]["web"]["unplaced"] == UNPLACED.unplaced
    assert "unplaced" not in body["workloads"]["db"]  # placed: as before the field existed


def test_a_checkpoint_from_before_the_new_fields_still_reads() -> None:
    body = {  # as the first numad wrote it: no reserved_from, unplaced (nor orphans)
        "reserved": "0,16",
        "workloads": {
            "db": {
                "spec": dict(RECORD.spec),
                "cpus": {"main": "1-2,17-18"},
                "memory": {},
                "devices": {},
            }
        },
    }
    loaded = state.decode(_signed(body), "test")
    assert loaded == state.Checkpoint("0,16", {"db": replace(RECORD, memory={}, devices={})})
    assert (loaded.reserved_from, loaded.workloads["db"].unplaced, loaded.orphans) == ("", "", ())


def test_an_unplaced_record_holds_nothing() -> None:
    with pytest.raises(ValueError, match="unplaced workload"):
        replace(RECORD, unplaced="cpus 1-2 went offline")


def test_record_of(machines: Machines) -> None:
    topo = discover(HostFS(machines.root(DAEMON_MACHINE)))
    view = CPUTopology.from_topology(topo)
    cpu_policy = StaticPolicy(view, StaticOptions())
    books = Books(
        CPUState(view.all, cpu_policy.reserve(2)),
        MemoryState(MemoryTable.build(topo)),
        DeviceState(DeviceInventory.build(topo, [])),
    )
    engine = Engine(Machine(topo.node_ids), cpu_policy)
    request = WorkloadRequest("db", (ContainerRequest("main", 2, {"memory": 1 << 30}),))
    books, outcome = admit(engine, books, request)
    assert outcome.admitted
    held = state.record_of(books, "db", {"name": "db"})
    assert held.cpus == {"main": outcome.placements["main"].cpus.format_list()}
    assert state.restore_blocks(held.memory["main"]) == books.memory.blocks[("db", "main")]
    assert not held.unplaced
    why = "cpus 5 went offline while numad was stopped"
    assert state.record_of(books, "web", {"name": "web"}, why) == state.Record(
        {"name": "web"}, unplaced=why
    )
    with pytest.raises(ValueError, match="cannot hold resources"):
        state.record_of(books, "db", {"name": "db"}, why)


# -- writing: every byte, or nothing changed ----------------------------------------------


def test_a_file_size_limit_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    """RLIMIT_FSIZE (as a full disk or a quota) first shortens a write, then fails it."""
    state.write(tmp_path, CHECKPOINT)
    before = (tmp_path / state.FILE).read_bytes()
    limit = len(before) + 100
    child = f"""
import resource, signal, sys
from pathlib import Path
from numad.daemon import state
from numad.errors import CheckpointError

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
big = state.Checkpoint("0", {{f"w{{i}}": state.Record({{"name": f"w{{i}}"}}) for i in range(99)}})
assert len(state.encode(big)) > 2 * {limit}
try:
    state.write(Path(sys.argv[1]), big)
except CheckpointError as err:
    print(err)
    sys.exit(3)
"""
    done = subprocess.run(
        [sys.executable, "-c", child, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"{tmp_path / state.FILE}: cannot write" in done.stdout
    assert "File too large [EFBIG]" in done.stdout
    assert (tmp_path / state.FILE).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [state.FILE]


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        pytest.param(durable.Fault.STALLED_WRITE, "cannot write .checkpoint.json.", id="stalled"),
        pytest.param(durable.Fault.ENOSPC, "No space left on device [ENOSPC]", id="enospc"),
        pytest.param(durable.Fault.EDQUOT, "Disk quota exceeded [EDQUOT]", id="edquot"),
        pytest.param(durable.Fault.EIO, "cannot write .checkpoint.json.", id="eio"),
        pytest.param(durable.Fault.FSYNC, "cannot fsync .checkpoint.json.", id="fsync"),
        pytest.param(durable.Fault.RENAME, "cannot rename .checkpoint.json.", id="rename"),
        pytest.param(durable.Fault.DIR_FSYNC, "previous checkpoint is put back", id="dir-fsync"),
    ],
)
def test_a_failed_write_keeps_the_previous_checkpoint(
    tmp_path: Path, fault: durable.Fault, cause: str
) -> None:
    state.write(tmp_path, CHECKPOINT)
    target = tmp_path / state.FILE
    before = target.read_bytes()
    with pytest.raises(CheckpointError) as caught:
        state.write(tmp_path, NEXT, durable.Syscalls.injecting(fault))
    assert str(caught.value).startswith(f"{target}: cannot ")
    assert cause in str(caught.value)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [state.FILE]
    state.write(tmp_path, NEXT)  # the fault gone, the next write goes through
    assert state.read(tmp_path) == (NEXT, None)


def test_a_failed_first_write_leaves_no_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="the new checkpoint is removed"):
        state.write(tmp_path, NEXT, durable.Syscalls.injecting(durable.Fault.DIR_FSYNC))
    assert list(tmp_path.iterdir()) == []


def test_short_writes_are_finished(tmp_path: Path) -> None:
    state.write(tmp_path, NEXT, durable.Syscalls.injecting(durable.Fault.SHORT_WRITES))
    assert (tmp_path / state.FILE).read_bytes() == state.encode(NEXT)


def test_the_directory_is_fsynced_after_the_rename(tmp_path: Path) -> None:
    state.write(tmp_path, CHECKPOINT)
    target = tmp_path / state.FILE
    seen: list[tuple[str, bytes]] = []

    def fsync(fd: int) -> None:
        st_ = os.fstat(fd)
        if stat.S_ISDIR(st_.st_mode):
            assert (st_.st_dev, st_.st_ino) == (tmp_path.stat().st_dev, tmp_path.stat().st_ino)
        seen.append(("dir" if stat.S_ISDIR(st_.st_mode) else "file", target.read_bytes()))
        os.fsync(fd)

    state.write(tmp_path, NEXT, durable.Syscalls(fsync=fsync))
    # The temp file is synced while the old checkpoint is in place, the state
    # directory once the new one is.
    assert seen == [("file", state.encode(CHECKPOINT)), ("dir", state.encode(NEXT))]


def test_each_write_is_a_new_file_renamed_into_place(tmp_path: Path) -> None:
    state.write(tmp_path, CHECKPOINT)
    target = tmp_path / state.FILE
    with target.open("rb") as old:
        state.write(tmp_path, NEXT)
        assert os.fstat(old.fileno()).st_ino != target.stat().st_ino
        assert old.read() == state.encode(CHECKPOINT)  # the old file was not rewritten


def test_a_link_at_the_temp_path_is_not_followed(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("not numad's")
    (directory / f".{state.FILE}.{os.getpid()}.tmp").symlink_to(victim)
    state.write(directory, CHECKPOINT)
    assert victim.read_text() == "not numad's"
    assert not (directory / state.FILE).is_symlink()
    assert state.read(directory) == (CHECKPOINT, None)
    assert [p.name for p in directory.iterdir()] == [state.FILE]


def test_a_checkpoint_numad_could_not_read_back_is_not_written(tmp_path: Path) -> None:
    state.write(tmp_path, CHECKPOINT)
    before = (tmp_path / state.FILE).read_bytes()
    huge = state.Checkpoint("0", {"db": state.Record({"pad": "x" * state.MAX_BYTES})})
    with pytest.raises(CheckpointError, match="more than numad reads back"):
        state.write(tmp_path, huge)
    assert (tmp_path / state.FILE).read_bytes() == before


# -- reading: a checkpoint with a valid checksum is still checked, part by part -----------


def _signed(body: object, version: object = state.VERSION) -> bytes:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    checksum = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    return json.dumps({"version": version, "checksum": checksum, "body": body}).encode()


BODY: dict[str, Any] = json.loads(state.encode(NEXT))["body"]
DB = "body/workloads/db"


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """Set (or, with ``...``, remove) ``a/b/c`` in a body."""
    *parents, last = path.split("/")

    def damage(body: dict[str, Any]) -> None:
        at: Any = body
        for key in parents:
            at = at[int(key)] if isinstance(at, list) else at[key]
        if value is ...:
            del at[last]
        else:
            at[int(last) if isinstance(at, list) else last] = value

    return damage


MEM = "workloads/db/memory/main"


@pytest.mark.parametrize(
    ("damage", "where"),
    [
        pytest.param(_set("workloads/db/spec", [1]), f"{DB}/spec: expected an object", id="spec"),
        pytest.param(_set("workloads/db/spec", ...), f"{DB}/spec: missing", id="no-spec"),
        pytest.param(_set("workloads/db/cpus", ["1"]), f"{DB}/cpus: expected an object", id="cpus"),
        pytest.param(
            _set("workloads/db/cpus/main", 5),
            f"{DB}/cpus/main: expected a string",
            id="cpu-list-type",
        ),
        pytest.param(
            _set("workloads/db/cpus/main", "1-x"), f"{DB}/cpus/main: not a CPU list", id="cpu-list"
        ),
        pytest.param(_set("workloads/db/cpus/main", "3-1"), "is reversed", id="cpu-range"),
        pytest.param(_set("workloads/db/cpus/main", "99999999"), "out of range", id="cpu-id"),
        pytest.param(_set("workloads/db/cpus/main", "-1"), "not a CPU list", id="cpu-negative"),
        pytest.param(_set("workloads/db/memory", ...), f"{DB}/memory: missing", id="no-memory"),
        pytest.param(_set(MEM, {"a": 1}), f"{DB}/memory/main: expected an array", id="blocks"),
        pytest.param(
            _set(f"{MEM}/0", ["memory", [0]]),
            "[resource, [nodes], [[node, bytes]",
            id="block-length",
        ),
        pytest.param(
            _set(f"{MEM}/0/0", 1), f"{DB}/memory/main[0][0]: expected a string", id="resource"
        ),
        pytest.param(
            _set(f"{MEM}/0/1", 0), f"{DB}/memory/main[0][1]: expected an array", id="nodes"
        ),
        pytest.param(
            _set(f"{MEM}/0/1", [-1]), "[0][1][0]: expected a count, found -1", id="node-negative"
        ),
        pytest.param(
            _set(f"{MEM}/0/1", [0, True]),
            "[0][1][1]: expected an integer, found True",
            id="node-bool",
        ),
        pytest.param(_set(f"{MEM}/0/1", [1 << 40]), "[0][1]: not a node set", id="node-range"),
        pytest.param(_set(f"{MEM}/0/2", {}), "[0][2]: expected an array", id="split"),
        pytest.param(
            _set(f"{MEM}/0/2/0", [0]), "[0][2][0]: expected [node, bytes]", id="split-pair"
        ),
        pytest.param(_set(f"{MEM}/0/2/0", [1, 5]), "on one of the nodes [0]", id="split-node"),
        pytest.param(
            _set(f"{MEM}/0/2/0", [0, -1]), "[0][2][0][1]: expected a count", id="bytes-negative"
        ),
        pytest.param(
            _set(f"{MEM}/0/2/0", [0, 1.5]), "expected an integer, found 1.5", id="bytes-float"
        ),
        pytest.param(
            _set("workloads/db/devices/main", ["x"]),
            f"{DB}/devices/main: expected an object",
            id="devices",
        ),
        pytest.param(
            _set("workloads/db/devices/main/vector-engine", "0000:1b:00.0"),
            "vector-engine: expected an array",
            id="device-list",
        ),
        pytest.param(
            _set("workloads/db/devices/main/vector-engine", [1]),
            "vector-engine[0]: expected a string",
            id="device-address",
        ),
        pytest.param(
            _set("workloads/db/unplaced", 1),
            f"{DB}/unplaced: expected a string",
            id="unplaced-type",
        ),
        pytest.param(
            _set("workloads/db/unplaced", "gone"),
            f"{DB}: unplaced (gone) but holds",
            id="unplaced-holding",
        ),
        pytest.param(_set("workloads/db", 3), f"{DB}: expected an object", id="workload"),
        pytest.param(_set("workloads", []), "body/workloads: expected an object", id="workloads"),
        pytest.param(_set("reserved", 0), "body/reserved: expected a string", id="reserved-type"),
        pytest.param(_set("reserved", "zero"), "body/reserved: not a CPU list", id="reserved"),
        pytest.param(_set("reserved", ...), "body/reserved: missing", id="no-reserved"),
        pytest.param(
            _set("reserved_from", 2), "body/reserved_from: expected a string", id="reserved-from"
        ),
        pytest.param(_set("orphans", "x"), "body/orphans: expected an array", id="orphans"),
        pytest.param(
            _set("orphans", [None]), "body/orphans[0]: expected a string, found None", id="orphan"
        ),
    ],
)
def test_a_signed_but_malformed_checkpoint_is_kept_aside(
    tmp_path: Path, damage: Callable[[dict[str, Any]], None], where: str
) -> None:
    body = copy.deepcopy(BODY)
    damage(body)
    data = _signed(body)
    with pytest.raises(CheckpointError, match="malformed") as caught:
        state.decode(data, "checkpoint.json")
    assert str(caught.value).startswith("checkpoint.json: malformed: ")
    assert where in str(caught.value)
    (tmp_path / state.FILE).write_bytes(data)
    loaded, why = state.read(tmp_path)
    assert loaded is None
    assert why is not None
    assert where in why
    _assert_kept_aside(tmp_path, data)


def test_a_body_that_is_not_an_object_is_malformed() -> None:
    with pytest.raises(CheckpointError, match="malformed: body: expected an object"):
        state.decode(_signed([BODY]), "test")


KEYS = (
    "reserved",
    "reserved_from",
    "orphans",
    "workloads",
    "db",
    "web",
    "spec",
    "cpus",
    "memory",
    "devices",
    "unplaced",
    "main",
    "vector-engine",
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=6)
    | st.sampled_from(["", "0", "1-3", "0,16", "3-1", "memory", "gone"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=16,
)


def _paths(value: object, at: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    yield at
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*at, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _paths(inner, (*at, index))


@st.composite
def bodies(draw: st.DrawFn) -> object:
    """Anything JSON, or (mostly) a valid body with one part replaced or removed."""
    if draw(st.integers(0, 3)) == 0:
        return draw(JSON)
    body = copy.deepcopy(BODY)
    path = draw(st.sampled_from(list(_paths(body))[1:]))
    parent: Any = body
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(JSON)
    return body


def _assert_well_typed(checkpoint: state.Checkpoint) -> None:
    CPUSet.parse_list(checkpoint.reserved)
    assert isinstance(checkpoint.reserved_from, str)
    assert all(isinstance(o, str) for o in checkpoint.orphans)
    for name, record in checkpoint.workloads.items():
        assert isinstance(name, str)
        assert isinstance(record.spec, Mapping)
        assert all(isinstance(k, str) for k in record.spec)
        assert isinstance(record.unplaced, str)
        for container, listed in record.cpus.items():
            assert isinstance(container, str)
            CPUSet.parse_list(listed)
        for raw in record.memory.values():
            for block in state.restore_blocks(raw):
                assert all(n in block.nodes and b >= 0 for n, b in block.split)
        for held in record.devices.values():
            for cls, addresses in held.items():
                assert isinstance(cls, str)
                assert all(isinstance(a, str) for a in addresses)
        if record.unplaced:
            assert not record.cpus
            assert not record.memory
            assert not record.devices


@settings(max_examples=300, deadline=None)
@given(bodies())
def test_any_signed_body_decodes_well_typed_or_is_kept_aside(body: object) -> None:
    data = _signed(body)
    try:
        decoded: state.Checkpoint | None = state.decode(data, "test")
    except CheckpointError:
        decoded = None
    if decoded is not None:
        _assert_well_typed(decoded)
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        (directory / state.FILE).write_bytes(data)
        loaded, why = state.read(directory)
        assert loaded == decoded
        if decoded is None:
            assert why is not None
            _assert_kept_aside(directory, data)
        else:
            assert why is None


def test_two_threads_writing_one_file_take_turns(tmp_path: Path) -> None:
    """Two writers of one file in one process (the unit record is saved from the
    daemon's thread and the unit loop's) share its temp and previous names: the
    second, started while the first waits on its fsync, waits its turn. Without the
    turn it removes the first's temp file, and the first's rename fails (ENOENT)."""
    second: list[BaseException | None] = []

    def write_second() -> None:
        try:
            durable.write_file(tmp_path, "units.json", b"second")
            second.append(None)
        except CheckpointError as err:
            second.append(err)

    other = threading.Thread(target=write_second)

    def fsync(fd: int) -> None:
        if not other.is_alive() and not second:  # the first's temp file, once
            other.start()
            other.join(0.5)  # the whole second write, had it not to wait
        os.fsync(fd)

    durable.write_file(tmp_path, "units.json", b"first", durable.Syscalls(fsync=fsync))
    other.join(10)
    assert second == [None]
    assert (tmp_path / "units.json").read_bytes() == b"second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["units.json"]
