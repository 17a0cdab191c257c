"""Run: what the steps of one training run share (``_train`` and ``_fit``).

Its settings, output place, checkpoint, cluster and budget, the dashboard's spans, and what to
close at the end.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from daskfeed.cluster import close_client
from daskfeed.dashboard import EpochSpans

if TYPE_CHECKING:
    from distributed import Client

    from daskfeed.batches import Closes
    from daskfeed.checkpoint import Checkpoint, CheckpointStore
    from daskfeed.cluster import Budget
    from daskfeed.core import Stop
    from daskfeed.reading import Listing
    from daskfeed.scanning import ProgressCallback
    from daskfeed.training._options import DataSpec, TrainOptions
    from daskfeed.training._ranks import Rank
    from daskfeed.training._spikes import StepLosses

Echo = Callable[[str], None]


@dataclass
class Run:
    """What the steps of one run share: its settings, place, cluster and what to close."""

    data: DataSpec
    label: str
    validation: DataSpec | None
    opts: TrainOptions
    echo: Echo
    stop: Stop | None
    ranks: Rank
    out: str
    store: CheckpointStore
    ckpt: Checkpoint | None
    client: Client
    budget: Budget
    link: str | None
    spans: EpochSpans = field(default_factory=EpochSpans)  # one per run: both sequences' epochs
    closing: list[Closes] = field(default_factory=list)  # sequences, the shared scan's lock
    listing: Listing | None = None  # the training files, listed while the cluster started
    val_listing: Listing | None = None  # ... and the validation files
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])  # run.json, history.json
    progress: ProgressCallback | None = None  # one progress bar for the run's scans
    certificate: dict[str, int] | None = None  # a resume's count of its epoch's rows (history.json)
    spikes: StepLosses | None = None  # every step's loss and the steps flagged (steps.bin, spikes.json)
    closer: threading.Thread | None = None  # closing the cluster while the outputs are written

    def trained(self, *sequences: Closes | None) -> None:
        """Training is over: the sequences closed, the cluster closing in a thread meanwhile.

        The outputs (``model.keras``, ``serving/``, the chart) are written in this process and
        need no cluster: a LocalCluster the run started closes beside them (its workers exit,
        its scheduler stops) instead of after them. A cluster given by address stays up.
        """
        for seq in sequences:
            if seq is not None:
                seq.close()
        if self.opts.cluster.scheduler is None and self.closer is None:
            self.closer = threading.Thread(target=close_client, args=(self.client,), daemon=True,
                                           name="daskfeed-close-cluster")
            self.closer.start()

    def close(self) -> None:
        """What the run holds closed: its sequences and marks, then its cluster (once closed)."""
        for held in self.closing:
            held.close()
        if self.closer is not None:
            self.closer.join()
        close_client(self.client)
