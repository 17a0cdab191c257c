"""The ``daskfeed`` command (also ``dask feed``): thin click commands over the library."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.cli._commands import cli, main
    from daskfeed.cli._demo import write_demo_data

__all__ = ["cli", "main", "write_demo_data"]

__getattr__, __dir__ = attach(__name__, {
    "cli": "_commands", "main": "_commands",
    "write_demo_data": "_demo",
})
