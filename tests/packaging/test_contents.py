"""What the package holds: every promised file, a relocated venv on Debian's
Python, the unit, the hook, the control fields, and lintian's verdict."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.packaging.build import REPO, version

pytestmark = pytest.mark.slow  # the first test of a session builds the package (~45 s)

VENV = "usr/lib/numad"
SITE = f"{VENV}/lib/python3.11/site-packages"
PROMISED = (
    "usr/bin/numad",
    f"{VENV}/bin/numad",
    f"{VENV}/bin/python3",
    f"{VENV}/pyvenv.cfg",
    f"{SITE}/numad/cli/main.py",
    f"{SITE}/numad/data/COPYING.hwloc",
    "lib/systemd/system/numad.service",
    "lib/systemd/system/numad.slice",
    "etc/numad/numad.toml",
    "usr/share/man/man8/numad.8.gz",
    "usr/share/bash-completion/completions/numad",
    "usr/share/containers/oci/hooks.d/numad.json",
    "usr/share/doc/numad/copyright",
    "usr/share/doc/numad/changelog.gz",
)
# numad's dependencies (pyproject.toml), by the names they import as.
IMPORTS = ("psutil", "pyudev", "cgroupspy", "structlog", "prometheus_client", "numpy", "yaml")


@pytest.mark.parametrize("path", PROMISED)
def test_the_package_holds(unpacked: Path, path: str) -> None:
    assert (unpacked / path).is_file() or (unpacked / path).is_symlink(), path


def test_usr_bin_numad_is_the_venvs_entry_point(unpacked: Path) -> None:
    link = unpacked / "usr/bin/numad"
    assert link.is_symlink()
    assert os.path.normpath(link.parent / os.readlink(link)) == str(unpacked / VENV / "bin/numad")
    shebang = (unpacked / VENV / "bin/numad").read_text().splitlines()[0]
    assert shebang == "#!/usr/lib/numad/bin/python3"


def test_the_venv_runs_on_debians_python(unpacked: Path) -> None:
    pyvenv = (unpacked / VENV / "pyvenv.cfg").read_text()
    assert "home = /usr/bin\n" in pyvenv
    assert (unpacked / VENV / "bin/python3").readlink() == Path("../../../bin/python3")
    # Debian's python3 with the package's site-packages, from outside the repository.
    script = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); "
        + "; ".join(f"import {name}" for name in IMPORTS)
        + "; import numad; assert numad.__file__.startswith(sys.path[0]), numad.__file__"
        + "; from numad.cli.main import main; sys.exit(main(['--version']))"
    )
    proc = subprocess.run(
        ["/usr/bin/python3", "-I", "-B", "-c", script, str(unpacked / SITE)],
        capture_output=True,
        text=True,
        check=False,
        cwd=unpacked,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"numad {version()}\n"


def test_no_file_names_the_build_tree(unpacked: Path) -> None:
    """Shebangs, activate scripts, pyvenv.cfg, RECORDs: /usr/lib/numad, never where it was built."""
    found = subprocess.run(
        ["grep", "-rlIF", "-e", str(REPO), "-e", "debian/numad/usr", "."],
        cwd=unpacked,
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.returncode == 1, found.stdout  # 1: no match
    scripts = [p for p in (unpacked / VENV / "bin").iterdir() if p.is_file()]
    assert scripts
    for script in scripts:
        text = script.read_text()
        if text.startswith("#!"):
            assert text.splitlines()[0] == "#!/usr/lib/numad/bin/python3", script


def test_no_bytecode_and_no_pip(unpacked: Path) -> None:
    compiled = [p for p in unpacked.rglob("*") if p.name == "__pycache__" or p.suffix == ".pyc"]
    assert compiled == []
    assert not (unpacked / SITE / "pip").exists()
    assert not (unpacked / VENV / "bin/pip").exists()


def test_the_unit_and_the_hook_run_usr_bin_numad(unpacked: Path) -> None:
    unit = (unpacked / "lib/systemd/system/numad.service").read_text()
    assert unit == (REPO / "systemd/numad.service").read_text()
    assert "\nExecStart=/usr/bin/numad serve\n" in unit
    hook = json.loads((unpacked / "usr/share/containers/oci/hooks.d/numad.json").read_text())
    assert hook["hook"]["path"] == "/usr/bin/numad"
    assert hook["hook"]["args"][:2] == ["numad", "oci-hook"]


def test_control_fields(control: Path) -> None:
    fields = (control / "control").read_text()
    depends = next(line for line in fields.splitlines() if line.startswith("Depends:"))
    for needed in ("python3 (>= 3.11)", "python3 (<< 3.12)", "libc6 (>= "):
        assert needed in depends
    # Epoch 1 (scripts/package): above Debian's own package of the name, Red Hat's numad.
    assert f"\nVersion: 1:{version()}\n" in fields
    assert (control / "conffiles").read_text().split() == ["/etc/numad/numad.toml"]


def test_the_service_is_enabled_and_started_the_slice_left_alone(control: Path) -> None:
    postinst = (control / "postinst").read_text()
    assert "deb-systemd-helper enable 'numad.service'" in postinst
    assert "deb-systemd-invoke $_dh_action 'numad.service' >" in postinst
    assert "compileall" in postinst
    assert "numad.slice" not in postinst + (control / "prerm").read_text()


def test_copyright_is_machine_readable(unpacked: Path) -> None:
    text = (unpacked / "usr/share/doc/numad/copyright").read_text()
    assert text.startswith(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    )
    assert "License: Apache-2.0" in text
    assert "Files: numad/data/*" in text
    assert "COPYING.hwloc" in text


def test_lintian_reports_no_errors(package: Path) -> None:
    proc = subprocess.run(
        ["lintian", "--no-tag-display-limit", str(package)],
        capture_output=True,
        text=True,
        check=False,
    )
    errors = [line for line in proc.stdout.splitlines() if line.startswith("E:")]
    assert errors == [], proc.stdout
    assert proc.returncode in (0, 2), proc.stderr  # 2: warnings only
