"""Shuffle quality: how much the label varies from batch to batch, against an iid shuffle.

A batch of an iid shuffle is a random sample of the epoch's rows: its label mean varies with a
standard deviation of ``sigma / sqrt(m)`` (``m`` rows, with the finite-population correction).
Rows shuffled only within windows of sorted data give batches whose label mean swings with
the window's, much more. :class:`LabelSpread` keeps each full batch's label figures as the
batches are served, and :meth:`LabelSpread.summary` gives the ratio of the observed spread to
the iid one (1.0: as good as iid) and the share of batches inside the iid 99 % interval.

For a regression target the batch mean of the target is used; for a binary label the share of
ones; for several classes each class's share (the spread summed over the classes, the interval
a chi-square test of the batch's class counts against the epoch's proportions).
"""

from __future__ import annotations

import threading
from typing import TypedDict

import numpy as np

_Z99 = 2.5758  # two-sided 99 % of a normal


class Spread(TypedDict):
    """What :meth:`LabelSpread.summary` reports of an epoch."""

    label_spread: float  # std of the batch label means over the iid one (1.0: iid)
    inside_iid: float  # share of full batches inside the iid 99 % interval
    spread_batches: int  # the full batches measured


class LabelSpread:
    """Label figures of an epoch's full batches (thread-safe; each batch added once).

    Parameters
    ----------
    batch_size
        Rows of a full batch (shorter batches are left out).
    classes
        Classes of a multiclass label (more than 2), else 0 (a mean per batch).
    """

    def __init__(self, batch_size: int, classes: int = 0) -> None:
        self.m = int(batch_size)
        self.classes = int(classes) if classes > 2 else 0
        self._lock = threading.Lock()
        self._means: list[float] = []  # a label mean per batch (scalar labels)
        self._sums = np.zeros(2)  # sum and sum of squares of every row's label (scalar labels)
        self._counts: list[np.ndarray] = []  # class counts per batch (several classes)

    def add(self, y: np.ndarray) -> None:
        """One batch's labels (ignored unless a full batch).

        Parameters
        ----------
        y
            The batch's label values (class codes for several classes).
        """
        if len(y) != self.m:
            return
        if self.classes:
            counts = np.bincount(np.asarray(y, dtype=np.int64).ravel(), minlength=self.classes)
            with self._lock:
                self._counts.append(counts[: self.classes].astype(np.int32))
            return
        v = np.asarray(y, dtype=np.float64).ravel()
        with self._lock:
            self._means.append(float(v.mean()))
            self._sums += (v.sum(), float(v @ v))

    def summary(self) -> Spread | None:
        """The epoch's spread against iid (None: fewer than two full batches, or no variation).

        Returns
        -------
        Spread or None
        """
        with self._lock:
            n = len(self._counts) if self.classes else len(self._means)
            if n < 2:
                return None
            rows = n * self.m
            fpc = (rows - self.m) / (rows - 1) if rows > 1 else 1.0  # batches drawn without replacement
            if self.classes:
                return self._classes(n, rows, fpc)
            means = np.asarray(self._means)
            mu = self._sums[0] / rows
            var = max(self._sums[1] / rows - mu * mu, 0.0)
        iid = var / self.m * fpc
        if iid <= 0:
            return None
        inside = np.abs(means - mu) <= _Z99 * np.sqrt(iid)
        return Spread(label_spread=round(float(np.sqrt(means.var(ddof=1) / iid)), 4),
                      inside_iid=round(float(inside.mean()), 4), spread_batches=n)

    def _classes(self, n: int, rows: int, fpc: float) -> Spread | None:
        counts = np.stack(self._counts).astype(np.float64)  # batches x classes
        p = counts.sum(axis=0) / rows
        iid = float((p * (1 - p)).sum()) / self.m * fpc
        if iid <= 0:
            return None
        shares = counts / self.m
        spread = float(np.sqrt(shares.var(axis=0, ddof=1).sum() / iid))
        present = p > 0
        expected = self.m * p[present]
        chi2 = (((counts[:, present] - expected) ** 2) / expected).sum(axis=1) / fpc
        dof = max(int(present.sum()) - 1, 1)
        # the chi-square 99 % quantile (Wilson-Hilferty)
        q99 = dof * (1 - 2 / (9 * dof) + 2.3263 * np.sqrt(2 / (9 * dof))) ** 3
        return Spread(label_spread=round(spread, 4), inside_iid=round(float((chi2 <= q99).mean()), 4),
                      spread_batches=n)
