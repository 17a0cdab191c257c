"""``daskfeed rows``' output: a step's rows as a table, CSV or JSON lines, without pandas.

The rows come as plain columns (:func:`daskfeed.training.trace_steps`); printing them here keeps
the command to numpy and the run's JSON (pandas alone takes longer to import than the trace:
``--show``, which reads the rows' values, is the one form that loads it). The CSV is what
:func:`daskfeed.batch_rows`' DataFrame writes with ``to_csv``, the JSON lines the objects its
``to_json(orient="records", lines=True)`` writes (``/`` not escaped), the table aligned as its
``to_string(index=False)`` aligns it; a line not known is empty, ``null``, ``<NA>``.
"""

from __future__ import annotations

import csv
import io
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daskfeed.training import StepRows

_NAMES = ("file", "line", "block", "block_row")


def _columns(found: StepRows, several: bool) -> tuple[list[str], list[list[Any]]]:
    """The header and the columns' values (None: a line not known)."""
    names = ["step", *_NAMES] if several else list(_NAMES)
    lines = [None if n < 0 else n for n in found.lines.tolist()]
    values = [found.files, lines, found.blocks.tolist(), found.block_rows.tolist()]
    return names, [found.steps.tolist(), *values] if several else values


def render(found: StepRows, fmt: str, several: bool) -> str:
    """``found`` as ``fmt`` (``table``, ``csv`` or ``json``), the rows one after another.

    Parameters
    ----------
    found
        The steps' rows (:func:`daskfeed.training.trace_steps`).
    fmt
        ``table``: columns aligned to the right under a header; ``csv``: a header line, then a
        line per row; ``json``: an object per line.
    several
        Whether several steps were asked (a ``step`` column first).

    Returns
    -------
    str
        The text, ending with a line break.
    """
    names, columns = _columns(found, several)
    rows = list(zip(*columns, strict=True)) if columns else []
    if fmt == "json":
        return "".join(json.dumps(dict(zip(names, row, strict=True)), separators=(",", ":")) + "\n"
                       for row in rows)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        writer.writerows([["" if v is None else v for v in row] for row in rows])
        return out.getvalue()
    cells = [[str(v) if v is not None else "<NA>" for v in col] for col in columns]
    # (as pandas aligns them: a column one wider than its name at least, one space apart)
    widths = [max([len(n) + 1, *map(len, col)]) for n, col in zip(names, cells, strict=True)]
    lines = [" ".join(n.rjust(w) for n, w in zip(names, widths, strict=True))]
    lines += [" ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
              for row in zip(*cells, strict=True)]
    return "\n".join(lines) + "\n"
