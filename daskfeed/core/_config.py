"""daskfeed's dask.config defaults and the helpers that read them.

Precedence, the same for the CLI and for Python: a flag or keyword argument > ``dask.config``
(``daskfeed.*`` keys: a YAML file in ``~/.config/dask/``, ``DASK_DASKFEED__*`` environment
variables, ``dask.config.set``) > the YAML shipped beside this module. The CLI's flags default
to ``None`` and are resolved here, so ``DASK_DASKFEED__BATCH_SIZE=512 daskfeed train …`` trains
with batches of 512.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import dask.config
import yaml

from daskfeed.core._exceptions import one_line_warnings, refuse_setting

_fn = os.path.join(os.path.dirname(__file__), "daskfeed.yaml")
with open(_fn, encoding="utf-8") as _f:
    _defaults = yaml.safe_load(_f)
dask.config.update_defaults(_defaults)


def _read(key: str) -> Any:
    """The ``daskfeed.<key>`` config value; the shipped default when dask.config holds none.

    The defaults are registered when this module is first imported (lazily: ``import daskfeed``
    loads no dask). A ``with dask.config.set({"daskfeed.cache-dir": ...})`` entered before that
    makes a ``daskfeed`` section of its key alone, and leaving it removes the whole section, the
    defaults registered meanwhile with it; a nested ``dask.config.set({"daskfeed": {...}})``
    replaces the section. Any key such a section lacks reads as shipped, whenever it is read.
    """
    return dask.config.get(f"daskfeed.{key}", default=shipped(key))


def get(key: str, value: Any = None) -> Any:
    """Return ``value`` if given, else the ``daskfeed.<key>`` config value.

    Parameters
    ----------
    key
        The key under ``daskfeed.`` (``"batch-size"``).
    value
        The value a flag or keyword argument gave (None: not given).

    Returns
    -------
    object
        ``value``, or the configured value (any YAML value).
    """
    if value is not None:
        return value
    return _read(key)


def get_renamed(key: str, old: str, value: Any = None) -> Any:
    """:func:`get` of a key renamed from ``old``: a value still set under the old key is used.

    Parameters
    ----------
    key, old
        The key under ``daskfeed.`` and its old name.
    value
        The value a flag or keyword argument gave (None: not given).

    Returns
    -------
    object
        ``value``, else ``daskfeed.<old>`` when set (with a warning naming the new key), else
        ``daskfeed.<key>``.
    """
    if value is not None:
        return value
    was = dask.config.get(f"daskfeed.{old}", None)
    if was is not None:
        warnings.warn(f"daskfeed.{old} is the old name of daskfeed.{key}; it is read, but will "
                      f"go.\nHint: set daskfeed.{key} (DASK_DASKFEED__{key.upper().replace('-', '_')}).",
                      FutureWarning, stacklevel=3)
        return was
    return _read(key)


def get_bytes(key: str, value: int | str | None = None) -> int:
    """Like :func:`get` for sizes: accepts ``"64MiB"`` style strings.

    Parameters
    ----------
    key
        The key under ``daskfeed.``.
    value
        The size given (None: the configured one).

    Returns
    -------
    int
        The size in bytes.
    """
    from dask.utils import parse_bytes

    v = get(key, value)
    return int(parse_bytes(v)) if isinstance(v, str) else int(v)


def get_seconds(key: str, value: float | str | None = None) -> float:
    """Like :func:`get` for durations: accepts ``"300s"`` style strings.

    Parameters
    ----------
    key
        The key under ``daskfeed.``.
    value
        The duration given (None: the configured one).

    Returns
    -------
    float
        The duration in seconds.
    """
    from dask.utils import parse_timedelta

    return float(parse_timedelta(get(key, value)))


_YES, _NO = frozenset({"true", "yes", "on", "1"}), frozenset({"false", "no", "off", "0"})


def get_flag(key: str, value: bool | None = None) -> bool:
    """Like :func:`get` for yes/no settings: a boolean, or its text from an environment variable.

    ``DASK_DASKFEED__LOCAL_TLS=false`` reaches ``dask.config`` as the text ``"false"`` (only
    ``False`` is parsed), so ``true``/``false``, ``yes``/``no``, ``on``/``off`` and ``1``/``0``
    are taken in any case.

    Parameters
    ----------
    key
        The key under ``daskfeed.``.
    value
        The value given (None: the configured one).

    Returns
    -------
    bool

    Raises
    ------
    SettingError
        Anything else (a ``ValueError``).
    """
    v = get(key, value)
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in _YES or text in _NO:
        return text in _YES
    refuse_setting(f"Expected daskfeed.{key} to be true or false.", repr(v),
                   f"set it to true or false (DASK_DASKFEED__{key.upper().replace('-', '_')}=false).")


def shipped(key: str) -> Any:
    """The default of ``daskfeed.<key>`` in the YAML shipped with daskfeed.

    Parameters
    ----------
    key
        The key under ``daskfeed.``.

    Returns
    -------
    object
        The shipped value (any YAML value).
    """
    return _defaults["daskfeed"][key]


def configured(key: str) -> bool:
    """Whether ``daskfeed.<key>`` was set to something other than the shipped default.

    ``dask.config`` does not record where a value came from, so a value equal to the shipped
    default (for sizes: the same number of bytes, ``64MiB`` = ``67108864``) counts as not set.

    Parameters
    ----------
    key
        The key under ``daskfeed.``.

    Returns
    -------
    bool
        True when the configured value differs from the shipped one.
    """
    value, default = _read(key), shipped(key)
    if isinstance(default, str) and key in _SIZES:
        from dask.utils import parse_bytes

        try:
            return int(parse_bytes(value)) != int(parse_bytes(default))
        except (TypeError, ValueError):
            return True
    return bool(value != default)


_SIZES = frozenset({"blocksize", "window-bytes", "prefetch-bytes", "trainer-reserve"})


def resolve_blocksize(value: int | str | None, derived: int) -> int:
    """CSV bytes per block: ``value`` > a configured ``daskfeed.blocksize`` > ``derived``.

    ``derived`` is what the memory budget allows (:class:`daskfeed.Budget`): at most
    the shipped ``daskfeed.blocksize`` and small enough that a window's parse peak fits a
    worker. A ``daskfeed.blocksize`` set in the config (``DASK_DASKFEED__BLOCKSIZE=200MiB``)
    is taken as asked, like ``--blocksize``; the shipped default only caps the derivation.

    Parameters
    ----------
    value
        The block size given (``--blocksize``; None: not given).
    derived
        The block size the memory budget allows.

    Returns
    -------
    int
        The block size in bytes.
    """
    if value is not None or configured("blocksize"):
        return blocksize(value)
    return int(derived)


# The settings more than one entry reads (scan, predict, DataSettings, ClusterSpec, CacheChoice,
# the CLI): one function each, so that each key is read, parsed and defaulted in one place
# (tests/core/test_config.py fails when a key is looked up in two).

def timeout(value: float | str | None = None) -> float:
    """``daskfeed.timeout``: the longest wait for a window, a scoring task or a scan's progress."""
    return get_seconds("timeout", value)


def vocabulary_size(value: int | None = None) -> int:
    """``daskfeed.vocabulary-size``: the most values a text column's vocabulary keeps."""
    return int(get("vocabulary-size", value))


def blocksize(value: int | str | None = None) -> int:
    """``daskfeed.blocksize`` in bytes: a block size asked for, else the configured cap."""
    return get_bytes("blocksize", value)


def window_bytes(value: int | str | None = None) -> int:
    """``daskfeed.window-bytes`` in bytes: the cap on one window's CSV bytes."""
    return get_bytes("window-bytes", value)


def trainer_reserve(value: int | str | None = None) -> int:
    """``daskfeed.trainer-reserve`` in bytes: the budget's share for the trainer process."""
    return get_bytes("trainer-reserve", value)


def cache_dir(value: str | os.PathLike[str] | None = None) -> str | None:
    """``daskfeed.cache-dir``: the parse cache's root (None: ``$XDG_CACHE_HOME/daskfeed``)."""
    v = get("cache-dir", value)
    return os.fspath(v) if v else None


def cache_lock_timeout(value: float | str | None = None) -> float:
    """``daskfeed.cache-lock-timeout``: how long to wait for a cache entry's lock (seconds)."""
    return get_seconds("cache-lock-timeout", value)


def dashboard_address(value: str | None = None) -> str | None:
    """``daskfeed.dashboard-address``: where a local cluster's dashboard listens ("": none)."""
    v = get("dashboard-address", value)
    return None if v is None else str(v) if v else ""  # (false, 0, "": no dashboard)


def buckets_in_memory() -> bool:
    """``daskfeed.buckets-in-memory``: whether the trainer may hold a small data set's buckets.

    Raises
    ------
    SettingError
        A value that is no yes or no.
    """
    value = get("buckets-in-memory")
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false", "yes", "no", "1", "0"):
        refuse_setting("Expected daskfeed.buckets-in-memory to be true or false.", repr(value),
                       "DASK_DASKFEED__BUCKETS_IN_MEMORY=false has every global order dealt to "
                       "bucket files beside the parse cache.")
    return text in ("true", "yes", "1")


def window_reads(value: str | None = None) -> str:
    """``daskfeed.window-reads``: who reads a window of the global order, ``auto`` or ``workers``.

    Raises
    ------
    SettingError
        Another value.
    """
    choice = str(get("window-reads", value)).strip().lower()
    if choice not in ("auto", "workers"):
        refuse_setting("Expected daskfeed.window-reads to be auto or workers (who reads a window "
                       "of the global order).", repr(choice),
                       "DASK_DASKFEED__WINDOW_READS=workers (or dask.config.set) has the cluster's "
                       "workers read every window; auto lets the trainer read them itself when "
                       "its cluster is this machine.")
    return choice


def local_tls(value: bool | None = None) -> bool:
    """``daskfeed.local-tls``: whether a local cluster speaks TLS with credentials of its own."""
    return get_flag("local-tls", value)


if get("warnings") == "line":  # a worker process started by the CLI
    one_line_warnings()
