"""Discovery of CPUs, physical cores, packages and L3 groups from /sys/devices/system/cpu.

Discovery edge: reads host files only through the ``Reader``. Quirks of real
machines are handled where they are met, each with a comment naming the file.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass

from numad.cpuset import CPUSet, digits
from numad.topology.model import CacheGroup, Core, Package
from numad.topology.sysread import Reader

CPU_DIR = "/sys/devices/system/cpu"
_CPU_NAME = re.compile(r"cpu(\d{1,7})")
_INDEX_NAME = re.compile(r"index(\d{1,3})")


@dataclass(frozen=True, slots=True)
class CPUFacts:
    """What sysfs says of one online CPU, before grouping."""

    id: int
    package_id: int | None  # physical_package_id, None where -1, missing or garbage
    package_siblings: CPUSet
    die: int | None
    cluster: int | None
    core_id: int | None
    siblings: CPUSet


def cpu_ids(r: Reader) -> tuple[CPUSet, CPUSet]:
    """All CPUs the kernel knows of, and the online ones among them."""
    known = CPUSet(int(m.group(1)) for n in r.fs.listdir(CPU_DIR) if (m := _CPU_NAME.fullmatch(n)))
    if not known:
        # Quirk: a tree without cpuN directories still names its CPUs in present/possible.
        known = r.id_list(f"{CPU_DIR}/present", CPUSet) or CPUSet()
    online = r.id_list(f"{CPU_DIR}/online", CPUSet)
    if online is None:
        # Quirk: old kernels have no cpu/online list; each CPU then has its own
        # cpuN/online flag, except the boot CPU (not hot-pluggable), which has none.
        online = CPUSet(c for c in known if r.integer(f"{CPU_DIR}/cpu{c}/online") != 0)
    if not online.issubset(known):
        # Only a CPU with a directory has a topology to read.
        r.note(f"{CPU_DIR}/online", f"names cpus {online - known} that have no directory (ignored)")
        online &= known
    return known, online


def cpu_facts(r: Reader, cpu: int, online: CPUSet) -> CPUFacts:
    base = f"{CPU_DIR}/cpu{cpu}/topology"
    package_id = r.integer(f"{base}/physical_package_id")
    if package_id is not None and package_id < 0:
        # Quirk: ppc64 LPARs (and some VMs) report physical_package_id -1; the
        # package is then known only by its sibling set, as hwloc groups it.
        package_id = None
    die = r.integer(f"{base}/die_id")
    cluster = r.integer(f"{base}/cluster_id")
    siblings = r.cpus(f"{base}/core_cpus_list", None) or r.cpus(
        f"{base}/thread_siblings_list", f"{base}/thread_siblings"
    )
    package_siblings = _package_cpus(r, cpu) if package_id is None else None
    me = CPUSet((cpu,))
    # Offline siblings keep no topology: a core is its online threads.
    siblings = ((siblings or me) & online) | me
    return CPUFacts(
        id=cpu,
        package_id=package_id,
        # Quirk: old kernels (2ps3-2t, a PS3 on 2.6) write neither physical_package_id
        # nor core_siblings; a core's threads still share one package.
        package_siblings=((package_siblings or siblings) & online) | me,
        die=die if die is not None and die >= 0 else None,  # arm64 reports die_id -1
        cluster=cluster if cluster is not None and cluster >= 0 else None,
        core_id=r.integer(f"{base}/core_id"),
        siblings=siblings,
    )


def _package_cpus(r: Reader, cpu: int) -> CPUSet | None:
    """The kernel's map of the CPUs sharing cpu's package (``core_siblings`` on old kernels)."""
    base = f"{CPU_DIR}/cpu{cpu}/topology"
    return r.cpus(f"{base}/package_cpus_list", None) or r.cpus(
        f"{base}/core_siblings_list", f"{base}/core_siblings"
    )


def _partition(sets: Iterable[CPUSet]) -> list[CPUSet]:
    """Merge overlapping sets into disjoint groups (sibling files can disagree)."""
    groups: list[CPUSet] = []
    for s in dict.fromkeys(sets):  # sibling files usually agree: pair each set once
        merged = s
        for g in [g for g in groups if not g.isdisjoint(s)]:
            groups.remove(g)
            merged |= g
        groups.append(merged)
    return sorted(groups, key=CPUSet.min)


def group_packages(
    r: Reader, facts: dict[int, CPUFacts]
) -> tuple[tuple[Package, ...], dict[int, int]]:
    """Packages and each CPU's package id."""
    by_id: dict[int, set[int]] = {}
    unnamed: list[CPUSet] = []
    for f in facts.values():
        if f.package_id is not None:
            by_id.setdefault(f.package_id, set()).add(f.id)
    named = {c: p for p, cpus in by_id.items() for c in cpus}
    for f in facts.values():
        if f.package_id is None:
            # A CPU whose id is unusable joins a sibling's named package if it has one.
            known = sorted(named[c] for c in f.package_siblings if c in named)
            if known:
                by_id[known[0]].add(f.id)
            else:
                unnamed.append(CPUSet(c for c in f.package_siblings if c not in named))
    # A split part and a group of -1 CPUs get fresh ids after every real one.
    next_id = max(by_id, default=-1) + 1
    found: list[tuple[int, CPUSet]] = []
    for p, cpus in sorted(by_id.items()):
        first, *rest = _split_by_package_cpus(r, CPUSet(cpus))
        found.append((p, first))
        for part in rest:
            found.append((next_id, part))
            next_id += 1
    for group in _partition(unnamed):
        found.append((next_id, group))
        next_id += 1
    packages = tuple(Package(id=p, cpus=cpus) for p, cpus in sorted(found))
    owner = {c: p.id for p in packages for c in p.cpus}
    return packages, owner


def _split_by_package_cpus(r: Reader, group: CPUSet) -> list[CPUSet]:
    """The CPUs of one physical_package_id, split where package_cpus names separate packages.

    Quirk: ia64 before Montecito has no PAL logical-to-physical call, so the
    kernel builds physical_package_id from the SAL platform id with the package
    part 0 (arch/ia64/kernel/smpboot.c, identify_siblings): both single-core
    sockets of a node read the same id, while package_cpus (core_siblings)
    names each socket alone (16ia64-8n2s). The ABI defines package_cpus as the
    CPUs sharing the package (Documentation/ABI/stable/sysfs-devices-system-cpu);
    where the two disagree the map wins, as in hwloc. One read per package
    unless they disagree.
    """
    mask = _package_cpus(r, group.min())
    if mask is None or group.issubset(mask):
        return [group]
    masks = []
    for c in group:
        own = _package_cpus(r, c)
        masks.append((own & group) | CPUSet((c,)) if own is not None else group)
    return _partition(masks)


def dies_within_packages(facts: dict[int, CPUFacts], owner: dict[int, int]) -> dict[int, CPUFacts]:
    """``die`` as the die's index within its package, whatever the kernel numbers.

    Quirk: ``die_id`` counts within the package up to Linux 6.8 and across the
    machine from 6.9 (x86's topology rewrite): the second package's first die is
    die 0 on 6.1 and die 1 on 6.12. Renumbering the distinct ids of each package
    in order gives the same answer on both.
    """
    ids: dict[int, set[int]] = {}
    for c, f in facts.items():
        if f.die is not None:
            ids.setdefault(owner[c], set()).add(f.die)
    index = {(p, d): i for p, dies in ids.items() for i, d in enumerate(sorted(dies))}
    return {
        c: f if f.die is None else dataclasses.replace(f, die=index[owner[c], f.die])
        for c, f in facts.items()
    }


def group_cores(facts: dict[int, CPUFacts], owner: dict[int, int]) -> tuple[Core, ...]:
    """Physical cores: SMT sibling sets, split where their core_ids differ.

    Quirk: ``core_id`` is not unique across packages, nor across the dies of
    one package on kernels without ``die_id`` (AMD multi-die packages), so
    CPUs are never joined by core_id: a core is (part of) a sibling set.
    """
    cores = []
    for group in _partition(f.siblings for f in facts.values()):
        # A sibling set names CPUs of two packages only in a broken tree; it is
        # then split so that every core stays inside one package.
        parts: dict[int, list[int]] = {}
        for c in group:
            parts.setdefault(owner[c], []).append(c)
        for package, members in parts.items():
            for threads in _split_by_core_id(members, facts):
                lowest = facts[threads[0]]
                cores.append(
                    Core(
                        id=lowest.id,
                        package=package,
                        die=lowest.die,
                        core_id=lowest.core_id,
                        cpus=CPUSet(threads),
                    )
                )
    return tuple(sorted(cores, key=lambda core: core.id))


def _split_by_core_id(members: list[int], facts: dict[int, CPUFacts]) -> list[list[int]]:
    """One package's sibling set, split into cores where its CPUs' core_ids differ.

    Quirk: on AMD family 15h (Bulldozer, Piledriver) the kernel pairs the two
    cores of a compute unit as SMT siblings (arch/x86/kernel/smpboot.c,
    match_smt(): same compute unit counts as "smt"), so thread_siblings names
    both although each has its own core_id (64amd64-4s2n4ca2co, cpu0 core_id 0
    and cpu1 core_id 1 in thread_siblings 0-1). They are separate cores, each
    with its own pipeline: hwloc and cAdvisor (the kubelet's CPU manager) count
    them so. Where any core_id is missing the sibling set stays one core.
    """
    keys = [(facts[c].die, facts[c].core_id) for c in members]
    if any(core_id is None for _, core_id in keys) or len(set(keys)) == 1:
        return [members]
    cores: dict[tuple[int | None, int | None], list[int]] = {}
    for c, key in zip(members, keys, strict=True):
        cores.setdefault(key, []).append(c)
    return sorted(cores.values(), key=min)


def l3_groups(r: Reader, online: CPUSet, cores: dict[int, CPUSet]) -> tuple[CacheGroup, ...]:
    """L3 caches, from cache/index*/ of each online CPU; ``cores``: each CPU's core threads.

    A CPU already inside a known L3's shared_cpu_list is not read again, which
    keeps discovery fast on large machines.
    """
    found: list[tuple[CPUSet, int | None, int | None]] = []
    covered = CPUSet()
    for cpu in online:
        if cpu in covered:
            continue
        l3 = _l3_of(r, cpu, online, cores[cpu])
        if l3 is None:
            continue
        shared, cache_id, size = l3
        shared = shared - covered  # sets must stay disjoint even if files disagree
        found.append((shared, cache_id, size))
        covered |= shared
    found.sort(key=lambda g: g[0].min())
    return tuple(
        CacheGroup(id=i, cpus=cpus, cache_id=cache_id, size_kb=size)
        for i, (cpus, cache_id, size) in enumerate(found)
    )


def _l3_of(
    r: Reader, cpu: int, online: CPUSet, core: CPUSet
) -> tuple[CPUSet, int | None, int | None] | None:
    base = f"{CPU_DIR}/cpu{cpu}/cache"
    for name in r.fs.listdir(base):
        if not _INDEX_NAME.fullmatch(name):
            continue
        if r.integer(f"{base}/{name}/level") != 3:
            continue
        kind = r.text(f"{base}/{name}/type")
        if kind not in (None, "Unified", "Data"):
            continue
        # Every thread of a core shares all of the core's caches.
        shared = _shared_cpus(r, f"{base}/{name}", cpu) or core
        return (
            (shared & online) | CPUSet((cpu,)),
            r.integer(f"{base}/{name}/id"),
            _size_kb(r, f"{base}/{name}/size"),
        )
    return None


def _shared_cpus(r: Reader, index: str, cpu: int) -> CPUSet | None:
    """The CPUs sharing one cache of ``cpu``; None where the files cannot say.

    Quirks: a cache is always shared with its own CPU, so a shared_cpu_list
    that does not name it is stale and shared_cpu_map is read instead
    (64fake-4n2s2ca2c2t copies cpu0's list into every CPU; its maps are right).
    ia64 kernels leave shared_cpu_map empty for the L3 (8ia64-2s2c2t), as
    hwloc notes: the caller then takes the CPU's core.
    """
    listed = r.id_list(f"{index}/shared_cpu_list", CPUSet)
    if listed is not None and cpu in listed:
        return listed
    mask = r.id_mask(f"{index}/shared_cpu_map", CPUSet)
    if mask is not None and cpu in mask:
        if listed is not None:
            r.note(f"{index}/shared_cpu_list", f"does not name cpu {cpu}; shared_cpu_map read")
        return mask
    if listed is not None or mask is not None:
        r.note(
            f"{index}/shared_cpu_map", f"does not name cpu {cpu}; the cache is taken as its core's"
        )
    return None


def _size_kb(r: Reader, path: str) -> int | None:
    text = r.text(path)
    if text is None:
        return None
    units = {"K": 1, "M": 1024, "G": 1024 * 1024}
    number, unit = (text[:-1], text[-1].upper()) if text[-1:].isalpha() else (text, "")
    if not digits(number) or (unit and unit not in units):
        r.note(path, f"not a cache size: {text[:40]!r} (ignored)")
        return None
    # A bare number is bytes; sysfs writes "32768K".
    return int(number) * units[unit] if unit else int(number) // 1024
