"""Files' kinds by their names' suffixes: compressed (how), Parquet, CSV (no fsspec loaded)."""

from __future__ import annotations

# compressions read by daskfeed.reading._streams, by suffix: each a stream of members / frames, all read
COMPRESSIONS = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bz2", ".xz": "xz",
                ".zst": "zstd", ".zstd": "zstd"}
CSV_SUFFIXES = tuple(base + packed for base in (".csv", ".tsv", ".txt")
                     for packed in ("", *COMPRESSIONS))
PARQUET_SUFFIXES = (".parquet", ".pq")


def compression_of(path: str) -> str | None:
    """Name the compression of ``path`` from its suffix; None when it is not compressed.

    Parameters
    ----------
    path
        A file's path or URL.

    Returns
    -------
    str or None
        ``"gzip"``, ``"bz2"``, ``"xz"`` or ``"zstd"`` (decompressed by
        :func:`daskfeed.reading.open_file`); for another suffix fsspec knows (``.zip``,
        ``.lz4``, ...) fsspec's name, read by fsspec.
    """
    lower = path.lower()
    if lower.endswith((".csv", ".tsv", ".txt")):  # the usual case, told at once
        return None
    for suffix, name in COMPRESSIONS.items():
        if lower.endswith(suffix):
            return name
    from fsspec.utils import infer_compression  # (fsspec: only for a suffix not known here)

    return infer_compression(path)


def is_parquet(path: str) -> bool:
    """Whether ``path`` is a Parquet file.

    Parameters
    ----------
    path
        A file's path or URL.

    Returns
    -------
    bool
        True for ``.parquet`` and ``.pq`` (any case).
    """
    return path.lower().endswith(PARQUET_SUFFIXES)
