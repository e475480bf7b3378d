"""Start-up: the checkpoint read back into the shared ``Holdings``.

Daemon side. Every recorded workload comes back exactly, repaired, or unplaced
(``numad.daemon.restore`` decides which); none is dropped while its spec can be
read, not even one whose managed root left the config (it is held, unwritten).
Released cgroups that still exist come back as orphans, and what each cgroup file
may still hold (its grant) until numad writes it again.
"""

from __future__ import annotations

import json

from numad.cpuset import CPUSet
from numad.daemon import state
from numad.daemon.commits import Commits
from numad.daemon.config import Config
from numad.daemon.holdings import Holdings
from numad.daemon.restore import restore
from numad.errors import NumadError, SpecError
from numad.host.cgroup import CgroupPath
from numad.host.targets import Log, union
from numad.observe import Problems
from numad.workload.shape import WorkloadSpec
from numad.workload.spec import parse_spec


def resume(  # noqa: PLR0917 - the parts start-up reads and fills
    held: Holdings,
    commits: Commits,
    checkpoint: state.Checkpoint,
    config: Config,
    health: Problems,
    log: Log,
) -> None:
    """Every recorded workload back: exactly, repaired, or unplaced; never dropped
    while its spec can be read."""
    roots = config.paths.managed_roots
    grants = commits.enforcer.grants  # what each file may still hold, until rewritten
    for path, cpus in checkpoint.grants.items():
        grants[path] = CPUSet.parse_list(cpus).bits
    for orphan in checkpoint.orphans:
        try:
            CgroupPath.parse(orphan).managed_by([CgroupPath.parse(r) for r in roots])
        except NumadError as err:
            log.warning("orphan_dropped", cgroup=orphan, problem=str(err))
            continue
        held.orphans.add(orphan)
    held.seen = set(checkpoint.seen) & checkpoint.workloads.keys()  # gone while down: released
    for name, record in sorted(checkpoint.workloads.items()):
        try:
            spec = _restored_spec(name, record, config)
        except NumadError as err:
            health.set(f"workload:{name}", f"{name}: dropped on restart: {err}")
            log.error("workload_dropped", workload=name, problem=str(err))
            continue
        held.specs[name] = spec
        for c in spec.containers:  # a checkpoint from before grants were recorded
            path, cpus = spec.container_cgroup(c), record.cpus.get(c.name, "")
            if CPUSet.parse_list(cpus).bits:
                grants[path] = grants.get(path, 0) | CPUSet.parse_list(cpus).bits
        held.books, what = restore(held.books, spec, record, held.cpu_policy, held.topology)
        if what.startswith("unplaced: "):
            commits.unplace(name, what.removeprefix("unplaced: "))
        elif what:
            log.warning("workload_replaced", workload=name, change=what)
        if commits.outside(spec):
            _hold_outside(held, spec, config, health, log)
    managed = held.orphans | {
        s.container_cgroup(c) for s in held.specs.values() for c in s.containers
    }
    for path in set(grants) - managed:  # numad no longer writes them
        del grants[path]


def _restored_spec(name: str, record: state.Record, config: Config) -> WorkloadSpec:
    """The recorded spec, read without the config's device classes (a class removed
    from the config leaves the workload unplaced, not dropped) and with its cgroup's
    top-level cgroup as a managed root if the config no longer has its root."""
    text = json.dumps(record.spec)
    roots = config.paths.managed_roots
    try:
        return parse_spec(text, "json", managed_roots=roots, device_classes=None)
    except SpecError:
        top = str(record.spec.get("cgroup", "")).split("/", maxsplit=1)[0]
        return parse_spec(text, "json", managed_roots=(*roots, top), device_classes=None)


def _hold_outside(
    held: Holdings, spec: WorkloadSpec, config: Config, health: Problems, log: Log
) -> None:
    """A workload whose cgroup a root taken out of the config held: its CPUs stay
    its own (in no pool, granted to no one), its cgroups as numad last wrote them,
    and numad is not ready until it is released or its root is back."""
    held.outside.add(spec.name)
    mine = [c for (w, _), c in held.books.cpu.assignments.items() if w == spec.name]
    cpus = CPUSet.from_bits(union(mine)).format_list()
    roots = ", ".join(config.paths.managed_roots)
    keeps = f"keeps its exclusive cpus {cpus}" if cpus else "holds no exclusive cpus for it"
    health.set(
        f"outside:{spec.name}",
        f"workload {spec.name}: its cgroup {spec.cgroup} is outside [paths] managed-roots"
        f" ({roots}); numad {keeps} and writes its cgroups no more;"
        f" release it (numad release {spec.name}) or add its root back and restart numad",
    )
    log.error("workload_outside_roots", workload=spec.name, cgroup=spec.cgroup, cpus=cpus)
