"""Inference: a trained run applied to data of any size, and its serving export."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.inference._export import export
    from daskfeed.inference._predict import predict
    from daskfeed.inference._runs import (
        RUNNING_MANIFEST,
        check_record,
        publish_manifest,
        write_record,
    )

__all__ = ["RUNNING_MANIFEST", "check_record", "export", "predict", "publish_manifest",
           "write_record"]

__getattr__, __dir__ = attach(__name__, {
    "predict": "_predict",
    "export": "_export",
    "RUNNING_MANIFEST": "_runs", "check_record": "_runs", "publish_manifest": "_runs",
    "write_record": "_runs",
})
