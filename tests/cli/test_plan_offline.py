"""`numad plan SPEC --root DIR`: the full explanation offline, writing nothing under DIR."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from numad.cli.demo import CONFIG, MACHINE
from numad.cli.main import main
from numad.cpuset import CPUSet
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


@pytest.mark.parametrize(
    ("machine", "cpus", "decision", "free"),
    [
        pytest.param(
            MACHINE,
            64,
            "rejected: 64 exclusive CPUs asked for, 31 free (policy best-effort)",
            ["node 0 has 15 CPUs free", "node 1 has 16 CPUs free"],
            id="64-cpus-on-32",
        ),
        pytest.param(
            "offline-cpu0-node0",
            8,
            "rejected: 8 exclusive CPUs asked for, 7 free (policy best-effort)",
            ["node 1 has 7 CPUs free"],
            id="node-0-offline",
        ),
    ],
)
def test_a_failed_allocation_is_a_rejection_in_words_too(  # noqa: PLR0917 - pytest's params
    machines: Machines,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    machine: str,
    cpus: int,
    decision: str,
    free: list[str],
) -> None:
    """The merge admits (best-effort), the CPU manager cannot allocate: the words say
    rejected, name the whole request and what each node has free, never 'admitted'."""
    spec = tmp_path / "big.toml"
    spec.write_text(f'name = "big"\ncgroup = "numad.slice/big"\ncpus = {cpus}\n')
    status = main(["plan", str(spec), "--root", str(machines.root(machine)), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert (status, result["admitted"], result["reason"]) == (3, False, "UnexpectedAdmissionError")
    # The detail keeps the kubelet's words; the explanation says them plainly.
    free_cpus = decision.split(", ")[1].split(maxsplit=1)[0]
    kubelet = (
        f"not enough cpus available to satisfy request: requested={cpus}, available={free_cpus}"
    )
    assert result["detail"] == kubelet
    assert result["explanation"].split("; ") == [
        decision,
        f"main asks for {cpus} exclusive CPUs",
        *free,
        "cpu fits nowhere",
    ]
    status = main(["plan", str(spec), "--root", str(machines.root(machine))])
    out, err = capsys.readouterr()
    assert (status, err) == (3, "")  # no start-up log lines
    assert out.splitlines()[:2] == [
        "big.toml: rejected",
        "  " + decision.removeprefix("rejected: "),
    ]
    assert "admitted" not in out
