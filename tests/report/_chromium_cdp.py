"""Headless Chromium driven over the DevTools protocol on a pipe (standard library only).

Loads one local file with networking off (no DNS, a closed proxy, the Network domain offline), collects
console errors, uncaught exceptions, error log entries and every request that was not for a local file,
and takes a full-page PNG screenshot. Also a command: ``python tests/report/_chromium_cdp.py PAGE.html OUT.png``.

``--remote-debugging-pipe``: Chromium reads NUL-terminated JSON commands on fd 3 and writes replies and
events on fd 4 (chrome/test/chromedriver and puppeteer's PipeTransport use the same framing).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # no name resolves
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",  # every request to a closed port
    "--remote-debugging-pipe",
]
LOCAL = ("file:", "data:", "about:")


def find() -> str | None:
    """The Chromium executable on PATH (Debian's package installs /usr/bin/chromium), or None."""
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class Rendered:
    png: bytes
    width: int
    height: int
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, error log entries
    requests: list[str] = field(default_factory=list)  # URLs requested that are not local
    boxes: dict[str, dict[str, float]] = field(default_factory=dict)  # selector matches: id -> page box


class _Pipe:
    def __init__(self, write_fd: int, read_fd: int, deadline: float) -> None:
        self._w, self._r, self._deadline = write_fd, read_fd, deadline
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict[str, Any]:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._w, data) :]
        while True:
            reply = self._next()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict[str, Any]:
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._next())
        return next(e for e in self.events if e.get("method") == method)

    def _next(self) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = self._deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise EOFError("Chromium closed the DevTools pipe")
            self._buf += chunk
        message, _, self._buf = self._buf.partition(b"\0")
        return json.loads(message)


def render(page: Path, *, width: int = 1280, selector: str = "section.plot", timeout: float = 60.0) -> Rendered:
    """Load ``page`` in a fresh headless Chromium with networking off; screenshot the whole page."""
    exe = find()
    if exe is None:
        raise FileNotFoundError("no Chromium on PATH (Debian: apt-get install chromium)")
    profile = tempfile.mkdtemp(prefix="memprune-chromium-")
    # Pipe ends numbered 10 and up: the child's dup2 onto 3 and 4 must not overwrite one of them.
    ends = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (*os.pipe(), *os.pipe())]
    to_r, to_w, from_r, from_w = ends
    log = os.path.join(profile, "stderr.log")
    actions = [
        (os.POSIX_SPAWN_DUP2, to_r, 3),
        (os.POSIX_SPAWN_DUP2, from_w, 4),
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
    ]
    argv = [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},900", "about:blank"]
    pid = os.posix_spawn(exe, argv, dict(os.environ), file_actions=actions)
    os.close(to_r)
    os.close(from_w)
    try:
        cdp = _Pipe(to_w, from_r, time.monotonic() + timeout)
        target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            cdp.call(f"{domain}.enable", session=s)
        cdp.call(
            "Network.emulateNetworkConditions",
            {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
            session=s,
        )
        cdp.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=s,
        )
        cdp.call("Page.navigate", {"url": page.resolve().as_uri()}, session=s)
        cdp.wait_for("Page.loadEventFired")
        height = int(_eval(cdp, s, "document.documentElement.scrollHeight"))
        cdp.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=s,
        )
        boxes = json.loads(
            _eval(
                cdp,
                s,
                f"""JSON.stringify(Object.fromEntries(
            [...document.querySelectorAll({json.dumps(selector)})].map(e => {{ const r = e.getBoundingClientRect();
              return [e.id, {{x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height}}]; }})))""",
            )
        )
        shot = cdp.call("Page.captureScreenshot", {"format": "png"}, session=s)
        import base64

        png = base64.b64decode(shot["data"])
        try:
            cdp.call("Browser.close")
        except (EOFError, TimeoutError):
            pass
        return Rendered(png, width, height, _errors(cdp.events), _requests(cdp.events), boxes)
    finally:
        for fd in (to_w, from_r):
            os.close(fd)
        _reap(pid)
        shutil.rmtree(profile, ignore_errors=True)


def _eval(cdp: _Pipe, session: str, expression: str) -> Any:
    result = cdp.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=session)
    if "exceptionDetails" in result:
        raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
    return result["result"]["value"]


def _errors(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
        elif method == "Runtime.exceptionThrown":
            out.append("exception: " + p["exceptionDetails"].get("text", ""))
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            out.append(f"log: {p['entry'].get('text', '')} {p['entry'].get('url', '')}".strip())
    return out


def _requests(events: list[dict[str, Any]]) -> list[str]:
    return [
        e["params"]["request"]["url"]
        for e in events
        if e.get("method") == "Network.requestWillBeSent" and not e["params"]["request"]["url"].startswith(LOCAL)
    ]


def _reap(pid: int, grace: float = 5.0) -> None:
    end = time.monotonic() + grace
    while time.monotonic() < end:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: _chromium_cdp.py PAGE.html OUT.png")
    result = render(Path(sys.argv[1]))
    Path(sys.argv[2]).write_bytes(result.png)
    print(
        f"{sys.argv[2]}: {result.width}x{result.height}, {len(result.png) // 1024} KiB, "
        f"errors {result.errors}, requests {result.requests}"
    )
