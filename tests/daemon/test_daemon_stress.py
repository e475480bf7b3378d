"""Stress: a real `numad serve` under a seeded barrage of hostile API requests, and under
concurrent admit/release from several clients at once; then one small test for each bug
those two runs found, as its minimal reproduction.

DESIGN section 4: every bad request gets a 4xx and a JSON error naming the subject.
Section 5: exclusive CPU sets stay disjoint, off the reserved CPUs and inside the online
ones, the shared pool is never empty, no device is held twice, every cgroup holds what
numad says (invariants 1, 2, 4), and bad input changes nothing (invariant 6).
Everything is seeded and bounded: request counts, client timeouts, a time budget.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from numad.cli.client import APIError, request
from numad.cli.demo import CONFIG, MACHINE
from numad.cpuset import CPUSet
from numad.daemon import state
from numad.daemon.api import MAX_BODY
from numad.errors import NumadError
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines
from tests.daemon.test_daemon_e2e import ONLINE, RESERVED, Numad, _check_invariants, _spec

SEED = 20240611
CLIENT_TIMEOUT = 10.0  # seconds; a request that takes longer counts as a hang
ENGINES = "vector-engine"  # 8 on node 0 of MACHINE
ALLOCATABLE = len(ONLINE - RESERVED)  # no exclusive request above this can ever fit

# -- the daemon, with what it printed ------------------------------------------------


class _Daemon(Numad):
    """A `Numad` a test can ask whether it printed any tracebacks (its log is a file,
    so a flood of them cannot fill a pipe and stall the daemon)."""

    def printed(self) -> str:
        """What this run of the daemon has printed so far."""
        with self.log.open("rb") as log:
            log.seek(self.logged)
            return log.read().decode(errors="replace")

    def tracebacks(self) -> str:
        """Each distinct exception numad printed (socketserver prints one block per
        failed request), with its count and its last frame; "" when there were none."""
        seen: dict[str, int] = {}
        text = self.printed()
        for block in text.split("Exception occurred during processing of request")[1:]:
            lines = [x.strip() for x in block.splitlines()]
            frames = [x for x in lines if x.startswith("File ")]
            errors = [x for x in lines if re.match(r"[\w.]+(Error|Exception)\b", x)]
            if not frames or not errors:
                continue  # still being written
            key = f"{errors[-1]} ({frames[-1]})"
            seen[key] = seen.get(key, 0) + 1
        if not seen and "Traceback" in text:
            seen[text[text.find("Traceback") :][:2000]] = 1
        return "\n".join(f"{n} x {key}" for key, n in seen.items())


@pytest.fixture
def daemon(machines: Machines, tmp_path: Path) -> Iterator[_Daemon]:
    root = tmp_path / "machine"
    subprocess.run(["cp", "-a", str(machines.root(MACHINE)), str(root)], check=True)
    config = tmp_path / "numad.toml"
    config.write_text(CONFIG)
    d = _Daemon(root, config)
    d.start()
    yield d
    if d.proc is not None and d.proc.poll() is None:
        d.stop()


def _eventually(check: Callable[[], None], tries: int = 4, pause: float = 0.25) -> None:
    """Run ``check`` until it passes. The reconcile loop rewrites every cgroup file
    (O_TRUNC, then write) every 10 s, so a read can catch one empty for a moment."""
    for _ in range(tries - 1):
        try:
            check()
        except AssertionError:
            time.sleep(pause)
        else:
            return
    check()


def _files(root: Path) -> dict[str, bytes]:
    """Every regular file under the machine root: sysfs, cgroups, the checkpoint."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _changed(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


# -- one exchange, through http.client or as raw bytes ----------------------------------


@dataclass(frozen=True)
class _Request:
    what: str  # for the report
    method: str = "GET"
    path: str = "/"
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    raw: bytes | None = None  # sent as is, for what http.client will not produce


@dataclass(frozen=True)
class _Answer:
    status: int | None = None
    content_type: str = ""
    body: bytes = b""
    failure: str | None = None  # the transport failed: dropped, hang, no status line


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=CLIENT_TIMEOUT)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def _send(path: str, req: _Request) -> _Answer:
    if req.raw is not None:
        return _send_raw(path, req.raw, head=req.raw.startswith(b"HEAD "))
    conn = _UnixHTTP(path)
    try:
        conn.putrequest(req.method, req.path, skip_accept_encoding=True)
        for name, value in req.headers:
            conn.putheader(name, value)
        if req.body is not None:
            conn.putheader("Content-Length", str(len(req.body)))
        conn.endheaders()
        # It may answer (501) and close before reading the body; then read that answer.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.send(req.body or b"")
        resp = conn.getresponse()
        return _Answer(resp.status, resp.getheader("Content-Type", ""), resp.read())
    except TimeoutError:
        return _Answer(failure="no answer within the client timeout (a hang)")
    except http.client.RemoteDisconnected:
        return _Answer(failure="connection closed without an answer")
    except http.client.BadStatusLine as err:
        return _Answer(failure=f"no HTTP status line: {err!r:.60}")
    except OSError as err:
        return _Answer(failure=f"connection dropped: {err!r:.60}")
    finally:
        conn.close()


def _send_raw(path: str, payload: bytes, *, head: bool = False) -> _Answer:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(CLIENT_TIMEOUT)
        s.connect(path)
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)  # the server sees EOF after this one request
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered (413) and closed before reading all; read that answer
        data = b""
        try:
            while chunk := s.recv(1 << 16):
                data += chunk
        except TimeoutError:
            if not data:
                return _Answer(failure="no answer within the client timeout (a hang)")
        except ConnectionResetError:
            pass
    return _parse_answer(data, head=head)


def _parse_answer(data: bytes, *, head: bool) -> _Answer:
    while True:
        if not data:
            return _Answer(failure="connection closed without an answer")
        top, sep, rest = data.partition(b"\r\n\r\n")
        match = re.match(rb"HTTP/1\.[01] (\d{3})", top)
        if not sep or match is None:
            return _Answer(failure=f"no HTTP status line: {data[:60]!r}")
        status = int(match[1])
        if status != 100:
            break
        data = rest  # an interim 100 Continue; the answer follows
    headers = {
        k.strip().lower(): v.strip()
        for k, _, v in (line.partition(b":") for line in top.split(b"\r\n")[1:])
    }
    length = int(headers.get(b"content-length", b"-1"))
    body = b"" if head else rest[:length] if length >= 0 else rest
    return _Answer(status, headers.get(b"content-type", b"").decode("latin-1"), body)


def _judge(req: _Request, answer: _Answer) -> str | None:
    """None for a proper rejection (a 4xx with a JSON error message), else what is wrong."""
    if answer.failure is not None:
        return answer.failure
    assert answer.status is not None
    kind = answer.content_type.split(";")[0] or "no Content-Type"
    if not 400 <= answer.status < 500:
        return f"HTTP {answer.status} ({kind}), not a 4xx"
    if req.method == "HEAD" or (req.raw or b"").startswith(b"HEAD "):
        return None  # no body, by HTTP's rules
    if kind != "application/json":
        return f"HTTP {answer.status} with a {kind} body, not a JSON error"
    try:
        error = json.loads(answer.body)["error"]
        ok = isinstance(error["message"], str) and error["message"].strip() and error["code"]
    except (ValueError, KeyError, TypeError):
        ok = False
    return None if ok else f"HTTP {answer.status} without a JSON error message"


# -- hostile requests from a seeded generator -------------------------------------------

ADMITTED = ("db", "web", "batch")  # what the barrage test admits before it starts

ODD_NAMES: list[object] = [
    "", "..", ".", "../etc", "-x", "_x", ".x", "Db", "a b", "a/b", "a\\b", "a\x00b", "a\nb",
    "x" * 64, "x" * 5000, "\u017f", "é", "\U0001f600", "db\n", " db", "a:b", "a@b", "%2e%2e",
    "$(id)", "\u202e", 5, None, True, [], {}, 1.5,
]  # fmt: skip
ODD_CGROUPS: list[object] = [
    "", "/", "/sys/fs/cgroup", "..", "../..", "numad.slice", "numad.slice/", "numad.slice/..",
    "numad.slice/../etc", "numad.slice/x/../../..", "numad.slice/./x", "numad.slice//x",
    "other.slice/x", "numad.slicex/y", "numad.slice/x\x00", "numad.slice/x\ny",
    "numad.slice/x y", "numad.slice/é", "numad.slice/" + "a" * 256,
    "numad.slice/" + "a/" * 600 + "a", "numad.slice\\x", "./numad.slice/x", "/numad.slice/x",
    "numad.slice/$(id)", 7, None, ["numad.slice"], {"a": 1},
]  # fmt: skip
BAD_CPUS: list[object] = [
    0, -1, -0.5, 0.0001, 1.0005, 4097, 10**30, 2**64, "abc", "", "1.", ".5", "-1", "1e3",
    "0x10", "1_000", "500 m", "500M", "0m", "5000000000000m", "1.0000000000001", True, None,
    [], {}, [1], "NaN", "inf", "\u0661",
]  # fmt: skip
BAD_MEMORY: list[object] = [
    0, -1, "-1Gi", "32Zi", "1.5", "0.5", 2**63, 2**64, "9Ei", "1e99", "", "Gi", True, None, [],
]  # fmt: skip
BAD_HUGEPAGES: list[tuple[str, object]] = [
    ("hugepages-", 1), ("hugepages-3Mi", 1), ("hugepages-0", 1), ("hugepages-1Pi", 1),
    ("hugepages-1e99", 1), ("hugepages-abc", 1), ("hugepages-2Mi\x00", 1),
    ("hugepages-2Mi", 0), ("hugepages-2Mi", -1), ("hugepages-2Mi", 2**62), ("hugepages-2Mi", "3Mi"),
    ("hugepages-1Gi", 1.5), ("hugepages-1Gi", True), ("hugepages-1Gi", None), ("hugepages-1Gi", []),
]  # fmt: skip
BAD_DEVICES: list[object] = [
    {"gpu": 1}, {"../vector-engine": 1}, {"": 1}, {"vector-engine\x00": 1}, {"VECTOR-ENGINE": 1},
    {ENGINES: 0}, {ENGINES: -1}, {ENGINES: 65537}, {ENGINES: 2**70}, {ENGINES: "1"},
    {ENGINES: 1.0}, {ENGINES: True}, {ENGINES: None}, {ENGINES: [1]}, {ENGINES: {"a": 1}},
    [], "vector-engine", 1,
]  # fmt: skip
BAD_POLICIES: list[object] = ["", "single-numa", "SINGLE-NUMA-NODE", "none ", 1, None, []]
UNKNOWN_FIELDS = ["cpu", "CPUs", "mem", "device", "__proto__", "name ", "x" * 1000, "", "\x00"]
BAD_CONTAINERS: list[object] = [
    [], {}, "main", [1], [{}], [{"name": "a"}, {"name": "a"}],
    [{"name": "a", "cgroup": "x"}, {"name": "b", "cgroup": "x/y"}],
    [{"name": "a", "kind": "init"}], [{"name": "a", "kind": "bogus"}], [{"name": "../a"}],
    [{"name": "a", "cgroup": "../b"}], [{"name": "a", "cpus": "x"}], [{"name": "a", "extra": 1}],
    [{"name": "a", "cgroup": "/abs"}], [{"name": "a", "devices": {"gpu": 1}}],
]  # fmt: skip
# JSON text the encoder cannot write: numbers past a float or past Python's digit
# limit, constants, and nesting far past any recursion limit.
RAW_JSON = [
    "1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1" + "0" * 5000, "0.1e-400",
    "[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000,
]  # fmt: skip
BIG_JSON = [
    "{" + ",".join(f'"k{i}": {i}' for i in range(20_000)) + "}",
    json.dumps({"name": "x" * (MAX_BODY - 64)}),  # just under the size limit
]
METHODS = ["PUT", "PATCH", "HEAD", "OPTIONS", "TRACE", "CONNECT", "FOO", "get", "M-SEARCH"]
SEGMENTS = [
    "v1", "v2", "V1", "workloads", "health", "topology", "plan", "explain", "..", ".", "",
    "%2e%2e", "%2F", "db%00", "nosuch", "ünï", "db;", "*", "~", "x" * 300, "workloads.json",
]  # fmt: skip
CONTENT_TYPES = [
    "text/plain", "application/xml", "", "APPLICATION/JSON", "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x", "application/json; charset=utf-16", "json",
    "application/toml", "application/yaml",
]  # fmt: skip
TOML_GARBAGE = [
    'name = "x"\nname = "y"', "name = ", "[[containers]]\n[containers", "cpus = nan",
    "cpus = inf", "cpus = 0x" + "f" * 200, "cpus = 1979-05-27T07:32:00Z", '"\x00" = 1',
    'name = """', "[devices]\na = 1\n[devices]", "a = " + "[" * 5000 + "]" * 5000,
    'name = "x"\ncgroup = "numad.slice/x"\ncpus = 1_000_000', "= 1", "[a.b]\n[a]\nb = 1",
]  # fmt: skip
YAML_GARBAGE = [
    "\t- a", "a: b: c", "&a [*a]", "- &a\n  - *a", "!!python/object/apply:os.system ['id']",
    "!!binary AAAA", "!!set {a, b}", "name: 2020-13-45", "? [a]\n: b", "---\na: 1\n---\nb: 2",
    "%YAML 9.9\n---\na: 1", "'unterminated", "key: @bad", "{" * 5000, "a: !!float nan",
    "name: &a [*a]\ncgroup: *a", "name: x\nname: y", "[" * 100_000,
    "\n".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 10))
    .replace("*l0", "lol"),  # "billion laughs": 9^9 references, built cheaply by aliases
]  # fmt: skip


def _rng(seed: int) -> random.Random:
    return random.Random(seed)  # noqa: S311 - seeded on purpose: the run is reproducible


def _name(rng: random.Random) -> str:
    return f"x{rng.randrange(10**6)}"  # a fresh, valid name


def _put(key: str, choices: list[object]) -> Callable[[random.Random, dict[str, Any]], None]:
    def mutate(rng: random.Random, doc: dict[str, Any]) -> None:
        doc[key] = rng.choice(choices)

    return mutate


def _bad_hugepages(rng: random.Random, doc: dict[str, Any]) -> None:
    key, value = rng.choice(BAD_HUGEPAGES)
    doc[key] = value


def _unknown_field(rng: random.Random, doc: dict[str, Any]) -> None:
    doc[rng.choice(UNKNOWN_FIELDS)] = rng.choice([1, "x", None, {"a": [1]}])


def _bad_containers(rng: random.Random, doc: dict[str, Any]) -> None:
    doc.pop("cpus", None)
    doc["containers"] = rng.choice(BAD_CONTAINERS)


def _beside_containers(rng: random.Random, doc: dict[str, Any]) -> None:
    doc["containers"] = [{"name": "main", "cpus": rng.randint(1, 4)}]  # and a top-level cpus


def _missing(rng: random.Random, doc: dict[str, Any]) -> None:
    doc.pop(rng.choice(["name", "cgroup"]))
    if rng.random() < 0.5:
        doc["cpus"] = rng.choice(BAD_CPUS)  # a spec without resources would be valid


def _raw_value(rng: random.Random, doc: dict[str, Any]) -> None:
    key = rng.choice(["cpus", "memory", "devices", "name", "cgroup"])
    doc[key] = _Raw(rng.choice(RAW_JSON))


MUTATIONS = [
    _put("name", ODD_NAMES),
    _put("cgroup", ODD_CGROUPS),
    _put("cpus", BAD_CPUS),
    _put("memory", BAD_MEMORY),
    _put("devices", BAD_DEVICES),
    _put("policy", BAD_POLICIES),
    _bad_hugepages,
    _unknown_field,
    _bad_containers,
    _beside_containers,
    _missing,
    _raw_value,
]


def _pod(rng: random.Random) -> dict[str, Any]:
    """A Kubernetes Pod manifest with something wrong in it."""
    limits: dict[str, Any] = {"cpu": "2", "memory": "1Gi"}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": _name(rng)},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }
    what = rng.randrange(9)
    if what == 0:
        pod[rng.choice(["apiVersion", "kind"])] = rng.choice(["v2", "Deployment", None, 1])
    elif what == 1:
        pod["metadata"]["name"] = rng.choice([n for n in ODD_NAMES if n != "Db"])  # lowered
    elif what == 2:
        pod["metadata"]["annotations"] = {"numad.io/cgroup": rng.choice(ODD_CGROUPS)}
    elif what == 3:
        pod["metadata"]["annotations"] = {"numad.io/topology-policy": rng.choice(BAD_POLICIES)}
    elif what == 4:
        limits[rng.choice(["cpu", "memory", "hugepages-2Mi", ENGINES])] = rng.choice(
            ["abc", -1, "1e99", "-1Gi", [], None, "0.5x", "1" + "0" * 70]
        )
    elif what == 5:
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "4"}  # above the limit
    elif what == 6:
        pod["spec"]["initContainers"] = [{"name": "init", "restartPolicy": "Never"}]
    elif what == 7:
        pod["spec"] = rng.choice([{"containers": []}, {}, [], {"containers": {}}])
    else:
        pod.pop(rng.choice(["metadata", "spec"]))
    return pod


def _unsatisfiable(rng: random.Random) -> dict[str, Any]:
    """A valid spec that admission must refuse (409), whatever else is admitted."""
    what = rng.randrange(4)
    name = _name(rng)
    if what == 0:
        cpus = rng.randint(ALLOCATABLE + 1, 4096)
        policy = rng.choice(["none", "restricted"])
        return _spec(name, cpus if rng.random() < 0.5 else str(cpus), policy=policy)
    if what == 1:
        return _spec(name, rng.randint(1, 4), devices={ENGINES: rng.randint(9, 65536)})
    if what == 2:
        taken = rng.choice(ADMITTED)  # already admitted: 409 before any allocation
        return _spec(taken, rng.randint(1, 4))
    many = [{"name": f"c{i}", "cpus": 1} for i in range(rng.randint(ALLOCATABLE + 1, 200))]
    return {"name": name, "cgroup": f"numad.slice/{name}", "containers": many}


@dataclass(frozen=True)
class _Raw:
    text: str  # written into the JSON text as is


def _json(doc: object) -> str:
    raws: list[str] = []

    def default(value: object) -> str:
        assert isinstance(value, _Raw)
        raws.append(value.text)
        return f"@@raw{len(raws) - 1}@@"

    text = json.dumps(doc, default=default)
    for i, raw in enumerate(raws):
        text = text.replace(f'"@@raw{i}@@"', raw)
    return text


def _toml(doc: dict[str, Any]) -> str:
    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v) if isinstance(v, float) else str(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(i) for i in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {value(i)}" for k, i in v.items()) + " }"
        if isinstance(v, _Raw):
            return v.text
        return json.dumps(v)  # strings; null (not TOML) and the rest fail to parse

    return "\n".join(f"{json.dumps(k)} = {value(v)}" for k, v in doc.items())


def _body(rng: random.Random) -> tuple[bytes, str, bool]:
    """(body, Content-Type, valid): ``valid`` bodies parse (and must be refused by
    admission), so they only go to POST /v1/workloads."""
    roll = rng.random()
    if roll < 0.08:
        doc = _unsatisfiable(rng)
        fmt = "yaml" if rng.random() < 0.3 else "json"
        return _encode(doc, fmt)[0], f"application/{fmt}", True
    if roll < 0.55:
        if roll < 0.45:
            doc = _spec(_name(rng), rng.randint(1, 4))
            for _ in range(rng.randint(1, 3)):
                rng.choice(MUTATIONS)(rng, doc)
            fmt = rng.choice(["json", "json", "json", "yaml", "toml"])
        else:
            doc, fmt = _pod(rng), rng.choice(["json", "yaml"])
        body, fmt = _encode(doc, fmt)
        return body, f"application/{fmt}", False
    garbage: list[tuple[bytes, str]] = [
        (rng.choice(TOML_GARBAGE).encode(), "application/toml"),
        (rng.choice(YAML_GARBAGE).encode(), "application/yaml"),
        (_bad_json(rng), "application/json"),
        (rng.randbytes(rng.choice([0, 1, 17, 512, 4096])), rng.choice(CONTENT_TYPES)),
        (_json(_spec(_name(rng), 1) | {"bogus": 1}).encode(), rng.choice(CONTENT_TYPES)),
    ]
    body, kind = rng.choice(garbage)
    return body, kind, False


def _encode(doc: dict[str, Any], fmt: str) -> tuple[bytes, str]:
    """``doc`` as ``fmt`` where that can say it, else as JSON; and the format used."""
    if fmt == "yaml" and not _has_raw(doc):
        return yaml.safe_dump(doc).encode(), "yaml"
    if fmt == "toml" and "apiVersion" not in doc:
        return _toml(doc).encode(), "toml"
    return _json(doc).encode(), "json"


def _has_raw(doc: object) -> bool:
    if isinstance(doc, dict):
        return any(_has_raw(v) for v in doc.values())
    return isinstance(doc, _Raw)


def _bad_json(rng: random.Random) -> bytes:
    good = json.dumps(_spec(_name(rng), 2, devices={ENGINES: 1}))
    return rng.choice(
        [
            good[: rng.randrange(1, len(good) - 1)],  # truncated
            good.replace(",", ",,", 1),
            good.replace('"', "'"),
            good[:-1] + ",}",
            good[:-1] + ', "name": "again"}',  # a duplicate key
            "\ufeff" + good.replace("2", "3", 1) + " trailing",
            good.replace("}", "}}"),
            "[" + good + "]",
            '"just a string"',
            "null",
            " \n\t ",
            *BIG_JSON,
        ]
    ).encode()


def _path(rng: random.Random) -> str:
    if rng.random() < 0.05:
        return "/" + "a" * rng.choice([10_000, 60_000, 70_000])  # past 65536: 414
    if rng.random() < 0.05:
        return rng.choice(["*", "v1/nosuch", "http://localhost/v1/nosuch", "/v1/workloads/ "])
    segments = [rng.choice(SEGMENTS) for _ in range(rng.randint(0, 6))]
    path = "/" + "/".join(segments)
    if rng.random() < 0.3:
        path += "?" + rng.choice(["x=1", "name=db", "../../etc/passwd", "a" * 3000, "", "?&=#"])
    return path


def _route(path: str) -> list[str]:
    return [p for p in path.split("?", maxsplit=1)[0].split("/") if p]  # as the server reads it


def _succeeds(method: str, path: str) -> bool:
    """Whether a request would rightly succeed: the generator leaves those out."""
    parts = _route("/" + path.lstrip("/"))
    mine = len(parts) >= 3 and parts[:2] == ["v1", "workloads"] and parts[2] in ADMITTED
    if method == "GET":
        return (
            parts in (["v1", "health"], ["v1", "topology"], ["v1", "workloads"])
            or (mine and len(parts) == 3)
            or (mine and len(parts) == 4 and parts[3] == "explain")
        )
    return method == "DELETE" and mine and len(parts) == 3


def _hostile(rng: random.Random) -> _Request:
    roll = rng.random()
    if roll < 0.45:
        body, kind, valid = _body(rng)
        path = "/v1/workloads" if valid or rng.random() < 0.6 else "/v1/plan"
        what = f"POST {path} {kind or 'no type'}: {body[:80]!r}"
        headers = (("Content-Type", kind),) if kind or rng.random() < 0.5 else ()
        return _Request(what, "POST", path, body, headers)
    if roll < 0.60:
        return _raw_request(rng)
    if roll < 0.68:
        return _oversized(rng)
    while True:
        method = rng.choice(["GET", "GET", "DELETE", "POST", *METHODS])
        path = _path(rng)
        if method == "DELETE" and rng.random() < 0.5:
            path = "/v1/workloads/" + str(rng.choice(ODD_NAMES))
        if not _succeeds(method, path):
            break
    data = rng.randbytes(rng.randint(0, 64)) if method not in ("GET", "HEAD") else None
    what = f"{method} {path[:80]!r}"
    if re.search(r"[^\x21-\x7e]", path) or len(path) > 65_000:
        line = f"{method} {path} HTTP/1.1\r\n".encode("utf-8", errors="surrogateescape")
        length = f"Content-Length: {len(data)}\r\n".encode() if data is not None else b""
        return _Request(what, method, path, raw=line + length + b"\r\n" + (data or b""))
    return _Request(what, method, path, data)


def _raw_request(rng: random.Random) -> _Request:
    """What http.client will not send: bad request lines, headers, Content-Lengths."""
    body = json.dumps(_spec(_name(rng), 1) | {"bogus": 1}).encode()
    post = b"POST /v1/workloads HTTP/1.1\r\nContent-Type: application/json\r\n"
    choice = rng.randrange(6)
    if choice == 0:  # no Content-Length at all, or a chunked body instead
        chunked = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        payload = post + rng.choice([b"\r\n" + body, chunked])
    elif choice == 1:  # a Content-Length that is not a plain decimal number
        value = rng.choice(
            [
                *(b"abc", b"-1", b"+5", b"1e3", b"0x10", b"5, 5", b"", b" 7 ", b"9" * 30),
                *(b"\xb2", b"\xb3", b"\xb9", b"1\xb2"),  # latin-1 superscript digits
            ]
        )
        payload = post + b"Content-Length: " + value + b"\r\n\r\n" + body
    elif choice == 2:  # a request line that is not one
        payload = rng.choice(
            [
                b"GARBAGE\r\n\r\n",
                b"POST /v1/workloads\r\n\r\n",
                b"GET / HTTP/1.1 extra\r\n\r\n",
                b"GET / FOO/1.1\r\n\r\n",
                b"GET / HTTP/1.x\r\n\r\n",
                b"GET / HTTP/2.0\r\n\r\n",
                b"\x00\x01\x02 / HTTP/1.1\r\n\r\n",
                b"GET /v1/work loads HTTP/1.1\r\n\r\n",
                b"get /v1/health HTTP/1.1\r\n\r\n",
                rng.randbytes(rng.randint(1, 300)) + b"\r\n\r\n",
            ]
        )
    elif choice == 3:  # headers the parser must refuse
        payload = rng.choice(
            [
                b"GET /v1/nosuch HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
                b"GET /v1/nosuch HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n",
                b"GET /v1/nosuch HTTP/1.1\r\nno colon here\r\n\r\n",
                b"GET /v1/nosuch HTTP/1.1\r\n: empty name\r\n\r\n",
            ]
        )
    elif choice == 4:  # two Content-Lengths, or an Expect the server cannot meet
        payload = rng.choice(
            [
                post + b"Content-Length: 3\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
                post + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
                post + b"Expect: teapot\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
            ]
        )
    else:  # a Content-Length beyond the body that follows (the client then closes)
        payload = post + b"Content-Length: %d\r\n\r\n" % (len(body) + 100) + body
    return _Request(f"raw {payload[:100]!r}", raw=payload)


def _oversized(rng: random.Random) -> _Request:
    size = MAX_BODY + rng.choice([1, 1000, 1 << 20])
    claimed = rng.choice([size, 10**12])
    body = b"{" + b" " * (size - 1) if claimed == size else b"{}"
    head = b"POST %s HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    path = rng.choice([b"/v1/workloads", b"/v1/plan"])
    return _Request(f"{size}-byte body, {claimed} claimed", raw=head % (path, claimed) + body)


def _barrage(daemon: _Daemon, count: int, budget: float) -> dict[str, list[str]]:
    """Send ``count`` hostile requests; return the failures by kind, each with examples."""
    rng = _rng(SEED)
    found: dict[str, list[str]] = {}
    deadline = time.monotonic() + budget
    for i in range(count):
        if time.monotonic() > deadline:
            found[f"time budget of {budget:.0f} s spent after {i} requests"] = []
            break
        req = _hostile(rng)
        failure = _judge(req, _send(daemon.socket, req))
        if failure is not None:
            found.setdefault(failure, []).append(req.what)
        if sum(len(v) for k, v in found.items() if "hang" in k) >= 3:
            break  # the daemon hangs: the rest would only burn the timeout
    return found


def _report(found: dict[str, list[str]]) -> str:
    lines = [f"{len(found)} kinds of wrong answer:"]
    for kind, whats in sorted(found.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(whats)} x {kind}")
        lines.extend(f"      e.g. {w[:200]}" for w in whats[:3])
    return "\n".join(lines)


def _stable_changes(before: dict[str, bytes], root: Path) -> list[str]:
    changed = _changed(before, _files(root))
    for _ in range(3):  # a file caught mid-rewrite by the reconcile loop reads empty
        if not changed:
            break
        time.sleep(0.25)
        changed = _changed(before, _files(root))
    return changed


BARRAGE = 2000
BARRAGE_BUDGET = 45.0  # seconds
BATCH = [{"name": "a", "cpus": 2}, {"name": "b", "cpus": "250m"}]  # exclusive and shared


def test_hostile_requests_get_json_4xx_and_change_nothing(daemon: _Daemon) -> None:
    for cgroup in ("db", "web", "batch", "batch/a", "batch/b"):
        scratch_mkdir(daemon.cgroups, f"numad.slice/{cgroup}")
    daemon.call("POST", "/v1/workloads", _spec("db", 4, devices={ENGINES: 2}))
    daemon.call("POST", "/v1/workloads", _spec("web", "500m"))
    batch = {"name": "batch", "cgroup": "numad.slice/batch", "containers": BATCH}
    daemon.call("POST", "/v1/workloads", batch)
    listed = daemon.call("GET", "/v1/workloads")
    before = _files(daemon.root)

    found = _barrage(daemon, BARRAGE, BARRAGE_BUDGET)

    assert daemon.proc is not None
    assert daemon.proc.poll() is None, f"numad exited: {daemon.stop()[-3000:]}"
    failures = [_report(found)] if found else []
    if not daemon.call("GET", "/v1/health")["ready"]:
        failures.append("numad is no longer ready")
    if daemon.call("GET", "/v1/workloads") != listed:
        failures.append("the workload list changed")
    changed = _stable_changes(before, daemon.root)
    if changed:
        failures.append(f"{len(changed)} files changed, e.g. {changed[:5]}")
    if daemon.tracebacks():
        failures.append(f"numad printed tracebacks:\n{daemon.tracebacks()}")
    assert not failures, "\n".join(failures)
    _eventually(lambda: _check_invariants(daemon))


# -- concurrent admit and release ----------------------------------------------------------

THREADS = 8
OPS = 1000  # admit, release and show requests in all
PHASES = 5  # the workers pause after each for a full check
SLOTS = 4  # workloads per thread: 0-2 one container, 3 two (containers a and b)
MULTI = 3
SENTINELS = {
    "shared-a": _spec("shared-a", "500m"),
    "shared-b": {
        "name": "shared-b",
        "cgroup": "numad.slice/shared-b",
        "containers": [{"name": "a", "cpus": "200m"}, {"name": "b", "cpus": 0.1}],
    },
}


@dataclass(frozen=True)
class _Holding:
    who: str  # workload/container
    cpus: CPUSet | None  # exclusive CPUs, or None on the shared pool
    devices: tuple[str, ...] = ()
    shown: CPUSet | None = None  # the pool a listing shows for a shared container


def _problems(holdings: list[_Holding]) -> list[str]:
    """DESIGN invariants 1 and 2 over one consistent view."""
    problems: list[str] = []
    exclusive = [h for h in holdings if h.cpus is not None]
    pool = ONLINE
    for n, h in enumerate(exclusive):
        assert h.cpus is not None
        problems += [
            f"{h.who} and {o.who} both hold CPUs {h.cpus & o.cpus}"
            for o in exclusive[:n]
            if o.cpus is not None and not h.cpus.isdisjoint(o.cpus)
        ]
        if not h.cpus.isdisjoint(RESERVED) or not h.cpus.issubset(ONLINE):
            problems.append(f"{h.who} holds {h.cpus}: reserved or not online")
        pool -= h.cpus
    if not pool:
        problems.append("the shared pool is empty")
    holders: dict[str, str] = {}
    for h in holdings:
        problems += [f"{d} held by {holders[d]} and {h.who}" for d in h.devices if d in holders]
        holders |= dict.fromkeys(h.devices, h.who)
    problems += [
        f"{h.who} shows {h.shown}, the pool is {pool}"
        for h in holdings
        if h.cpus is None and h.shown is not None and h.shown != pool
    ]
    return problems


def _from_listing(listed: list[dict[str, Any]]) -> list[_Holding]:
    return [
        _Holding(
            f"{w['name']}/{name}",
            CPUSet.parse_list(c["cpus"]) if c["exclusive"] else None,
            tuple(d for ds in c["devices"].values() for d in ds),
            None if c["exclusive"] else CPUSet.parse_list(c["cpus"]),
        )
        for w in listed
        for name, c in w["containers"].items()
    ]


def _from_checkpoint(daemon: Numad) -> list[_Holding]:
    """A consistent snapshot at any moment: the checkpoint is replaced by rename,
    under numad's lock, before any cgroup changes."""
    path = daemon.root / "var" / "lib" / "numad" / state.FILE
    checkpoint = state.decode(path.read_bytes(), str(path))
    out = []
    for name, record in checkpoint.workloads.items():
        containers = record.cpus.keys() | record.devices.keys()
        for c in sorted(containers):
            cpus = CPUSet.parse_list(record.cpus.get(c, ""))
            devices = tuple(d for ds in record.devices.get(c, {}).values() for d in ds)
            out.append(_Holding(f"{name}/{c}", cpus or None, devices))
    return out


def _request(
    socket_path: str, method: str, path: str, body: str | None, refused: list[str]
) -> dict[str, Any]:
    """numad's own client. A refused connection is noted in ``refused`` and retried,
    so that the run goes on and its invariants are still checked."""
    for attempt in range(200):
        try:
            return request(socket_path, method, path, body, timeout=CLIENT_TIMEOUT)
        except APIError:
            raise
        except NumadError as err:
            if "cannot connect" not in err.problem:
                raise
            refused.append(f"{method} {path}: {err}")
            time.sleep(0.002 * (attempt + 1))
    raise AssertionError(f"{method} {path}: the daemon refused 200 connections in a row")


@dataclass
class _Worker:
    """One client thread's workloads: names t<index>-s<slot>, never another's."""

    index: int
    daemon: Numad
    rng: random.Random
    refused: list[str]
    held: dict[int, dict[str, str]] = field(default_factory=dict)  # slot -> exclusive cpus
    counts: dict[str, int] = field(default_factory=dict)

    def name(self, slot: int) -> str:
        return f"t{self.index}-s{slot}"

    def cgroups(self) -> list[str]:
        out = []
        for slot in range(SLOTS):
            out.append(f"numad.slice/{self.name(slot)}")
            if slot >= MULTI:
                out += [f"numad.slice/{self.name(slot)}/{c}" for c in ("a", "b")]
        return out

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        text = None if body is None else json.dumps(body)
        return _request(self.daemon.socket, method, path, text, self.refused)

    def spec(self, slot: int) -> dict[str, Any]:
        rng, name = self.rng, self.name(slot)
        if slot >= MULTI:
            containers = [{"name": "a", "cpus": rng.randint(1, 4)}, {"name": "b", "cpus": "100m"}]
            return {"name": name, "cgroup": f"numad.slice/{name}", "containers": containers}
        roll = rng.random()
        if roll < 0.25:
            return {**_spec(name, 1), "cpus": rng.choice(["250m", "0.5", 1.5])}  # shared
        spec = _spec(name, rng.randint(1, 4) if roll < 0.9 else rng.randint(6, 15))
        if rng.random() < 0.2:
            spec["devices"] = {ENGINES: rng.randint(1, 3)}
        return spec

    def run(self, ops: int) -> None:
        for _ in range(ops):
            slot = self.rng.randrange(SLOTS)
            if slot not in self.held:
                self.admit(slot, self.spec(slot))
            elif self.rng.random() < 0.7:
                self.release(slot)
            else:
                self.show(slot)

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def admit(self, slot: int, spec: dict[str, Any]) -> None:
        try:
            answer = self.call("POST", "/v1/workloads", spec)
        except APIError as err:
            self.rejected(spec, err)
            return
        self.count("admitted")
        shown = answer["workload"]["containers"]
        wanted = spec.get("containers") or [{**spec, "name": "main"}]
        for want in wanted:
            got = shown[want["name"]]
            assert got["exclusive"] == isinstance(want["cpus"], int), (spec, got)
            if got["exclusive"]:
                assert len(CPUSet.parse_list(got["cpus"])) == want["cpus"], (spec, got)
            devices = want.get("devices", {})
            assert {k: len(v) for k, v in got["devices"].items()} == devices, (spec, got)
        self.held[slot] = {c: v["cpus"] for c, v in shown.items() if v["exclusive"]}
        for cname, cpus in self.held[slot].items():
            cgroup = shown[cname]["cgroup"]
            _eventually(partial(_cgroup_is, self.daemon, cgroup, cpus), pause=0.05)

    def rejected(self, spec: dict[str, Any], err: APIError) -> None:
        """A refusal is fine, as long as it is one: 409, a rejection code, a message."""
        error = err.body.get("error", {})
        what = f"admit {spec}: {err.status} {err.body}"
        assert err.status == 409, what
        assert error.get("code") in ("topology_affinity", "allocation"), what
        assert error.get("message"), what
        self.count("rejected")

    def release(self, slot: int) -> None:
        name = self.name(slot)
        assert self.call("DELETE", f"/v1/workloads/{name}") == {"released": name}
        del self.held[slot]
        self.count("released")

    def show(self, slot: int) -> None:
        shown = self.call("GET", f"/v1/workloads/{self.name(slot)}")["containers"]
        assert {c: v["cpus"] for c, v in shown.items() if v["exclusive"]} == self.held[slot]
        self.count("shown")


def _cgroup_is(daemon: Numad, cgroup: str, cpus: str) -> None:
    assert daemon.cpus_of(cgroup) == CPUSet.parse_list(cpus), f"{cgroup} is not {cpus}"


class _Monitor(threading.Thread):
    """While the workers run: the invariants in checkpoint snapshots, and the list
    request, which must answer (its entries are read one by one, so they are not
    checked against each other here)."""

    def __init__(self, daemon: Numad, refused: list[str]) -> None:
        super().__init__(daemon=True)
        self.numad = daemon
        self.refused = refused
        self.stopping = threading.Event()
        self.problems: list[str] = []
        self.list_errors: list[str] = []
        self.snapshots = 0

    def run(self) -> None:
        while not self.stopping.wait(0.1) and not self.problems:
            self.problems += _problems(_from_checkpoint(self.numad))
            self.snapshots += 1
            try:
                _request(self.numad.socket, "GET", "/v1/workloads", None, self.refused)
            except APIError as err:
                self.list_errors.append(f"{err.status} {err.body}")


def _full_check(daemon: Numad) -> None:
    """With the workers paused: the invariants, and every cgroup against the listing."""
    assert not _problems(_from_listing(daemon.call("GET", "/v1/workloads")["workloads"]))
    assert not _problems(_from_checkpoint(daemon))
    _eventually(lambda: _check_invariants(daemon))


def test_concurrent_admit_release_keep_the_invariants(daemon: _Daemon) -> None:
    rng = _rng(SEED)
    refused: list[str] = []
    workers = [_Worker(i, daemon, _rng(rng.randrange(1 << 32)), refused) for i in range(THREADS)]
    sentinels = ["shared-a", "shared-b", "shared-b/a", "shared-b/b"]
    for cgroup in [c for w in workers for c in w.cgroups()] + [
        f"numad.slice/{c}" for c in sentinels
    ]:
        scratch_mkdir(daemon.cgroups, cgroup)
    for spec in SENTINELS.values():
        daemon.call("POST", "/v1/workloads", spec)
    monitor = _Monitor(daemon, refused)
    monitor.start()
    with ThreadPoolExecutor(THREADS) as pool:
        for phase in range(PHASES):
            runs = [pool.submit(w.run, OPS // THREADS // PHASES) for w in workers]
            for run in runs:
                run.result(timeout=120)
            assert not monitor.problems, f"phase {phase}: {monitor.problems[:5]}"
            _full_check(daemon)
    monitor.stopping.set()
    monitor.join(timeout=CLIENT_TIMEOUT)
    assert not monitor.problems, monitor.problems[:5]

    for w in workers:
        for slot in list(w.held):
            w.release(slot)
    listed = daemon.call("GET", "/v1/workloads")["workloads"]
    assert [w["name"] for w in listed] == sorted(SENTINELS)
    for w in listed:  # every exclusive CPU is back in the pool, and every shared cgroup has it
        for c in w["containers"].values():
            assert CPUSet.parse_list(c["cpus"]) == ONLINE
            _eventually(partial(_cgroup_is, daemon, c["cgroup"], ONLINE.format_list()))
    _full_check(daemon)
    for name in SENTINELS:
        daemon.call("DELETE", f"/v1/workloads/{name}")
    assert daemon.call("GET", "/v1/workloads")["workloads"] == []

    totals = {k: sum(w.counts.get(k, 0) for w in workers) for k in ("admitted", "rejected")}
    assert totals["admitted"] > 50
    assert totals["rejected"] > 0
    assert monitor.snapshots > 0
    assert not daemon.tracebacks(), daemon.tracebacks()
    # Found by this test (see the minimal reproductions below): both fail the run.
    assert not monitor.list_errors, (
        f"GET /v1/workloads failed {len(monitor.list_errors)} times while workloads were "
        f"released, e.g. {monitor.list_errors[:3]}"
    )
    assert not refused, f"{len(refused)} connections refused, e.g. {refused[:3]}"


# -- minimal reproductions of what the two runs above found ------------------------------


def test_a_content_length_in_superscript_digits_gets_a_4xx(daemon: _Daemon) -> None:
    """ "²" (latin-1 0xB2) passes str.isdigit() but not int(): the handler raised a
    ValueError, the connection closed without an answer, a traceback went to stderr."""
    payload = b"POST /v1/workloads HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n{}"
    req = _Request("a Content-Length of ²", raw=payload)
    assert _judge(req, _send(daemon.socket, req)) is None
    assert not daemon.tracebacks(), daemon.tracebacks()


HTTP_LAYER_REFUSALS = {
    "unknown method (501)": b"PUT /v1/workloads HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    "lower-case method (501)": b"get /v1/health HTTP/1.1\r\n\r\n",
    "HTTP/2.0 (505)": b"GET /v1/health HTTP/2.0\r\n\r\n",
    "no request line (400)": b"GARBAGE\r\n\r\n",
    "space in the path (400)": b"GET /v1/work loads HTTP/1.1\r\n\r\n",
    "path over 64 KiB (414)": b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
    "101 headers (431)": b"GET /v1/health HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n",
}


def test_requests_the_http_layer_refuses_get_json_4xx_too(daemon: _Daemon) -> None:
    """What http.server refuses before numad's handler runs gets the stdlib's HTML error
    page (with no status line at all while the request line is unparsed), and unknown
    methods and versions get a 501 or 505."""
    wrong = {}
    for what, payload in HTTP_LAYER_REFUSALS.items():
        req = _Request(what, raw=payload)
        failure = _judge(req, _send(daemon.socket, req))
        if failure is not None:
            wrong[what] = failure
    assert not wrong, json.dumps(wrong, indent=1)


def test_a_body_numad_does_not_read_is_not_run_as_a_request(daemon: _Daemon) -> None:
    """A body the handler never reads (a 404, 411 or 413; a GET or DELETE with a body)
    stays on the keep-alive connection and is parsed as the next request: here a DELETE
    sent as the body of a GET to an unknown route released db."""
    scratch_mkdir(daemon.cgroups, "numad.slice/db")
    daemon.call("POST", "/v1/workloads", _spec("db", 4))
    hidden = b"DELETE /v1/workloads/db HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    head = b"GET /v1/nosuch HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(hidden)
    assert _send_raw(daemon.socket, head + hidden).status == 404
    assert [w["name"] for w in daemon.call("GET", "/v1/workloads")["workloads"]] == ["db"]


def test_a_cgroup_belongs_to_one_workload(daemon: _Daemon) -> None:
    """Nothing stops a second workload from naming a cgroup numad already manages: it
    was admitted, and its shared pool overwrote db's exclusive cpuset.cpus."""
    scratch_mkdir(daemon.cgroups, "numad.slice/db")
    db = daemon.call("POST", "/v1/workloads", _spec("db", 4))["containers"]["main"]["cpus"]
    other = json.dumps({"name": "other", "cgroup": "numad.slice/db", "cpus": "500m"})
    req = _Request("a second workload in db's cgroup", "POST", "/v1/workloads", other.encode())
    failures = [f for f in [_judge(req, _send(daemon.socket, req))] if f is not None]
    if daemon.cpus_of("numad.slice/db") != CPUSet.parse_list(db):
        failures.append(f"db holds {db}, its cgroup has {daemon.cpus_of('numad.slice/db')}")
    assert not failures, failures


def test_the_workload_list_answers_while_workloads_are_released(daemon: _Daemon) -> None:
    """GET /v1/workloads takes the names, then shows each one under the lock on its own:
    a release in between makes the list answer 404 "<name>: no such workload" (and a
    list that does answer mixes moments)."""
    names = [f"w{i}" for i in range(20)]
    for name in names:
        scratch_mkdir(daemon.cgroups, f"numad.slice/{name}")
        daemon.call("POST", "/v1/workloads", _spec(name, "100m"))
    stop = threading.Event()

    def churn() -> None:
        for _ in range(100):
            if stop.is_set():
                return
            name = random.choice(names)  # noqa: S311 - any order will do
            daemon.call("DELETE", f"/v1/workloads/{name}")
            daemon.call("POST", "/v1/workloads", _spec(name, "100m"))

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    errors = []
    for _ in range(100):
        try:
            daemon.call("GET", "/v1/workloads")
        except APIError as err:
            errors.append(f"{err.status} {err.body}")
        if not churner.is_alive():
            break
    stop.set()
    churner.join(timeout=30)
    assert not errors, f"{len(errors)} list requests failed, e.g. {errors[:2]}"


def test_clients_wait_their_turn_while_the_daemon_is_busy(daemon: _Daemon) -> None:
    """The API socket listens with socketserver's default backlog of 5, and numad's
    client connects with its timeout already set, so a full queue is EAGAIN at once:
    with the daemon busy for half a second (SIGSTOP stands in for a loaded host), 6 of
    12 clients got "cannot connect: Resource temporarily unavailable"."""
    answers: list[str] = []

    def health() -> None:
        try:
            answers.append(str(request(daemon.socket, "GET", "/v1/health", timeout=10)))
        except NumadError as err:
            answers.append(str(err))

    assert daemon.proc is not None
    clients = [threading.Thread(target=health) for _ in range(12)]
    daemon.proc.send_signal(signal.SIGSTOP)
    try:
        for client in clients:
            client.start()
        time.sleep(0.5)
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
    for client in clients:
        client.join(timeout=20)
    refused = [a for a in answers if "cannot connect" in a]
    assert not refused, f"{len(refused)} of {len(clients)} refused: {refused[0]}"
