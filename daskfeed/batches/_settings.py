"""DataSettings: how one data set is read, scanned and batched, resolved once where they enter.

``DaskSequence(...)`` and ``train(...)`` build one (the ``daskfeed.*`` config filled in here, in
:meth:`DataSettings.resolve`, and nowhere below); :class:`~daskfeed.batches._prepare.Prepared`,
the scan and :class:`~daskfeed.batches._stream.BatchStream` read it and look nothing up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from daskfeed.batches._skips import Skips
from daskfeed.cache import CacheChoice
from daskfeed.core import config, refuse_setting
from daskfeed.manifest import split_settings
from daskfeed.reading import ReadOptions, read_options


@dataclass(frozen=True)
class DataSettings:
    """One data set's settings, resolved (see :class:`~daskfeed.DaskSequence` for each).

    Attributes
    ----------
    label, features, exclude, weight
        The label, the features (None: every column but the label), columns left out, the
        sample-weight column.
    batch_size, shuffle, seed, as_matrix, drop_remainder, shard
        How batches are made.
    timeout, prefetch_bytes, window_bytes
        The longest wait for a window (seconds), bytes of windows held ahead, encoded bytes per
        window (unless rows per window are given when serving).
    vocabulary_size
        Values kept per text column.
    cache
        Where the parse cache goes (:class:`~daskfeed.cache.CacheChoice`).
    validation_split, subset
        The split this data set is a part of (``0.0``/None: the whole data).
    read
        How the files are read (:class:`~daskfeed.reading.ReadOptions`).
    blocksize_given
        Whether ``read.blocksize`` was asked for (else a given manifest's blocks are used).
    skip_batches
        Batches of the global order left out (:class:`~daskfeed.batches.Skips`).
    window_reads
        Who reads a window of the global order: ``"auto"`` (the trainer where its cluster is
        this machine) or ``"workers"`` (``daskfeed.window-reads``).
    buckets_in_memory
        Whether the trainer may hold a small data set's buckets instead of dealing them to
        files (``daskfeed.buckets-in-memory``).
    """

    label: str
    read: ReadOptions = field(default_factory=ReadOptions)
    features: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    weight: str | None = None
    batch_size: int = 1024
    shuffle: bool = True
    seed: int = 0
    as_matrix: bool = False
    drop_remainder: bool = False
    shard: tuple[int, int] = (0, 1)
    timeout: float = 300.0
    prefetch_bytes: int = 256 * 2**20
    window_bytes: int = 256 * 2**20
    vocabulary_size: int = 1000
    cache: CacheChoice = field(default_factory=CacheChoice)
    validation_split: float = 0.0
    subset: str | None = None
    blocksize_given: bool = False
    skip_batches: Skips = field(default_factory=Skips)
    window_reads: str = "auto"
    buckets_in_memory: bool = True

    @property
    def asked_blocksize(self) -> int | None:
        """The block size asked for (``read.blocksize`` if given, else None: the run decides)."""
        return self.read.blocksize if self.blocksize_given else None

    @property
    def split(self) -> dict[str, Any] | None:
        """The split's settings as a manifest records them (None: the whole data)."""
        return split_settings(self.validation_split or None, self.subset, self.seed)

    @classmethod
    def resolve(cls, *, label: str, features: Sequence[str] | None = None,
                exclude: Sequence[str] = (), weight: str | None = None,
                batch_size: int | None = None, shuffle: bool = True, seed: int = 0,
                as_matrix: bool = False, drop_remainder: bool = False,
                shard: tuple[int, int] = (0, 1), timeout: float | str | None = None,
                prefetch_bytes: int | str | None = None, window_bytes: int | str | None = None,
                vocabulary_size: int | None = None,
                cache: bool | str | os.PathLike[str] | None = True,
                validation_split: float | None = None, subset: str | None = None,
                blocksize: int | str | None = None, encoding: str = "utf-8",
                dtype: dict[str, str] | None = None,
                storage_options: dict[str, Any] | None = None, bad_lines: str = "error",
                sep: str | None = None, na_values: Sequence[str] | None = None,
                decimal: str = ".", skip_batches: str | Skips | Mapping[int, Any] | None = None,
                ) -> DataSettings:
        """The settings with the ``daskfeed.*`` config filled in where not given, checked.

        Parameters
        ----------
        label, features, exclude, weight, batch_size, shuffle, seed, as_matrix
            As :class:`~daskfeed.DaskSequence` takes them.
        drop_remainder, shard, timeout, prefetch_bytes, window_bytes, vocabulary_size, cache
            Likewise.
        validation_split, subset
            Likewise (checked together).
        blocksize, encoding, dtype, storage_options, bad_lines, sep, na_values, decimal
            How the files are read (:func:`~daskfeed.reading.read_options`).
        skip_batches
            Batches of the global order to leave out: ``"3:48200-48260,4:17"`` (epochs and
            steps from 1, as ``daskfeed rows`` numbers them; :meth:`Skips.parse
            <daskfeed.batches.Skips.parse>`).

        Returns
        -------
        DataSettings

        Raises
        ------
        SettingError
            ``batch_size < 1``, a ``daskfeed.window-reads`` neither auto nor workers, a read
            setting out of its range (an unknown ``bad_lines``:
            :func:`~daskfeed.reading.read_options`), or a split that is not one (see
            :func:`~daskfeed.manifest.split_settings`).
        """
        size = int(config.get("batch-size", batch_size))
        if size < 1:
            refuse_setting("Expected batch_size >= 1 (rows per batch).",
                           f"batch_size={batch_size!r}", "e.g. batch_size=1024 (--batch-size 1024).")
        split = split_settings(validation_split, subset, int(seed))
        return cls(
            label=label, features=tuple(features) if features is not None else None,
            exclude=tuple(exclude or ()), weight=weight, batch_size=size, shuffle=bool(shuffle),
            seed=int(seed), as_matrix=bool(as_matrix), drop_remainder=bool(drop_remainder),
            shard=(int(shard[0]), int(shard[1])), timeout=config.timeout(timeout),
            prefetch_bytes=config.get_bytes("prefetch-bytes", prefetch_bytes),
            window_bytes=config.window_bytes(window_bytes),
            vocabulary_size=config.vocabulary_size(vocabulary_size),
            cache=CacheChoice.resolve(cache),
            validation_split=split["validation_split"] if split else 0.0,
            subset=split["subset"] if split else None,
            read=read_options(blocksize=blocksize, sep=sep, encoding=encoding, dtype=dtype,
                              storage_options=storage_options, bad_lines=bad_lines,
                              na_values=na_values, decimal=decimal),
            blocksize_given=blocksize is not None,
            skip_batches=Skips.parse(skip_batches),
            window_reads=config.window_reads(),
            buckets_in_memory=config.buckets_in_memory(),
        )
