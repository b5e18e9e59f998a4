"""Drive a real headless Chromium (the Debian package) from tests, with the standard library.

Chromium speaks the DevTools protocol over a pipe (``--remote-debugging-pipe``: it reads
commands from fd 3 and writes replies and events to fd 4, each a JSON message ended by a NUL
byte), so no Python package, driver binary or network port is needed. :class:`Chromium` opens
one page, evaluates JavaScript in it, takes screenshots, and collects console errors,
uncaught exceptions and error log entries in :attr:`Chromium.errors`.

Chromium runs with a fresh ``--user-data-dir`` and without sandbox, GPU, first-run, sync,
component updates or background networking (it must not reach the network).
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe")


MISSING = ("headless Chromium not installed: apt-get install chromium (as root; .ci/run does "
           "it before make test)")
"""The skip reason of a browser test where :func:`available` is false."""


def available() -> bool:
    """Whether a Chromium executable is installed."""
    return Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)


class Chromium:
    """One headless Chromium with one page (module docstring).

    Args:
        width, height: the page's viewport in CSS pixels.
        timeout: seconds to wait for any reply.
    """

    def __init__(self, width: int = 1400, height: int = 900, timeout: float = 30.0):
        self.timeout = timeout
        self.errors: list[str] = []
        self._events: list[dict[str, Any]] = []
        self._buf = b""
        self._n = 0
        self._profile = tempfile.mkdtemp(prefix="interp-chromium-")
        cmd_r, self._cmd_w = os.pipe()  # we write commands, Chromium reads them on fd 3
        self._out_r, out_w = os.pipe()  # Chromium writes replies on fd 4

        def fds() -> None:  # in the child: move the pipe ends to fds 3 and 4 (inheritable)
            a, b = os.dup(cmd_r), os.dup(out_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self._proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self._profile}",
             f"--window-size={width},{height}", "about:blank"],
            preexec_fn=fds, close_fds=False, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(out_w)
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.call("Target.attachToTarget",
                                  {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Page", "Log"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                  session=True)

    # -- protocol --------------------------------------------------------------------------
    def _recv(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out_r], [], [], left)[0]:
                raise TimeoutError("no reply from Chromium")
            chunk = os.read(self._out_r, 1 << 16)
            if not chunk:
                raise EOFError("Chromium closed the pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def _note(self, m: dict[str, Any]) -> None:
        method, p = m.get("method"), m.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                     for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.errors.append("exception: " + str(d.get("exception", {}).get(
                "description", d.get("text"))))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            self.errors.append("log: " + p["entry"].get("text", ""))
        self._events.append(m)

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             session: bool = False) -> dict[str, Any]:
        """Send one command and return its result (events seen meanwhile are noted)."""
        self._n += 1
        msg: dict[str, Any] = {"id": self._n, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self._session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._recv()
            if m.get("id") == self._n:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self._note(m)

    # -- page ------------------------------------------------------------------------------
    def open(self, path: str | Path) -> None:
        """Load a local file and wait for its load event."""
        self._events.clear()
        self.call("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=True)
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            self._note(self._recv())

    def evaluate(self, expression: str) -> Any:
        """Evaluate JavaScript in the page and return its value (JSON-able).

        Raises:
            RuntimeError: the expression threw.
        """
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": True}, session=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"JavaScript error: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, path: str | Path, *, full_page: bool = False) -> Path:
        """Save a PNG of the viewport (or the whole page) to ``path``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", params, session=True)["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        """Close the browser and remove its profile."""
        try:
            self.call("Browser.close")
        except (OSError, EOFError, TimeoutError, RuntimeError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for fd in (self._cmd_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()
