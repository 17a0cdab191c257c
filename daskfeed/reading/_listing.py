"""Listing: the files of some paths and globs, listed in a thread while the cluster starts.

Listing 20,000 local files takes the trainer about 0.4 s (a stat per file), a bucket's objects
requests over the network, and starting a local cluster about a second: begun before the
cluster, the listing is done by the time the :class:`~daskfeed.reading._source.Source` needs it.
(On 2 cores and local files this gains nothing measurable: the trainer is busy itself while its
cluster starts. It pays where the listing waits on the network, or cores are free.) The same
listing serves every ``Source`` of those files in a run. A :class:`Listing` is handed to
``Source`` in place of the paths; what it lists is what
:func:`~daskfeed.reading._files.expand_paths` lists, a second earlier, and what the listing has
to say (files left out) is warned where the files are asked for, once, pointing at the caller's
line as it would without the thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from daskfeed.core import warn_user
from daskfeed.reading._files import FileInfo, a_local_file, expand_paths

PathsLike = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


class Listing:
    """The files of ``data``, listed in a thread of their own from now on.

    Parameters
    ----------
    data
        A path, a glob (``**`` too), a directory, an fsspec URL or a list of those, as
        :class:`~daskfeed.Source` takes them.
    storage_options
        Passed to fsspec; the ``Source`` it is handed to must read with the same ones.

    Examples
    --------
    >>> listing = Listing("logs/**/*.csv")  # doctest: +SKIP
    >>> client = Client(LocalCluster())  # doctest: +SKIP
    >>> source = Source(listing)  # the files, listed meanwhile  # doctest: +SKIP
    """

    def __init__(self, data: PathsLike, storage_options: dict[str, Any] | None = None) -> None:
        self.data = data
        self.storage_options = dict(storage_options or {})
        self._done = threading.Event()
        self._files: list[FileInfo] = []
        self._said: list[str] = []  # warned by files(), in the caller's thread
        self._error: BaseException | None = None
        threading.Thread(target=self._list, daemon=True, name="daskfeed-listing").start()

    def _list(self) -> None:
        try:
            self._files = expand_paths(self.data, self.storage_options, self._said)
        except BaseException as err:  # raised where the files are asked for
            self._error = err
        finally:
            self._done.set()

    def files(self, storage_options: dict[str, Any]) -> list[FileInfo]:
        """The files listed (waits for the listing to end).

        Parameters
        ----------
        storage_options
            Those the caller reads with: the listing's own, or it lists again with them.

        Returns
        -------
        list of FileInfo
            As :func:`~daskfeed.reading.expand_paths` returns them.

        Raises
        ------
        DataNotFoundError
            As ``expand_paths`` raises it (a pattern matching nothing, storage refusing).
        """
        if dict(storage_options) != self.storage_options:  # listed for other credentials
            return expand_paths(self.data, storage_options)
        self._done.wait()
        for note in self._said:
            warn_user(note)
        self._said = []  # said once
        if self._error is not None:
            raise self._error
        return self._files

    def listed(self) -> list[FileInfo]:
        """The files listed (waits for the listing to end), saying nothing.

        For a look ahead in another thread (the first file's header); what the listing has to
        say, or the error it met, is said by :meth:`files`.

        Returns
        -------
        list of FileInfo
            As :meth:`files` returns them; [] when the listing failed.
        """
        self._done.wait()
        return [] if self._error is not None else self._files

    def glimpse(self) -> list[FileInfo]:
        """One file to look at now: of local data, the first a glob's walk meets; else :meth:`listed`.

        For a look at a header in another thread while the listing goes on (20,000 files take
        it seconds on a busy trainer); not the listing's first file, nor necessarily one it
        keeps (its size and time are left 0).

        Returns
        -------
        list of FileInfo
            One file, or what :meth:`listed` returns.
        """
        if not self._done.is_set():
            found = a_local_file(self.data)
            if found is not None:
                return [FileInfo(found, 0, 0.0)]
        return self.listed()
