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
        f"{c}: {placement(held)}" for c, held in (workload.get("containers") or {}).items()
    )
    lines = [f"{name}{unit}: admitted; {placed}" if placed else f"{name}{unit}: admitted"]
    lines += [f"note: {note}" for note in answer.get("notes") or ()]
    if workload.get("state") == "waiting for its cgroup":
        lines.append(
            f"warning: its cgroup {workload.get('cgroup')} does not exist yet: numad holds"
            " the placement and writes it once the cgroup is made"
        )
    return lines


def resized(answer: Mapping[str, Any]) -> list[str]:
    """``resize``: a line naming what changed, then the workload as ``show`` prints it."""
    shown = answer.get("workload") or {}
    name, container = shown.get("name", "?"), answer.get("resized", "?")
    who = f"{name}/{container}" if len(shown.get("containers") or {}) > 1 else name
    changes = [f"cpus {answer[k]} {k}" for k in ("added", "removed") if answer.get(k)]
    head = f"{who}: resized" + (f"; {', '.join(changes)}" if changes else "")
    return [head, *workload(shown)]


def rejected(name: str, answer: Mapping[str, Any]) -> list[str]:
    """A rejection (``admit``, ``plan``, ``run``): the explanation, one part a line."""
    lines = _explained(answer, {})
    lines[0] = lines[0].removeprefix("rejected: ")
    return [f"{name}: rejected", *_indent(lines)]


def plan(name: str, answer: Mapping[str, Any]) -> list[str]:
    """``plan``: the decision explained, with what each container would get (or, for
    a workload admitted already, gets)."""
    if not answer.get("admitted"):
        return rejected(name, answer)
    containers = answer.get("containers") or {}
    lines = _explained(answer, containers)
    if answer.get("already"):
        lines.insert(0, "admitted already (numad release frees it); it holds:")
    else:
        lines[0] = lines[0].replace("admitted", "would be admitted", 1)
    lines += [f"note: {note}" for note in answer.get("notes") or ()]
    return [f"{name}:", *_indent(lines)]


def explanation(answer: Mapping[str, Any]) -> list[str]:
    """``explain``: why the workload sits where it does, container by container."""
    return [f"{answer.get('name', '?')}:", *_indent(_explained(answer, {}))]


def _explained(answer: Mapping[str, Any], containers: Mapping[str, Any]) -> list[str]:
    """The explanation one part a line; with several containers decided, each
    container's parts under its name; then each container's placement, if given."""
    explained = answer.get("explained") or []
    if len(explained) <= 1:
        lines = _parts(answer)
        for c, held in containers.items():
            lines += [f"{c}: {placement(held)}", *_groups(held, "  ")]
        return lines
    lines = [_parts(answer)[0]]
    for each in explained:
        first, *rest = each.get("parts") or ["no explanation given"]
        container = each.get("container", "?")
        lines.append(f"{container}: {first}")
        lines += _indent(rest)
        if container in containers:
            lines.append(f"  placed: {placement(containers[container])}")
            lines += _groups(containers[container], "    ")
    return lines


def workload(shown: Mapping[str, Any]) -> list[str]:
    """``show``: the workload, then one block per container."""
    head = f"{shown.get('name', '?')}: {shown.get('state', 'unknown')}"
    lines = [head]
    if shown.get("unit"):
        lines.append(f"  unit      {shown['unit']}")
    lines.append(f"  cgroup    {shown.get('cgroup') or _NONE}")
    if shown.get("movable"):
        lines.append("  movable   numad may move it to admit another workload")
    if shown.get("unplaced"):
        lines.append(f"  unplaced  {shown['unplaced']}")
    if shown.get("outside"):
        lines.append(f"  outside   {shown['outside']}")
    memory = shown.get("memory") or {}
    if memory and memory.get("state") != "shared":  # shared: each container says "any node"
        lines.append(f"  memory    {_memory(memory)}")
    for name, c in (shown.get("containers") or {}).items():
        kind = "exclusive" if c.get("exclusive") else "shared pool"
        lines += [
            f"  container {name}",
            f"    cgroup   {c.get('cgroup') or _NONE}",
            f"    cpus     {c.get('cpus') or _NONE} ({kind})",
            f"    memory   {_mems(c.get('mems'))}",
            f"    devices  {_devices(c.get('devices') or {})}",
        ]
        lines += _groups(c, "    ")
    return lines


def table(workloads: Sequence[Mapping[str, Any]]) -> list[str]:
    """``list``: one row per container, columns aligned (UNIT where any workload has one,
    MOVABLE where any is movable)."""
    if not workloads:
        return ["no workloads admitted"]
    units = any(w.get("unit") for w in workloads)
    movable = any(w.get("movable") for w in workloads)
    head = ("NAME", "STATE", "CONTAINER", "CPUS", "MEMORY", "DEVICES", "CGROUP")
    rows: list[tuple[str, ...]] = [head + ("UNIT",) * units + ("MOVABLE",) * movable]
    for w in workloads:
        for name, c in (w.get("containers") or {}).items():
            cpus = c.get("cpus") or _NONE
            row: tuple[str, ...] = (
                str(w.get("name", "?")),
                str(w.get("state", "?")),
                name,
                cpus if c.get("exclusive") else f"{cpus} (shared pool)",
                _mems(c.get("mems")),
                _devices(c.get("devices") or {}),
                c.get("cgroup") or w.get("cgroup") or _NONE,
            )
            row += (str(w.get("unit") or _NONE),) * units
            rows.append(row + ("yes" if w.get("movable") else "no",) * movable)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]


def host(answer: Mapping[str, Any]) -> list[str]:
    """``host``: isolation as it stands."""
    lines = [
        f"isolation  {answer.get('isolating') or 'off'}",
        f"exclusive  {answer.get('exclusive') or _NONE}",
        f"shared     {answer.get('shared') or _NONE}",
    ]
    isolated = answer.get("isolated") or []
    lines.append(f"isolated cgroups: {len(isolated)}")
    lines += [f"  {i.get('cgroup')}  cpus {i.get('cpus')}  via {i.get('via')}" for i in isolated]
    parts = answer.get("partitions") or []
    if parts:
        lines.append(f"partitions: {len(parts)}")
        lines += [f"  {p.get('cgroup')}  cpus {p.get('cpus')}  {p.get('state')}" for p in parts]
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
    return str(text).split("; ")


def _indent(lines: Sequence[str]) -> list[str]:
    return [f"  {line}" for line in lines]


def placement(held: Mapping[str, Any]) -> str:
    cpus = held.get("cpus") or "shared pool"
    if "exclusive" in held and not held["exclusive"]:
        cpus = f"{cpus} (shared pool)"
    words = [f"cpus {cpus}", f"memory {_mems(held.get('mems'))}"]
    devices = held.get("devices") or {}
    if devices:
        words.append(f"devices {_devices(devices)}")
    return ", ".join(words)


def _groups(held: Mapping[str, Any], indent: str) -> list[str]:
    """Each device with the CPUs and memory that go with it, one a line:
    "with gpu 0000:1b:00.0 (node 0): cpus 2-3, memory 1Gi", and "some CPUs off
    node 0" where not all of its CPUs are on its node (memory only where it has some)."""
    lines = []
    for g in held.get("groups") or ():
        node = g.get("node", "?")
        words = [f"cpus {g.get('cpus') or _NONE}"]
        if g.get("memory"):
            words.append(f"memory {_size(g['memory'])}")
        if g.get("cpus") and not g.get("local"):
            words.append(f"some CPUs off node {node}")
        head = f"with {g.get('class', '?')} {g.get('device', '?')} (node {node})"
        lines.append(f"{indent}{head}: {', '.join(words)}")
    return lines


def _size(n: int) -> str:
    """Bytes as the glossary words sizes: the largest unit that holds one, one decimal."""
    for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f}".removesuffix(".0") + unit
    return f"{n}B"


def _mems(mems: object) -> str:
    """Memory nodes as the glossary words them: "any node" when not pinned."""
    if not mems:
        return "any node"
    text = str(mems)
    return f"node {text}" if text.isdigit() else f"nodes {text}"


def _devices(devices: Mapping[str, Sequence[str]]) -> str:
    if not devices:
        return _NONE
    return " ".join(f"{name}={','.join(addresses)}" for name, addresses in devices.items())


def _memory(memory: Mapping[str, Any]) -> str:
    words = [str(memory.get("state", "?"))]
    if memory.get("nodes"):
        words.append(f"on {_mems(memory['nodes'])}")
    if memory.get("locality") is not None:
        words.append(f"locality {float(memory['locality']):.0%}")
    return ", ".join(words)


def _task(task: object) -> str:
    if isinstance(task, Mapping):
        return " ".join(f"{k}={v}" for k, v in task.items())
    return str(task)
