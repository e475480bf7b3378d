"""systemd's D-Bus API: the AllowedCPUs= and AllowedMemoryNodes= of units.

An adapter at the host edge; with ``numad.host.dbus_stream`` the only module
that speaks D-Bus (jeepney lives in these two and nowhere else). It touches
systemd's sockets and nothing else; what it sets is runtime unit state, which
systemd then writes to the unit's cgroup itself.

As root, numad talks to systemd's private peer socket, as systemctl does
(src/shared/bus-util.c, bus_connect_system_systemd): a peer-to-peer stream with
no bus daemon, so no Hello call, and a peer that must run as root or as us
(bus_check_peercred). jeepney's blocking connection always says Hello, so the
stream is built from jeepney's pieces (``numad.host.dbus_stream``). Otherwise it
goes through the system bus (with Hello). Every call has a deadline. Calls from
several threads take turns on one stream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self, TypeVar

# jeepney ships no type information (no py.typed); its values are checked where they come in.
from jeepney import (
    DBusAddress,
    HeaderFields,
    Message,
    MessageType,
    Properties,
    new_method_call,
)
from jeepney.bus import get_connectable_addresses
from jeepney.bus_messages import message_bus

from numad.cpuset import CPUSet, NodeSet
from numad.errors import NumadError
from numad.host.dbus_stream import Stream, stray

PRIVATE_ADDRESS = "unix:path=/run/systemd/private"
SYSTEM_BUS_ADDRESS = "unix:path=/run/dbus/system_bus_socket"

_SYSTEMD = "org.freedesktop.systemd1"
_MANAGER = DBusAddress("/org/freedesktop/systemd1", _SYSTEMD, f"{_SYSTEMD}.Manager")
_NO_SUCH_UNIT = f"{_SYSTEMD}.NoSuchUnit"
# The unit types with a cgroup context: their own interface carries the cgroup
# properties (bus_unit_cgroup_vtable), Unit does not.
_CGROUP_INTERFACES = {
    "service": "Service",
    "slice": "Slice",
    "scope": "Scope",
    "socket": "Socket",
    "mount": "Mount",
    "swap": "Swap",
}

_Ids = TypeVar("_Ids", CPUSet, NodeSet)


BACKOFF_FIRST = 1.0  # seconds a peer that failed is left alone, doubled per failure
BACKOFF_MAX = 30.0


class SystemdError(NumadError):
    """A call to systemd failed: an error reply, no reply in time, or a lost connection."""


def to_dbus(ids: CPUSet | NodeSet) -> bytes:
    """systemd's ``ay`` form of a set: byte i, bit j is id 8*i+j (little-endian).

    As cpu_set_to_dbus and cpu_set_from_dbus (src/shared/cpu-set-util.c) write
    and read it: ``out[cpu / 8] |= 1u << (cpu % 8)``; used for AllowedCPUs= and
    AllowedMemoryNodes= alike (src/core/dbus-cgroup.c, bus_cgroup_set_property).
    systemd pads to whole longs; the shortest form reads the same, and the
    empty set is the empty array, which resets the property. systemd refuses
    ids from 8192 up (ERANGE).
    """
    bits = ids.bits
    return bits.to_bytes((bits.bit_length() + 7) // 8, "little")


def from_dbus(data: bytes, kind: type[_Ids]) -> _Ids:
    """The set that systemd's ``ay`` form ``data`` names (see ``to_dbus``)."""
    return kind.from_bits(int.from_bytes(data, "little"))


def _cgroup_interface(unit: str) -> str:
    suffix = unit.rpartition(".")[2]
    if suffix not in _CGROUP_INTERFACES:
        known = ", ".join(f".{s}" for s in _CGROUP_INTERFACES)
        raise SystemdError(unit, "this unit type has no cgroup", f"name a {known} unit")
    return f"{_SYSTEMD}.{_CGROUP_INTERFACES[suffix]}"


class Systemd:
    """A connection to systemd's manager; build it with ``Systemd.connect``. Calls
    from several threads take turns (the enforcer's and the memory mover's). A stream
    that failed is closed, and the next call connects again."""

    def __init__(
        self, stream: Stream, address: str, timeout: float, *, path: str, peer: bool
    ) -> None:
        self._stream: Stream | None = stream
        self.address = address
        self.timeout = timeout
        self._path, self._peer = path, peer
        self._turn = threading.RLock()  # one call at a time on the stream (Hello nests)
        # A peer that did not answer is not asked again until the backoff has passed:
        # a pass that needs systemd many times waits once, not once per call.
        self.clock = time.monotonic
        self._backoff = 0.0
        self._quiet_until = 0.0
        self._stop_wait: float | None = None  # numad stops: each call's bound (``hurry``)
        self._gave_up = False  # numad stops and a call got no answer: ask no more
        self._shut: Stream | None = None  # the stream ``hurry`` shut under a call
        # Told each answered call's member and seconds (numad's reply-time histogram).
        self.observe: Callable[[str, float], None] = lambda member, seconds: None

    @classmethod
    def connect(cls, address: str | None = None, timeout: float = 5.0) -> Systemd | None:
        """Connect to systemd, or None when it cannot be reached (no systemd here).

        ``address`` (D-Bus form, ``unix:path=...``) names a systemd peer socket;
        by default the private socket is tried, then the system bus. Each socket
        tried gets ``timeout`` seconds to connect, authenticate (and say Hello).
        """
        tries = [(PRIVATE_ADDRESS, True), (SYSTEM_BUS_ADDRESS, False)]
        if address is not None:
            tries = [(address, True)]
        for addr, peer in tries:
            try:
                paths = list(get_connectable_addresses(addr))
            except RuntimeError as err:  # jeepney: a transport other than unix
                raise SystemdError(addr, "not a Unix socket address", "use unix:path=...") from err
            for path in paths:
                try:
                    stream = Stream.open(path, timeout, peer=peer)
                except (OSError, ValueError):  # unreachable, or refused at authentication
                    continue
                systemd = cls(stream, addr, timeout, path=path, peer=peer)
                if peer or systemd._hello():
                    return systemd
        return None

    def unit(self, name: str) -> str | None:
        """The object path of ``name`` if systemd has it loaded; None otherwise.

        GetUnit, not LoadUnit: asking never loads a unit.
        """
        reply = self._call(name, new_method_call(_MANAGER, "GetUnit", "s", (name,)))
        if _error_name(reply) == _NO_SUCH_UNIT:
            return None
        return str(self._body(name, "GetUnit", reply, "o")[0])

    def allowed(self, name: str) -> tuple[CPUSet, NodeSet]:
        """The unit's AllowedCPUs= and AllowedMemoryNodes=; empty sets when not set."""
        cpus = bytes(self._property(name, "AllowedCPUs", "ay"))
        mems = bytes(self._property(name, "AllowedMemoryNodes", "ay"))
        return from_dbus(cpus, CPUSet), from_dbus(mems, NodeSet)

    def set_allowed(
        self, name: str, cpus: CPUSet | None, mems: NodeSet | None, *, runtime: bool = True
    ) -> None:
        """Set AllowedCPUs= and AllowedMemoryNodes=; None leaves one alone, empty resets it.

        SetUnitProperties, as ``systemctl set-property`` (``--runtime`` by
        default: gone at reboot). systemd loads the unit's file for this if it
        is not loaded (src/core/dbus-manager.c, method_set_unit_properties).
        """
        values = [
            (key, ("ay", to_dbus(ids)))
            for key, ids in (("AllowedCPUs", cpus), ("AllowedMemoryNodes", mems))
            if ids is not None
        ]
        if not values:
            return
        body = (name, runtime, values)
        message = new_method_call(_MANAGER, "SetUnitProperties", "sba(sv)", body)
        self._body(name, "SetUnitProperties", self._call(name, message), "")

    def control_group(self, name: str) -> str | None:
        """The unit's cgroup (``/system.slice/foo.service``); None when it has none."""
        return str(self._property(name, "ControlGroup", "s")) or None

    def transient(self, name: str) -> bool:
        """Whether the unit is transient (``systemd-run``, a scope): its runtime
        settings go with it when systemd unloads it; any other's stay in /run."""
        return bool(self._property(name, "Transient", "b", f"{_SYSTEMD}.Unit"))

    def load(self, name: str) -> str:
        """The unit's object path, loading its file if need be (LoadUnit); a unit with
        no file and no runtime state raises."""
        reply = self._call(name, new_method_call(_MANAGER, "LoadUnit", "s", (name,)))
        path = str(self._body(name, "LoadUnit", reply, "o")[0])
        where = DBusAddress(path, _SYSTEMD, f"{_SYSTEMD}.Unit")
        body = self._body(
            name, "LoadState", self._call(name, Properties(where).get("LoadState")), "v"
        )
        state = body[0][1] if body[0][0] == "s" else "?"
        if state not in ("loaded", "masked"):
            raise SystemdError(name, f"systemd cannot load it (LoadState={state})")
        return path

    def slice(self, name: str) -> str:
        """The slice the unit runs in (``system.slice``)."""
        return str(self._property(name, "Slice", "s"))

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def hurry(self, seconds: float) -> None:
        """numad stops: a call waiting on systemd ends now; each later call (what
        numad gives back) waits at most ``seconds`` for its answer, even to a peer in
        its backoff; once one of them gets none, systemd is stuck and every later call
        fails at once. So a stuck systemd holds the stop for ``seconds`` in all, and a
        slow one that answers is still told everything. Safe from any thread: it does
        not wait for the call under way."""
        self._stop_wait = seconds
        stream = self._stream
        if stream is not None:
            self._shut = stream  # the next call connects again, not on what is shut
            stream.interrupt()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _hello(self) -> bool:
        """Say Hello to the bus daemon, as a bus requires first; False if it refuses."""
        try:
            reply = self._call(self.address, message_bus.Hello())
        except SystemdError:
            return False
        if _error_name(reply) is not None:
            self.close()
            return False
        return True

    def _property(self, name: str, key: str, signature: str, interface: str = "") -> Any:
        """The value of property ``key`` of the unit, checked to have ``signature``;
        ``interface`` by default its type's (where the cgroup settings are)."""
        interface = interface or _cgroup_interface(name)
        path = self.unit(name)
        if path is None:
            raise SystemdError(name, f"cannot read {key}: systemd has no such unit loaded")
        where = DBusAddress(path, _SYSTEMD, interface)
        body = self._body(name, key, self._call(name, Properties(where).get(key)), "v")
        sig, value = body[0]
        if sig != signature:
            raise SystemdError(name, f"{key} has D-Bus type {sig!r}, expected {signature!r}")
        return value

    def _call(self, name: str, message: Message) -> Message:
        """The reply to ``message``; a lost or stalled connection raises and is closed."""
        member = message.header.fields.get(HeaderFields.member)
        with self._turn:
            if self._gave_up:
                problem = f"numad is stopping: not asking {member}: {self.address} did not answer"
                raise SystemdError(name, problem)
            left = self._quiet_until - self.clock()
            if left > 0 and self._stop_wait is None:
                problem = (
                    f"not asking {member}: {self.address} did not answer; again in {left:.1f} s"
                )
                raise SystemdError(name, problem)
            try:
                if self._stream is not None and self._stream is self._shut:
                    self.close()  # shut by ``hurry`` while no call was on it
                if self._stream is None:
                    self._reconnect(name, member)
                assert self._stream is not None
                reply = self._exchange(name, member, self._stream, message)
            except SystemdError:
                self._backoff = min(max(2 * self._backoff, BACKOFF_FIRST), BACKOFF_MAX)
                self._quiet_until = self.clock() + self._backoff
                raise
            self._backoff = 0.0
            return reply

    def _reconnect(self, name: str, member: object) -> None:
        """A new stream where the last one failed (it may have held half a call)."""
        try:
            self._stream = Stream.open(self._path, self._wait, peer=self._peer)
        except (OSError, ValueError) as err:
            self._gave_up = self._stop_wait is not None and isinstance(err, TimeoutError)
            problem = f"cannot call {member}: the connection to {self.address} is lost ({err})"
            raise SystemdError(name, problem) from err
        if not self._peer and not self._hello():
            raise SystemdError(name, f"cannot call {member}: {self.address} refused Hello")

    @property
    def _wait(self) -> float:
        """How long a call may wait for its answer: shorter once numad stops."""
        return self.timeout if self._stop_wait is None else min(self.timeout, self._stop_wait)

    def _exchange(self, name: str, member: object, stream: Stream, message: Message) -> Message:
        stopping = self._stop_wait is not None  # asked after ``hurry``: a give-back
        sent = time.monotonic()
        try:
            reply: Message = stream.call(message, sent + self._wait)
        except (OSError, ValueError) as err:  # ValueError: jeepney could not parse a message
            self.close()
            if stopping and isinstance(err, TimeoutError):
                self._gave_up = True
                problem = (
                    f"numad is stopping: no reply to {member} from {self.address}"
                    f" within {self._wait:g} s"
                )
                raise SystemdError(name, problem) from err
            if self._stop_wait is not None:
                problem = f"numad is stopping: gave up waiting for {member} from {self.address}"
                raise SystemdError(name, problem) from err
            if isinstance(err, TimeoutError):
                problem = (
                    f"no reply to {member} (serial {stream.serial}) from {self.address}"
                    f" within {self.timeout:g} s{stray(stream.unmatched)}"
                )
                raise SystemdError(name, problem, "is systemd stuck?") from err
            problem = f"{member}: the connection to {self.address} failed ({err})"
            raise SystemdError(name, problem) from err
        self.observe(str(member), time.monotonic() - sent)
        return reply

    def _body(self, name: str, what: str, reply: Message, signature: str) -> tuple[Any, ...]:
        """The reply's body, checked to have ``signature``; an error reply raises."""
        error = _error_name(reply)
        if error is not None:
            text = reply.body[0] if reply.body and isinstance(reply.body[0], str) else None
            detail = f"{error}: {text}" if text else error
            raise SystemdError(name, f"{what} failed: {detail}")
        got = reply.header.fields.get(HeaderFields.signature, "")
        if reply.header.message_type is not MessageType.method_return or got != signature:
            raise SystemdError(name, f"{what}: unexpected reply of type {got!r}")
        return tuple(reply.body)


def _error_name(reply: Message) -> str | None:
    if reply.header.message_type is not MessageType.error:
        return None
    return str(reply.header.fields.get(HeaderFields.error_name, "(unnamed error)"))
