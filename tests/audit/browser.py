"""A real headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, to open a report the way a
person would and see what it did: console errors, uncaught exceptions, every request, and the page's DOM.

Chromium is started with an empty profile and everything that phones home switched off, on a debugging port
it picks itself (read back from ``DevToolsActivePort``); the protocol runs over its websocket.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
         "--disable-extensions", "--remote-debugging-port=0", "about:blank")
STARTUP_S = 30.0
PLOTS = ".plotly-graph-div"  # a page's plots, drawn once each has an SVG trace
DRAWN = f"[...document.querySelectorAll('{PLOTS}')].every(d => d.querySelector('svg.main-svg .trace'))"


def chromium_path() -> str | None:
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


def require_chromium() -> None:
    """CI must have the browser (scripts/setup.sh installs Debian's chromium): there its absence fails."""
    if chromium_path() is None:
        message = "no chromium on PATH: scripts/setup.sh installs it (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@dataclass
class PageVisit:
    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, the page itself included


class DevTools:
    """The browser's protocol connection, or (``session``) one page's on it: commands with ids, the events
    that arrive meanwhile kept in order."""

    def __init__(self, socket: ClientConnection, session: str | None = None) -> None:
        self.socket = socket
        self.session = session
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        mine = self.next_id
        command = {"id": mine, "method": method, "params": params}
        self.socket.send(json.dumps(command | ({"sessionId": self.session} if self.session else {})))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == mine:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            if "method" in message:
                self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")


@contextmanager
def chromium() -> Iterator[DevTools]:
    binary = chromium_path()
    if binary is None:
        raise FileNotFoundError("no chromium on PATH (Debian: apt-get install chromium)")
    profile = tempfile.mkdtemp(prefix="audit-chromium-")
    process = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env={**os.environ, "HOME": profile})
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + STARTUP_S
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit code {process.poll()})")
            time.sleep(0.05)
        port = port_file.read_text().splitlines()[0]
        with connect(f"ws://127.0.0.1:{port}{port_file.read_text().splitlines()[1]}", max_size=None) as browser:
            tools = DevTools(browser)
            target = tools.call("Target.createTarget", url="about:blank")["targetId"]
            session = tools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            yield DevTools(browser, session)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(profile, ignore_errors=True)


def visit(tools: DevTools, url: str, ready: str, timeout: float = 60.0) -> PageVisit:
    """Open ``url`` and wait until the JavaScript expression ``ready`` is true; what happened on the way."""
    for domain in ("Page", "Runtime", "Network", "Log"):
        tools.call(f"{domain}.enable")
    tools.call("Page.navigate", url=url)
    deadline = time.monotonic() + timeout
    while not tools.evaluate(ready):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the page never became ready: {ready}")
        time.sleep(0.2)
    tools.evaluate("1")  # drain the events sent meanwhile
    seen = PageVisit()
    for event in tools.events:
        method, params = event["method"], event.get("params", {})
        if method == "Network.requestWillBeSent":
            seen.requests.append(params["request"]["url"])
        elif method == "Runtime.exceptionThrown":
            seen.exceptions.append(json.dumps(params.get("exceptionDetails", {}))[:500])
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            seen.console_errors.append(json.dumps(params.get("args", []))[:500])
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            seen.console_errors.append(params["entry"].get("text", "")[:500])
    return seen
