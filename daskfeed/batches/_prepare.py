"""Prepare: the data a sequence will serve, everything before Keras.

Its settings come resolved (:class:`~daskfeed.batches._settings.DataSettings`); the files as a
:class:`~daskfeed.reading._source.Source`, the cluster's client, the parse cache, the manifest (scanned,
or given and checked), the features and their encoding, and the checks of a validation set
against its training set. None of it imports keras, so ``daskfeed train`` prepares its data
while keras loads; :class:`~daskfeed.adapters._sequence.DaskSequence` serves the batches of a
:class:`Prepared`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from daskfeed.batches._checks import (
    check_classes,
    check_compatible,
    check_disjoint,
    check_weight_column,
    check_weights,
)
from daskfeed.batches._settings import DataSettings
from daskfeed.cluster import Owner, acquire_client
from daskfeed.core import DaskfeedError, warn_user
from daskfeed.manifest import Encoding, Manifest, id_like, id_warning
from daskfeed.reading import Source
from daskfeed.scanning import scan_source

if TYPE_CHECKING:
    import dask.dataframe as dd

    from daskfeed.reading import Listing, PathsLike
    from daskfeed.scanning import ProgressCallback


class Prepared:
    """One data set made ready to serve: files, client, parse cache, manifest, encoding.

    The client it starts (when given none) is held by ``owner``, which the
    :class:`~daskfeed.batches.BatchStream` serving it takes over; :meth:`close` gives it
    back when no stream is made.

    Parameters
    ----------
    data
        A path, glob, list of paths, fsspec URL, or ``dask.dataframe.DataFrame``.
    settings
        How the data are read, scanned and batched, resolved where they entered
        (:class:`~daskfeed.DataSettings`); nothing is looked up here.
    client
        A ``distributed.Client`` or scheduler address; default: the current client, else a
        LocalCluster owned by the stream.
    owns_client
        The ``client`` given is these data's own (e.g. a LocalCluster started for their memory
        budget): closed with them, or by the stream serving them, as one started here is.
    manifest
        A :class:`~daskfeed.manifest.Manifest` (or its JSON path) of these data made with the
        same settings: no scan.
    reference
        The manifest whose statistics encode the features (e.g. the training set's).
    scan_progress
        Called as the scan goes (see :func:`~daskfeed.scanning.scan`).

    Raises
    ------
    DaskfeedError
        Bad data or settings, with what was expected, what was received and a hint.
    """

    def __init__(self, data: PathsLike | Listing | dd.DataFrame, settings: DataSettings, *,
                 client: Any = None,
                 manifest: Manifest | str | os.PathLike[str] | None = None,
                 reference: Manifest | None = None,
                 scan_progress: ProgressCallback | None = None,
                 owns_client: bool = False) -> None:
        self._handed = False  # to a stream (which then owns the client)
        self.owner = Owner()
        if owns_client:  # closed with the data from here on, also when what follows fails
            self.owner.client, self.owner.owns = client, True
        try:
            manifest = Manifest.from_json(manifest) if isinstance(manifest, (str, os.PathLike)) \
                else manifest
            if manifest is not None and not settings.blocksize_given:  # its blocks, byte for byte
                blocksize = manifest.read_options.get("blocksize") or settings.read.blocksize
                read = replace(settings.read, blocksize=int(blocksize))
                settings = replace(settings, read=read)
            self.settings = settings
            self.source = Source(data, options=settings.read)
            self.owner.client, owns = acquire_client(
                client, dict(self.source.options.storage_options))  # (credentials: over TLS only)
            self.owner.owns = owns or owns_client
        except BaseException:
            self.close()
            raise
        self.scheduler_address = self.client.scheduler.address  # what a pickled copy reconnects to
        self.security = getattr(self.client, "security", None)  # tls:// reconnects after pickling
        try:
            self.cache, self.cache_status = settings.cache.open(self.source, self.client)
            if self.cache is not None:  # its parts are in use until the data are closed
                self.owner.releases.append(self.cache.release)
            self.manifest = self._resolve_manifest(manifest, scan_progress)
            self._encode(reference)
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
    def _resolve_manifest(self, manifest: Manifest | None,
                          progress: ProgressCallback | None) -> Manifest:
        """Return this data's manifest: ``manifest`` checked against the settings, or a new scan."""
        st = self.settings
        if manifest is None:
            return scan_source(self.source, label=st.label, client=self.client,
                               timeout=st.timeout, vocabulary_size=st.vocabulary_size,
                               parse_cache=self.cache, progress=progress, split=st.split)
        manifest.check_settings(self.source, label=st.label, vocabulary_size=st.vocabulary_size,
                                split=st.split)
        self.source.use_splits(manifest.splits)  # its files' blocks where the scan read them
        manifest.warn_notes()  # what the scan said still holds: say it again
        return manifest

    def _encode(self, reference: Manifest | None) -> None:
        """Pick the features, check them (and the weights) and make the encoding."""
        st = self.settings
        ref = reference if reference is not None else self.manifest
        self.reference = ref  # whose statistics encode the features
        features = list(st.features) if st.features is not None else None
        exclude = list(st.exclude)
        if st.weight is not None:
            check_weight_column(self.manifest, st.weight, st.label, features)
            exclude = [*exclude, st.weight]
        self.features = ref.feature_names(features, exclude)
        if features is None and reference is None and (ids := id_like(ref.columns, self.features)):
            warn_user(id_warning(ids))
        if reference is not None:
            check_compatible(self.manifest, reference, [*self.features, st.label])
            check_disjoint(self.manifest, reference, st.validation_split, st.subset, st.seed)
            check_classes(self.manifest, reference, self.source, self.client, st.label,
                          self.cache)
        self.encoding = Encoding.from_manifest(ref, self.features, st.as_matrix, weight=st.weight)
        if st.weight is not None:
            check_weights(self.manifest, self.source, self.client, st.label, st.weight,
                          self.cache)
