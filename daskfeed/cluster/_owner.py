"""Owner: what a DaskSequence gives back and which process may use it.

The client (closed only if the sequence started it, at interpreter exit too) and the process
that created it: a forked child inherits the parent's connection, which is not its to use or close.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from daskfeed.cluster._start import close_client
from daskfeed.core import SettingError, run_at_exit

if TYPE_CHECKING:
    from distributed import Client


class Owner:
    """What a :class:`DaskSequence` must give back, held apart from it for its finalizer.

    The client (closed only if the sequence started it) and the process that may close it:
    a forked child inherits the parent's connection, which is not its to close.
    """

    def __init__(self) -> None:
        self.client: Client | None = None
        self.owns = False
        self.pid = os.getpid()
        self.releases: list[Callable[[Client | None], None]] = []  # given the client, before it closes
        OWNERS.add(self)

    def close(self) -> None:
        """Drop the client, closing it if owned; idempotent, a no-op in another process."""
        if self.pid != os.getpid():
            return
        client, owns = self.client, self.owns
        self.client, self.owns = None, False
        releases, self.releases = self.releases, []
        for release in releases:  # e.g. the parse cache's leases (nothing to say if it fails)
            with contextlib.suppress(Exception):
                release(client)
        if owns and client is not None:
            close_client(client)

    def check_process(self) -> None:
        """Refuse a fork's copy (Keras' worker processes): its connection did not survive.

        Raises
        ------
        SettingError
            Called in another process than the one that created the sequence.
        """
        if self.pid != os.getpid():
            raise SettingError(
                f"This DaskSequence was created in process {self.pid} and a batch was "
                f"asked for in process {os.getpid()}, a fork of it (Keras' "
                "use_multiprocessing=True?). Expected batches in the process that created it. "
                "Received: a forked copy, whose cluster connection and prefetch threads did not "
                "survive the fork.\nHint: leave use_multiprocessing=False (use workers=N "
                "threads); to use the data in another process, pickle the sequence (the copy "
                "connects to the same scheduler)."
            )


OWNERS: weakref.WeakSet[Owner] = weakref.WeakSet()


def _close_owned_clients() -> None:
    """At interpreter exit: close the clients (and local clusters) sequences started."""
    for owner in list(OWNERS):
        owner.close()


run_at_exit(_close_owned_clients)


def refuse_multiprocessing(kwargs: dict[str, Any]) -> None:
    """Refuse Keras' worker processes before any scan or cluster work."""
    if kwargs.get("use_multiprocessing"):
        raise SettingError(
            "DaskSequence does not run in Keras' worker processes. Expected "
            "use_multiprocessing=False (the default). Received: use_multiprocessing=True.\n"
            "Hint: the Dask workers already compute the batches and the trainer only slices "
            "arrays, so a process pool adds nothing: leave the default (the batches' windows "
            "are read ahead on the cluster)."
        )
