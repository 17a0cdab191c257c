"""How one CLI flag's value is read: sizes, durations, config defaults, columns, storage options.

Credentials given on the command line (in ``--storage-options`` or a data URL) are noted where
the flag is read and warned of once, when the command runs (:func:`warn_secrets`).

Click parameter types and callbacks; :mod:`daskfeed.cli._flags` groups the flags commands share.
Nothing heavy at import.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from daskfeed.core import DaskfeedError, redact_url, secret_options


class ByteSize(click.ParamType):
    """A size such as ``64MiB`` or ``200MB`` (``dask.utils.parse_bytes``), positive; as bytes.

    ``parse_bytes`` reads ``""`` as 1 byte and takes negative sizes: both are refused here.
    """

    name = "size"

    def convert(self, value: str | int, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Bytes as an int.

        Parameters
        ----------
        value
            The flag's text (or a size already in bytes).
        param, ctx
            The flag and the command's context (for the error message).

        Returns
        -------
        int
            The size in bytes.

        Raises
        ------
        click.BadParameter
            When ``value`` is not one (exit 2 with click's usage line).
        """
        if isinstance(value, int):
            n = value
        else:
            from dask.utils import parse_bytes

            text = str(value).strip()
            try:
                n = int(parse_bytes(text)) if text else 0
            except (ValueError, TypeError):
                self.fail(f"expected a size such as 64MiB or 200MB. Received: {value!r}", param, ctx)
        if n <= 0:
            self.fail(f"expected a positive size such as 64MiB. Received: {value!r}", param, ctx)
        return n


class MemorySize(click.ParamType):
    """A size such as ``14GB`` or ``14GiB`` (``dask.utils.parse_bytes``), positive."""

    name = "size"

    def convert(self, value: str | int, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """Validate with ``parse_memory_limit``; keep the user's spelling for the echo.

        Parameters
        ----------
        value
            The flag's text.
        param, ctx
            The flag and the command's context (for the error message).

        Returns
        -------
        str
            ``value`` as the user spelled it.

        Raises
        ------
        click.BadParameter
            When ``value`` is not one (exit 2 with click's usage line).
        """
        from daskfeed.cluster import parse_memory_limit

        try:
            parse_memory_limit(value)
        except DaskfeedError as err:
            self.fail(str(err), param, ctx)
        return str(value)


class Duration(click.ParamType):
    """A duration such as ``300``, ``300s`` or ``5min`` (``dask.utils.parse_timedelta``), positive."""

    name = "duration"

    def convert(self, value: str | float, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """Seconds as a float.

        Parameters
        ----------
        value
            The flag's text (or a number of seconds).
        param, ctx
            The flag and the command's context (for the error message).

        Returns
        -------
        float
            The duration in seconds.

        Raises
        ------
        click.BadParameter
            When ``value`` is not one (exit 2 with click's usage line).
        """
        try:
            from dask.utils import parse_timedelta

            seconds = float(parse_timedelta(value, default="seconds"))
        except (ValueError, TypeError, KeyError):
            self.fail(f"expected a duration such as 300, 300s or 5min. Received: {value!r}", param, ctx)
        if seconds <= 0:
            self.fail(f"expected a positive duration. Received: {value!r}", param, ctx)
        return seconds


def column_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    """``--features``, ``--exclude``, ``--na-values``: ``A,B`` → ``["A", "B"]``.

    A leading ``,`` (or an empty value) names the unnamed column, ``""``.
    """
    if value is None:
        return None
    cols = [c.strip() for c in value.split(",") if c.strip()]
    if not value.strip() or value.strip().startswith(","):  # '' or ",id": the unnamed column
        cols.insert(0, "")
    return cols


def step_range(ctx: click.Context, param: click.Parameter, value: str) -> range:
    """``--step 48211`` → ``range(48211, 48212)``; ``--step 48200-48260`` → steps 48200 to 48260."""
    first, dash, last = value.strip().partition("-")
    try:
        lo = int(first)
        hi = int(last) if dash else lo
    except ValueError:
        lo = hi = 0
    if lo < 1 or hi < lo:
        raise click.BadParameter(
            f"Expected a step from 1, or steps A-B with 1 <= A <= B. Received: {value!r}.\nHint: "
            "--step 48211, or --step 48200-48260.", ctx, param)
    return range(lo, hi + 1)


def layer_sizes(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    """``--hidden 128,64`` → ``(128, 64)``; sizes >= 1."""
    if value is None:
        return None
    try:
        sizes = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"expected comma-separated layer sizes >= 1 such as 128,64. "
                                 f"Received: {value!r}")
    return sizes


class ConfigOption(click.Option):
    """A flag whose default is the ``daskfeed.<key>`` config value, resolved by the library.

    The flag's own default is ``None`` (so ``DASK_DASKFEED__BATCH_SIZE=512`` or a dask YAML
    file is not masked by a click default); ``--help`` shows the value in effect and its key,
    e.g. ``[default: 1024 (daskfeed.batch-size)]``.
    """

    def __init__(self, *args: Any, config_key: str, **kwargs: Any) -> None:
        kwargs["default"] = None
        super().__init__(*args, **kwargs)
        self.config_key = config_key

    def get_help_extra(self, ctx: click.Context) -> click.types.OptionHelpExtra:
        """Click's help extras with the configured default.

        Parameters
        ----------
        ctx
            The command's context.

        Returns
        -------
        click.types.OptionHelpExtra
            Click's extras, ``default`` showing the value in effect and its config key.
        """
        from daskfeed.core import config  # (dask.config: loaded for --help, not for every command)

        extra = super().get_help_extra(ctx)
        value = config.get(self.config_key)
        shown = '""' if value == "" else "none" if value is None else str(value)
        if self.config_key == "blocksize" and not config.configured("blocksize"):
            shown = f"from the budget, at most {shown}"  # see config.resolve_blocksize
        extra["default"] = f"{shown} (daskfeed.{self.config_key})"
        return extra


def separator(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--sep``: one character; a backslash and t, ``tab`` or ``TAB`` mean a tab (None: by suffix)."""
    if value is None:
        return None
    text = {"\\t": "\t", "tab": "\t", "TAB": "\t"}.get(value, value)
    if len(text) != 1:
        raise click.BadParameter(f"expected one character such as ',' ';' or '\\t' (tab). "
                                 f"Received: {value!r}")
    return text


def dtype_pairs(ctx: click.Context, param: click.Parameter, value: str | None) -> dict[str, str] | None:
    """``--dtype zip=string,code=string`` → ``{"zip": "string", "code": "string"}``."""
    if not value:
        return None
    pairs = [p.strip() for p in value.split(",") if p.strip()]
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise click.BadParameter(f"expected COLUMN=TYPE pairs such as zip=string. Received: {bad[0]!r}")
    return {k.strip(): v.strip() for k, v in (p.split("=", 1) for p in pairs)}


def parse_storage_options(ctx: click.Context | None, param: click.Parameter | None,
                          value: tuple[str, ...]) -> dict[str, Any] | None:
    """``--storage-options`` JSON, KEY=VALUE pairs or ``@FILE.json`` (repeatable) → one dict for fsspec.

    ``KEY=VALUE`` values are JSON when they parse (``anon=true``, ``max_concurrency=4``), else
    text; a dotted key nests (``client_kwargs.region_name=eu-west-1``). ``@FILE.json`` reads a
    JSON object from a file (credentials there are not on the command line, where any user of
    the machine can read them). Values are never echoed: they may hold credentials; the names of
    credentials given on the command line itself are noted (:func:`note_secrets`) for the
    command's warning.

    Parameters
    ----------
    ctx, param
        Click's context and flag (unused: a click callback).
    value
        The flag's values, one per ``--storage-options``.

    Returns
    -------
    dict or None
        The merged options (fsspec's keyword arguments); None when none were given.

    Raises
    ------
    click.BadParameter
        An item that is neither a JSON object, KEY=VALUE pairs nor ``@`` and a readable file
        holding a JSON object.
    """
    merged: dict[str, Any] = {}
    named: list[str] = []  # credentials given on the command line
    for item in value:
        text = item.strip()
        if text.startswith("@"):
            merged.update(_options_file(text[1:]))
            continue
        if text.startswith("{"):
            parsed = _json_object(text, "")
            named += secret_options(parsed)
            merged.update(parsed)
            continue
        for pair in text.split():
            key, eq, raw = pair.partition("=")
            if not eq or not key:
                raise click.BadParameter(f"expected KEY=VALUE pairs such as endpoint_url=http://"
                                         f"127.0.0.1:9000, a JSON object or @FILE.json. Received an "
                                         f"item without '=' (key {key[:40]!r}).")
            try:
                val: Any = json.loads(raw)
            except ValueError:
                val = raw
            *parents, last = key.split(".")
            node = merged
            for name in parents:
                node = node.setdefault(name, {})
            node[last] = val
            named += [".".join([*parents, n]) for n in secret_options({last: val})]
    if named:
        note_secrets(ctx, f"--storage-options {', '.join(dict.fromkeys(named))}")
    return merged or None


def _json_object(text: str, where: str) -> dict[str, Any]:
    """The JSON object ``text`` (from the file ``where``, or the command line: ``""``)."""
    source = f" in {where}" if where else ""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as err:  # (the text itself is never shown: it may hold secrets)
        raise click.BadParameter(f"expected a JSON object such as '{{\"anon\": true}}'{source}. "
                                 f"Received text that is not JSON ({err.msg} at line {err.lineno} "
                                 f"column {err.colno}).") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter(f"expected a JSON object {{...}}{source}. Received: a JSON "
                                 f"{type(parsed).__name__}.")
    return parsed


def _options_file(path: str) -> dict[str, Any]:
    """The storage options in the JSON file ``path`` (``--storage-options @path``)."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise click.BadParameter(f"expected @FILE.json, a JSON file of storage options. Received: "
                                 f"@{path}, which cannot be read ({err.strerror or err}).") from None
    return _json_object(text, repr(path))


_SECRETS = "daskfeed.secrets"  # (a key of click's context meta: where credentials came)
_warned = False  # warned once per process


def note_secrets(ctx: click.Context | None, where: str) -> None:
    """Note that credentials came on the command line (``where``: which flag, which URL).

    Parameters
    ----------
    ctx
        The command's context (None: outside click; nothing is noted).
    where
        E.g. ``"--storage-options key, secret"``.
    """
    if ctx is not None:
        ctx.meta.setdefault(_SECRETS, []).append(where)


def data_urls(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """A callback for DATA and ``--validation``: notes URLs holding credentials; the values as given."""
    for url in value:
        clean = redact_url(url)
        if clean != url:
            note_secrets(ctx, f"in the URL {clean!r}")
    return value


def warn_secrets(ctx: click.Context | None) -> None:
    """Warn, once per process, when credentials came on the command line.

    The warning names where they came (never them), the risk and where to give them instead.

    Parameters
    ----------
    ctx
        The command's context, where :func:`note_secrets` noted them.
    """
    global _warned
    where = ctx.meta.get(_SECRETS) if ctx is not None else None
    if not where or _warned:
        return
    _warned = True
    shown = "; ".join(where[:3]) + (f"; and {len(where) - 3} more" if len(where) > 3 else "")
    click.echo(
        f"warning: credentials on the command line ({shown}): while daskfeed runs, "
        f"any user of this machine can read them in /proc/{os.getpid()}/cmdline (ps), and your "
        "shell keeps them in its history. Hint: give them where only you can read them: the "
        "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), a profile "
        "(AWS_PROFILE, or --storage-options '{\"profile\": \"name\"}'), or a JSON file only you "
        "can read: --storage-options @options.json (chmod 600), e.g. {\"key\": ..., \"secret\": "
        "...} for s3://, {\"headers\": {\"Authorization\": \"Basic ...\"}} for https://.",
        err=True)
