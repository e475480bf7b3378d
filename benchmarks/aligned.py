"""Aligned pairs under best-effort: align-per-resource on against off, in a churn.

Run from the repository root:

    .venv/bin/python benchmarks/aligned.py [--seeds 0-3] [--steps 600]

The machines and arrivals of benchmarks/devices.py (the DGX-like synthetic machine:
8 GPUs and 8 NICs, 4 of each a node, 112 CPUs a node; the 2-socket recording with 8
vector engines, all on node 0, 16 CPUs a node), all under best-effort: a container
asking 1, 2, 4 or 8 "gpu" devices, no NIC or one, 2-8 exclusive CPUs and 1-4 GiB;
45% of steps release a random admitted workload. The same stream is admitted on two
hosts in lockstep, the Topology Manager option align-per-resource on and off, through
numad's own engine (numad.placement.admission.admit).

Figures per machine and setting, over the admitted containers (each device with a
node and the CPUs and memory that go with it: numad.placement.groups):

- spanning: containers whose merge found no single preferred mask (the ones the
  option is for);
- CPUs paired: the share of (device, CPU) pairs whose CPU is on the device's node,
  over the spanning containers, then over every container with devices;
- memory paired: the share of memory bytes on a device's node within that node's
  share (its devices' part of the amount), the same two ways;
- admissions (must be equal), and the median time of one admission.

Exit status 0 when admissions were equal and the option never paired fewer CPUs or
less memory than off, 2 otherwise.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # devices.py: the machines and arrivals

from devices import MACHINES, host, request, seeds  # noqa: E402

from numad.hostfs import HostFS  # noqa: E402
from numad.placement.admission import Placement, admit, release  # noqa: E402
from numad.placement.managers.cpu.topology import CPUTopology  # noqa: E402
from numad.placement.managers.device import Pick  # noqa: E402
from numad.placement.policy import Policy, PolicyOptions  # noqa: E402
from numad.topology.discover import discover  # noqa: E402
from numad.topology.model import Topology  # noqa: E402
from numad.topology.record import load_fixture  # noqa: E402


@dataclass
class Share:
    """Paired out of all, counted twice: over the spanning containers and over all."""

    spanning: list[int] = field(default_factory=lambda: [0, 0])
    every: list[int] = field(default_factory=lambda: [0, 0])

    def add(self, paired: int, total: int, *, spanning: bool) -> None:
        for tally in (self.every, self.spanning) if spanning else (self.every,):
            tally[0] += paired
            tally[1] += total

    @staticmethod
    def text(tally: list[int]) -> str:
        return f"{tally[0] / tally[1]:.1%}" if tally[1] else "-"


@dataclass
class Tally:
    admitted: int = 0
    spanning: int = 0
    cpus: Share = field(default_factory=Share)
    memory: Share = field(default_factory=Share)
    seconds: list[float] = field(default_factory=list)


def count(
    tally: Tally, topo: CPUTopology, placed: Placement, memory: int, *, spanning: bool
) -> None:
    """One admitted container's pairs (see the module's docstring); ``memory``: the
    bytes it asked for."""
    if not placed.groups:
        return
    local = sum((g.cpus.bits & topo.numa.get(g.node, 0)).bit_count() for g in placed.groups)
    tally.cpus.add(local, len(placed.cpus), spanning=spanning)
    on_node: dict[int, int] = {}
    for g in placed.groups:
        on_node[g.node] = on_node.get(g.node, 0) + g.memory
    nodes = [g.node for g in placed.groups]
    paired = sum(min(size, memory * nodes.count(n) // len(nodes)) for n, size in on_node.items())
    tally.memory.add(paired, memory, spanning=spanning)


def churn(topo: Topology, gpu_vendor: str, seed: int, steps: int) -> dict[bool, Tally]:
    rng = random.Random(seed)  # noqa: S311 - a seeded, repeatable stream, no secrets
    hosts = {
        align: host(topo, gpu_vendor, Pick.LOCALITY, PolicyOptions(align_per_resource=align))
        for align in (False, True)
    }
    books = {align: b for align, (_, b) in hosts.items()}
    gpus = len(books[False].devices.inventory.classes["gpu"])
    tally = {align: Tally() for align in hosts}
    admitted: list[str] = []
    for step in range(steps):
        if admitted and rng.random() < 0.45:
            gone = admitted.pop(rng.randrange(len(admitted)))
            books = {a: release(b, gone) for a, b in books.items()}
            continue
        wanted = request(rng, f"w{step}", gpus, Policy.BEST_EFFORT)
        ok = {}
        for align, (engine, _) in hosts.items():
            started = time.perf_counter()
            books[align], outcome = admit(engine, books[align], wanted)
            tally[align].seconds.append(time.perf_counter() - started)
            ok[align] = outcome.admitted
            if not outcome.admitted:
                continue
            t = tally[align]
            t.admitted += 1
            spanning = not outcome.decisions[0][1].preferred
            t.spanning += spanning
            (container,) = wanted.containers
            memory = sum(container.memory.values())
            placed = outcome.placements["main"]
            count(t, engine.cpu_policy.topo, placed, memory, spanning=spanning)
        if not all(ok.values()):
            if any(ok.values()):  # the settings disagree: release what one admitted
                books = {a: release(b, wanted.name) if ok[a] else b for a, b in books.items()}
            continue
        admitted.append(wanted.name)
    return tally


def merged(tallies: list[Tally]) -> Tally:
    total = Tally()
    for t in tallies:
        total.admitted += t.admitted
        total.spanning += t.spanning
        total.seconds += t.seconds
        for mine, theirs in ((total.cpus, t.cpus), (total.memory, t.memory)):
            for a, b in ((mine.spanning, theirs.spanning), (mine.every, theirs.every)):
                a[0] += b[0]
                a[1] += b[1]
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-3", help="seeds, e.g. 0-3 (default)")
    parser.add_argument("--steps", type=int, default=600, help="steps per seed (600)")
    args = parser.parse_args()
    print(
        f"{'machine':<27}{'option':<7}{'admitted':>9}{'spanning':>9}"
        f"{'CPUs paired':>22}{'memory paired':>22}{'admit p50':>10}"
    )
    print(f"{'':<52}{'spanning':>11}{'all':>8}{'spanning':>14}{'all':>8}")
    ok = True
    with tempfile.TemporaryDirectory(prefix="numad-aligned-") as tmp:
        for label, (archive, gpu_vendor) in MACHINES.items():
            topo = discover(HostFS(load_fixture(archive, Path(tmp) / archive.stem)))
            runs = [churn(topo, gpu_vendor, seed, args.steps) for seed in seeds(args.seeds)]
            total = {align: merged([r[align] for r in runs]) for align in (False, True)}
            for align, t in total.items():
                median = statistics.median(t.seconds) * 1000 if t.seconds else 0.0
                print(
                    f"{label:<27}{'on' if align else 'off':<7}{t.admitted:>9}{t.spanning:>9}"
                    f"{Share.text(t.cpus.spanning):>11}{Share.text(t.cpus.every):>8}"
                    f"{Share.text(t.memory.spanning):>14}{Share.text(t.memory.every):>8}"
                    f"{median:>8.2f}ms"
                )
            on, off = total[True], total[False]
            if on.admitted != off.admitted or any(
                _ratio(mine) < _ratio(theirs)
                for mine, theirs in (
                    (on.cpus.spanning, off.cpus.spanning),
                    (on.memory.spanning, off.memory.spanning),
                )
            ):
                ok = False
    print(f"admissions equal, never fewer pairs with the option: {'yes' if ok else 'NO'}")
    return 0 if ok else 2


def _ratio(tally: list[int]) -> float:
    return tally[0] / tally[1] if tally[1] else 1.0


if __name__ == "__main__":
    sys.exit(main())
