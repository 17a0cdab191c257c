"""Headless Chromium renders daskfeed's page, its charts and Dask's /status while a real fit runs.

Needs Debian's ``chromium`` (``scripts/install-browser.sh``); skipped with the reason where it
is missing. Chromium runs with the project's flags and is driven over its DevTools protocol.
``DASKFEED_SCREENSHOT_DIR=DIR`` keeps the PNGs (the README's screenshot).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from live_probe import check_probe, fit_watched, live

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync",
         "--window-size=1200,900"]

# make test-slow (CI) installs Chromium and sets DASKFEED_REQUIRE_BROWSER: there a missing
# browser fails the test instead of skipping it
REQUIRED = os.environ.get("DASKFEED_REQUIRE_BROWSER") == "1"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM) and not REQUIRED,
                       reason=f"headless Chromium not installed ({CHROMIUM} missing): run "
                              "scripts/install-browser.sh (apt-get install -y chromium)"),
]


SPIKE = {"epoch": 1, "step": 7, "batch": 7, "loss": 9.5, "median": 0.6, "threshold": 1.2, "steps": 1,
         "command": "daskfeed rows daskfeed-out --epoch 1 --step 7"}
TEXT = "document.body ? document.body.innerText : ''"  # the page's text as rendered
# the charts' series as BokehJS holds them in the browser (the live document, filled over Bokeh's
# websocket; the page's first drawing, from the document it carries, is gone by then): each
# series' points, and the line glyphs that draw it
SERIES = ("loss", "rows_per_s", "data_wait", "rss_bytes", "budget_bytes")
CHART_DATA = """(() => {
  const B = window.Bokeh;
  if (!B || !B.documents || B.documents.length != 1) return "";
  const d = B.documents[0], e = d.get_model_by_name("daskfeed-epochs");
  if (!e) return "";
  const col = (src, k) => Array.from(src.data instanceof Map ? src.data.get(k) : src.data[k]);
  const models = [...d.all_models], series = {};
  for (const name of SERIES) {
    const s = d.get_model_by_name("daskfeed-series-" + name);
    if (!s) return "";
    const lines = models.filter((m) => m.type == "GlyphRenderer" && m.data_source === s && m.visible
                                       && m.glyph.type == "Line" && m.glyph.x.field == "x"
                                       && m.glyph.y.field == "y");
    series[name] = {x: col(s, "x"), y: col(s, "y"), lines: lines.length};
  }
  const spikes = d.get_model_by_name("daskfeed-spikes"), marked = d.get_model_by_name("daskfeed-spike-marks");
  const hover = models.filter((m) => m.type == "HoverTool" && m.renderers.includes(marked));
  return JSON.stringify({series, epochs: col(e, "epoch").length, epoch_steps: col(e, "step"),
                         val_loss: col(e, "val_loss").filter(Number.isFinite).length,
                         spikes: {x: col(spikes, "x"), loss: col(spikes, "loss"),
                                  command: col(spikes, "command")},
                         tooltips: hover.map((h) => JSON.stringify(h.tooltips))});
})()""".replace("SERIES", json.dumps(list(SERIES)))


def unbroken(points: dict[str, Any]) -> bool:
    """A series drawn as one line: a line glyph, two points or more, every one finite (JSON
    has no NaN: BokehJS's NaN reads as null), in order of their x."""
    x, y = points["x"], points["y"]
    return (points["lines"] >= 1 and len(x) == len(y) >= 2
            and all(isinstance(v, (int, float)) and math.isfinite(v) for v in x + y) and x == sorted(x))


class Browser:
    """Headless Chromium driven over the DevTools protocol (tornado's websocket client).

    ``--screenshot=PNG`` shoots when the page has loaded; Bokeh draws /status's plots after
    that, over its own websocket. So: load the page, then shoot until the picture shows what
    it should (or the deadline passes).
    """

    def __init__(self, profile: Path) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}",
                                      "--remote-debugging-port=0", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert self.proc.poll() is None, f"chromium exited with status {self.proc.returncode}"
            assert time.monotonic() < deadline, "chromium opened no DevTools port in 60 s"
            time.sleep(0.1)  # polling interval
        self.devtools = f"http://127.0.0.1:{int(port_file.read_text().split()[0])}"

    def shoot(self, url: str, png: Path, good: Any, timeout: float = 60,
              read: str = TEXT) -> tuple[Path, str]:
        """Open ``url`` in a new tab; screenshot and read the page (``read``: a JavaScript
        expression; by default the DOM's ``document.body.innerText``, as a person reads it)
        until ``good(png, text)`` or ``timeout`` (the last of both is returned)."""
        req = urllib.request.Request(f"{self.devtools}/json/new?{url}", method="PUT")
        with urllib.request.urlopen(req, timeout=30) as r:
            tab = json.loads(r.read())
        try:
            return asyncio.run(self._shoot(tab["webSocketDebuggerUrl"], png, good, timeout, read))
        finally:
            urllib.request.urlopen(f"{self.devtools}/json/close/{tab['id']}", timeout=30).close()

    @staticmethod
    async def _shoot(ws_url: str, png: Path, good: Any, timeout: float, expression: str
                     ) -> tuple[Path, str]:
        from tornado.websocket import websocket_connect

        ws = await websocket_connect(ws_url, max_message_size=256 * 2**20)
        ids = iter(range(1, 1 << 30))

        async def call(method: str, **params: Any) -> dict[str, Any]:
            n = next(ids)
            await ws.write_message(json.dumps({"id": n, "method": method, "params": params}))
            while True:
                msg = json.loads(await ws.read_message())
                if msg.get("id") == n:
                    assert "error" not in msg, msg
                    return msg["result"]

        try:
            deadline = time.monotonic() + timeout
            while True:
                shot = await call("Page.captureScreenshot", format="png")
                png.write_bytes(base64.b64decode(shot["data"]))
                read = await call("Runtime.evaluate", expression=expression, returnByValue=True)
                text = str(read.get("result", {}).get("value") or "")
                if good(png, text) or time.monotonic() > deadline:
                    return png, text
                await asyncio.sleep(0.5)  # polling interval
        finally:
            ws.close()

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the browser and its helper processes
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


def screenshot_at_load(url: str, png: Path, profile: Path) -> Path:
    """What a plain ``chromium --headless --screenshot=PNG URL`` shows: the page as drawn when it
    has loaded (no waiting on scripts that draw later)."""
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}", url],
                   check=True, timeout=120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return png


def red_line(png: Path, right: int = 900) -> int:
    """Pixels of the data-wait line's red (firebrick, lighter where anti-aliased) left of ``right``:
    on the plots, not the legends' samples nor the toolbars' logos beside them."""
    from PIL import Image

    with Image.open(png) as img:
        rgb = img.convert("RGB").crop((0, 0, right, img.height))
        return sum(n for n, (r, g, b) in rgb.getcolors(1 << 24) or []
                   if r > 120 and g < 140 and b < 140 and r - max(g, b) > 60)


def ink(png: Path) -> tuple[int, float]:
    """Colours below the page's top bar, and the share of those pixels that differ from the
    background colour (a page whose scripts drew nothing has its top bar alone)."""
    from PIL import Image

    with Image.open(png) as img:
        rgb = img.convert("RGB").crop((0, 60, img.width, img.height))
        colours = rgb.getcolors(1 << 24) or []
        background = max(colours)[0]
        return len(colours), 1 - background / (rgb.width * rgb.height)


# what a person reads on daskfeed's page while fit runs: each a pattern of the rendered text
# fit ends when the browser has read what it came for (stop_when_done), never by running out of
# epochs first: on a busy machine (a CPU hog beside the slow tier) 40 epochs once ended before
# Chromium had read the three pages
EPOCHS = 1000

SEEN = {
    "epoch": rf"Epoch (\d+) of {EPOCHS:,}",
    "batch": r"Batch [\d,]+ of [\d,]+",
    "rows/s": r"[\d,]+ rows/s",
    "data wait": r"waiting for data: [\d.]+ ?% of training time",
    "memory against the budget": r"trainer's process tree: [\d.]+ [kKMGT]?i?B of [\d.]+ "
                                 r"[kKMGT]?i?B budget \([\d.]+ ?%\)",
    "loss": r"\bloss\s+\d+\.\d+",
    "the scan": r"train\s+done\s+[\d,]+",
}


def _read(text: str) -> dict[str, str | None]:
    """What each of SEEN shows in ``text`` (None: not on the page)."""
    found = {what: re.search(pattern, text) for what, pattern in SEEN.items()}
    return {what: m.group(0) if m else None for what, m in found.items()}


def test_chromium_renders_the_daskfeed_page_and_dask_status_during_fit(client, demo_data, tmp_path):
    shots: dict[str, tuple[Path, str]] = {}

    def page_drawn(png: Path, text: str) -> bool:  # cards and bars drawn, the live figures read
        colours, share = ink(png)
        seen = _read(text)
        return colours > 100 and share > 0.1 and all(seen.values()) and int(
            re.search(SEEN["epoch"], text).group(1)) >= 2

    def plots_drawn(png: Path, text: str) -> bool:  # Bokeh's plots: axes, grids, labels
        colours, share = ink(png)
        return colours > 100 and share > 0.01

    def charts_drawn(png: Path, text: str) -> bool:  # lines on canvases, points in the browser
        got = json.loads(text) if text else {}
        series = got.get("series", {})
        steps = got.get("epoch_steps") or [math.inf]  # the batch step each epoch ended at
        return (plots_drawn(png, "") and got.get("val_loss", 0) >= 1 and len(series) == len(SERIES)
                and all(unbroken(points) for points in series.values())
                and max(series["loss"]["x"]) > steps[0]  # the loss line goes on past epoch 1's end
                and len(got.get("spikes", {}).get("x", [])) == 1)  # the spike sent, marked

    sent = []

    def marks(most: int) -> list[dict]:  # one loss spike, as train's per-step loss callback flags it
        if sent:
            return []
        sent.append(SPIKE)
        return [SPIKE]

    def take(links):
        shots["charts at load"] = (screenshot_at_load(links.charts, tmp_path / "charts-at-load.png",
                                                      tmp_path / "profile-at-load"), "")
        browser = Browser(tmp_path / "profile")
        try:
            shots["daskfeed"] = browser.shoot(links.page, tmp_path / "daskfeed.png", page_drawn)
            shots["status"] = browser.shoot(links.dashboard, tmp_path / "status.png", plots_drawn)
            shots["charts"] = browser.shoot(links.charts, tmp_path / "charts.png", charts_drawn,
                                            read=CHART_DATA)
        finally:
            browser.close()

    probe, _, history, _ = fit_watched(client, demo_data, seen=live(2, history=1), epochs=EPOCHS,
                                       also=take, marks=marks)
    s = check_probe(probe)  # the screenshots were taken while fit ran, at epoch >= 2
    assert s["epoch"] >= 2 and len(history.epoch) < EPOCHS
    (page, text), (status, _) = shots["daskfeed"], shots["status"]
    (tmp_path / "daskfeed.txt").write_text(text)  # kept beside the screenshots
    seen = _read(text)
    assert all(seen.values()), (seen, text)  # every figure a person looks for, as rendered
    assert 2 <= int(re.search(SEEN["epoch"], text).group(1)) <= EPOCHS, seen
    assert page_drawn(page, text), ink(page)
    assert plots_drawn(status, ""), ink(status)
    at_load, _ = shots["charts at load"]  # drawn from the page itself, not blank until Bokeh's websocket
    assert plots_drawn(at_load, ""), ink(at_load)
    charts, data = shots["charts"]  # daskfeed's Bokeh charts: drawn, and fed live
    got = json.loads(data) if data else {}
    assert charts_drawn(charts, data), (got, ink(charts))
    # data wait, rows/s, loss and memory: each one unbroken line over the run, across epochs
    series = got["series"]
    assert all(unbroken(series[name]) for name in SERIES), series
    assert got["epochs"] >= 1 and max(series["loss"]["x"]) > got["epoch_steps"][0], got
    assert red_line(charts) > 300, red_line(charts)  # the data-wait line, even at 0 %: above the axis
    # the spike: marked at its batch (epoch 1's batch 7) and its loss, its command in the tooltip
    assert got["spikes"] == {"x": [7], "loss": [SPIKE["loss"]], "command": [SPIKE["command"]]}, got
    assert any("@command" in t for t in got["tooltips"]), got["tooltips"]
    keep = os.environ.get("DASKFEED_SCREENSHOT_DIR")
    if keep:
        os.makedirs(keep, exist_ok=True)
        for png in (page, status, charts, tmp_path / "daskfeed.txt"):
            shutil.copy(png, keep)
