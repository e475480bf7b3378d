"""IRQ affinity off exclusive CPUs (``[host] irq-affinity``, off by default).

Edge module: reads and writes ``/proc/irq/N/smp_affinity_list`` and
``/proc/irq/default_smp_affinity`` under the root it is given. Each interrupt
runs on its own setting less the exclusive CPUs, or on the shared pool where
that leaves none. Before numad first changes one it keeps the interrupt's own
setting in ``irqs.json`` in the state directory, durably, and puts every one
back on stop. An interrupt the kernel will not move (a per-CPU or managed
interrupt: EIO) is listed, not hidden. Under the unit, ``/proc/irq`` is
read-only (ProtectKernelTunables=): a host that turns this on adds
``ReadWritePaths=/proc/irq`` in a drop-in.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from numad.cpuset import CPUSet, digits
from numad.errors import CheckpointError, NumadError
from numad.host.durable import read_json, write_file
from numad.host.targets import Log

FILE = "irqs.json"
DEFAULT = "default"  # the key of /proc/irq/default_smp_affinity (a hex mask)


class IrqAffinity:
    def __init__(self, proc_irq: Path, state_dir: Path, log: Log) -> None:
        self.proc_irq = proc_irq
        self.state_dir = state_dir
        self.log = log
        self.originals, self.problem = _load(state_dir)
        self.stuck: dict[str, str] = {}  # irq -> why the kernel keeps it where it is

    def apply(self, exclusive: CPUSet, pool: CPUSet) -> list[str]:
        """Move every interrupt off ``exclusive``; returns the problems (a record that
        cannot be kept stops the change)."""
        problems = []
        for irq in self._irqs():
            if irq in self.stuck:
                continue  # refused once: a managed or per-CPU interrupt stays so
            own = CPUSet.parse_list(self.originals.get(irq) or self._read(irq))
            wanted = (own - exclusive) or pool
            if not wanted or self._read(irq) == str(wanted):
                continue
            if not self._remember(irq):
                problems.append(f"irq {irq}: cannot keep its own affinity before changing it")
                continue
            try:
                self._write(irq, wanted)
            except OSError as err:
                self.stuck[irq] = f"{os.strerror(err.errno or 0)} (the kernel keeps it)"
                self.originals.pop(irq)  # unchanged: nothing to give back
                with contextlib.suppress(CheckpointError):
                    self._save()
        return problems

    def restore(self) -> list[str]:
        """Every interrupt numad moved gets its own setting back."""
        problems = []
        for irq, own in sorted(self.originals.items()):
            try:
                self._write(irq, CPUSet.parse_list(own))
            except OSError as err:
                if err.errno != 2:  # gone: nothing to give back
                    problems.append(f"irq {irq}: cannot give its affinity {own} back: {err}")
        if not problems:
            self.originals = {}
            try:
                self._save()
            except CheckpointError as err:  # every affinity is back: only the record stays
                problems.append(f"the IRQ record still lists them (the next numad rechecks): {err}")
        return problems

    def view(self) -> dict[str, Any]:
        return {"moved": sorted(self.originals), "unmovable": dict(sorted(self.stuck.items()))}

    def _irqs(self) -> list[str]:
        try:
            names = [e.name for e in os.scandir(self.proc_irq) if digits(e.name)]
        except OSError:
            return []
        found = [n for n in names if (self.proc_irq / n / "smp_affinity_list").is_file()]
        has_default = (self.proc_irq / "default_smp_affinity").is_file()
        return sorted(found, key=int) + ([DEFAULT] if has_default else [])

    def _read(self, irq: str) -> str:
        if irq == DEFAULT:
            mask = (self.proc_irq / "default_smp_affinity").read_text().strip()
            return str(CPUSet.from_bits(int(mask.replace(",", ""), 16)))
        return str(CPUSet.parse_list((self.proc_irq / irq / "smp_affinity_list").read_text()))

    def _write(self, irq: str, cpus: CPUSet) -> None:
        if irq == DEFAULT:
            path, text = self.proc_irq / "default_smp_affinity", f"{cpus.bits:x}"
        else:
            path, text = self.proc_irq / irq / "smp_affinity_list", cpus.format_list()
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def _remember(self, irq: str) -> bool:
        if irq in self.originals:
            return True
        self.originals[irq] = self._read(irq)
        try:
            self._save()
        except CheckpointError as err:
            del self.originals[irq]
            self.log.error("irq_record_failed", irq=irq, problem=str(err))
            return False
        return True

    def _save(self) -> None:
        data = json.dumps({"version": 1, "irqs": self.originals}, sort_keys=True).encode()
        write_file(self.state_dir, FILE, data, what="IRQ record")


def _load(state_dir: Path) -> tuple[dict[str, str], str | None]:
    raw, problem = read_json(state_dir, FILE)
    try:
        if raw is None:
            return {}, problem
        return {str(k): str(CPUSet.parse_list(str(v))) for k, v in raw["irqs"].items()}, None
    except (TypeError, KeyError, AttributeError, NumadError) as err:
        return {}, f"{state_dir / FILE}: not a record numad wrote ({err})"
