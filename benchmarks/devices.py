"""Devices placed by PCIe locality against the kubelet's lowest-index order: a churn.

Run from the repository root:

    .venv/bin/python benchmarks/devices.py [--seeds 0-3] [--steps 600]

Two machines with devices behind PCIe switches: the DGX-like synthetic machine
(fixtures/sysfs/224intel64-2pa56co2t+8gpu8nic-dgxlike: 8 GPUs and 8 InfiniBand NICs
in pairs under 4 switches) and the bundled 2-socket recording 32intel64-2p8co2t+8ve
(8 vector engines and 2 InfiniBand NICs under PLX switches; its "gpu" class here is
the vector engines). Per seed, one stream of arrivals and departures (45% of steps
release a random admitted workload): a container asking 1, 2, 4 or 8 "gpu" devices,
with no NIC or one, 2-8 exclusive CPUs and 1-4 GiB, under best-effort or
single-numa-node. The same stream is admitted on two hosts in lockstep, one with
``pick = "locality"`` for both classes and one with ``pick = "index"``, through
numad's own engine (numad.placement.admission.admit), as the daemon builds it.

Figures per machine and rule, over the containers given two or more devices:

- switch-local: the share whose devices all sit under one PCIe switch, among those
  for which such a set was free (found by brute force over the free devices, with
  the kubelet's per-node counts: the merge's nodes and the per-node split are the
  same under both rules, by construction);
- CPUs local: the share of their exclusive CPUs in their devices' local_cpulist (on
  both machines every device's local_cpulist is its whole socket, so this is 100%
  whichever rule: said, not hidden);
- admissions of the whole stream (locality must not admit fewer).

Target (issue 27): switch-local >= 95% where possible under locality. Exit status 0
when it held on every machine and admissions never dropped, 2 otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from numad.hostfs import HostFS  # noqa: E402
from numad.placement.admission import (  # noqa: E402
    Books,
    ContainerRequest,
    Engine,
    WorkloadRequest,
    admit,
    release,
)
from numad.placement.managers.cpu.state import CPUState  # noqa: E402
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy  # noqa: E402
from numad.placement.managers.cpu.topology import CPUTopology  # noqa: E402
from numad.placement.managers.device import (  # noqa: E402
    DeviceClass,
    DeviceInventory,
    DeviceState,
    Pick,
)
from numad.placement.managers.memory import MemoryState, MemoryTable  # noqa: E402
from numad.placement.policy import Machine, Policy, PolicyOptions  # noqa: E402
from numad.topology.discover import discover  # noqa: E402
from numad.topology.model import Topology  # noqa: E402
from numad.topology.pcie import SWITCH, common_path  # noqa: E402
from numad.topology.record import load_fixture  # noqa: E402

GIB = 1 << 30
SWITCH_LOCAL_TARGET = 0.95
MACHINES = {
    "dgx-like (8 GPU, 8 NIC)": (
        ROOT / "fixtures/sysfs/224intel64-2pa56co2t+8gpu8nic-dgxlike.tar.bz2",
        "0x10de",
    ),
    "2-socket, 8 VE (recorded)": (ROOT / "fixtures/sysfs/32intel64-2p8co2t+8ve.tar.bz2", "0x1bcf"),
}
NIC_VENDOR = "0x15b3"


@dataclass
class Tally:
    admitted: int = 0
    multi: int = 0
    possible: int = 0  # multi-device containers for which a switch-local set was free
    switch_local: int = 0  # ... and that got one
    cpus: int = 0
    cpus_local: int = 0


def host(
    topo: Topology, gpu_vendor: str, pick: Pick, options: PolicyOptions | None = None
) -> tuple[Engine, Books]:
    """An engine and empty books for ``topo``: 2 CPUs reserved, the memory manager on,
    the classes "gpu" (``gpu_vendor``) and "nic" picking by ``pick``."""
    view = CPUTopology.from_topology(topo)
    policy = StaticPolicy(view, StaticOptions())
    reserved = policy.reserve(2)
    engine = Engine(
        Machine(topo.node_ids), policy, options=options or PolicyOptions(), memory_manager=True
    )
    classes = [
        DeviceClass("gpu", vendor=gpu_vendor, pick=pick),
        DeviceClass("nic", vendor=NIC_VENDOR, pick=pick),
    ]
    devices = DeviceState(DeviceInventory.build(topo, classes))
    return engine, Books(
        CPUState(view.all, reserved), MemoryState(MemoryTable.build(topo)), devices
    )


def switch_set_free(devices: DeviceState, chosen: dict[str, tuple[str, ...]]) -> bool:
    """Whether some free set with the same per-class, per-node counts as ``chosen``
    (the devices just taken count as free) shares a switch."""
    node = {d.address: d.node for ds in devices.inventory.classes.values() for d in ds}
    taken = {a for v in chosen.values() for a in v}
    choices = []
    for name, picked in chosen.items():
        for n in {node[a] for a in picked}:
            count = sum(1 for a in picked if node[a] == n)
            free = [d.address for d in devices.free(name) if d.node == n]
            free += [a for a in picked if node[a] == n and a in taken]
            choices.append(list(itertools.combinations(sorted(set(free)), count)))
    paths = paths_of(devices)
    return any(
        kind(paths, [a for part in combo for a in part]) == SWITCH
        for combo in itertools.product(*choices)
    )


def paths_of(devices: DeviceState) -> dict[str, tuple[str, ...]]:
    """Every device's PCIe path, by address."""
    return {d.address: d.path for ds in devices.inventory.classes.values() for d in ds}


def kind(paths: dict[str, tuple[str, ...]], addresses: list[str]) -> str | None:
    """What the devices at ``addresses`` share: SWITCH, a root port, ... or None."""
    shared = common_path([paths[a] for a in addresses])
    return None if shared is None else shared.kind


def request(
    rng: random.Random, name: str, gpus: int, policy: Policy | None = None
) -> WorkloadRequest:
    """An arrival; ``policy`` overrides the drawn one (the draws stay the same, so
    benchmarks/aligned.py sees the same stream under best-effort)."""
    want = {"gpu": rng.choice([n for n in (1, 2, 4, 8) if n <= gpus]), "nic": rng.choice((0, 1))}
    container = ContainerRequest(
        "main",
        rng.choice((2, 4, 8)),
        {"memory": rng.choice((1, 2, 4)) * GIB},
        {k: v for k, v in want.items() if v},
    )
    drawn = rng.choice((Policy.BEST_EFFORT, Policy.SINGLE_NUMA_NODE))
    return WorkloadRequest(name, (container,), policy or drawn)


def churn(topo: Topology, gpu_vendor: str, seed: int, steps: int) -> dict[Pick, Tally]:
    rng = random.Random(seed)  # noqa: S311 - a seeded, repeatable stream, no secrets
    hosts = {pick: host(topo, gpu_vendor, pick) for pick in (Pick.LOCALITY, Pick.INDEX)}
    books = {pick: b for pick, (_, b) in hosts.items()}
    gpus = len(books[Pick.INDEX].devices.inventory.classes["gpu"])
    tally = {pick: Tally() for pick in hosts}
    admitted: list[str] = []
    for step in range(steps):
        if admitted and rng.random() < 0.45:
            gone = admitted.pop(rng.randrange(len(admitted)))
            books = {p: release(b, gone) for p, b in books.items()}
            continue
        wanted = request(rng, f"w{step}", gpus)
        decided = {}
        for pick, (engine, _) in hosts.items():
            books[pick], decided[pick] = admit(engine, books[pick], wanted)
        ok = {pick: o.admitted for pick, o in decided.items()}
        for pick in hosts:
            tally[pick].admitted += ok[pick]
        if not all(ok.values()):
            if any(ok.values()):  # the rules disagree: release what one admitted
                books = {p: release(b, wanted.name) if ok[p] else b for p, b in books.items()}
            continue
        admitted.append(wanted.name)
        for pick, outcome in decided.items():
            placed = outcome.placements["main"]
            devices = books[pick].devices
            chosen = {k: tuple(v) for k, v in placed.devices.items()}
            flat = [a for v in chosen.values() for a in v]
            t = tally[pick]
            local = 0
            for name, addresses in chosen.items():
                for d in devices.inventory.classes[name]:
                    if d.address in addresses and d.local_cpus is not None:
                        local |= d.local_cpus.bits
            t.cpus += len(placed.cpus)
            t.cpus_local += (placed.cpus.bits & local).bit_count()
            if len(flat) < 2:
                continue
            t.multi += 1
            if switch_set_free(devices, chosen):
                t.possible += 1
                t.switch_local += kind(paths_of(devices), flat) == SWITCH
    return tally


def seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-3", help="seeds, e.g. 0-3 (default)")
    parser.add_argument("--steps", type=int, default=600, help="steps per seed (600)")
    args = parser.parse_args()
    print(
        f"{'machine':<28}{'rule':<10}{'admitted':>9}{'multi-dev':>10}{'possible':>9}"
        f"{'switch-local':>13}{'CPUs local':>11}"
    )
    ok = True
    with tempfile.TemporaryDirectory(prefix="numad-devices-") as tmp:
        for label, (archive, gpu_vendor) in MACHINES.items():
            topo = discover(HostFS(load_fixture(archive, Path(tmp) / archive.stem)))
            total = {pick: Tally() for pick in (Pick.LOCALITY, Pick.INDEX)}
            for seed in seeds(args.seeds):
                for pick, t in churn(topo, gpu_vendor, seed, args.steps).items():
                    s = total[pick]
                    s.admitted += t.admitted
                    s.multi += t.multi
                    s.possible += t.possible
                    s.switch_local += t.switch_local
                    s.cpus += t.cpus
                    s.cpus_local += t.cpus_local
            for pick, s in total.items():
                share = s.switch_local / s.possible if s.possible else 1.0
                cpus = s.cpus_local / s.cpus if s.cpus else 1.0
                print(
                    f"{label:<28}{pick.value:<10}{s.admitted:>9}{s.multi:>10}{s.possible:>9}"
                    f"{share:>12.1%}{cpus:>11.1%}"
                )
            loc, idx = total[Pick.LOCALITY], total[Pick.INDEX]
            share = loc.switch_local / loc.possible if loc.possible else 1.0
            if share < SWITCH_LOCAL_TARGET or loc.admitted < idx.admitted:
                ok = False
    print(
        f"target: switch-local >= {SWITCH_LOCAL_TARGET:.0%} where possible under locality,"
        f" admissions not below index: {'met' if ok else 'NOT met'}"
    )
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
