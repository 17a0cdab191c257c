"""Inference: a trained run applied to data of any size, and its serving export."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.inference._export import export
    from daskfeed.inference._predict import predict

__all__ = ["export", "predict"]

__getattr__, __dir__ = attach(__name__, {
    "predict": "_predict",
    "export": "_export",
})
