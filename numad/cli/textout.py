"""The client commands' answers as text for people.

Edge module, used by ``numad.cli.commands``: each function takes the daemon's JSON
answer (as ``--json`` prints it unchanged) and returns lines to print. Nothing
here asks the daemon or decides anything; a field the answer lacks is shown as
absent, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_NONE = "-"


def admitted(answer: Mapping[str, Any]) -> list[str]:
    """``admit``: one line naming the workload and where each container went."""
    workload = answer.get("workload") or {}
    name = workload.get("name", "?")
    unit = f" (unit {workload['unit']})" if workload.get("unit") else ""
    placed = "; ".join(
        f"{c}: {_placement(held)}" for c, held in (workload.get("containers") or {}).items()
    )
    return [f"{name}{unit}: admitted; {placed}" if placed else f"{name}{unit}: admitted"]


def rejected(name: str, answer: Mapping[str, Any]) -> list[str]:
    """A rejection (``admit``, ``plan``, ``run``): the explanation, one part a line."""
    parts = _parts(answer)
    parts[0] = parts[0].removeprefix("rejected: ")
    return [f"{name}: rejected", *_indent(parts)]


def plan(name: str, answer: Mapping[str, Any]) -> list[str]:
    """``plan``: the decision explained, then what each container would get."""
    if not answer.get("admitted"):
        return rejected(name, answer)
    parts = _parts(answer)
    parts[0] = parts[0].replace("admitted", "would be admitted", 1)
    lines = [f"{name}:", *_indent(parts)]
    for container, held in (answer.get("containers") or {}).items():
        lines.append(f"  {container}: {_placement(held)}")
    return lines


def explanation(answer: Mapping[str, Any]) -> list[str]:
    """``explain``: why the workload sits where it does."""
    return [f"{answer.get('name', '?')}:", *_indent(_parts(answer))]


def workload(shown: Mapping[str, Any]) -> list[str]:
    """``show``: the workload, then one block per container."""
    head = f"{shown.get('name', '?')}: {shown.get('state', 'unknown')}"
    lines = [head]
    if shown.get("unit"):
        lines.append(f"  unit      {shown['unit']}")
    lines.append(f"  cgroup    {shown.get('cgroup') or _NONE}")
    if shown.get("unplaced"):
        lines.append(f"  unplaced  {shown['unplaced']}")
    if shown.get("outside"):
        lines.append(f"  outside   {shown['outside']}")
    memory = shown.get("memory") or {}
    if memory:
        lines.append(f"  memory    {_memory(memory)}")
    for name, c in (shown.get("containers") or {}).items():
        kind = "exclusive" if c.get("exclusive") else "shared pool"
        lines += [
            f"  container {name}",
            f"    cgroup   {c.get('cgroup') or _NONE}",
            f"    cpus     {c.get('cpus') or _NONE} ({kind})",
            f"    mems     {c.get('mems') or 'any node'}",
            f"    devices  {_devices(c.get('devices') or {})}",
        ]
    return lines


def table(workloads: Sequence[Mapping[str, Any]]) -> list[str]:
    """``list``: one row per container, columns aligned (UNIT where any workload has one)."""
    if not workloads:
        return ["no workloads admitted"]
    units = any(w.get("unit") for w in workloads)
    head = ("NAME", "STATE", "CONTAINER", "CPUS", "MEMS", "DEVICES", "CGROUP")
    rows: list[tuple[str, ...]] = [head + ("UNIT",) * units]
    for w in workloads:
        for name, c in (w.get("containers") or {}).items():
            cpus = c.get("cpus") or _NONE
            row = (
                str(w.get("name", "?")),
                str(w.get("state", "?")),
                name,
                cpus if c.get("exclusive") else f"{cpus} (shared)",
                c.get("mems") or _NONE,
                _devices(c.get("devices") or {}),
                c.get("cgroup") or w.get("cgroup") or _NONE,
            )
            rows.append(row + (str(w.get("unit") or _NONE),) * units)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]


def host(answer: Mapping[str, Any]) -> list[str]:
    """``host``: isolation as it stands."""
    lines = [
        f"isolation  {'on' if answer.get('isolate') else 'off'}",
        f"exclusive  {answer.get('exclusive') or _NONE}",
        f"shared     {answer.get('shared') or _NONE}",
    ]
    isolated = answer.get("isolated") or []
    lines.append(f"isolated cgroups: {len(isolated)}")
    lines += [f"  {i.get('cgroup')}  cpus {i.get('cpus')}  via {i.get('via')}" for i in isolated]
    unmovable = answer.get("unmovable") or {}
    tasks = unmovable.get("tasks") or []
    more = unmovable.get("not_shown") or 0
    lines.append(f"tasks numad cannot move off exclusive CPUs: {len(tasks) + more}")
    lines += [f"  {_task(t)}" for t in tasks]
    if more:
        lines.append(f"  ... and {more} more")
    irqs = answer.get("irqs") or {}
    lines.append(f"interrupts moved off exclusive CPUs: {'on' if irqs.get('enabled') else 'off'}")
    for irq in irqs.get("moved") or []:
        lines.append(f"  moved {_task(irq)}")
    for irq, why in (irqs.get("unmovable") or {}).items():
        lines.append(f"  cannot move irq {irq}: {why}")
    return lines


# -- parts ---------------------------------------------------------------------------


def _parts(answer: Mapping[str, Any]) -> list[str]:
    """The explanation's parts (numad.placement.explain joins them with "; "), else the detail."""
    text = answer.get("explanation") or answer.get("detail") or "no explanation given"
    parts = str(text).split("; ")
    detail = answer.get("detail")
    if detail and detail not in text:
        parts.insert(1, str(detail))
    return parts


def _indent(lines: Sequence[str]) -> list[str]:
    return [f"  {line}" for line in lines]


def _placement(held: Mapping[str, Any]) -> str:
    cpus = held.get("cpus") or "shared pool"
    if "exclusive" in held and not held["exclusive"]:
        cpus = f"{cpus} (shared pool)"
    words = [f"cpus {cpus}", f"mems {held.get('mems') or 'any'}"]
    devices = held.get("devices") or {}
    if devices:
        words.append(f"devices {_devices(devices)}")
    return ", ".join(words)


def _devices(devices: Mapping[str, Sequence[str]]) -> str:
    if not devices:
        return _NONE
    return " ".join(f"{name}={','.join(addresses)}" for name, addresses in devices.items())


def _memory(memory: Mapping[str, Any]) -> str:
    words = [str(memory.get("state", "?"))]
    if memory.get("nodes"):
        words.append(f"on nodes {memory['nodes']}")
    if memory.get("locality") is not None:
        words.append(f"locality {float(memory['locality']):.0%}")
    return ", ".join(words)


def _task(task: object) -> str:
    if isinstance(task, Mapping):
        return " ".join(f"{k}={v}" for k, v in task.items())
    return str(task)
