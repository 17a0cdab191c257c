"""Prepare: the data a sequence will serve, everything before Keras.

The settings resolved once (config defaults included), the files as a
:class:`~daskfeed.reading._source.Source`, the cluster's client, the parse cache, the manifest (scanned,
or given and checked), the features and their encoding, and the checks of a validation set
against its training set. None of it imports keras, so ``daskfeed train`` prepares its data
while keras loads; :class:`~daskfeed.adapters._sequence.DaskSequence` serves the batches of a
:class:`Prepared`.
"""

from __future__ import annotations

import os
from typing import Any

from daskfeed.batches._checks import (
    check_classes,
    check_compatible,
    check_disjoint,
    check_weight_column,
    check_weights,
)
from daskfeed.cache import open_cache
from daskfeed.cluster import Owner, acquire_client
from daskfeed.core import DaskfeedError, config, warn_user
from daskfeed.manifest import Encoding, Manifest, id_like, id_warning, split_settings
from daskfeed.reading import Source
from daskfeed.scanning import scan

__all__ = ["Prepared"]


class Prepared:
    """One data set made ready to serve: settings, files, client, parse cache, manifest, encoding.

    Takes :class:`~daskfeed.adapters._sequence.DaskSequence`'s arguments but the serving ones (windows,
    prefetching's spans and stop request, Keras' ``workers``); see there for each. The client
    it starts (when given none) is held by ``owner``, which the
    :class:`~daskfeed.batches._stream.BatchStream` serving it takes over; :meth:`close` gives it
    back when no stream is made. The settings are its attributes, resolved once (config defaults
    included): a stream and a sequence read them here.

    Raises
    ------
    DaskfeedError
        Bad data or settings, with what was expected, what was received and a hint.
    """

    def __init__(
        self,
        data: Any,
        *,
        label: str,
        features: list[str] | None = None,
        exclude: tuple[str, ...] | list[str] = (),
        batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        client: Any = None,
        as_matrix: bool = False,
        manifest: Manifest | str | os.PathLike[str] | None = None,
        reference: Manifest | None = None,
        drop_remainder: bool = False,
        prefetch_bytes: int | str | None = None,
        timeout: float | str | None = None,
        blocksize: int | str | None = None,
        encoding: str = "utf-8",
        dtype: dict[str, str] | None = None,
        storage_options: dict[str, Any] | None = None,
        vocabulary_size: int | None = None,
        shard: tuple[int, int] = (0, 1),
        cache: bool | str | os.PathLike[str] = True,
        bad_lines: str = "error",
        sep: str = ",",
        na_values: list[str] | tuple[str, ...] | None = None,
        decimal: str = ".",
        weight: str | None = None,
        validation_split: float | None = None,
        subset: str | None = None,
        scan_progress: Any = None,
    ) -> None:
        split = split_settings(validation_split, subset, int(seed))  # before any work
        self._handed = False  # to a sequence (which then owns the client)
        self._settle(label=label, weight=weight, batch_size=batch_size, shuffle=shuffle, seed=seed,
                     drop_remainder=drop_remainder, shard=shard, timeout=timeout,
                     prefetch_bytes=prefetch_bytes, split=split)
        manifest, blocksize = _with_blocksize(manifest, blocksize)
        self.source = Source(data, blocksize=blocksize, encoding=encoding, dtype=dtype,
                             storage_options=storage_options, bad_lines=bad_lines, sep=sep,
                             na_values=na_values, decimal=decimal)
        self.owner = Owner()
        self.owner.client, self.owner.owns = acquire_client(client)
        self.scheduler_address = self.client.scheduler.address  # what a pickled copy reconnects to
        self.security = getattr(self.client, "security", None)  # tls:// reconnects after pickling
        try:
            self.cache, self.cache_status = self._open_cache(cache)
            self.manifest = self._resolve_manifest(manifest, vocabulary_size, split, scan_progress)
            self._encode(reference, features, exclude, as_matrix)
        except BaseException:
            self.close()
            raise

    @property
    def client(self) -> Any:
        """The ``distributed.Client`` (None once closed)."""
        return self.owner.client

    def close(self) -> None:
        """Close the client if it was started here (a sequence made of this data does so itself)."""
        self.owner.close()

    def hand_over(self) -> Owner:
        """The client's owner, for the one sequence that serves these data.

        Returns
        -------
        Owner

        Raises
        ------
        DaskfeedError
            The data were handed over before, or closed: a second sequence would share (and
            close) the first one's client.
        """
        if self.owner.client is None or self._handed:
            raise DaskfeedError(
                "Expected prepared data not yet served or closed. Received: data already handed "
                "to a DaskSequence, or closed.\nHint: prepare the data again for another "
                "sequence (Prepared(...)), or pass manifest=seq.manifest to skip the scan.")
        self._handed = True
        return self.owner

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the client: a copy's stream connects to ``scheduler_address``."""
        state = self.__dict__.copy()
        state.pop("owner")
        state["_handed"] = True  # a copy serves no new sequence
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.owner = Owner()

    # -- the steps, in order -----------------------------------------------------------
    def _settle(self, *, label: str, weight: str | None, batch_size: int | None, shuffle: bool,
                seed: int, drop_remainder: bool, shard: tuple[int, int],
                timeout: float | str | None, prefetch_bytes: int | str | None,
                split: dict[str, Any] | None) -> None:
        """Resolve the plain settings once (config defaults included)."""
        self.batch_size = int(config.get("batch-size", batch_size))
        if self.batch_size < 1:
            raise ValueError(f"Expected batch_size >= 1. Received: batch_size={batch_size}.")
        self.label = label
        self.weight = weight
        self.validation_split = split["validation_split"] if split else 0.0
        self.subset = split["subset"] if split else None
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_remainder = bool(drop_remainder)
        self.shard = (int(shard[0]), int(shard[1]))
        self.timeout = config.get_seconds("timeout", timeout)
        self.prefetch_bytes = config.get_bytes("prefetch-bytes", prefetch_bytes)

    def _open_cache(self, cache: bool | str | os.PathLike[str] | None) -> tuple[Any, str]:
        """The block cache on the workers and its status line (``cache`` off: None)."""
        if cache is None or cache is False:
            return None, "cache: off"
        root = None if cache is True else cache
        return open_cache(self.source, root or config.get("cache-dir"),
                          compression=config.get("cache-compression"), required=root is not None,
                          client=self.client)

    def _resolve_manifest(self, manifest: Manifest | None, vocabulary_size: int | None,
                          split: dict[str, Any] | None, progress: Any) -> Manifest:
        """Return this data's manifest: ``manifest`` checked against the settings, or a new scan."""
        k = int(config.get("vocabulary-size", vocabulary_size))
        if manifest is None:
            return scan(self.source, label=self.label, client=self.client, timeout=self.timeout,
                        vocabulary_size=k, partition_cache=self.cache, progress=progress,
                        validation_split=split["validation_split"] if split else None,
                        subset=split["subset"] if split else None, seed=self.seed)
        manifest.check_settings(self.source, label=self.label, vocabulary_size=k, split=split)
        manifest.warn_notes()  # what the scan said still holds: say it again
        return manifest

    def _encode(self, reference: Manifest | None, features: list[str] | None,
                exclude: tuple[str, ...] | list[str], as_matrix: bool) -> None:
        """Pick the features, check them (and the weights) and make the encoding."""
        ref = reference if reference is not None else self.manifest
        self.reference = ref  # whose statistics encode the features
        if self.weight is not None:
            check_weight_column(self.manifest, self.weight, self.label, features)
            exclude = [*exclude, self.weight]
        self.features = ref.feature_names(features, exclude)
        if features is None and reference is None and (ids := id_like(ref.columns, self.features)):
            warn_user(id_warning(ids))
        if reference is not None:
            check_compatible(self.manifest, reference, [*self.features, self.label])
            check_disjoint(self.manifest, reference, self.validation_split, self.subset, self.seed)
            check_classes(self.manifest, reference, self.source, self.client, self.label,
                          self.cache)
        self.as_matrix = bool(as_matrix)
        self.encoding = Encoding.from_manifest(ref, self.features, as_matrix, weight=self.weight)
        if self.weight is not None:
            check_weights(self.manifest, self.source, self.client, self.label, self.weight,
                          self.cache)


def _with_blocksize(manifest: Manifest | str | os.PathLike[str] | None,
                    blocksize: int | str | None) -> tuple[Manifest | None, int | str | None]:
    """The manifest (read from its JSON path) and the blocksize: the manifest's unless given."""
    if manifest is not None and not isinstance(manifest, Manifest):
        manifest = Manifest.from_json(manifest)
    if manifest is not None and blocksize is None:  # its blocks: the same byte ranges
        blocksize = manifest.read_options.get("blocksize")
    return manifest, blocksize
