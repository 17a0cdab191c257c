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


# an estimate of the time left is shown once this share of the work is done, and this long in:
# before, a file that took long to open (or an empty one) made "ETA 42508s" at 0 %
ETA_AFTER_SHARE = 0.05
ETA_AFTER_SECONDS = 2.0


def eta_seconds(done: float, total: float, seconds: float) -> float | None:
    """The seconds left at the rate so far, once that rate means something; else None.

    The rate of the first moments (opening files, an empty file, workers starting) says little
    of the rest: an estimate is given once at least 5 % of ``total`` is done and 2 seconds have
    passed, and not once everything is done.

    Parameters
    ----------
    done, total
        Work done and in all (bytes, rows, blocks: one unit).
    seconds
        Time spent on ``done``.

    Returns
    -------
    float or None
        ``(total - done)`` at ``done / seconds`` per second, or None (nothing sensible to say).
    """
    if total <= 0 or done >= total or done < ETA_AFTER_SHARE * total \
            or seconds < ETA_AFTER_SECONDS:
        return None
    return (total - done) * seconds / done
