"""A real headless Chromium (Debian's ``chromium`` package) for the live page's tests,
driven over the DevTools protocol on a pipe: no Python dependency, no open port.

``python -m tests.browser --prepare`` (scripts/check runs it as root) installs the
package where it is missing, as ``tests.vm.harness --prepare`` does for QEMU.
Chromium's own network chatter (updates, translation, safe browsing) is switched
off; it loads only the pages a test names.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests import debian

PACKAGE = "chromium"
COMMAND_SECONDS = 30.0  # one DevTools command; a page load is one command


class BrowserError(RuntimeError):
    """Chromium could not be started, or did not answer in time."""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def install() -> None:
    """Install Debian's chromium where it is missing (root only)."""
    if chromium() is not None:
        return
    try:
        debian.install([PACKAGE], timeout=900)
    except debian.InstallError as err:
        raise BrowserError(str(err)) from err


class Browser:
    """One Chromium process and one page in it. ``events`` holds what the page logged."""

    def __init__(self, profile: Path) -> None:
        binary = chromium()
        if binary is None:
            raise BrowserError("chromium is not installed")
        # Chromium reads commands from fd 3 and writes answers to fd 4; the pipes are
        # kept above 10 so that moving them to 3 and 4 in the child clobbers nothing.
        to_child, self._to_browser = _pipe()
        self._from_browser, from_child = _pipe()

        def plumb() -> None:
            os.dup2(to_child, 3)
            os.dup2(from_child, 4)

        argv = [binary, "--headless=new", "--remote-debugging-pipe", *_QUIET]
        if os.geteuid() == 0:
            argv.append("--no-sandbox")  # Chromium's sandbox refuses to run as root
        argv += [f"--user-data-dir={profile}", "about:blank"]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=plumb,  # noqa: PLW1509 - a test's one child, before any thread forks
        )
        os.close(to_child)
        os.close(from_child)
        self.events: list[dict[str, Any]] = []
        self._answers: dict[int, dict[str, Any]] = {}
        self._next = 0
        self._ready = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._session: str | None = None
        self._reader.start()
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        self._session = attached["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.send(f"{domain}.enable")

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One DevTools command to the page (the browser before a page is attached)."""
        with self._ready:
            self._next += 1
            ident = self._next
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if self._session:
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + COMMAND_SECONDS
        with self._ready:
            while ident not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    raise BrowserError(f"{method}: no answer from chromium")
                self._ready.wait(left)
            answer = self._answers.pop(ident)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    def _read(self) -> None:
        buffered = b""
        while chunk := os.read(self._from_browser, 1 << 16):
            buffered += chunk
            *messages, buffered = buffered.split(b"\0")
            with self._ready:
                for raw in messages:
                    message = json.loads(raw)
                    if "id" in message:
                        self._answers[message["id"]] = message
                    else:
                        self.events.append(message)
                self._ready.notify_all()

    def errors(self) -> list[str]:
        """What the page reported as an error: console.error, uncaught exceptions, failed
        loads (the Log domain)."""
        found = []
        for e in list(self.events):
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Runtime.exceptionThrown":
                found.append(f"exception: {params.get('exceptionDetails')}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                found.append(f"log: {params['entry'].get('text')} {params['entry'].get('url')}")
        return found

    def size(self, width: int, height: int, *, mobile: bool = False) -> None:
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )

    def load(self, url: str) -> None:
        answer = self.send("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise BrowserError(f"{url}: {answer['errorText']}")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON values only)."""
        answer = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, seconds: float) -> Any:
        """The first truthy value of ``expression`` within ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.2)

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self._session = None
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self._to_browser)
        self._reader.join(timeout=10)
        os.close(self._from_browser)


@contextlib.contextmanager
def browser(profile: Path) -> Iterator[Browser]:
    b = Browser(profile)
    try:
        yield b
    finally:
        b.close()


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    high = (fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 10), fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 10))
    os.close(r)
    os.close(w)
    return high


_QUIET = [
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-sync",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-features=Translate,OptimizationHints,MediaRouter,SafeBrowsing",
    "--metrics-recording-only",
    "--mute-audio",
    "--hide-scrollbars",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.browser", description=__doc__)
    parser.add_argument("--prepare", action="store_true", help="install chromium if missing")
    args = parser.parse_args(argv)
    if args.prepare:
        install()
        print(json.dumps({"chromium": chromium()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
