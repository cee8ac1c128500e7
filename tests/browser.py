"""A minimal headless-Chromium driver over the Chrome DevTools Protocol, for the browser tests.

Chromium is started with ``--remote-debugging-pipe``: it reads protocol commands from file
descriptor 3 and writes replies and events to file descriptor 4, each message a JSON object ended
by a NUL byte. That needs nothing beyond the standard library (no Selenium, no Playwright, no
browser download): only a Chromium on the machine (Debian: ``apt install chromium``).

Everything runs on local ``file://`` pages; any request that leaves the machine is blocked and
reported, so a page that would need the network fails its test instead of hanging on it.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = "install Chromium to run the browser tests: `sudo apt install chromium` (Debian/Ubuntu)"


def find_chromium() -> str | None:
    """The path of a Chromium (or Chrome) executable on PATH, or None."""
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


class BrowserError(RuntimeError):
    """Chromium did not answer, or answered a command with an error."""


class Chromium:
    """One headless Chromium process with one tab, driven synchronously.

    ``call`` sends a command and waits for its reply; events that arrive meanwhile are kept in
    ``events`` (a list of ``(method, params)``) until ``clear_events``. Use as a context manager.
    """

    def __init__(self, executable: str, timeout: float = 30.0):
        self.timeout = timeout
        self.events: list[tuple[str, dict]] = []
        self._next_id = 0
        self._buffer = b""
        self._profile = tempfile.TemporaryDirectory(prefix="mpcourse-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child must see the pipe ends as fds 3 and 4: move them out of the way first (they
        # may be 3 or 4 already), then duplicate them there, inheritable, just before exec.
        def wire_fds():
            read_end = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            write_end = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)
        args = [executable, "--headless", "--remote-debugging-pipe", "--no-first-run",
                "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--hide-scrollbars",
                "--mute-audio", f"--user-data-dir={self._profile.name}", "about:blank"]
        if os.geteuid() == 0:  # Chromium refuses to run its sandbox as root (containers, CI)
            args.insert(1, "--no-sandbox")
        self._process = subprocess.Popen(args, preexec_fn=wire_fds, pass_fds=(3, 4),
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.session = None
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=target,
                                     flatten=True)["sessionId"]
            for domain in ("Page", "Network", "Runtime"):
                self.call(f"{domain}.enable")
            # Offline by construction: only local files may load.
            self.call("Network.setBlockedURLs", urls=["http://*", "https://*", "ws://*", "wss://*"])
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.session = None
            self.call("Browser.close", timeout=5)
        except (BrowserError, OSError):
            pass
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._profile.cleanup()

    # -- the protocol ---------------------------------------------------------------------------

    def call(self, method: str, timeout: float | None = None, **params) -> dict:
        """Send one command (to the tab once attached) and return its result."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._read(deadline, method)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply["result"]
            if "method" in reply:
                self.events.append((reply["method"], reply.get("params", {})))

    def wait_for(self, method: str, after: int = 0, timeout: float | None = None,
                 where=lambda params: True) -> int:
        """Wait until an event ``method`` whose params satisfy ``where`` has arrived (it may have
        already), at index ``after`` or later in ``events``; return its index."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for index, (name, params) in enumerate(self.events[after:], start=after):
                if name == method and where(params):
                    return index
            reply = self._read(deadline, method)
            if "method" in reply:
                self.events.append((reply["method"], reply.get("params", {})))

    def clear_events(self) -> None:
        self.events = []

    def _read(self, deadline: float, waiting_for: str) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise BrowserError(f"Chromium did not answer {waiting_for} in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium exited while waiting for {waiting_for}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    # -- what the tests use ---------------------------------------------------------------------

    def open(self, url: str) -> str | None:
        """Load ``url`` and wait for its load event; return an error text if it did not load."""
        self.clear_events()
        result = self.call("Page.navigate", url=url)
        if result.get("errorText"):
            return result["errorText"]
        try:  # the load event after this navigation committed, not a late one of the last page
            committed = self.wait_for("Page.frameNavigated",
                                      where=lambda e: e["frame"].get("loaderId") == result["loaderId"])
            self.wait_for("Page.loadEventFired", after=committed)
        except BrowserError as error:
            return str(error)
        return None

    def evaluate(self, expression: str):
        """Evaluate JavaScript in the page (awaiting a promise) and return its value as JSON."""
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True,
                           returnByValue=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(details.get("exception", {}).get("description") or details["text"])
        return result["result"].get("value")

    def set_viewport(self, width: int, height: int, mobile: bool) -> None:
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=mobile)

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
