"""A real headless Chromium driven over the Chrome DevTools Protocol, for the report tests.

Chromium runs as its own process (stopped by PID) with a fresh profile; the port it chose is
read from the DevToolsActivePort file it writes there. The client speaks CDP over the
browser's WebSocket with `websockets` (one page session, flat mode). Without Chromium the
tests that need it skip, except under CI=true, where they fail (make system-deps installs it).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

from tests.db_servers import stop_process

START_TIMEOUT_S = 60.0
COMMAND_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
VIEWPORT = (1280, 900)


def chromium_binary() -> str:
    """Chromium's path; skips the test without it (fails under CI=true)."""
    path = shutil.which("chromium")
    if path is None:
        message = "chromium is not installed (make system-deps installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


# What the page reports about its plots: every <img> and <svg>, with its box in page
# coordinates (for cropping the screenshot) and an <img>'s decoded size.
_PLOTS_JS = """JSON.stringify(
  [...document.querySelectorAll('img, svg')].map(e => {
    const r = e.getBoundingClientRect();
    const box = {x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height};
    if (e.tagName.toLowerCase() === 'img') {
      return {tag: 'img', src: e.currentSrc, complete: e.complete,
              natural_w: e.naturalWidth, natural_h: e.naturalHeight, ...box};
    }
    const b = e.getBBox();
    return {tag: 'svg', src: '', complete: true, natural_w: b.width, natural_h: b.height, ...box};
  }))"""


@dataclass
class PageLoad:
    """What loading one page showed: problems seen on the way, its plots and a screenshot."""

    url: str
    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    plots: list[dict[str, Any]] = field(default_factory=list)
    screenshot: Path | None = None
    probed: Any = None  # the value of the `probe` expression, after the load event

    @property
    def problems(self) -> list[str]:
        return self.console_errors + self.exceptions + self.failed_requests


class CdpError(RuntimeError):
    pass


class Cdp:
    """Commands and events over one WebSocket; events are kept until taken."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session is not None:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while True:
            reply = self._receive(deadline, method)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str, deadline: float) -> dict[str, Any]:
        for i, event in enumerate(self.events):
            if event["method"] == method:
                return self.events.pop(i)
        while True:
            msg = self._receive(deadline, method)
            if msg.get("method") == method:
                return msg
            if "method" in msg:
                self.events.append(msg)

    def _receive(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer from Chromium for {waiting_for}")
        try:
            raw = self.ws.recv(timeout=left)
        except TimeoutError:
            raise TimeoutError(f"no answer from Chromium for {waiting_for}") from None
        msg: dict[str, Any] = json.loads(raw)
        return msg


def _wait_for_port(proc: subprocess.Popen[bytes], profile: Path, log: Path) -> str:
    """The browser's WebSocket URL, from the DevToolsActivePort file (`port\\n/path`)."""
    active = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"chromium exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        lines = active.read_text().split("\n") if active.exists() else []
        if len(lines) >= 2 and lines[0].isdigit() and lines[1].startswith("/"):
            return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        time.sleep(0.1)
    raise TimeoutError(f"chromium wrote no DevToolsActivePort in {START_TIMEOUT_S} s")


# Offline: every host name fails to resolve (as on a host without internet); file:// pages
# and loopback still load.
OFFLINE_FLAGS = ["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]


@contextmanager
def chromium(workdir: Path, offline: bool = False) -> Iterator[Browser]:
    """A headless Chromium with a fresh profile under `workdir`, stopped by PID at the end;
    `offline`: with no name resolution, so that nothing beyond this host loads."""
    binary = chromium_binary()
    profile = workdir / "chromium-profile"
    profile.mkdir(parents=True)
    log = workdir / "chromium.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "--no-sandbox",  # tests run as root in containers
                "--no-first-run",
                "--disable-gpu",
                *(OFFLINE_FLAGS if offline else []),
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = _wait_for_port(proc, profile, log)
        with connect(url, max_size=64 * 2**20, open_timeout=START_TIMEOUT_S) as ws:
            yield Browser(Cdp(ws))
    finally:
        stop_process(proc, STOP_TIMEOUT_S)


class Browser:
    """Pages opened one at a time in the running Chromium."""

    def __init__(self, cdp: Cdp) -> None:
        self.cdp = cdp

    def load(self, path: Path, screenshot: Path, probe: str | None = None) -> PageLoad:
        """Open `path` in a new page, wait for its load event, collect what went wrong on the
        way, its plots, and a full-page screenshot (PNG) written to `screenshot`; `probe`, a
        JavaScript expression giving a JSON string, is evaluated in the page (`probed`)."""
        cdp = self.cdp
        target = cdp.call("Target.createTarget", url="about:blank")["targetId"]
        session = cdp.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            cdp.call(f"{domain}.enable", session)
        width, height = VIEWPORT
        cdp.call(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        cdp.events.clear()
        url = path.resolve().as_uri()
        nav = cdp.call("Page.navigate", session, url=url)
        page = PageLoad(url)
        if nav.get("errorText"):
            page.failed_requests.append(f"{url}: {nav['errorText']}")
            return page
        cdp.wait_event("Page.loadEventFired", time.monotonic() + COMMAND_TIMEOUT_S)
        found = cdp.call("Runtime.evaluate", session, expression=_PLOTS_JS, returnByValue=True)
        page.plots = json.loads(found["result"]["value"])
        if probe is not None:
            value = cdp.call("Runtime.evaluate", session, expression=probe, returnByValue=True)
            page.probed = json.loads(value["result"]["value"])
        size = cdp.call("Page.getLayoutMetrics", session)["cssContentSize"]
        shot = cdp.call(
            "Page.captureScreenshot",
            session,
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
        )
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        page.screenshot = screenshot
        _problems(page, [e for e in cdp.events if e.get("sessionId") == session])
        cdp.call("Target.closeTarget", targetId=target)
        return page


def _problems(page: PageLoad, events: list[dict[str, Any]]) -> None:
    """Console errors, uncaught exceptions and failed or refused loads among `events`."""
    urls = {
        e["params"]["requestId"]: e["params"]["request"]["url"]
        for e in events
        if e["method"] == "Network.requestWillBeSent"
    }
    for event in events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [str(a.get("value", a.get("description", ""))) for a in params.get("args", [])]
            page.console_errors.append("console: " + " ".join(args))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            page.console_errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            page.exceptions.append(f"exception: {text}")
        elif method == "Network.loadingFailed":
            url = urls.get(params.get("requestId"), params.get("requestId"))
            reason = params.get("blockedReason") or params.get("errorText")
            page.failed_requests.append(f"failed: {url} ({params.get('type')}): {reason}")
        elif method == "Network.responseReceived":
            response = params.get("response", {})
            if int(response.get("status", 0) or 0) >= 400:
                page.failed_requests.append(f"HTTP {response['status']}: {response.get('url')}")
