"""Telling systemd what numad wrote into the cgroups of its units, off the daemon's lock.

numad writes an isolated cgroup's cpuset itself, at once and under the daemon's
lock: the kernel has every shrink before any exclusive set is granted, whatever
systemd is doing. A cgroup that systemd owns (its unit's ControlGroup is that
path) must also carry the value as the unit's runtime ``AllowedCPUs=``, or systemd
writes its own back at the next ``daemon-reload`` or restart. That is a D-Bus call,
as slow as systemd is: ``UnitRecord.send`` makes it from a loop of its own
(``numad.daemon.loops.unit_loop``), never under the daemon's lock, and a failure
is a health problem retried with the bus's backoff (``numad.host.systemd_bus``).

Until systemd has applied a value it was sent, it may still write it into the
cgroup, after a narrower one numad wrote since: ``may_run_on`` is every such value,
and no CPU in it is granted exclusively meanwhile (``numad.host.isolation``).

Before its first change to a unit, the unit's own ``AllowedCPUs=`` is kept in
``units.json`` (durably, one small file), so a numad that crashed still resets it.
A unit that had none gets every online CPU first, then its property reset, only
where the kernel lets its cgroup's ``cpuset.cpus`` become empty again: cgroup v2
refuses that to a cgroup with tasks (ENOSPC), and so does systemd's reset, which
it logs as a failure on every stop. There the unit keeps ``AllowedCPUs=`` every
online CPU, which is what its cgroup holds (until the next boot: runtime only), and
its record stays: when it is isolated again, its own is still none, not numad's
every CPU.

Nothing is sent to a unit whose cgroup is gone (it stopped): systemd would load the
unit for the call, and for a slice make its cgroup again. A transient unit's
settings go with it; any other keeps numad's value in /run, so its record stays and
it gets its own back when it runs again (``resting``).
Cost: per isolated unit whose value changed; nothing per cgroup under a managed root
that is not a unit.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from numad.cpuset import CPUSet
from numad.errors import CgroupError, CheckpointError, NumadError
from numad.host.durable import read_json, write_file
from numad.host.systemd_units import APPLY_SECONDS, Units, settle
from numad.host.targets import Log
from numad.observe import Problems

FILE = "units.json"
UNIT_SUFFIXES = (".slice", ".scope", ".service", ".socket", ".mount", ".swap")


class UnitRecord:
    """The values numad wants systemd to hold for the units it isolates, sent from
    one thread; the daemon's side (``want``, ``may_run_on``, ``unit``) only touches
    memory under a lock of its own."""

    def __init__(
        self,
        systemd: Units,
        state_dir: Path,
        log: Log,
        read: Callable[[str], CPUSet],
        *,
        empty: Callable[[str], bool] = lambda path: True,
        exists: Callable[[str], bool] = lambda path: True,
        problems: Problems | None = None,
        sleep: Callable[[float], None] = time.sleep,
        stopping: threading.Event | None = None,
        pending: threading.Event | None = None,
    ) -> None:
        self.systemd = systemd
        self.state_dir = state_dir
        self.stopping = stopping or threading.Event()  # numad stops: no more waiting
        self.log = log
        self.read = read  # a cgroup's cpuset.cpus as the kernel holds it
        self.empty = empty  # empties a cgroup's cpuset.cpus; False: the kernel refused
        self.exists = exists  # whether a cgroup is there: its unit runs
        self.sleep = sleep
        self.lock = threading.Lock()  # the daemon's side and the sender's, briefly
        self.round = threading.RLock()  # held for a whole round, and for a give-back
        self.saving = threading.Lock()  # one save at a time, the newest record last
        self.wanted: dict[str, CPUSet] = {}  # path -> the value systemd should hold
        self.sending: dict[str, CPUSet] = {}  # path -> values systemd may still write
        self.units: dict[str, str | None] = {}  # path -> its unit, or None: not systemd's
        self.problems = problems or Problems()  # "unit:PATH": why systemd lacks its value
        self.returning: set[str] = set()  # told, and isolated no more: give back
        self.awaited: set[str] = set()  # returning, a write below waits on it: a pass after
        self.resting: set[str] = set()  # told, not given back till it runs (or is isolated)
        self.online = CPUSet()  # every CPU: first, for a unit given back that had none
        self.pending = pending or threading.Event()  # set by want(): the sender has work
        self.told, problem = _load(state_dir)  # path -> {"unit", "cpus"}: the unit's own
        if problem:
            self.problems.set("unit-record", problem)

    # -- the daemon's side: memory only ----------------------------------------------------

    def want(self, path: str, cpus: CPUSet) -> None:
        with self.lock:
            if self.units.get(path, "") is None:
                return  # known not to be a unit
            self.wanted[path] = cpus
        self.pending.set()

    def keep_only(self, paths: set[str], owned: set[str], online: CPUSet) -> None:
        """Cgroups isolated no more: nothing more to send for them. A unit that was told
        a value and is a workload's now keeps it (its record is dropped: systemd keeps
        the cpuset controller on for it, and numad places it from now on); any other
        gets its own back from the sender (one above a workload's first: ``above``),
        with every ``online`` CPU first where it had none."""
        with self.lock:
            self.online = online
            self.wanted = {p: c for p, c in self.wanted.items() if p in paths}
            mine = [p for p in self.told if p not in paths and p in owned]
            for path in mine:
                del self.told[path]
            self.resting = {p for p in self.resting if p in self.told and p not in paths}
            self.returning = {p for p in self.told if p not in paths and p not in self.resting}
            self.units = {p: u for p, u in self.units.items() if p in paths or p in self.told}
        if mine:
            try:  # one small file
                self._save()
            except CheckpointError as err:  # kept on disk: a later numad resets the unit
                self.log.warning("unit_record_failed", problem=str(err))
        for key in self.problems.subjects():
            if key.startswith("unit:") and key[len("unit:") :] not in paths:
                self.problems.clear(key)

    def adopt(self, originals: dict[str, dict[str, str]]) -> bool:
        """Units a numad before 2026-12 told itself (``"via": "systemd"`` in the isolation
        record) become this record's, so the sender gives them back off the lock; each
        entry there becomes its cgroup file's (the same value). True when any did (the
        caller saves its record); one that cannot be kept here stays as it was."""
        legacy = {p: o for p, o in originals.items() if o.get("via") == "systemd"}
        if not legacy or any("unit" not in o for o in legacy.values()):
            return False
        with self.lock:
            was = dict(self.told)
            for path, own in legacy.items():
                self.told.setdefault(path, {"unit": own["unit"], "cpus": own.get("cpus", "")})
        try:
            self._save()
        except CheckpointError as err:
            with self.lock:
                self.told = was
            self.log.warning("unit_record_failed", problem=f"older units kept as they were: {err}")
            return False
        for path, own in legacy.items():
            originals[path] = {"via": "cgroupfs", "cpus": own.get("cpus", "")}
        return True

    def give_back_later(self, paths: Iterable[str], online: CPUSet) -> None:
        """Each unit its own AllowedCPUs= again, from the sender (off the daemon's lock)."""
        with self.lock:
            self.online = online
            for path in paths:
                if path in self.told:
                    self.returning.add(path)
                    self.resting.discard(path)
                    self.wanted.pop(path, None)
        self.pending.set()

    def above(self, path: str, *, wait: bool = False) -> str | None:
        """The unit above ``path`` that is still to get its own AllowedCPUs= back: until
        it has, systemd may write the narrow value numad told it into its cgroup, and
        so into ``path``'s. ``wait``: a write there waits for the round that gives it
        back, which then wakes a pass. Cost: per unit being given back (rarely any)."""
        with self.lock:
            for unit in self.returning:
                if path.startswith(unit + "/"):
                    if wait:
                        self.awaited.add(unit)
                    return self.told[unit]["unit"]
        return None

    def may_run_on(self, path: str) -> CPUSet:
        """What systemd was sent for ``path`` and may not have written yet."""
        with self.lock:
            return self.sending.get(path, CPUSet())

    def unit(self, path: str) -> str | None:
        """The unit owning ``path`` as last found (no D-Bus call)."""
        with self.lock:
            found = self.units.get(path)
            return found if found is not None else self.told.get(path, {}).get("unit")

    # -- the sender's side: D-Bus, never under the daemon's lock ---------------------------

    def send(self) -> bool:
        """One round: each wanted value to its unit, waiting until systemd applied it.
        True when a value that may have blocked a grant is settled (the daemon then
        runs a pass, so the grant is not left to the next one)."""
        with self.round:
            return self._round()

    def _round(self) -> bool:
        with self.lock:
            batch = sorted(self.wanted.items())
            returning = sorted(self.returning)
        settled = False
        for path in returning:
            try:
                self.give_back(path, self.online)
            except NumadError as err:
                name = self.told[path]["unit"]
                gone = False
                with contextlib.suppress(NumadError):
                    gone = self.systemd.unit(name) is None
                if gone:
                    self._absent(
                        path, ended="systemd has no such unit", kept="systemd has it unloaded"
                    )
                else:
                    self.log.warning("unit_reset_failed", cgroup=path, problem=str(err))
            with self.lock:  # given back (or gone): what waited below is written now
                if path not in self.returning:
                    settled |= path in self.awaited
                    self.awaited.discard(path)
        for path, cpus in batch:
            if not self.exists(path):  # stopped: a call would load it (a slice: its cgroup)
                self._stopped(path, cpus)
                continue
            try:
                unit = self._resolve(path)
                if unit is not None:
                    self._keep_own(path, unit)
                    settled |= self._send(path, unit, cpus)
            except NumadError as err:
                if not self.exists(path):  # it stopped meanwhile: nothing left to tell
                    self._stopped(path, cpus)
                    continue
                self._unload(path)
                self.problems.set(f"unit:{path}", f"{path}: systemd lacks its cpuset yet: {err}")
                self.log.warning("unit_record_failed", cgroup=path, problem=str(err))
                continue
            self.problems.clear(f"unit:{path}")
            with self.lock:
                if self.wanted.get(path) == cpus or unit is None:
                    self.wanted.pop(path, None)
        return settled

    def _resolve(self, path: str) -> str | None:
        with self.lock:
            if path in self.units:
                return self.units[path]
        name = path.rsplit("/", maxsplit=1)[-1]
        owned = None
        ours = name.endswith(UNIT_SUFFIXES) and self.systemd.unit(name)
        if ours and self.systemd.control_group(name) == "/" + path:
            owned = name
        with self.lock:
            self.units[path] = owned
        return owned

    def _stopped(self, path: str, cpus: CPUSet) -> None:
        """``path``'s unit stopped: its cgroup is gone, and nothing is owed to it."""
        with self.lock:
            self.units.pop(path, None)
            self.sending.pop(path, None)
            if self.wanted.get(path) == cpus:
                del self.wanted[path]
        self.problems.clear(f"unit:{path}")

    def _unload(self, path: str) -> None:
        """A call for ``path`` failed: if systemd has its unit no more, the next round
        asks again which unit owns it (a cgroup left behind has none)."""
        with self.lock:
            unit = self.units.get(path)
        with contextlib.suppress(NumadError):
            if unit is not None and self.systemd.unit(unit) is None:
                with self.lock:
                    self.units.pop(path, None)

    def _keep_own(self, path: str, unit: str) -> None:
        """The unit's own AllowedCPUs=, durably, before numad first changes it."""
        if path in self.told:
            return
        own = self.systemd.allowed(unit)[0]
        transient = "yes" if self.systemd.transient(unit) else "no"
        with self.lock:
            self.told[path] = {"unit": unit, "cpus": own.format_list(), "transient": transient}
        try:
            self._save()
        except CheckpointError:
            with self.lock:
                del self.told[path]
            raise

    def _send(self, path: str, unit: str, cpus: CPUSet) -> bool:
        """Send ``cpus``; True when systemd has applied it and it is still the one
        wanted, and it settled a wider value sent before (a grant may wait on it)."""
        with self.lock:
            was = self.sending.get(path, CPUSet())
            self.sending[path] = was | cpus  # from now on systemd may write it
        # A failure keeps it there: a call that timed out may still be applied.
        self.systemd.set_allowed(unit, cpus, None, runtime=True)
        if not self._applied(path, cpus):
            return False  # a newer value is wanted: sent next, this one may still land
        with self.lock:
            if self.wanted.get(path) != cpus:
                return False
            del self.sending[path]
        return bool(was - cpus)

    def _applied(self, path: str, cpus: CPUSet) -> bool:
        """Wait until systemd has written ``cpus`` (it does so after answering); False
        as soon as a newer value is wanted instead."""
        newer = False

        def done() -> bool:
            nonlocal newer
            if self.read(path) == cpus:
                return True
            with self.lock:
                newer = self.wanted.get(path) != cpus
            return newer

        if not settle(done, self.sleep, APPLY_SECONDS, self.stopping):
            if self.stopping.is_set():
                raise CgroupError(path, "numad is stopping: not waiting for systemd to write it")
            raise CgroupError(
                path,
                f"systemd accepted AllowedCPUs={cpus.format_list()} but has not written"
                f" it after {APPLY_SECONDS:.0f} s",
            )
        return not newer

    # -- giving back ------------------------------------------------------------------------

    def give_back(self, path: str, online: CPUSet) -> None:
        """The unit's own AllowedCPUs= again; with ``online``, every CPU first where it
        had none, and the property unset only where the kernel empties its cgroup's
        cpuset.cpus (not with tasks in it: see the module's doc)."""
        with self.round:
            self._give_back(path, online)

    def _give_back(self, path: str, online: CPUSet) -> None:
        own = self.told.get(path)
        if own is None:
            return
        if not self.exists(path):  # not running: a call would load it (a slice: its cgroup)
            self._absent(path, ended="it ended", kept="not running")
            return
        cpus = CPUSet.parse_list(own["cpus"])
        if not cpus and online:
            self.systemd.set_allowed(own["unit"], online, None, runtime=True)
            if not self.empty(path):  # tasks in it: systemd's reset would fail too
                self.log.info("unit_left_on_every_cpu", unit=own["unit"], cpus=str(online))
                self._rest(path)  # its own is still none, whatever it holds now
                return
        self.systemd.set_allowed(own["unit"], cpus, None, runtime=True)
        self._forget(path)

    def _absent(self, path: str, *, ended: str, kept: str) -> None:
        """``path``'s unit is not running, or not loaded: a transient unit's settings went
        with it (forgotten); any other keeps numad's runtime AllowedCPUs= in /run for its
        next load, so its own is kept and given back later."""
        unit = self.told[path]["unit"]
        if self.told[path].get("transient", "yes") == "yes":
            self.log.info("unit_reset_skipped", unit=unit, why=ended)
            self._forget(path)
        else:
            self.log.info("unit_reset_deferred", unit=unit, why=kept)
            self._rest(path)

    def _rest(self, path: str) -> None:
        """Kept, not given back until it is asked again (``give_back_later``)."""
        with self.lock:
            self.resting.add(path)
            self.returning.discard(path)
            self.wanted.pop(path, None)
            self.sending.pop(path, None)

    def _forget(self, path: str) -> None:
        with self.lock:
            del self.told[path]
            self.resting.discard(path)
            self.returning.discard(path)
            self.wanted.pop(path, None)
            self.sending.pop(path, None)
            self.units.pop(path, None)
        self._save()

    def _save(self) -> None:
        """The record as it is now; saves from two threads write the newer last."""
        with self.saving:
            with self.lock:
                told = dict(self.told)
            write_file(self.state_dir, FILE, _dump(told), what="unit record")


def _dump(told: dict[str, dict[str, str]]) -> bytes:
    return json.dumps({"version": 1, "units": told}, sort_keys=True).encode()


def _load(state_dir: Path) -> tuple[dict[str, dict[str, str]], str | None]:
    raw, problem = read_json(state_dir, FILE)
    try:
        if raw is None:
            return {}, problem and f"{problem}. The units it lists had AllowedCPUs= from numad"
        found = {str(p): _entry(own) for p, own in raw["units"].items()}
        for own in found.values():
            CPUSet.parse_list(own["cpus"])
    except (TypeError, KeyError, AttributeError, NumadError) as err:
        return {}, f"{state_dir / FILE}: not a record numad wrote ({err}); reset by hand"
    return found, None


def _entry(own: dict[str, object]) -> dict[str, str]:
    entry = {"unit": str(own["unit"]), "cpus": str(own["cpus"])}
    if "transient" in own:  # recorded since 2026-12-05; before, taken as transient
        entry["transient"] = str(own["transient"])
    return entry
