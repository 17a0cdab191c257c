"""DataSettings: one data set's settings resolved once, the daskfeed.* config filled in there only."""

from __future__ import annotations

import dataclasses

import dask.config
import pytest

from daskfeed import SettingError
from daskfeed.batches import DataSettings
from daskfeed.cache import CacheChoice


def test_the_config_fills_what_is_not_given_and_a_given_value_wins():
    conf = {"daskfeed.batch-size": 64, "daskfeed.timeout": "90s", "daskfeed.prefetch-bytes": "8MiB",
            "daskfeed.window-bytes": "16MiB", "daskfeed.vocabulary-size": 7,
            "daskfeed.blocksize": "1MiB", "daskfeed.cache-dir": "/tmp/somewhere",
            "daskfeed.cache-compression": "zstd"}
    with dask.config.set(conf):
        s = DataSettings.resolve(label="y")
        given = DataSettings.resolve(label="y", batch_size=10, timeout=5, prefetch_bytes=1000,
                                     window_bytes="2kB", vocabulary_size=3, blocksize="4kB",
                                     cache=False)
    assert (s.batch_size, s.timeout, s.prefetch_bytes, s.window_bytes, s.vocabulary_size) == (
        64, 90.0, 8 * 2**20, 16 * 2**20, 7)
    assert s.read.blocksize == 2**20 and not s.blocksize_given
    assert s.cache == CacheChoice(on=True, root="/tmp/somewhere", required=False,
                                  compression="zstd")
    assert (given.batch_size, given.timeout, given.prefetch_bytes, given.window_bytes,
            given.vocabulary_size, given.read.blocksize) == (10, 5.0, 1000, 2000, 3, 4000)
    assert given.blocksize_given and given.cache == CacheChoice(on=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.batch_size = 1  # type: ignore[misc]


def test_settings_are_checked_where_they_enter():
    with pytest.raises(ValueError, match="batch_size >= 1"):
        DataSettings.resolve(label="y", batch_size=0)
    with pytest.raises(SettingError, match="0 < validation_split < 1"):
        DataSettings.resolve(label="y", validation_split=1.5, subset="training")
    with pytest.raises(SettingError, match="decimal"):
        DataSettings.resolve(label="y", sep=",", decimal=",")  # the separator too
    with pytest.raises(ValueError, match="bad_lines"):
        DataSettings.resolve(label="y", bad_lines="ignore")


def test_a_split_and_an_explicit_cache_directory():
    s = DataSettings.resolve(label="y", validation_split=0.25, subset="validation", seed=4,
                             cache="/data/cache", features=["a", "b"], exclude=["c"])
    assert s.split == {"validation_split": 0.25, "subset": "validation", "seed": 4}
    assert s.split is not s.split  # a fresh dict each time: the scan adds to it
    assert DataSettings.resolve(label="y").split is None
    assert s.cache == CacheChoice(on=True, root="/data/cache", required=True,
                                  compression=s.cache.compression)
    assert s.features == ("a", "b") and s.exclude == ("c",)
