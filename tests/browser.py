"""A headless Chromium the tests can point, hover and read: the DevTools protocol over
``--remote-debugging-pipe`` (JSON messages ending in a NUL byte on file descriptors 3 and 4), so
no websocket library and no port. Network features are off, as in ``make screenshots``.

    with Browser(width=800) as b:
        b.open(path)                      # a local file, loaded from file://
        x, y = b.evaluate("...")          # any JavaScript expression's value
        b.hover(x, y)                     # a real mouse move: mouseover/mousemove fire
        png = b.screenshot()              # the whole page, as PNG bytes
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

CHROMIUM = shutil.which(os.environ.get("CHROMIUM", "chromium")) or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--hide-scrollbars",
]


class Browser:
    """One headless Chromium with one page; a context manager that ends the process it started."""

    def __init__(self, width: int = 1000, height: int = 800, timeout: float = 20.0):
        if CHROMIUM is None:
            raise FileNotFoundError("no chromium on PATH; install it (apt-get install chromium)")
        self.timeout, self._next, self._buf = timeout, 0, b""
        self._profile = tempfile.mkdtemp(prefix="attncircuits-chromium-")
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()

        def fds():  # in the child: its fd 3 reads our commands, its fd 4 writes the replies
            high = [os.dup(fd) for fd in (to_child, from_child)]  # above 4, so neither is clobbered
            os.dup2(high[0], 3)  # dup2 leaves the new descriptor inheritable
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self._profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=fds, close_fds=False,
        )
        os.close(to_child)
        os.close(from_child)
        try:
            target = self.send("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                      mobile=False, session=True)
        except BaseException:
            self.close()
            raise

    # ---- the protocol ----
    def send(self, method: str, session: bool = False, **params) -> dict:
        """Send one command and wait for its reply; raise on a protocol error."""
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._write, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\0" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._read], [], [], left)[0]:
                    raise TimeoutError(f"chromium did not answer {method} within {self.timeout} s")
                chunk = os.read(self._read, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium closed the pipe during {method}")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    # ---- what the tests use ----
    def open(self, path: Path, dark: bool | None = None) -> None:
        """Load a local file and wait until it has loaded; ``dark`` emulates the reader's colour
        scheme preference (``prefers-color-scheme``)."""
        if dark is not None:
            feature = {"name": "prefers-color-scheme", "value": "dark" if dark else "light"}
            self.send("Emulation.setEmulatedMedia", features=[feature], session=True)
        self.send("Page.navigate", url=Path(path).resolve().as_uri(), session=True)
        deadline = time.monotonic() + self.timeout
        while self.evaluate("document.readyState") != "complete" or self.evaluate("location.protocol") != "file:":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not finish loading within {self.timeout} s")
            time.sleep(0.05)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (JSON-serialisable)."""
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True, session=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression!r} raised in the page: {r['exceptionDetails']}")
        return r["result"].get("value")

    def hover(self, x: float, y: float) -> None:
        """Move the mouse to (x, y) in CSS pixels of the viewport."""
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y, session=True)

    def click(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1, session=True)

    def screenshot(self) -> bytes:
        """The whole page (beyond the viewport) as PNG bytes."""
        r = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True, session=True)
        return base64.b64decode(r["data"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
