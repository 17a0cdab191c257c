"""Shuffle quality on data sorted by label: per-batch label means against the global mean."""

from __future__ import annotations

import numpy as np

import daskfeed


def test_batches_of_label_sorted_data_are_mixed(tmp_path, client, write_csv):
    # 16 files of 500 rows: the first 8 all label 0, the last 8 all label 1 (worst case)
    for f in range(16):
        rows = "".join(f"{f * 500 + i},{int(f >= 8)}\n" for i in range(500))
        write_csv(f"d/part_{f:02d}.csv", "x,y\n" + rows)
    kw = {"label": "y", "client": client, "batch_size": 250, "cache": False}
    pattern = str(tmp_path / "d" / "*.csv")
    with daskfeed.DaskSequence(pattern, shuffle=False, **kw) as plain, \
            daskfeed.DaskSequence(pattern, window_rows=2000, seed=1, **kw) as mixed:
        def deviation(seq) -> float:
            means = np.array([seq[i][1].mean() for i in range(len(seq))])
            return float(np.abs(means - 0.5).mean())

        unshuffled, shuffled = deviation(plain), deviation(mixed)
    iid = float(np.sqrt(0.25 / 250))  # expected |mean - 0.5| of a random batch is ~0.8 of this
    # unshuffled: every batch is pure (deviation 0.5); windows of 4 of the 16 files mix labels
    assert unshuffled == 0.5
    assert shuffled < 0.15, shuffled
    print(f"shuffle quality: mean |batch label mean - 0.5| = {shuffled:.3f} "
          f"(unshuffled {unshuffled:.3f}, iid ~{0.8 * iid:.3f})")
