"""daskfeed's dask.config defaults and the helpers that read them.

Precedence is keyword argument > ``dask.config`` (``daskfeed.*`` keys, YAML, ``DASK_DASKFEED__*``
environment variables) > the YAML shipped beside this module.
"""

from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml

_fn = os.path.join(os.path.dirname(__file__), "daskfeed.yaml")
with open(_fn, encoding="utf-8") as _f:
    _defaults = yaml.safe_load(_f)
dask.config.update_defaults(_defaults)


def get(key: str, value: Any = None) -> Any:
    """Return ``value`` if given, else the ``daskfeed.<key>`` config value."""
    if value is not None:
        return value
    return dask.config.get(f"daskfeed.{key}")


def get_bytes(key: str, value: int | str | None = None) -> int:
    """Like :func:`get` for sizes: accepts ``"64MiB"`` style strings."""
    from dask.utils import parse_bytes

    v = get(key, value)
    return int(parse_bytes(v)) if isinstance(v, str) else int(v)


def get_seconds(key: str, value: float | str | None = None) -> float:
    """Like :func:`get` for durations: accepts ``"300s"`` style strings."""
    from dask.utils import parse_timedelta

    return float(parse_timedelta(get(key, value)))
