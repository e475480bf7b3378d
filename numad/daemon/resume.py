"""Start-up: the checkpoint read back into the shared ``Holdings``.

Daemon side. Every recorded workload comes back exactly, repaired, or unplaced
(``numad.daemon.restore`` decides which); none is dropped while its spec can be
read. Released cgroups that still exist come back as orphans, and what each cgroup
file may still hold (its grant) until numad writes it again.
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
from numad.host.targets import Log
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
            spec = _restored_spec(name, record, config, health)
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
    managed = held.orphans | {
        s.container_cgroup(c) for s in held.specs.values() for c in s.containers
    }
    for path in set(grants) - managed:  # numad no longer writes them
        del grants[path]


def _restored_spec(
    name: str, record: state.Record, config: Config, health: Problems
) -> WorkloadSpec:
    """The recorded spec, read without the config's device classes (a class removed
    from the config leaves the workload unplaced, not dropped); a cgroup now
    outside the managed roots keeps its workload, flagged, holding its CPUs."""
    text = json.dumps(record.spec)
    roots = config.paths.managed_roots
    try:
        return parse_spec(text, "json", managed_roots=roots, device_classes=None)
    except SpecError:
        cgroup = str(record.spec.get("cgroup", ""))
        spec = parse_spec(
            text,
            "json",
            managed_roots=(*roots, cgroup.split("/", maxsplit=1)[0]),
            device_classes=None,
        )
    health.set(
        f"workload:{name}",
        f"{name}: cgroup {spec.cgroup} is outside the managed roots"
        f" ({', '.join(roots)}); numad cannot write it; release it or add its root back",
    )
    return spec
