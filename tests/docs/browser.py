"""One headless chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON
messages ended by a NUL byte, commands on fd 3, answers and events on fd 4). No library needed, and one
browser opens every page of the site in turn, collecting each page's DOM after its scripts ran and the errors
it logged (script exceptions, console errors, resources that failed to load)."""

from __future__ import annotations

import fcntl
import json
import os
import queue
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 60.0  # a hang guard per command, not a speed check

#: Evaluated in the page once it loaded: waits (10 s at most) until a search page has shown its results, then
#: returns the DOM.
_DOM = """new Promise(done => {
  const start = Date.now();
  const ready = () => !document.querySelector('#search-results') ||
                      document.querySelector('#search-results .search-summary') || Date.now() - start > 10000;
  const poll = () => ready() ? done(document.documentElement.outerHTML) : setTimeout(poll, 50);
  poll();
})"""


def _above_9(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


@dataclass
class Opened:
    """A page as the browser showed it: the DOM after its scripts ran, and the errors it logged."""

    html: str
    errors: list[str]


class BrowserError(RuntimeError):
    """The browser died, answered with an error, or did not answer in time."""


class Browser:
    """A headless chromium; :meth:`open` loads a URL and returns what it showed. Use as a context manager."""

    def __init__(self, executable: str) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-")
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()
        # above 9, so that placing them on 3 and 4 in the child never overwrites one with the other
        to_browser, from_browser = (_above_9(to_browser), _above_9(from_browser))

        command = [executable, "--headless", "--disable-gpu", "--remote-debugging-pipe"]
        command += [f"--user-data-dir={self._profile.name}", "--no-first-run", "about:blank"]
        if os.geteuid() == 0:
            command.insert(1, "--no-sandbox")  # chromium refuses to run as root with its sandbox
        # bash puts the pipe ends where chromium expects them (fds 3 and 4), then becomes chromium
        redirect = f'exec "$@" 3<&{to_browser} 4>&{from_browser} {to_browser}<&- {from_browser}>&-'
        self._process = subprocess.Popen(
            ["bash", "-c", redirect, "bash", *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(to_browser, from_browser),
        )
        os.close(to_browser)
        os.close(from_browser)
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._events: list[dict[str, Any]] = []
        self._next_id = 0
        threading.Thread(target=self._reader, daemon=True).start()
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self._call(f"{domain}.enable", session=True)

    def _reader(self) -> None:
        pending = b""
        with os.fdopen(self._read, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                pending += chunk
                *whole, pending = pending.split(b"\0")
                for message in whole:
                    self._messages.put(json.loads(message))
        self._messages.put(None)  # the browser closed its end

    def _next(self) -> dict[str, Any]:
        try:
            message = self._messages.get(timeout=TIMEOUT_S)
        except queue.Empty:
            raise BrowserError(f"chromium sent nothing for {TIMEOUT_S:.0f} s") from None
        if message is None:
            raise BrowserError(f"chromium exited (code {self._process.poll()})")
        return message

    def _call(self, method: str, params: dict[str, Any] | None = None, session: bool = False) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._next()
            if answer.get("id") != self._next_id:
                self._events.append(answer)
                continue
            if "error" in answer:
                raise BrowserError(f"{method}: {answer['error']}")
            result: dict[str, Any] = answer["result"]
            return result

    def _wait_for(self, method: str) -> None:
        while not any(event.get("method") == method for event in self._events):
            self._events.append(self._next())

    def open(self, url: str) -> Opened:
        """Loads ``url``, waits for its load event (and a search page's results), returns DOM and errors."""
        self._events.clear()
        navigated = self._call("Page.navigate", {"url": url}, session=True)
        if navigated.get("errorText"):
            return Opened("", [f"navigation failed: {navigated['errorText']}"])
        self._wait_for("Page.loadEventFired")
        value = self._call("Runtime.evaluate", {"expression": _DOM, "awaitPromise": True, "returnByValue": True}, True)
        errors = []
        for event in self._events:
            params = event.get("params", {})
            if event.get("method") == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                errors.append(f"script error: {details.get('exception', {}).get('description') or details['text']}")
            elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") == "error":
                errors.append("console error: " + " ".join(str(a.get("value", "")) for a in params.get("args", [])))
            elif event.get("method") == "Log.entryAdded" and params["entry"].get("level") == "error":
                entry = params["entry"]
                if entry.get("url", "").endswith("/favicon.ico"):
                    continue  # asked for by the browser itself, not by the page
                errors.append(f"{entry.get('source')} error: {entry.get('text')} {entry.get('url', '')}".strip())
        return Opened(str(value["result"].get("value", "")), errors)

    def close(self) -> None:
        try:
            self._call("Browser.close")
        except BrowserError:
            pass
        finally:
            os.close(self._write)
            try:
                self._process.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
