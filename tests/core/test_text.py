"""Durations as lines and the page show them (daskfeed.core._text)."""

from __future__ import annotations

from daskfeed.core import duration


def test_durations_in_at_most_two_units():
    assert duration(3725) == "1h 02m" and duration(59.6) == "1m 00s" and duration(187) == "3m 07s"
    assert duration(12.34) == "12s" and duration(12.34, tenths=True) == "12.3s"
    assert duration(3600, tenths=True) == "1h 00m"
