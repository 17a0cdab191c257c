"""Labels as users have them: a price in the thousands (regression in the label's units), text
class labels, and the files they come in (TSV, ';', a row-number column)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import daskfeed
from daskfeed._keras import keras


@pytest.fixture(scope="module")
def prices(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """price = 3000 + 1500·x1 − 800·x2 + noise (sd 100): 4 training files and 1 held out."""
    root = tmp_path_factory.mktemp("prices")
    rng = np.random.default_rng(11)
    paths = {}
    for name, files in (("train", 4), ("test", 1)):
        for i in range(files):
            n = 2000
            x1, x2 = rng.normal(size=n), rng.normal(size=n)
            price = np.round(3000 + 1500 * x1 - 800 * x2 + rng.normal(0, 100, n), 2)
            pd.DataFrame({"x1": x1, "x2": x2, "price": price}).to_csv(
                root / f"{name}_{i}.csv", index=False)
        paths[name] = str(root / f"{name}_*.csv")
    return paths


def test_regression_learns_prices_in_their_units(prices: dict[str, str], client) -> None:
    keras.utils.set_random_seed(0)
    with daskfeed.DaskSequence(prices["train"], label="price", batch_size=128, client=client,
                               cache=False) as train, \
            daskfeed.DaskSequence(prices["test"], label="price", batch_size=1000, client=client,
                                  shuffle=False, reference=train.manifest, cache=False) as test:
        model = daskfeed.default_model(train)
        assert not model.get_layer("label_units").weights  # a fixed rescale, nothing to train
        model.fit(train, epochs=4, shuffle=False, verbose=0)
        x, y = _all_batches(test)
        pred = model.predict(x, verbose=0)[:, 0]
    baseline = np.abs(y - train.manifest.columns["price"].mean).mean()
    mae = np.abs(pred - y).mean()
    assert mae < 0.3 * baseline, (mae, baseline)
    # saved and read back, the model still predicts prices (the rescale is part of it)
    reloaded = keras.saving.load_model(_saved(model))
    np.testing.assert_allclose(reloaded.predict(x, verbose=0)[:, 0], pred, rtol=1e-5, atol=1e-3)


def _all_batches(seq: daskfeed.DaskSequence) -> tuple[dict[str, np.ndarray], np.ndarray]:
    batches = [seq[i] for i in range(len(seq))]
    x = {k: np.concatenate([b[0][k] for b in batches]) for k in batches[0][0]}
    return x, np.concatenate([b[1] for b in batches])


def _saved(model: keras.Model) -> str:
    import tempfile

    path = tempfile.mkdtemp(prefix="daskfeed-labels-") + "/model.keras"
    model.save(path)
    return path
