"""Fixtures shared by the tests of the global order's buckets (dealt to files, or held)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """3,000 rows in 12 files of 250; every 7th row has no label (432 of them: 12 × 36).

    Columns ``uid`` (file × 1000 + row: a row traced to its file), ``level``, ``region`` (text,
    a dictionary per file) and ``cleared`` (the label, 0/1).
    """
    root = tmp_path_factory.mktemp("dealt")
    rng = np.random.default_rng(5)
    for f in range(12):
        n = 250
        label = rng.integers(0, 2, n).astype(float)
        label[np.arange(n) % 7 == 3] = np.nan
        region = rng.choice(["north", "south", "Île", "東"], n)
        pd.DataFrame({"uid": np.arange(n) + f * 1000, "level": rng.integers(1, 60, n),
                      "region": region, "cleared": label}).to_csv(root / f"part-{f:02d}.csv",
                                                                 index=False)
    return str(root / "*.csv")
