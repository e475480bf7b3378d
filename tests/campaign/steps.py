"""The fault campaign's steps inside numad's own life: admit, release, resize, cgroup
create and remove, CPU offline and online (hotplug), vector engines leaving and
coming back, clock advance past the release grace, config change and restart,
crash and restart, and faults (cgroup EBUSY/EINVAL/ENOSPC/EACCES, checkpoint
short writes/ENOSPC/EIO/fsync failures, exceptions inside the reconcile and
hotplug loops). Each takes the ``Simulation`` and may raise ``Crash``.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from numad.cpuset import CPUSet
from numad.errors import CheckpointError
from numad.host import durable
from numad.host.cgroup.v2 import CgroupV2Backend
from numad.host.scratch import scratch_mkdir
from tests.campaign.faults import Crash
from tests.campaign.world import ALL, NAMES, STRAYS, TOPS, VE_DEVICES, Simulation, Violation


def admit(sim: Simulation) -> None:
    free = [n for n in NAMES if n not in sim.daemon.specs]
    if not free:
        return
    name = sim.rng.choice(free)
    if sim.rng.random() < 0.8:
        scratch_mkdir(sim.cgroups, f"numad.slice/{name}")
        sim.removed.discard(name)
    spec: dict[str, Any] = {"name": name, "cgroup": f"numad.slice/{name}"}
    spec["cpus"] = sim.rng.choice((1, 2, 3, 4, 6, "500m"))
    spec["movable"] = NAMES.index(name) % 2 == 0  # half, and no draw: the seeds keep their runs
    if sim.devices and sim.rng.random() < 0.3:
        spec["devices"] = {"ve": 1}
    try:
        sim.admit(spec)
    except CheckpointError:
        if name in sim.daemon.specs:
            raise Violation(f"{name}: checkpoint failed but admitted in memory") from None


def release(sim: Simulation) -> None:
    if not sim.daemon.specs:
        return
    name = sim.rng.choice(sorted(sim.daemon.specs))
    was_answered = name in sim.answered
    sim.answered.discard(name)  # a crash inside may or may not have released it
    try:
        sim.daemon.release(name)
    except CheckpointError:
        if name not in sim.daemon.specs:
            raise Violation(f"{name}: checkpoint failed but released in memory") from None
        if was_answered:
            sim.answered.add(name)


def resize(sim: Simulation) -> None:
    """An admitted exclusive workload grows or shrinks in place (PATCH): a refusal
    changes neither the books nor the checkpoint; a grow keeps every CPU it held, a
    shrink keeps a subset; a failed checkpoint write leaves the books as they were."""
    daemon = sim.daemon
    held = daemon.books.cpu.assignments
    names = sorted(n for n in daemon.specs if held.get((n, "main")))
    if not names:
        return
    name = sim.rng.choice(names)
    before, books = held[(name, "main")], daemon.books
    cpus = sim.rng.choice((1, 2, 3, 4, 6, 8, 12))
    written = sim.checkpoint_bytes()
    try:
        status, answer = daemon.resize(name, json.dumps({"cpus": cpus}).encode())
    except CheckpointError:
        sim.expect(daemon.books is books, f"{name}: checkpoint failed but resized in memory")
        return
    sim.expect(status in (200, 409), f"{name}: resize answered {status}: {answer}")
    sim.resizes["resized" if status == 200 else "refused"] += 1
    after = daemon.books.cpu.assignments.get((name, "main"), 0)
    if status == 409:
        sim.expect(daemon.books is books, f"{name}: refused resize changed the books")
        sim.expect(sim.checkpoint_bytes() == written, f"{name}: refused resize wrote")
        return
    sim.expect(after.bit_count() == cpus, f"{name}: resized to {after.bit_count()}, not {cpus}")
    grew, shrank = after & before == before, after & ~before == 0
    if not (grew or shrank):  # re-placed whole: only a movable one, only to grow
        sim.expect(daemon.specs[name].movable, f"{name}: resize both added and removed CPUs")
        sim.expect(cpus > before.bit_count(), f"{name}: re-placed to shrink")
        sim.resizes["re-placed"] += 1


def move(sim: Simulation) -> None:
    """A workload one CPU larger than any node has free: it fits only if movable
    workloads move (when the machine has that many free). The moved ones are
    movable and keep their size; the others keep their CPUs. Half the time numad
    crashes at one of the change's first dozen cgroup writes: in the middle of a
    change to several workloads (the invariants are checked after every write)."""
    daemon = sim.daemon
    free = [n for n in NAMES if n not in daemon.specs]
    if not free:
        return
    topo, cpu = daemon.engine.cpu_policy.topo, daemon.books.cpu
    want = max((cpu.available & mask).bit_count() for mask in topo.numa.values()) + 1
    name = sim.rng.choice(free)
    scratch_mkdir(sim.cgroups, f"numad.slice/{name}")
    sim.removed.discard(name)
    before, specs = dict(cpu.assignments), dict(daemon.specs)
    spec = {"name": name, "cgroup": f"numad.slice/{name}", "cpus": want}
    if sim.rng.random() < 0.5:
        sim.faults.crash_in = sim.rng.randrange(0, 12)
    try:
        admitted = sim.admit(spec)
    except CheckpointError:
        return
    finally:
        sim.faults.crash_in = -1
    after = sim.daemon.books.cpu.assignments
    moved = [k for k, bits in before.items() if after.get(k) != bits]
    for key in moved:  # moved: admitted again by its request (all of it, after hotplug)
        sim.expect(specs[key[0]].movable, f"{key[0]}: not movable, but moved")
        asked = {c.name: c.cpus for c in specs[key[0]].to_request().containers}[key[1]]
        sim.expect(
            after.get(key, 0).bit_count() == asked,
            f"{key[0]}: moved to {after.get(key, 0).bit_count()} CPUs, asked {asked}",
        )
    sim.expect(admitted or not moved, f"{name}: rejected, but workloads moved")
    if moved:
        sim.moves["admissions"] += 1
        sim.moves["moved"] += len({k[0] for k in moved})


def cgroup_churn(sim: Simulation) -> None:
    if sim.rng.random() < 0.2:  # a top-level cgroup comes or goes (a slice, a scope)
        top = sim.rng.choice(TOPS)
        if (sim.cgroups / top).is_dir():
            shutil.rmtree(sim.cgroups / top)
        else:
            CgroupV2Backend(sim.cgroups, [top], emulate_kernel=True).ensure(top)
        return
    name = sim.rng.choice(NAMES + STRAYS)  # a name's cgroup, or one never admitted
    spec = sim.daemon.specs.get(name)
    path = spec.cgroup if spec is not None else f"numad.slice/{name}"
    if (sim.cgroups / path).is_dir():
        sim.remove(path)  # a stray's goes with the workloads below it
        sim.removed.add(name)
    else:
        sim.make(path)


def admit_below(sim: Simulation) -> None:
    """A workload whose cgroup lies below a cgroup that is no workload's (``x0``, or
    ``x2`` beside ``x2/inner``), mostly one numad has isolated: numad gives it its own
    cpuset back and isolates the strays it bounded in its place, first. Each cgroup
    that the isolated one bounded at the start runs on no written exclusive grant at
    any write of the step (checked after each); its release isolates it again."""
    free = [n for n in NAMES if n not in sim.daemon.specs]
    if not free:
        return
    name, above = sim.rng.choice(free), f"numad.slice/{sim.rng.choice(('x0', 'x2'))}"
    if sim.rng.random() < 0.5:
        scratch_mkdir(sim.cgroups, f"{above}/inner")
    if not (sim.cgroups / above).is_dir():
        scratch_mkdir(sim.cgroups, above)
    if sim.rng.random() < 0.7:
        sim.reconcile_pass()  # found and isolated before the workload comes, mostly
    path = f"{above}/{name}"
    pool = sim.daemon.books.cpu.shared_pool
    isolated = above in sim.daemon.others  # else nothing bounds them (no pass, no event)
    sim.bounded = {
        str(d.relative_to(sim.cgroups))
        for d in (sim.cgroups / above).rglob("*")
        if isolated and d.is_dir() and not sim.runs_on(str(d.relative_to(sim.cgroups))) & ~pool
    } - {path}
    scratch_mkdir(sim.cgroups, path)
    sim.removed.discard(name)
    spec = {"name": name, "cgroup": path, "cpus": sim.rng.choice((1, 2, 4, "500m"))}
    spec["movable"] = NAMES.index(name) % 2 == 0
    sim.faults.injected["admitted below a stray"] += 1
    try:
        sim.admit(spec)
    except CheckpointError:
        if name in sim.daemon.specs:
            raise Violation(f"{name}: checkpoint failed but admitted in memory") from None
    finally:
        sim.bounded = set()


def hotplug(sim: Simulation) -> None:
    online_file = sim.root / "sys/devices/system/cpu/online"
    online = CPUSet.parse_list(online_file.read_text())
    victim = sim.rng.choice(sorted(ALL))
    if victim in online and len(online) > 8:
        new = online - CPUSet([victim])
        sim.faults.injected["cpu offline"] += 1
    else:
        new = online | CPUSet([victim])
    online_file.write_text(new.format_list() + "\n")
    if sim.rng.random() < 0.2:
        sim.faults.loop_exception = True
    sim.daemon.supervisor.run_once("hotplug", sim.daemon.rediscover)


def device_churn(sim: Simulation) -> None:
    """A vector engine leaves (removed, or its driver not bound yet) or comes back;
    numad hears of it by hotplug or at its next start."""
    devices, stash = sim.root / "sys/bus/pci/devices", sim.root / "stash"
    stash.mkdir(exist_ok=True)
    address = sim.rng.choice(VE_DEVICES)
    if (devices / address).exists():
        (devices / address).rename(stash / address)
        sim.faults.injected["device removed"] += 1
    elif (stash / address).exists():
        (stash / address).rename(devices / address)
    if sim.rng.random() < 0.5:
        sim.daemon.supervisor.run_once("hotplug", sim.daemon.rediscover)
    else:
        sim.restart()


def reconcile(sim: Simulation) -> None:
    if sim.daemon.specs and sim.rng.random() < 0.2:  # exists() is asked of each
        sim.faults.loop_exception = True
        if sim.reconcile_pass():
            raise Violation("an injected exception did not reach the supervisor")
        if not sim.daemon.health.has("loop:reconcile"):
            raise Violation("a failed reconcile pass is not in health")
        return
    sim.reconcile_pass()


def advance_clock(sim: Simulation) -> None:
    sim.clock_now += sim.rng.choice((1.0, 10.0, 31.0))


def checkpoint_fault(sim: Simulation) -> None:
    fault = sim.rng.choice(list(durable.Fault))
    sim.faults.injected[f"checkpoint {fault}"] += 1
    sim.daemon.syscalls = durable.Syscalls.injecting(fault)
    roll = sim.rng.random()
    try:
        (admit if roll < 0.5 else release if roll < 0.8 else resize)(sim)
    finally:
        sim.daemon.syscalls = durable.SYSCALLS


def crash_soon(sim: Simulation) -> None:
    sim.faults.crash_in = sim.rng.randrange(0, 3)
    roll = sim.rng.random()
    (admit if roll < 0.5 else release if roll < 0.8 else resize)(sim)
    sim.faults.crash_in = -1


def crash_in_checkpoint(sim: Simulation) -> None:
    sim.faults.injected["crash inside a checkpoint write"] += 1

    def dying(fd: int, data: memoryview) -> int:
        os.write(fd, data[: len(data) // 2])
        raise Crash

    sim.daemon.syscalls = durable.Syscalls(write=dying)
    roll = sim.rng.random()
    (admit if roll < 0.5 else release if roll < 0.8 else resize)(sim)


def restart(sim: Simulation) -> None:
    sim.restart()


def config_change(sim: Simulation) -> None:
    sim.faults.injected["config change"] += 1
    sim.restart(change_config=True)
