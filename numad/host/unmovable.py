"""What may still run on exclusive CPUs and numad cannot move: the root cgroup's
tasks, read from the hierarchy and ``/proc`` for the host view (``numad host``)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from numad.cpuset import CPUSet

PF_KTHREAD = 0x00200000  # include/linux/sched.h: this task is a kernel thread


def unmovable(root: Path | None, exclusive: CPUSet, proc: Path = Path("/proc")) -> dict[str, Any]:
    """What still may run on exclusive CPUs and numad cannot move: the tasks of the
    root cgroup (kernel threads, and any process left there: no cpuset applies to
    the root), listed with their name and allowed CPUs where ``/proc`` shows them
    (the unit's ProtectProc=invisible hides kernel threads: those are counted)."""
    found: list[dict[str, Any]] = []
    hidden = 0
    pids: list[int] = []
    if root is not None and exclusive:
        with contextlib.suppress(OSError, ValueError):
            pids = [int(p) for p in (root / "cgroup.procs").read_text().split()]
    for pid in pids:
        try:
            stat = (proc / str(pid) / "stat").read_text()
            status = (proc / str(pid) / "status").read_text()
        except OSError:
            hidden += 1  # gone, or hidden from numad
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        flags = int(rest.split()[6])  # field 9 of /proc/PID/stat (proc(5))
        allowed = next(
            (
                line.split(":", 1)[1].strip()
                for line in status.splitlines()
                if line.startswith("Cpus_allowed_list:")
            ),
            "",
        )
        cpus = CPUSet.parse_list(allowed)
        if not cpus & exclusive:
            continue
        kernel = bool(flags & PF_KTHREAD)
        found.append({"pid": pid, "name": name, "kernel_thread": kernel, "cpus": str(cpus)})
    return {"tasks": found, "not_shown": hidden}
