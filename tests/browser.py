"""Headless Chromium driven over the Chrome DevTools Protocol, for testing reports in a real browser.

Why CDP directly (with ``websocket-client``) and not a browser-automation framework: Debian's
``chromium`` package is the only browser here (frameworks want to download their own builds),
and the protocol gives exactly what the tests check: console messages, uncaught exceptions,
JavaScript dialogs, every network request, DOM queries and screenshots.

The browser is started with no network access beyond the page (``--host-resolver-rules`` maps
every host name to nothing, and background services are off), so a report that tried to fetch
anything would both fail and be seen trying.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websocket

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--mute-audio",
    "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--window-size=1400,1000",
)

ALL_FIGURES_DRAWN = "[...document.querySelectorAll('.js-plotly-plot')].every(d => d.querySelector('svg.main-svg'))"


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageLoad:
    """What happened while a page loaded and settled."""

    url: str
    console: list[dict[str, Any]] = field(default_factory=list)  # Runtime.consoleAPICalled + Log.entryAdded
    exceptions: list[dict[str, Any]] = field(default_factory=list)  # Runtime.exceptionThrown
    dialogs: list[dict[str, Any]] = field(default_factory=list)  # Page.javascriptDialogOpening
    requests: list[str] = field(default_factory=list)  # Network.requestWillBeSent URLs

    @property
    def errors(self) -> list[str]:
        out = [json.dumps(e, default=str)[:500] for e in self.exceptions]
        out += [json.dumps(c, default=str)[:500] for c in self.console if c.get("level") in ("error", "assert")]
        return out


class Browser:
    """One headless Chromium with one page, driven over CDP. Use as a context manager."""

    def __init__(self, executable: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="tpbench-chromium-")
        self.proc = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        port = self._port()
        self.ws = websocket.create_connection(self._page_ws(port), timeout=60, suppress_origin=True)
        self._id = 0
        self._events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")

    def _port(self, timeout: float = 30.0) -> int:
        """Chromium writes its chosen debugging port to DevToolsActivePort in the profile."""
        marker = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"chromium exited with {self.proc.returncode}: {self.proc.stderr.read().decode()[-2000:]}"
                )
            if marker.exists() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            time.sleep(0.05)
        raise RuntimeError("chromium did not open its debugging port")

    @staticmethod
    def _page_ws(port: int, timeout: float = 30.0) -> str:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                    pages = [t for t in json.load(r) if t.get("type") == "page"]
                if pages:
                    return pages[0]["webSocketDebuggerUrl"]
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("chromium has no page target")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Send a command and wait for its result; events that arrive meanwhile are kept."""
        self._id += 1
        my = self._id
        self.ws.send(json.dumps({"id": my, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self._on_event(msg)

    def _on_event(self, msg: dict[str, Any]) -> None:
        self._events.append(msg)
        if msg["method"] == "Page.javascriptDialogOpening":
            # A dialog blocks the page: dismiss it so the test reports it instead of hanging.
            self._id += 1
            self.ws.send(
                json.dumps({"id": self._id, "method": "Page.handleJavaScriptDialog", "params": {"accept": False}})
            )

    def _drain(self, seconds: float) -> None:
        """Collect events for ``seconds`` (rendering continues after the load event)."""
        deadline = time.monotonic() + seconds
        self.ws.settimeout(0.1)
        try:
            while time.monotonic() < deadline:
                try:
                    msg = json.loads(self.ws.recv())
                except websocket.WebSocketTimeoutException:
                    continue
                if "method" in msg:
                    self._on_event(msg)
        finally:
            self.ws.settimeout(60)

    def load(self, path: Path, settle_s: float = 1.0, timeout: float = 120.0) -> PageLoad:
        """Open a local file, wait for its load event and for every plotly figure to draw."""
        self._events.clear()
        url = Path(path).resolve().as_uri()
        self.send("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while not any(e["method"] == "Page.loadEventFired" for e in self._events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load in {timeout} s")
            self._drain(0.2)
        while not self.evaluate(ALL_FIGURES_DRAWN):
            if time.monotonic() > deadline:
                break  # the caller's DOM check reports which figures are missing
            self._drain(0.2)
        self._drain(settle_s)
        result = PageLoad(url)
        for e in self._events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.consoleAPICalled":
                result.console.append(
                    {
                        "level": "error" if p.get("type") in ("error", "assert") else p.get("type"),
                        "text": " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])),
                    }
                )
            elif m == "Log.entryAdded":
                result.console.append(
                    {"level": p["entry"].get("level"), "text": p["entry"].get("text"), "url": p["entry"].get("url")}
                )
            elif m == "Runtime.exceptionThrown":
                result.exceptions.append(p.get("exceptionDetails", {}))
            elif m == "Page.javascriptDialogOpening":
                result.dialogs.append(p)
            elif m == "Network.requestWillBeSent":
                result.requests.append(p["request"]["url"])
        return result

    def evaluate(self, expression: str) -> Any:
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, out: Path, max_height: int = 16000) -> Path:
        """A PNG of the whole page (up to ``max_height`` CSS pixels tall)."""
        size = self.send("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], max_height), "scale": 1}
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)["data"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(data))
        return out

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ensure_chromium() -> str | None:
    """The browser's path; as root with apt-get available, install Debian's chromium first if missing
    (``make test`` does this too; this covers running pytest directly)."""
    found = find_chromium()
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env, capture_output=True, timeout=1200)
    return find_chromium()
