"""Dates written as text, read value by value as pyarrow reads a column of them.

One reading for the whole project: the reader turns a text column of ISO 8601 dates that
pyarrow left as text (zoned and naive times mixed, or null markers among them) into timestamps,
the encoding reads a block of dates left as text, and ``serving/`` follows the same grammar
(:data:`ISO_DATE`) in TensorFlow. A zone is converted to UTC; a time without one is taken as UTC
(pyarrow's timestamps without a zone count seconds the same way).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SPACES = " \t\n\r\x0b\x0c"  # stripped around a date or a number, as serving strips them
# ISO 8601 as pyarrow's parser takes it (RE2, ASCII digits), the grammar of serving's DATE: year,
# month, day, then optionally T or a space and hh, hh:mm, hh:mm:ss or hh:mm:ss.f (1 to 9 digits),
# then optionally Z, ±hh, ±hhmm or ±hh:mm
ISO_DATE = (r"^(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})(?:[T ](?P<h>\d{2})(?::(?P<mi>\d{2})"
            r"(?::(?P<s>\d{2})(?:\.(?P<f>\d{1,9}))?)?)?(?P<z>Z|(?P<zs>[+-])(?P<zh>\d{2})"
            r"(?::?(?P<zm>\d{2}))?)?)?$")
DATE_START = re.compile(r"[ \t\n\r\x0b\x0c]*[0-9]{4}-[0-9]{2}-[0-9]{2}")  # could be a date: look closer
NS_RANGE = 9_223_372_035  # seconds from 1970 within int64 nanoseconds (1677 to 2262)
_DAYS_IN_MONTH = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)


@dataclass
class IsoDates:
    """A text column read as ISO 8601 dates, value by value (numpy arrays, one entry per value).

    ``seconds`` since 1970 UTC (whole; 0 where not a date), ``nanos`` the fraction's
    nanoseconds, ``fraction`` where one was written, ``zoned`` where a zone was written, ``ok``
    where the value is a date, ``blank`` where it is missing or only spaces.
    """

    seconds: np.ndarray
    nanos: np.ndarray
    fraction: np.ndarray
    zoned: np.ndarray
    ok: np.ndarray
    blank: np.ndarray

    def as_seconds(self) -> np.ndarray:
        """Float seconds (NaN where not a date), a fraction as nanosecond timestamps carry it.

        Returns
        -------
        numpy.ndarray
            float64 seconds since 1970 (UTC).
        """
        in_ns = np.abs(self.seconds) < NS_RANGE
        ticks = (np.where(in_ns, self.seconds, 0) * 10**9 + self.nanos).astype(np.float64) / 1e9
        value = self.seconds.astype(np.float64)
        value = np.where(self.fraction, np.where(in_ns, ticks, value + self.nanos / 1e9), value)
        value[~self.ok | self.blank] = np.nan
        return value

    def as_timestamps(self) -> pa.Array:
        """The dates as one Arrow timestamp array (missing where not a date).

        In seconds when no value has a fraction, else nanoseconds; microseconds when a date
        lies outside 1677–2262 (digits past the microsecond dropped: float64 seconds of such a
        date do not hold a microsecond either). Zoned (UTC) when some value had a zone, as
        pyarrow types a column of zoned times.

        Returns
        -------
        pyarrow.Array
        """
        tz = "UTC" if self.zoned.any() else None
        valid = self.ok & ~self.blank
        if not self.fraction[valid].any():
            unit, ticks = "s", self.seconds
        elif (np.abs(self.seconds[valid]) < NS_RANGE).all():
            unit, ticks = "ns", np.where(valid, self.seconds, 0) * 10**9 + self.nanos
        else:
            unit, ticks = "us", self.seconds * 10**6 + self.nanos // 1000
        return pa.array(ticks, pa.int64(), mask=~valid).cast(pa.timestamp(unit, tz))


def iso_dates(col: pa.Array) -> IsoDates:
    """Read a text column as ISO 8601 dates (:data:`ISO_DATE`; spaces around a value ignored).

    Vectorised, in int64: no value goes through Python.

    Parameters
    ----------
    col
        A pyarrow string Array.

    Returns
    -------
    IsoDates
    """
    text = pc.utf8_trim(col, characters=SPACES)
    blank = np.asarray(pc.fill_null(pc.equal(text, ""), True), dtype=bool)  # null or spaces
    parts = pc.extract_regex(text, ISO_DATE)
    matched = np.asarray(parts.is_valid(), dtype=bool)

    def whole(name: str) -> np.ndarray:  # "" (an absent part) is 0
        part = pc.struct_field(parts, name)
        zero, empty = pa.scalar("0", part.type), pa.scalar("", part.type)
        digits = pc.binary_join_element_wise(zero, part, empty)
        return np.asarray(pc.fill_null(digits, zero).cast(pa.int64()), dtype=np.int64)

    y, m, d, hh, mm, ss, zh, zm = (whole(n) for n in ("y", "mo", "d", "h", "mi", "s", "zh", "zm"))
    frac = pc.fill_null(pc.struct_field(parts, "f"), "")
    fraction = np.asarray(pc.not_equal(frac, ""), dtype=bool)
    nanos = np.asarray(pc.utf8_rpad(frac, width=9, padding="0").cast(pa.int64()), dtype=np.int64)
    zoned = np.asarray(pc.not_equal(pc.fill_null(pc.struct_field(parts, "z"), ""), ""), dtype=bool)
    west = np.asarray(pc.fill_null(pc.equal(pc.struct_field(parts, "zs"), "-"), False), dtype=bool)
    leap = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
    month_days = _DAYS_IN_MONTH[np.clip(m - 1, 0, 11)] + ((m == 2) & leap)
    ok = (matched & (m >= 1) & (m <= 12) & (d >= 1) & (d <= month_days) & (hh < 24) & (mm < 60)
          & (ss < 60) & (zh < 24) & (zm < 60))
    offset = (zh * 3600 + zm * 60) * np.where(west, -1, 1)
    secs = _days_from_civil(y, m, d) * 86400 + hh * 3600 + mm * 60 + ss - offset
    return IsoDates(secs, nanos, fraction, zoned & ok, ok, blank)


def iso_seconds(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Seconds since 1970 (UTC) of a text column of dates, and where a value is not one.

    Parameters
    ----------
    col
        A pyarrow string Array.

    Returns
    -------
    tuple of numpy.ndarray
        float64 seconds (NaN where missing or not a date), and where a value is not a date
        although not missing (missing: null, or only spaces).
    """
    dates = iso_dates(col)
    return dates.as_seconds(), ~dates.ok & ~dates.blank


def _days_from_civil(y: np.ndarray, m: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of proleptic Gregorian dates (H. Hinnant's algorithm), as serving."""
    y = y - (m <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + np.where(m > 2, -3, 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468
