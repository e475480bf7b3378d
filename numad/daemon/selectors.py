"""Device selectors as the config writes them, checked and written as sysfs does:
PCI ids ("0x10de", "10de", or the "1bcf:001c" that ``numad topology`` prints), class
prefixes ("0x0b40") and addresses ("0000:3b:00.0", domain 0000 when left out)."""

from __future__ import annotations

import re

from numad.errors import ConfigError

_PCI_ADDRESS = re.compile(r"(?:([0-9a-f]{4}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])")


def pci_ids(where: str, vendor: str | None, device: str | None) -> tuple[str | None, str | None]:
    """vendor and device as sysfs writes them; a vendor "vvvv:dddd" gives the device
    too (a device given beside it must be the same)."""
    if vendor is not None and ":" in vendor:
        v, _, d = vendor.partition(":")
        pair = id_of(f"{where} vendor", v), id_of(f"{where} vendor", d)
        if device is not None and id_of(f"{where} device", device) != pair[1]:
            raise ConfigError(f"{where} device", f"{device} is not the device of {vendor!r}")
        return pair
    return (
        None if vendor is None else id_of(f"{where} vendor", vendor),
        None if device is None else id_of(f"{where} device", device),
    )


def id_of(where: str, text: str) -> str:
    """A 16-bit PCI id: "0x" and four lower-case hex digits."""
    return "0x" + _bare(where, text, 4).rjust(4, "0")


def hex_id(where: str, text: str, digits: int) -> str:
    """A prefix of a PCI id (a class code): "0x" and its hex digits, as given."""
    return "0x" + _bare(where, text, digits)


def _bare(where: str, text: str, digits: int) -> str:
    bare = text.strip().lower().removeprefix("0x")
    if not bare or len(bare) > digits or any(ch not in "0123456789abcdef" for ch in bare):
        raise ConfigError(
            where,
            f"{text!r} is not a hex id of at most {digits} digits",
            'write it as sysfs or lspci -n does, e.g. "0x10de" or "10de"',
        )
    return bare


def pci_address(where: str, text: str) -> str:
    """A PCI address, domain 0000 when left out: "0000:3b:00.0"."""
    found = _PCI_ADDRESS.fullmatch(text.strip().lower())
    if found is None:
        raise ConfigError(
            f"{where} addresses", f"{text!r} is not a PCI address", 'e.g. "0000:3b:00.0"'
        )
    domain, bus, slot, function = found.groups()
    return f"{domain or '0000'}:{bus}:{slot}.{function}"
