"""The checkpoint: atomic, checksummed, versioned; an unreadable one is kept aside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from numad import state
from numad.errors import CheckpointError

RECORD = state.Record(
    spec={"name": "db", "cgroup": "numad.slice/db", "cpus": 4},
    cpus={"main": "1-2,17-18"},
    memory={"main": [["memory", [0], [[0, 1073741824]]]]},
    devices={"main": {"vector-engine": ["0000:1b:00.0"]}},
)
CHECKPOINT = state.Checkpoint("0,16", {"db": RECORD})


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
        pytest.param(lambda _b: b"\x00\xff garbage", "unreadable", id="garbage"),
        pytest.param(lambda _b: b"[]", "unreadable", id="wrong-shape"),
    ],
)
def test_unreadable_checkpoint_is_kept_aside(tmp_path: Path, damage: object, problem: str) -> None:
    state.write(tmp_path, CHECKPOINT)
    target = tmp_path / state.FILE
    original = target.read_bytes()
    assert callable(damage)
    target.write_bytes(damage(original))
    loaded, why = state.read(tmp_path)
    assert loaded is None
    assert why is not None
    assert problem in why
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(f"{state.FILE}.corrupt.")]
    assert len(kept) == 1
    assert kept[0].read_bytes() == damage(original)  # nothing lost
    assert not target.exists()


def test_checksum_covers_every_field(tmp_path: Path) -> None:
    state.write(tmp_path, CHECKPOINT)
    doc = json.loads((tmp_path / state.FILE).read_text())
    doc["body"]["reserved"] = "0"
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        state.decode(json.dumps(doc).encode(), "test")


def test_write_failure_names_the_file(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the directory should be")
    with pytest.raises(CheckpointError):
        state.write(blocker, CHECKPOINT)
