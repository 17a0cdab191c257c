"""Numbers written as text, read as pyarrow reads a block of them; ``serving/`` reads by the same rules."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from daskfeed.reading import NA_MARKERS, SPACES

if TYPE_CHECKING:
    import pandas as pd

# numbers written as text, as pyarrow reads a block of them (serving/ reads text by the same)
# (ASCII digits only: Python's \d would take other scripts' digits, which neither pyarrow nor
# TensorFlow's RE2 reads as numbers)
NUMBER = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|(?i:[+-]?(?:inf(?:inity)?|nan))"
HEX = r"0[xX][0-9A-Fa-f]{1,16}"  # pyarrow reads these as int64 (the bits)
WHOLE = r"[+-]?[0-9]{1,18}"  # exact in int64


def text_numbers(s: pd.Series, dtype: str, fill: float | np.generic) -> tuple[np.ndarray, np.ndarray | None]:
    """Text of a number column read value by value as pyarrow reads a block of such values.

    Decimal numbers (``inf``, ``nan`` too), ``0x`` hexadecimals (int64 bits), ``true`` /
    ``false`` (1, 0); spaces around ignored — what ``serving/`` reads (its ``NUMBER``, ``HEX``,
    ``WHOLE``). The rest gets ``fill`` (the training mean): missing when blank, a null marker,
    NaN or infinite, otherwise counted as unparsed.

    Parameters
    ----------
    s
        The column's text (a block's).
    dtype
        The array's dtype (``int64``: whole numbers exactly).
    fill
        The value of what is not read.

    Returns
    -------
    tuple
        The values, and where a value was no number nor missing (None: nowhere).
    """
    text = s.astype("string").str.strip(SPACES).fillna("")
    decimal = text.str.fullmatch(NUMBER).to_numpy(dtype=bool, na_value=False)
    hexa = text.str.fullmatch(HEX).to_numpy(dtype=bool, na_value=False)
    lower = text.str.lower()
    true = lower.eq("true").to_numpy(dtype=bool, na_value=False)
    false = lower.eq("false").to_numpy(dtype=bool, na_value=False)
    value = np.full(len(text), np.nan)
    value[decimal] = [float(v) for v in text[decimal]]
    bits = [int(v, 16) for v in text[hexa]]
    ints = np.zeros(len(text), dtype=np.int64)
    ints[hexa] = [b - 2**64 if b >= 2**63 else b for b in bits]
    value[hexa] = ints[hexa]
    value[true], value[false] = 1.0, 0.0
    read = decimal | hexa | true | false
    missing = ~read | ~np.isfinite(value)  # NaN and inf: missing, as the read rule has them
    if dtype == "int64":  # whole numbers exactly, the rest as a cast would make them
        whole = text.str.fullmatch(WHOLE).to_numpy(dtype=bool, na_value=False)
        ints[whole] = [int(v) for v in text[whole]]
        other = ~whole & ~hexa & ~missing
        with np.errstate(invalid="ignore"):
            ints[other] = value[other].astype(np.int64)
        arr = ints
    else:
        arr = value.astype(dtype)
    arr[missing] = fill
    unparsed = not_numbers(s, ~read) if (~read).any() else None
    return arr, unparsed


def not_numbers(s: pd.Series, nan: np.ndarray) -> np.ndarray | None:
    """Where text read as NaN is no missing value: not blank, no null marker, no NaN spelt out."""
    text = s.astype("string").str.strip(SPACES)
    missing = (text.isna() | text.eq("") | text.isin(NA_MARKERS)
               | text.str.fullmatch(r"[+-]?nan", case=False))
    unparsed = nan & ~missing.to_numpy(dtype=bool, na_value=True)
    return unparsed if unparsed.any() else None
