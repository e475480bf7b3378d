"""The live page: the running daemon for people, in a browser, on the metrics listener.

Edge, read-only. ``GET /`` is one self-contained HTML page (inline CSS and script,
no external asset); it fetches ``GET /state.json`` every few seconds and redraws:
the picture of the machine (``numad.topology.picture``, SVG inline) under its legend,
the workloads with their colours, CPUs, nodes, devices and memory locality, and the
problems ``/v1/health`` lists. A workload's colour is its name's, so a refresh after a
release repaints nobody else. The state is read from the daemon's own read-only views
(the same ones the API serves), under its lock, at each request; the page changes
nothing.

Off unless ``[metrics] page = true``: the API's socket is mode 0660, but the metrics
port answers anyone who reaches it (any local user on loopback), and the state names
every workload, its cgroup and placement. Off, both paths answer 404 saying so.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from html import escape
from typing import Any, Protocol

from numad.topology.model import Topology
from numad.topology.picture import from_api, legend_keys, svg

REFRESH_SECONDS = 3
PAGE_PATHS = ("/", "/index.html")
STATE_PATH = "/state.json"

Answer = tuple[int, bytes, str]  # status, body, content type


class Source(Protocol):
    """What the page reads of the daemon (``numad.daemon.root.Daemon`` has it all)."""

    @property
    def ready(self) -> bool: ...
    @property
    def problems(self) -> list[str]: ...
    @property
    def topology(self) -> Topology: ...
    def list_all(self) -> list[dict[str, Any]]: ...
    def host(self) -> dict[str, Any]: ...
    def nrt(self) -> dict[str, Any]: ...


def state(source: Source, title: str = "") -> dict[str, Any]:
    """Everything the page shows, as JSON values."""
    workloads = source.list_all()
    host = source.host()
    topo = source.topology
    holders = from_api(workloads, host, source.nrt())
    keys = legend_keys(topo, holders)
    colours = {k.workload: k.fill for k in keys if k.workload is not None}
    return {
        "ready": source.ready,
        "problems": list(source.problems),
        "reserved": host.get("reserved", ""),
        "shared": host.get("shared", ""),
        "workloads": [_workload(w, colours.get(w["name"], "")) for w in workloads],
        "legend": [{"fill": k.fill, "label": k.label, "workload": k.workload} for k in keys],
        "svg": svg(topo, holders, title, legend=False),  # the page draws the legend
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _workload(shown: dict[str, Any], colour: str) -> dict[str, Any]:
    """One workload's row; ``colour`` is its key's in the legend (its own where it holds
    CPUs or devices, the shared pool's where it runs there)."""
    containers = shown.get("containers", {})
    memory = shown.get("memory", {})
    return {
        "name": shown["name"],
        "colour": colour,
        "cgroup": shown.get("cgroup", ""),
        "state": shown.get("state", ""),
        "unplaced": shown.get("unplaced"),
        "containers": [
            {
                "name": name,
                "cpus": c.get("cpus", ""),
                "exclusive": bool(c.get("exclusive")),
                "mems": c.get("mems", ""),
                "devices": {k: sorted(v) for k, v in sorted(c.get("devices", {}).items())},
            }
            for name, c in containers.items()
        ],
        "nodes": memory.get("nodes", ""),
        "locality": memory.get("locality"),
    }


OFF = (
    b"numad: the live page and /state.json are off; set [metrics] page = true in"
    b" numad.toml to serve them (every workload, cgroup and placement, to whoever can"
    b" reach this port); /metrics is served either way\n"
)


class LivePage:
    """Answers the page's paths, or 404 with ``OFF`` unless ``enabled``; ``None`` for
    any other path (metrics go on)."""

    def __init__(self, source: Source, title: str = "numad", *, enabled: bool = False) -> None:
        self.enabled = enabled
        self._state: Callable[[], dict[str, Any]] = lambda: state(source, title)
        self._page = PAGE.replace("__TITLE__", escape(title)).replace(
            "__REFRESH_MS__", str(REFRESH_SECONDS * 1000)
        )

    def answer(self, path: str) -> Answer | None:
        if path not in (*PAGE_PATHS, STATE_PATH):
            return None
        if not self.enabled:
            return 404, OFF, "text/plain"
        if path in PAGE_PATHS:
            return 200, self._page.encode(), "text/html; charset=utf-8"
        try:
            body = json.dumps(self._state())
        except Exception as err:  # noqa: BLE001 - one failed refresh is answered, not fatal
            return 500, json.dumps({"error": f"{type(err).__name__}: {err}"}).encode(), _JSON
        return 200, body.encode(), _JSON


_JSON = "application/json"

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>__TITLE__</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0;padding:12px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:18px 0 6px}
#status{color:#555;margin-bottom:8px}.bad{color:#a40000}.ok{color:#276a27}
#picture{overflow-x:auto}
#picture svg{width:100%;min-width:760px;height:auto;max-width:1200px;background:#fff;
border:1px solid #ccc}
.scroll{overflow-x:auto}table{border-collapse:collapse;background:#fff;min-width:100%}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#eee}.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;
border:1px solid #555;vertical-align:-1px}ul{margin:4px 0;padding-left:20px}
.swatch.offline{background:repeating-linear-gradient(45deg,#eee 0 3px,#b0b0b0 3px 5px)}
.range{white-space:nowrap}
#legend{display:flex;flex-wrap:wrap;gap:2px 14px;margin:0 0 6px;padding:0;list-style:none}
#legend li{white-space:nowrap}
</style></head>
<body>
<h1>__TITLE__</h1>
<div id="status">loading&hellip;</div>
<h2>Problems</h2><ul id="problems"><li>none</li></ul>
<h2>Workloads</h2>
<div class="scroll"><table id="workloads"><thead><tr><th>workload</th><th>container</th>
<th>CPUs</th><th>memory nodes</th><th>devices</th><th>memory locality</th><th>state</th>
</tr></thead><tbody></tbody></table></div>
<h2>Machine</h2><ul id="legend"></ul><div id="picture"></div>
<script>
"use strict";
const REFRESH_MS = __REFRESH_MS__;
let lastSvg = "";
function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text;
  row.appendChild(td);
  return td;
}
function plural(n, noun) {
  return n + " " + noun + (n === 1 ? "" : "s");
}
function swatch(fill) {
  const mark = document.createElement("span");
  mark.className = fill.startsWith("url(") ? "swatch offline" : "swatch";
  if (!fill.startsWith("url(")) mark.style.background = fill;
  return mark;
}
// A kernel list ("5-7,21-23") whose lines break only between its ranges, never inside one.
function ranges(td, prefix, list) {
  td.replaceChildren(prefix);
  list.split(",").forEach((part, i) => {
    if (i > 0) td.append(",", document.createElement("wbr"));
    const range = document.createElement("span");
    range.className = "range";
    range.textContent = part;
    td.appendChild(range);
  });
  return td;
}
function nodes(list) {
  return /^\\d+$/.test(list) ? "node " : "nodes ";
}
function locality(value) {
  return value === null || value === undefined ? "unknown" : (value * 100).toFixed(1) + " %";
}
function showWorkloads(workloads) {
  const body = document.querySelector("#workloads tbody");
  body.replaceChildren();
  if (workloads.length === 0) {
    const row = body.insertRow();
    cell(row, "none admitted").colSpan = 7;
  }
  for (const w of workloads) {
    w.containers.forEach((c, i) => {
      const row = body.insertRow();
      row.className = "workload";
      row.dataset.workload = w.name;
      const name = cell(row, i === 0 ? w.name : "");
      if (i === 0 && w.colour) name.prepend(swatch(w.colour));
      cell(row, c.name);
      ranges(cell(row, ""), c.exclusive ? "" : "shared pool: ", c.cpus || "-");
      const mems = c.mems || w.nodes;
      if (mems) ranges(cell(row, ""), nodes(mems), mems); else cell(row, "any node");
      const devices = Object.entries(c.devices).map(([k, v]) => k + ": " + v.join(", "));
      cell(row, devices.length ? devices.join("; ") : "-");
      cell(row, locality(w.locality));
      cell(row, w.unplaced ? "unplaced: " + w.unplaced : w.state);
    });
  }
}
function showLegend(keys) {
  const list = document.getElementById("legend");
  list.replaceChildren();
  for (const key of keys) {
    const item = document.createElement("li");
    if (key.workload !== null) item.dataset.workload = key.workload;
    item.append(swatch(key.fill), key.label);
    list.appendChild(item);
  }
}
function showProblems(problems) {
  const list = document.getElementById("problems");
  list.replaceChildren();
  for (const text of problems.length ? problems : ["none"]) {
    const item = document.createElement("li");
    item.textContent = text;
    if (problems.length) item.className = "bad";
    list.appendChild(item);
  }
}
function show(state) {
  const status = document.getElementById("status");
  status.textContent = (state.ready ? "ready" : "NOT READY") + " \\u00b7 " +
    plural(state.workloads.length, "workload") + " \\u00b7 reserved CPUs " +
    (state.reserved || "none") +
    " \\u00b7 updated " + state.time;
  status.className = state.ready ? "ok" : "bad";
  showProblems(state.problems);
  showWorkloads(state.workloads);
  showLegend(state.legend);
  if (state.svg !== lastSvg) {
    document.getElementById("picture").innerHTML = state.svg;
    lastSvg = state.svg;
  }
}
async function refresh() {
  try {
    const answer = await fetch("state.json", {cache: "no-store"});
    const state = await answer.json();
    if (!answer.ok) throw new Error(state.error || ("HTTP " + answer.status));
    show(state);
  } catch (err) {
    const status = document.getElementById("status");
    status.textContent = "numad unreachable: " + err.message + " (retrying)";
    status.className = "bad";
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}
refresh();
</script>
</body></html>
"""
