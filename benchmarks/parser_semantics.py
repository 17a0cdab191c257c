"""Where Polars' CSV reader and pyarrow's (as daskfeed calls it) read the same text differently.

    .venv/bin/python -m pip install polars
    .venv/bin/python benchmarks/parser_semantics.py [--out benchmarks/results] [--name NAME]

Issue 46 asks for the fastest reader as the one parse path, with no silent difference from the
path kept for what it cannot read. Before that change, this lists the cases where the two differ
on what daskfeed's parse depends on: rows (short lines, blank lines), missing values (quoted
empty fields, whitespace), the types inferred and the values each accepts for a type. Two
tables:

- *whole texts*: pyarrow with daskfeed's options (only empty fields are null, no timestamps
  inferred, quoted line breaks) against ``polars.read_csv`` inferring over every row;
- *one value, one type*: each value alone in a column of a given type (pyarrow's
  ``column_types``, polars' ``schema_overrides``): what each accepts, and as what.

Every row is printed; those that differ are marked ``DIFF``. Writes
``<out>/parser-semantics-<name>.txt`` (with polars' and pyarrow's versions).
"""

from __future__ import annotations

import argparse
import io
import os
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

TEXTS = {
    "short line (fewer fields)": b"1,2,3\n4,5\n",
    "long line (more fields)": b"1,2\n4,5,6\n",
    "quoted empty field": b'a,""\nb,\n',
    "blank line": b"1,2\n\n3,4\n",
    "line of spaces": b"1,2\n  \n3,4\n",
    "CRLF": b"1,x\r\n2,y\r\n",
    "dates and times": b"2020-01-01,12:00:00\n2020-01-02,13:00:00\n",
    "timestamps": b"2020-01-01T10:00:00Z,1\n2020-01-01 10:00:00,2\n",
    "booleans": b"True,1\nfalse,0\n",
    "signs": b"+5,.5\n-0,5.\n",
    "infinities and NaN": b"inf,NaN\n-Infinity,nan\n",
    "exponents": b"1e5,1E-3\n2,3\n",
    "spaces around numbers": b" 5,x \n6,y\n",
    "an integer past int64": b"99999999999999999999,1\n",
    "quoted line break": b'1,"a\nb"\n2,c\n',
    "quoted number": b'"5",1\n6,2\n',
}

VALUES = {
    "int64": ["5", " 5", "5 ", "+5", "-0", "007", "0x10", "1_000", "5.0", "1e3", "  ",
              '"5"', "9223372036854775807", "9223372036854775808"],
    "float64": ["1.5", " 1.5", "1.5 ", "+1.5", ".5", "5.", "1e5", "1E+5", "inf", "-inf",
                "Infinity", "NaN", "-nan", "1_0.5", "1.5f", "0x1p3", "1d5", "  ", "1e400"],
    "bool": ["true", "True", "TRUE", "tRuE", "1", "0", "yes", "t", " true"],
}


def pyarrow_read(body: bytes, names: list[str], types: dict[str, Any] | None = None) -> Any:
    """``body`` read as daskfeed's parse reads it (``daskfeed.reading._tables.read_csv``)."""
    import pyarrow.csv as pacsv

    return pacsv.read_csv(
        io.BytesIO(body), read_options=pacsv.ReadOptions(column_names=names, use_threads=False),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(column_types=types or {}, strings_can_be_null=True,
                                             null_values=[""], timestamp_parsers=[]))


def polars_read(body: bytes, names: list[str], types: dict[str, Any] | None = None) -> Any:
    """``body`` read by Polars, every row looked at to infer types; as Arrow."""
    import polars as pl

    return pl.read_csv(io.BytesIO(body), has_header=False, new_columns=names,
                       infer_schema_length=None, schema_overrides=types).to_arrow()


def shown(read: Any) -> str:
    """A table's types and values, or the error's first words."""
    try:
        table = read()
    except Exception as err:  # (what the reader says is the finding)
        return f"error: {type(err).__name__}: {str(err).splitlines()[0][:70]}"
    if hasattr(table, "schema"):
        return f"{[str(t) for t in table.schema.types]} {table.to_pydict()}"
    return f"{table.type} {table.to_pylist()}"  # (one column)


def comparisons() -> list[str]:
    """Both tables' lines."""
    import polars as pl
    import pyarrow as pa

    lines = ["# whole texts: pyarrow (daskfeed's options) | polars (inferring over every row)"]
    for what, body in TEXTS.items():
        names = [f"c{i}" for i in range(len(body.split(b"\n")[0].split(b",")))]
        a = shown(lambda b=body, n=names: pyarrow_read(b, n))
        p = shown(lambda b=body, n=names: polars_read(b, n))
        same = a.replace("large_string", "string") == p.replace("large_string", "string")
        lines += [f"{'' if same else 'DIFF '}{what}", f"    pyarrow: {a}", f"    polars:  {p}"]
    lines.append("# one value, one type: pyarrow's column_types | polars' schema_overrides")
    arrow = {"int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}
    polars = {"int64": pl.Int64, "float64": pl.Float64, "bool": pl.Boolean}
    for kind, values in VALUES.items():
        for v in values:
            body = (v + "\n").encode()
            a = shown(lambda b=body, k=kind: pyarrow_read(b, ["c"], {"c": arrow[k]}).column(0))
            p = shown(lambda b=body, k=kind: polars_read(b, ["c"], {"c": polars[k]}).column(0))
            a, p = a.split(" ", 1)[-1] if not a.startswith("error") else "error", \
                p.split(" ", 1)[-1] if not p.startswith("error") else "error"
            lines.append(f"{'DIFF ' if a != p else '     '}{kind:8s} {v!r:24s} pyarrow {a:16s} "
                         f"polars {p}")
    return lines


def main(argv: list[str] | None = None) -> None:
    """Print both tables and write them under ``--out``."""
    import polars as pl
    import pyarrow as pa

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default=time.strftime("%Y-%m-%d"))
    a = p.parse_args(argv)
    lines = [f"polars {pl.__version__}, pyarrow {pa.__version__}", *comparisons()]
    print("\n".join(lines))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"parser-semantics-{a.name}.txt"), "w") as f:
        f.write("\n".join([*lines, "command: python benchmarks/parser_semantics.py"]) + "\n")


if __name__ == "__main__":
    main()
