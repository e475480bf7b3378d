"""What an operator reads and types: numad(8), the bash completion and the
commented /etc/numad/numad.toml, all as the package ships them."""

from __future__ import annotations

import argparse
import gzip
import re
import subprocess
from pathlib import Path

import pytest

from numad.cli.main import parser
from numad.daemon import config

pytestmark = pytest.mark.slow  # they need the package (tests/packaging/build.py)

CONFIG = "etc/numad/numad.toml"
COMPLETION = "usr/share/bash-completion/completions/numad"


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(command: str) -> list[str]:
    """A command's long options, but --help (which the man page does not list)."""
    actions = _commands()[command]._actions
    return [o for a in actions for o in a.option_strings if o.startswith("--") and o != "--help"]


@pytest.fixture(scope="module")
def manual(unpacked: Path) -> str:
    """numad(8) as groff renders it for a terminal, without overstrikes or hyphens."""
    source = gzip.decompress((unpacked / "usr/share/man/man8/numad.8.gz").read_bytes())
    proc = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-rHY=0", "-P-cbou"],
        input=source,
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""  # groff's warnings (-ww) about the page
    return proc.stdout.decode()


@pytest.mark.parametrize(
    "section", ["NAME", "SYNOPSIS", "DESCRIPTION", "EXIT STATUS", "SIGNALS", "FILES", "SEE ALSO"]
)
def test_man_page_has_section(manual: str, section: str) -> None:
    assert re.search(rf"^{section}$", manual, re.MULTILINE), section


def test_man_page_has_every_command_with_its_options(manual: str) -> None:
    text = re.sub(r"\s+", " ", manual)  # options wrap across lines
    for command in _commands():
        assert f"COMMAND 'numad {command}'" in text
        for option in _options(command):
            assert option in text, (command, option)


def test_man_page_tells_the_exit_statuses_and_signals(manual: str) -> None:
    exit_status = manual.split("\nEXIT STATUS\n")[1].split("\nSIGNALS\n", maxsplit=1)[0]
    for status in ("0", "1", "2", "3", "130"):
        assert re.search(rf"^ +{status} ", exit_status, re.MULTILINE), status
    assert "128+N" in exit_status  # numad run passes its command's status on
    signals = manual.split("\nSIGNALS\n")[1].split("\nFILES\n", maxsplit=1)[0]
    for signal in ("SIGHUP", "SIGTERM", "SIGINT"):
        assert signal in signals
    files = manual.split("\nFILES\n")[1]
    assert "/etc/numad/numad.toml" in files


def test_shipped_config_gives_exactly_the_defaults(unpacked: Path) -> None:
    path = unpacked / CONFIG
    assert config.load(path) == config.Config(source=str(path))


def test_shipped_config_shows_the_true_defaults(unpacked: Path, tmp_path: Path) -> None:
    """Every commented setting ("#key = value"), uncommented, is the default too."""
    text = (unpacked / CONFIG).read_text()
    uncommented = tmp_path / "numad.toml"
    uncommented.write_text(re.sub(r"(?m)^#(?=[a-z])", "", text))
    assert uncommented.read_text() != text
    assert config.load(uncommented) == config.Config(source=str(uncommented))


def test_shipped_config_explains_every_option(unpacked: Path) -> None:
    text = (unpacked / CONFIG).read_text()
    sections = dict(re.findall(r"(?ms)^\[([a-z]+)\]\n(.*?)(?=^\[|\Z)", text))
    for section, keys in config._KEYS.items():
        for key in keys:
            assert re.search(rf"(?m)^# ?{key} = ", sections[section]), (section, key)
    for key in config._DEVICE_KEYS:  # a device class is an example: none by default
        assert re.search(rf"(?m)^# .*\b{key}\b", text), key


def _complete(unpacked: Path, *words: str) -> list[str]:
    """What the shipped completion offers after ``words`` in a real bash."""
    script = (
        'source "$0"; spec=$(complete -p numad); fn=${spec##*-F }; fn=${fn%% *};'
        ' COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE};'
        ' "$fn" numad "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}";'
        ' printf "%s\\n" "${COMPREPLY[@]}"'
    )
    proc = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script, str(unpacked / COMPLETION), *words],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_completion_completes_a_command(unpacked: Path) -> None:
    assert _complete(unpacked, "numad", "ad") == ["admit"]
    assert set(_complete(unpacked, "numad", "")) >= set(_commands())


def test_completion_lists_a_commands_options(unpacked: Path) -> None:
    offered = _complete(unpacked, "numad", "serve", "-")
    assert set(_options("serve")) <= set(offered)
    assert "--config" in offered
    assert _complete(unpacked, "numad", "oci-hook", "--on-reject", "") == ["fail", "run"]
