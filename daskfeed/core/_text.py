"""Figures as people read them in lines and on the page."""

from __future__ import annotations


def duration(seconds: float, *, tenths: bool = False) -> str:
    """A duration: ``1h 02m``, ``3m 07s``, ``12s`` (``12.3s`` with ``tenths``).

    Parameters
    ----------
    seconds
        The duration.
    tenths
        Show tenths of a second below a minute.

    Returns
    -------
    str
        The duration, in at most two units.
    """
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{seconds:.1f}s" if tenths else f"{s}s"
