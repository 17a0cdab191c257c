"""The recipe daskfeed replaces: a Keras ``PyDataset`` whose batch ``i`` is hand-split file ``i``.

Its own module so that Keras' worker processes can unpickle the class by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from keras.utils import PyDataset


class OldRecipe(PyDataset):
    """Batch ``i`` = ``pandas.read_csv(files[i])``: the files were split to the batch size by hand.

    Parameters
    ----------
    files
        The hand-split CSV files, one per batch.
    features, label
        Columns of ``x`` (float32 matrix, blanks 0) and ``y``.
    **kwargs
        ``workers``, ``use_multiprocessing``, ``max_queue_size`` for ``PyDataset``.
    """

    def __init__(self, files: Sequence[str], features: Sequence[str], label: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.files, self.features, self.label = list(files), list(features), label

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        df = pd.read_csv(self.files[i], usecols=[*self.features, self.label])
        x = df[self.features].fillna(0).to_numpy(np.float32)
        return x, df[self.label].fillna(0).to_numpy(np.float32)
