"""The fault campaign's hostile numbers: specs whose numbers no workload asks for
(a million hexadecimal digits, 1e400, -0, "1e999999", values nested thousands
deep), sent as an API client would. Each is refused with a SpecError naming its
field (or, past what the document's parser reads, the document), within a bound
of CPU time far below what converting it would cost, and nothing is committed.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

from numad.daemon import state
from numad.errors import SpecError
from tests.campaign.world import Simulation, Violation

NAME = "hostile"
HEAD = {"name": NAME, "cgroup": f"numad.slice/{NAME}"}
TOML_HEAD = f'name = "{NAME}"\ncgroup = "numad.slice/{NAME}"\n'
YAML_HEAD = f"name: {NAME}\ncgroup: numad.slice/{NAME}\n"
CPU_SECONDS = 2.0  # converting a million hex digits to Decimal took ~20 s


def _json(**fields: object) -> str:
    return json.dumps({**HEAD, **fields})


def _raw_json(field: str, literal: str) -> str:
    """A JSON spec with a literal json.dumps cannot write (1e400, -0, huge integers)."""
    return _json()[:-1] + f', "{field}": {literal}}}'


# Each: the format, the spec for a size (digits or depth), the field its error names
# ("" for the document: the parser itself refuses it, or its length).
Hostile = tuple[str, Callable[[int], str], str]
PAYLOADS: list[Hostile] = [
    ("toml", lambda n: f"{TOML_HEAD}cpus = 0x{'f' * n}\n", "cpus"),
    ("toml", lambda n: f"{TOML_HEAD}cpus = 1\nmemory = 0x{'f' * n}\n", "memory"),
    ("toml", lambda n: f"{TOML_HEAD}cpus = 1\nhugepages-2Mi = 0b{'1' * n}\n", "hugepages-2Mi"),
    ("toml", lambda _: f"{TOML_HEAD}cpus = -0\n", "cpus"),
    ("toml", lambda _: f"{TOML_HEAD}cpus = 1e400\n", "cpus"),
    ("toml", lambda _: f"{TOML_HEAD}cpus = nan\n", "cpus"),
    ("yaml", lambda n: f"{YAML_HEAD}cpus: 0x{'f' * n}\n", "cpus"),
    ("yaml", lambda n: f"{YAML_HEAD}cpus: 1\nmemory: 0o{'7' * n}\n", "memory"),
    ("yaml", lambda _: f"{YAML_HEAD}cpus: .inf\n", "cpus"),
    ("yaml", lambda n: f"{YAML_HEAD}cpus: {'[' * min(n, 2000)}{']' * min(n, 2000)}\n", ""),
    ("json", lambda _: _raw_json("cpus", "1e400"), "cpus"),
    ("json", lambda _: _raw_json("cpus", "-0"), "cpus"),
    ("json", lambda _: _raw_json("cpus", f"{'9' * 4000}"), "cpus"),
    ("json", lambda n: _raw_json("cpus", f"{'9' * max(n, 5000)}"), ""),  # Python's own limit
    ("json", lambda _: _json(cpus="1e999999"), "cpus"),
    ("json", lambda n: _json(cpus=f"0x{'f' * n}"), "cpus"),
    ("json", lambda _: _json(cpus=1, memory="1e999999"), "memory"),
    ("json", lambda _: _raw_json("memory", "-1e-400")[:-1] + ', "cpus": 1}', "memory"),
    ("json", lambda _: _raw_json("devices", '{"ve": 1e400}')[:-1] + ', "cpus": 1}', "devices"),
    ("json", lambda _: _raw_json("containers", '[{"name": "a", "cpus": 1e400}]'), "containers"),
    ("json", lambda n: _raw_json("cpus", f"{'[' * min(n, 900)}1{']' * min(n, 900)}"), "cpus"),
    ("json", lambda n: _raw_json("cpus", f"{'[' * n}{']' * n}"), ""),
]
SIZES = (1_000, 100_000, 1_000_000)


def hostile_numbers(sim: Simulation) -> None:
    """A few hostile specs: each refused at once, naming where; nothing changes."""
    before = _committed(sim)
    names = set(sim.daemon.specs)
    for fmt, make, field in sim.rng.sample(PAYLOADS, 2):
        text = make(sim.rng.choice(SIZES))
        sim.faults.injected["hostile number"] += 1
        started = time.process_time()
        refused = _refusal(sim, fmt, text)
        spent = time.process_time() - started
        where = rf"{NAME}: {re.escape(field)}\b" if field else "spec: "  # too long, too deep
        sim.expect(
            re.match(where, refused) is not None,
            f"{fmt} {text[:80]!r}...: refused as {refused[:200]!r}, not naming {field or fmt}",
        )
        sim.expect(spent < CPU_SECONDS, f"{fmt} {text[:80]!r}...: {spent:.1f} s of CPU to refuse")
    sim.expect(_committed(sim) == before, "a hostile spec changed the checkpoint")
    sim.expect(set(sim.daemon.specs) == names, "a hostile spec changed the workloads")


def _refusal(sim: Simulation, fmt: str, text: str) -> str:
    try:
        spec = sim.daemon.parse(text, fmt)
    except SpecError as err:
        return str(err)
    except Exception as err:
        raise Violation(f"step {sim.steps}: {fmt} {text[:80]!r}...: raised {err!r}") from err
    raise Violation(f"step {sim.steps}: {fmt} {text[:80]!r}...: accepted as {spec}")


def _committed(sim: Simulation) -> bytes | None:
    try:
        return (sim.root / "var/lib/numad" / state.FILE).read_bytes()
    except FileNotFoundError:
        return None
