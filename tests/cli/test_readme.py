"""The README works as written: every shell block in it runs, in order, on the bundled
machine under a scratch ``--root`` (with ``.venv/bin`` on PATH, from a stand-in clone),
unless a comment right above it says why it cannot run here:

- ``<!-- real-host: why -->``: it installs system-wide or touches host services (sudo,
  systemctl, podman, the scripts that set up .venv); every repository file it names
  must exist;
- ``<!-- long: why -->``: benchmarks, seconds to minutes each; every script it names
  must exist and answer ``--help``, and every script in benchmarks/ must be listed;
- ``<!-- file: NAME -->`` above a non-shell block saves it as NAME in the clone before
  the shell blocks run (the example spec and config are planned and admitted as
  written).

Every fenced block names its language, so none escapes by being untagged.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
README = PROJECT / "README.md"
SHELL = frozenset({"sh", "shell", "bash", "console"})
FENCE = re.compile(r"^```(\S*)\s*$")
MARK = re.compile(r"^<!--\s*(real-host|long|file)\b:?\s*(.*?)\s*-->$")
# What only a real host may run: its services, system-wide installs, .venv's set-up.
NEEDS_HOST = re.compile(r"\bsudo\b|\bsystemctl\b|\bpodman\b|\bscripts/(check|demo)\b")
BENCHMARK = re.compile(r"\bbenchmarks/[\w-]+\.py\b")
TIMEOUT = 300.0


@dataclass(frozen=True, slots=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    mark: str  # "", "real-host", "long" or "file"
    arg: str  # the reason, or the file name


def blocks(text: str) -> list[Block]:
    """The fenced blocks of ``text``, each with the mark on the line just above it."""
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = lines.index("```", i + 1)
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.match(above.strip())
        body = "\n".join(lines[i + 1 : end]) + "\n"
        kind, arg = (mark.group(1), mark.group(2)) if mark else ("", "")
        found.append(Block(i + 1, opening.group(1), body, kind, arg))
        i = end + 1
    return found


def script(found: list[Block]) -> str:
    """The runnable shell blocks as one bash script that stops at the first failure,
    saying which README line the failing block starts on."""
    parts = ["set -euo pipefail"]
    for b in found:
        if b.lang in SHELL and not b.mark:
            parts.append(f"echo '# README.md line {b.line}' >&2")
            parts.append(b.text)
    return "\n".join(parts) + "\n"


def run(text: str, tmp_path: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run ``text``'s shell blocks in a stand-in clone under ``tmp_path``, with TMPDIR
    ``tmp``; whatever they leave running (a background numad serve) is ended with
    their process group."""
    clone = tmp_path / "clone"
    clone.mkdir()
    for entry in PROJECT.iterdir():
        if entry.name != ".git":
            (clone / entry.name).symlink_to(entry)
    found = blocks(text)
    for b in found:
        if b.mark == "file":
            (clone / b.arg).write_text(b.text)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "TMPDIR": str(tmp),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    proc = subprocess.Popen(
        ["bash", "-c", script(found)],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, ended below
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A TMPDIR with a short path: pytest's are too long for the socket the README's
    daemon makes under ``mktemp -d`` (a Unix socket's path holds at most 107 bytes)."""
    tmp = Path(tempfile.mkdtemp(prefix="numad-readme-"))
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def readme() -> list[Block]:
    return blocks(README.read_text())


def test_every_block_names_its_language_and_marks_stand_right_above_blocks(
    readme: list[Block],
) -> None:
    untagged = [b.line for b in readme if not b.lang]
    assert untagged == [], f"README.md blocks without a language at lines {untagged}"
    marks = sum(1 for line in README.read_text().splitlines() if MARK.match(line.strip()))
    assert marks == sum(1 for b in readme if b.mark), "a mark that stands above no block"
    for b in readme:
        if b.mark == "file":
            assert b.lang not in SHELL, f"line {b.line}: a file mark goes on a file's block"
            assert re.fullmatch(r"[\w.-]+", b.arg), f"line {b.line}: file name {b.arg!r}"
        elif b.mark:
            assert b.lang in SHELL, f"line {b.line}: only shell blocks are kept from running"


def test_each_block_kept_from_running_says_why_and_names_real_files(
    readme: list[Block], record_property: Callable[[str, object], None]
) -> None:
    run_here = [b for b in readme if b.lang in SHELL and not b.mark]
    real_host = [b for b in readme if b.mark == "real-host"]
    long = [b for b in readme if b.mark == "long"]
    record_property(
        "readme_blocks", f"{len(run_here)} run, {len(real_host)} real-host, {len(long)} long"
    )
    assert len(run_here) >= 2
    for b in real_host:
        assert NEEDS_HOST.search(b.text), f"line {b.line}: nothing in it needs a real host"
        for path in re.findall(r"(?<![\w/.$-])(?:systemd|packaging|scripts)/[\w./-]+", b.text):
            assert (PROJECT / path).exists(), f"line {b.line}: {path} does not exist"
    for b in long:
        assert b.arg, f"line {b.line}: say why it is not run"


def test_every_benchmark_is_listed_and_answers_help(readme: list[Block]) -> None:
    listed = {p for b in readme if b.mark == "long" for p in BENCHMARK.findall(b.text)}
    present = {f"benchmarks/{p.name}" for p in (PROJECT / "benchmarks").glob("*.py")}
    assert listed == present
    for path in sorted(listed):
        done = subprocess.run(
            [sys.executable, str(PROJECT / path), "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"{path} --help: {done.stderr}"


def test_the_readme_runs_as_written(tmp_path: Path, short_tmp: Path) -> None:
    done = run(README.read_text(), tmp_path, short_tmp)
    assert done.returncode == 0, f"README.md failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "would be admitted on node 0" in done.stdout  # the spec plans as written
    assert "inference: admitted" in done.stdout
    # The plain mkdir'd cgroup got its cpuset: the line after the admission.
    effective = done.stdout.split("inference: admitted", 1)[1].splitlines()[1]
    assert len(effective.split(",")) == 2, effective  # 8 CPUs: 4 cores' two threads
    assert list(short_tmp.iterdir()) == []  # the walk-through cleans up after itself


def test_a_broken_command_fails_the_run_and_names_its_block(
    tmp_path: Path, short_tmp: Path
) -> None:
    text = (
        "# a README\n\n```sh\nnumad topology --fixture 32intel64-2p8co2t+8ve > /dev/null\n```\n\n"
        "```sh\nnumad topology --fixture nosuch | cat\necho never\n```\n"
    )
    done = run(text, tmp_path, short_tmp)
    assert done.returncode != 0
    assert done.stderr.splitlines()[0] == "# README.md line 3"
    assert "# README.md line 7" in done.stderr
    assert "never" not in done.stdout
