"""The isolation record, ``isolation.json`` in the state directory: what numad gives
back to the cgroups it isolates (``numad.host.isolation``).

``cgroups``: each isolated cgroup's own cpuset file, kept before numad first wrote
it. ``left``: the cgroups numad gave back every CPU though their own was none (the
kernel refuses an empty cpuset.cpus in a cgroup with tasks), with that value: when
one is isolated again while it still holds it, its own is none, not numad's value.
One small file, written whole (``numad.host.durable``).
"""

from __future__ import annotations

import json
from pathlib import Path

from numad.cpuset import CPUSet
from numad.errors import NumadError
from numad.host.durable import read_json, write_file

FILE = "isolation.json"

Record = dict[str, dict[str, str]]


def save(state_dir: Path, originals: Record, left: dict[str, str]) -> None:
    data = {"version": 1, "cgroups": originals, "left": left}
    write_file(state_dir, FILE, json.dumps(data, sort_keys=True).encode(), what="isolation record")


def load(state_dir: Path) -> tuple[Record, dict[str, str], str | None]:
    """The record a previous numad left (it stopped without giving everything back),
    or nothing and why it could not be read (numad goes on; the user must look)."""
    raw, problem = read_json(state_dir, FILE)
    try:
        if raw is None:
            why = problem and f"{problem}. The cpusets it lists were numad's to give back"
            return {}, {}, why
        cgroups = raw["cgroups"]
        found = {str(p): {str(k): str(v) for k, v in own.items()} for p, own in cgroups.items()}
        for own in found.values():
            CPUSet.parse_list(own.get("cpus", ""))
        left = {str(p): str(cpus) for p, cpus in raw.get("left", {}).items()}  # since 2026-12-05
    except (TypeError, KeyError, AttributeError, NumadError) as err:
        return {}, {}, f"{state_dir / FILE}: not a record numad wrote ({err}); restore by hand"
    return found, left, None
