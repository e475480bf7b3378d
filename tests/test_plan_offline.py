"""`numad plan SPEC --root DIR`: the full explanation offline, writing nothing under DIR."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from numad.cli import main
from numad.cpuset import CPUSet
from numad.demo import CONFIG, MACHINE
from tests.conftest import Machines


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


@pytest.mark.parametrize(
    ("spec", "suffix", "admitted", "cpus"),
    [
        pytest.param(
            'name = "db"\ncgroup = "numad.slice/db"\ncpus = 6\n', ".toml", True, 6, id="toml"
        ),
        pytest.param(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: infer}\nspec:\n  containers:\n"
            "  - name: main\n    resources:\n      limits: {cpu: '4', memory: 1Gi}\n",
            ".yaml",
            True,
            4,
            id="guaranteed-pod",
        ),
        pytest.param(
            'name = "big"\ncgroup = "numad.slice/big"\ncpus = 20\n',
            ".toml",
            False,
            0,
            id="rejected",
        ),
    ],
)
def test_offline_plan(  # noqa: PLR0917 - pytest passes fixtures and params positionally
    machines: Machines,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    spec: str,
    suffix: str,
    admitted: bool,
    cpus: int,
) -> None:
    root = tmp_path / "machine"
    subprocess.run(["cp", "-a", str(machines.root(MACHINE)), str(root)], check=True)
    before = _files(root)
    (tmp_path / "numad.toml").write_text(CONFIG)
    (tmp_path / f"spec{suffix}").write_text(spec)
    argv = [
        "plan",
        str(tmp_path / f"spec{suffix}"),
        "--root",
        str(root),
        "--config",
        str(tmp_path / "numad.toml"),
    ]
    status = main([*argv, "--json"])
    result = json.loads(capsys.readouterr().out)
    assert status == (0 if admitted else 3)
    assert result["admitted"] is admitted
    if admitted:
        (placement,) = result["containers"].values()
        assert len(CPUSet.parse_list(placement["cpus"])) == cpus
    else:
        assert "single-numa-node" in result["explanation"]
    assert _files(root) == before  # nothing written under the recorded machine
