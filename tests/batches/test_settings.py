"""DataSettings: one data set's settings resolved once, the daskfeed.* config filled in there only."""

from __future__ import annotations

import dataclasses
import inspect

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
    with pytest.raises(SettingError, match="bad_lines"):
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


def _keywords(fn) -> dict[str, object]:
    """A callable's keyword-only parameters and their defaults."""
    return {name: p.default for name, p in inspect.signature(fn).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _source_keywords(path: str, cls: str) -> dict[str, object]:
    """``cls.__init__``'s keyword-only parameters and defaults, read from the source (ast)."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    tree = ast.parse((root / path).read_text())
    init = next(f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    return {a.arg: (inspect.Parameter.empty if d is None else ast.literal_eval(d))
            for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True)}


# what a training run sets itself, not taken from train()'s caller: the rank's shard, the budget's
# prefetch and window shares, the split's side; the shuffle and the tail are the global order's
SET_BY_THE_RUN = {"label", "shard", "prefetch_bytes", "window_bytes", "subset", "shuffle",
                  "drop_remainder"}


def test_every_entry_takes_the_one_list_of_data_settings_with_its_defaults():
    """DaskSequence, TorchDataset, train and the CLI name each data setting as resolve does."""
    from daskfeed.adapters import DaskSequence
    from daskfeed.cli._commands import cli
    from daskfeed.training._options import DATA_KEYS, TrainOptions

    one = _keywords(DataSettings.resolve)
    seq = _keywords(DaskSequence.__init__)
    assert {k: seq.get(k, "missing") for k in one} == one  # names and defaults alike
    assert set(DATA_KEYS) == set(one) - SET_BY_THE_RUN  # train(**settings) routes these
    flags = {p.name for p in cli.commands["train"].params} | {"cache"}  # (--cache / --no-cache)
    assert set(DATA_KEYS) <= flags
    opts = TrainOptions.resolve(label="y", batch_size=64, seed=3, blocksize="1MiB",
                                validation_split=0.2, weight="w", sep=";")
    assert opts.data == DataSettings.resolve(label="y", batch_size=64, seed=3, blocksize="1MiB",
                                             validation_split=0.2, subset="training",
                                             weight="w", sep=";")
    ds = _source_keywords("daskfeed/adapters/_torch.py", "TorchDataset")  # (without torch)
    assert {k: ds.get(k, "missing") for k in set(one) - {"shard"}} == {
        k: v for k, v in one.items() if k != "shard"}  # (its shard: torch.distributed's)
    serving = ("client", "memory_limit", "nworkers", "manifest", "reference", "window_rows")
    assert {k: seq.get(k, "missing") for k in serving} == {k: ds[k] for k in serving}


def test_a_batch_size_below_1_is_a_setting_error_where_it_enters():
    with pytest.raises(SettingError, match=r"Expected batch_size >= 1 \(rows per batch\)\. "
                                           r"Received: batch_size=0\."):
        DataSettings.resolve(label="y", batch_size=0)
