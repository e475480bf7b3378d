"""Where a workload's anonymous memory is, and the system call that moves it.

Edge module: reads cgroups' ``memory.numa_stat`` and
``/sys/devices/system/node/nodeN/meminfo``, and calls migrate_pages(2); it
writes no file. ``numad.host.memory_move`` runs the moves on a worker thread.

Kernel behaviour (measured on the VM kernels 6.1 and 6.12): on v2 a write that
narrows ``cpuset.mems`` migrates the cgroup's pages inside the write(), slowly
(about 1 s per 64 MiB under emulation), and any other cpuset write made
meanwhile waits for it (benchmarks/migration.py saw an admission wait 4.1 s);
a write that keeps the old node moves nothing, and migrate_pages(2) then moves
the pages without holding up anyone's cpuset writes. On v1 a mems change moves
pages only where ``cpuset.memory_migrate`` is 1.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from numad.cpuset import NodeSet, digits
from numad.errors import CgroupError, HostFileError, NumadError, SysfsFormatError


def anon_by_node(text: str, *, v1_page_size: int | None = None) -> dict[int, int]:
    """Anonymous bytes per node from the text of a cgroup's ``memory.numa_stat``.

    * v2 (Documentation/admin-guide/cgroup-v2.rst, "memory.numa_stat"): lines
      ``type N0=<bytes in node 0> N1=<bytes in node 1> ...`` in BYTES, found by key
      (the doc warns that new entries can show up in the middle).
    * v1 (Documentation/admin-guide/cgroup-v1/memory.rst, "numa_stat"): lines
      ``anon=<total pages> N0=<node 0 pages> ...`` in PAGES (pass ``v1_page_size``);
      ``hierarchical_anon`` (children's pages too) is preferred. Lines with no
      ``=`` in the first word are skipped, as runc does for vendor additions.

    Raises ValueError naming the line when a line is malformed, when no anon
    line is present, or when a v1 text comes without ``v1_page_size``.
    """
    rows: dict[str, dict[int, int]] = {}
    v1 = any("=" in line.split(maxsplit=1)[0] for line in text.splitlines() if line.strip())
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words:
            continue
        key, eq, total = words[0].partition("=")
        if v1 and not eq:
            continue
        if not key or (eq and not digits(total)):
            raise ValueError(f"memory.numa_stat line {number}: {line!r} does not start with a key")
        rows[key] = _per_node(words[1:], number, line)
    key = "hierarchical_anon" if v1 and "hierarchical_anon" in rows else "anon"
    if key not in rows:
        raise ValueError("memory.numa_stat: no anon line")
    if not v1:
        return rows[key]
    if v1_page_size is None or v1_page_size <= 0:
        raise ValueError("memory.numa_stat: the v1 format counts pages; pass v1_page_size")
    return {node: pages * v1_page_size for node, pages in rows[key].items()}


def _per_node(words: list[str], number: int, line: str) -> dict[int, int]:
    counts: dict[int, int] = {}
    for word in words:
        name, _, value = word.partition("=")
        node = name[1:]
        if name[:1] != "N" or not digits(node) or not digits(value) or int(node) in counts:
            raise ValueError(f"memory.numa_stat line {number}: {line!r}: bad field {word!r}")
        counts[int(node)] = int(value)
    return counts


def read_anon_by_node(cgroup_dir: Path) -> dict[int, int] | None:
    """Anonymous bytes per node of v2 ``cgroup_dir`` and its descendants; None without the file.

    The file is missing where the memory controller is not enabled. It already
    covers the subtree, so descendants are not summed: memory_numa_stat_show()
    (mm/memcontrol.c) prints lruvec_page_state(), the rstat counter to which
    mem_cgroup_css_rstat_flush() adds each child's delta (``state``, where the
    cgroup's own share is ``state_local``). CgroupError: unreadable or malformed.
    """
    path = cgroup_dir / "memory.numa_stat"
    try:
        return anon_by_node(path.read_text())
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CgroupError(str(path), f"cannot be read: {err.strerror or err}") from err
    except ValueError as err:
        raise CgroupError(str(path), f"unexpected content: {err}") from err


def locality(by_node: Mapping[int, int], nodes: NodeSet) -> float | None:
    """The share of the bytes that sit on ``nodes`` (0.0 to 1.0); None when there are none."""
    total = sum(by_node.values())
    if total <= 0:
        return None
    return sum(size for node, size in by_node.items() if node in nodes) / total


def free_bytes(node: int, sys_root: Path = Path("/sys")) -> int:
    """``MemFree`` of ``node`` in bytes, from ``devices/system/node/node<N>/meminfo``."""
    path = sys_root / "devices" / "system" / "node" / f"node{node}" / "meminfo"
    try:
        text = path.read_text()
    except OSError as err:
        raise HostFileError(str(path), f"cannot be read: {err.strerror or err}") from err
    for line in text.splitlines():
        # "Node 0 MemFree:         8618408 kB" (drivers/base/node.c, node_read_meminfo)
        words = line.split()
        if words[2:3] == ["MemFree:"] and len(words) == 5 and digits(words[3]):
            return int(words[3]) * 1024
    raise SysfsFormatError(str(path), "has no 'MemFree: <n> kB' line")


def off_bytes(by_node: Mapping[int, int], nodes: NodeSet) -> int:
    """Bytes that sit on nodes outside ``nodes``."""
    return sum(size for node, size in by_node.items() if node not in nodes)


# arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h
# (arm64 uses the generic table); checked in this host's linux-libc-dev headers.
SYSCALL_NUMBERS: Mapping[str, int] = {"x86_64": 256, "aarch64": 238}
MAX_NUMNODES = 1024  # the kernel's largest: CONFIG_NODES_SHIFT is at most 10
_WORD_BITS = ctypes.sizeof(ctypes.c_ulong) * 8

Syscall = Callable[[int, int, int, tuple[int, ...], tuple[int, ...]], tuple[int, int]]
"""(number, pid, maxnode, old mask words, new mask words) -> (return value, errno)."""


@functools.cache
def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def libc_syscall(
    number: int, pid: int, maxnode: int, old: tuple[int, ...], new: tuple[int, ...]
) -> tuple[int, int]:
    """The real syscall through libc's syscall(); the masks become unsigned long arrays."""
    words = ctypes.c_ulong * len(old)
    args = (ctypes.c_long(number), ctypes.c_int(pid), ctypes.c_ulong(maxnode))
    result = int(_libc().syscall(*args, words(*old), words(*new)))
    return result, (ctypes.get_errno() if result == -1 else 0)


def migrate_pages(
    pid: int, old: NodeSet, new: NodeSet, *, syscall: Syscall = libc_syscall, machine: str = ""
) -> int:
    """Move ``pid``'s pages on ``old`` to ``new``; the number of pages that could not be moved.

    Raises OSError with the kernel's errno: ProcessLookupError (ESRCH) when the
    process has exited; PermissionError (EPERM) without ptrace access to it, or
    without CAP_SYS_NICE when ``new`` leaves its cpuset; EINVAL for a node the
    kernel lacks or when ``new`` misses numad's own cpuset (kernel_migrate_pages,
    mm/mempolicy.c). NumadError on a machine whose syscall number is unknown.
    """
    arch = machine or platform.machine()
    number = SYSCALL_NUMBERS.get(arch)
    if number is None:
        known = ", ".join(f"{m} ({n})" for m, n in SYSCALL_NUMBERS.items())
        raise NumadError("migrate_pages", f"no syscall number known for {arch!r}", known)
    union = old | new
    highest = union.max() if union else 0
    if highest >= MAX_NUMNODES:
        raise ValueError(f"node {highest} is beyond any kernel's MAX_NUMNODES ({MAX_NUMNODES})")
    # Both masks are arrays of unsigned long, as many words as the highest node
    # needs. maxnode is the mask's bit count PLUS ONE: the man page calls it
    # "the maximum node number plus one", but get_nodes() (mm/mempolicy.c) starts
    # with "--maxnode" and reads only maxnode - 1 bits, so maxnode = highest + 1
    # would drop the highest node. libnuma passes mask size + 1 for the same
    # reason. Bits above the kernel's MAX_NUMNODES must be zero (else EINVAL).
    count = highest // _WORD_BITS + 1
    maxnode = count * _WORD_BITS + 1
    result, err = syscall(number, pid, maxnode, _words(old, count), _words(new, count))
    if result < 0:
        raise OSError(err, f"pid {pid}: migrate_pages failed: {os.strerror(err)}")
    return result


def _words(nodes: NodeSet, count: int) -> tuple[int, ...]:
    mask = (1 << _WORD_BITS) - 1
    return tuple((nodes.bits >> (i * _WORD_BITS)) & mask for i in range(count))
