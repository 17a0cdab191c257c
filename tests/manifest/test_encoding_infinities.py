"""Infinities are missing in every encoder's hands, as the read rule makes them (NaN too)."""

from __future__ import annotations

import numpy as np
import pytest

FILL = -7.0


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_an_infinity_gets_the_fill_from_pandas_arrow_and_text(dtype) -> None:
    """A float column holding inf/-inf (a DataFrame's, an Arrow table's, or text pyarrow left as
    text) gets the column's fill where it is infinite, never an infinite or wrapped value."""
    import pandas as pd
    import pyarrow as pa

    from daskfeed.manifest import ColumnCode, Encoding, encode_features
    from daskfeed.manifest._encoding import encode_frame

    code = ColumnCode("a", "numeric", FILL, (), dtype)
    encoding = Encoding("y", "float32", (code,))
    values = [1.5, np.inf, -np.inf, np.nan, 2.0]
    want = [np.dtype(dtype).type(v) for v in (1.5, FILL, FILL, FILL, 2.0)]
    framed = encode_frame(pd.DataFrame({"a": values, "y": [1, 0, 1, 0, 1]}), encoding)
    assert np.asarray(framed.x["a"]).tolist() == want
    table = pa.table({"a": pa.array(values, pa.float64()), "y": [1, 0, 1, 0, 1]})
    assert encode_features(table, encoding)["a"].tolist() == want
    text = pa.table({"a": ["1.5", "inf", "-Infinity", "nan", "2.0"], "y": [1, 0, 1, 0, 1]})
    assert encode_features(text, encoding)["a"].tolist() == want
