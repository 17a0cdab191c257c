"""A live look at a watched fit: polls daskfeed's ``status.json`` while ``model.fit`` runs, then
reads the page and ``/metrics`` before fit ends (tests/training/test_watch.py and
tests/e2e/test_dashboard_browser.py)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

from helpers import load_factor

POLL = 0.2  # seconds between two looks at the page


def get(url: str) -> str:
    # a page rendered by a scheduler of this busy process: the bound grows with the load (a
    # charts page took over 10 s beside the rest of the suite on 2 cores)
    with urllib.request.urlopen(url, timeout=30 * load_factor()) as r:
        assert r.status == 200, url
        return r.read().decode()


class LiveProbe(threading.Thread):
    """Polls ``/daskfeed/status.json`` while fit runs; once ``seen(status)``, fetches the page
    and ``/metrics`` (fit still running) and calls ``also(links)``; records what it got."""

    def __init__(self, links: Any, seen: Any, fitting: threading.Event, timeout: float = 150,
                 also: Any = None) -> None:
        super().__init__(daemon=True, name="live-probe")
        self.links, self.seen, self.fitting, self.also = links, seen, fitting, also
        self.deadline = time.monotonic() + timeout
        self.done = threading.Event()
        self.status: dict[str, Any] | None = None
        self.last: dict[str, Any] | None = None
        self.page = self.metrics = ""
        self.fitting_after = False
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while time.monotonic() < self.deadline and self.status is None:
                status = json.loads(get(self.links.status))
                self.last = status
                if self.fitting.is_set() and self.seen(status):
                    self.status = status
                    self.page = get(self.links.page)
                    self.metrics = get(self.links.metrics)
                    if self.also is not None:
                        self.also(self.links)
                    self.fitting_after = self.fitting.is_set()
                else:
                    time.sleep(POLL)  # polling interval, not a synchronisation
        except BaseException as err:
            self.error = err
        finally:
            self.done.set()


def stop_when_done(probe: LiveProbe, fitting: threading.Event) -> Any:
    """A callback: marks fit running, and stops it once the probe has what it came for."""
    from daskfeed.adapters._keras import keras

    class StopWhenSeen(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            fitting.set()

        def on_train_batch_end(self, batch, logs=None):
            if probe.done.is_set():
                self.model.stop_training = True

        def on_train_end(self, logs=None):
            fitting.clear()

    return StopWhenSeen()


def check_probe(probe: LiveProbe) -> dict[str, Any]:
    probe.join(timeout=30)
    if probe.error is not None:
        raise probe.error
    assert probe.status is not None, f"no live figures before the deadline; last status: {probe.last}"
    assert probe.fitting_after, "fit had ended before the page and /metrics were read"
    return probe.status


def fit_watched(client: Any, data: Any, *, seen: Any, epochs: int, spans: bool = False,
                also: Any = None, marks: Any = None,
                **seq_kwargs: Any) -> tuple[LiveProbe, Any, Any, Any]:
    """A real fit with WatchCallback, read live by a LiveProbe; stopped once the probe is done.

    ``marks``: WatchCallback's (the loss spikes it sends, as ``daskfeed train``'s callback)."""
    from daskfeed.adapters._sequence import DaskSequence
    from daskfeed.core._rss import RSSSampler
    from daskfeed.dashboard._plugin import EpochSpans, install, scan_span
    from daskfeed.training._model import default_model
    from daskfeed.training._watch import WatchCallback

    links = install(client)
    assert links is not None and links.page.endswith("/daskfeed")
    kind = DaskSequence
    if spans:
        seq_kwargs["spans"] = EpochSpans()
    with scan_span(client, name="train"):
        seq = kind(data.train_glob, label="cleared", batch_size=256, client=client, **seq_kwargs)
    with scan_span(client, name="validation"):
        val = kind(data.validate_glob, label="cleared", batch_size=1024, client=client, shuffle=False,
                   reference=seq.manifest, **seq_kwargs)
    fitting = threading.Event()
    probe = LiveProbe(links, seen, fitting, also=also)
    model = default_model(seq.manifest, features=seq.features)
    with seq, val, RSSSampler() as rss:
        watch = WatchCallback(client, seq, validation=val, budget_bytes=4_000_000_000, rss_sampler=rss,
                              every_seconds=0.2, marks=marks)
        probe.start()
        history = model.fit(seq, validation_data=val, epochs=epochs, shuffle=False, verbose=0,
                            callbacks=[watch, stop_when_done(probe, fitting)])
    return probe, watch, history, seq.manifest


def live(min_epoch: int, *, history: int = 0):
    """What the probe waits for: training at ``min_epoch`` (1-based) with a batch, rows/s, loss."""
    def seen(s: dict[str, Any]) -> bool:
        return (s.get("state") == "training" and (s.get("epoch") or 0) >= min_epoch
                and (s.get("batch") or 0) > 0 and (s.get("rows_per_s") or 0) > 0
                and "loss" in (s.get("logs") or {}) and len(s.get("history") or []) >= history)

    return seen
