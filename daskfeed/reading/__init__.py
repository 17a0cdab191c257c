"""Reading: input files, byte streams, CSV records, blocks parsed into Arrow tables, ``Source``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskfeed.core import attach

if TYPE_CHECKING:
    from daskfeed.reading._credentials import url_credentials, with_credentials
    from daskfeed.reading._dates import ISO_DATE, SPACES, iso_seconds
    from daskfeed.reading._files import (
        Block,
        FileInfo,
        expand_paths,
        protocol,
        refuse_missing_local,
        relist,
        stat_file,
    )
    from daskfeed.reading._lines import RowLines
    from daskfeed.reading._listing import Listing, PathsLike
    from daskfeed.reading._locate import Spot, locate_values
    from daskfeed.reading._now import ASK_SECONDS, long_reads, named, reading, reads_now
    from daskfeed.reading._nulls import NA_MARKERS, count_by_part, first_values, na_counts, naive_times
    from daskfeed.reading._parts import Part, file_key, options_salt, part_key
    from daskfeed.reading._records import line_number
    from daskfeed.reading._small_files import SharedParse, SmallFiles
    from daskfeed.reading._source import Source, first_header, read_options
    from daskfeed.reading._splits import SplitError
    from daskfeed.reading._streams import open_file
    from daskfeed.reading._suffixes import compression_of, is_parquet
    from daskfeed.reading._tables import FieldText, ReadOptions, iter_tables, record_range

__all__ = ["ASK_SECONDS", "ISO_DATE", "NA_MARKERS", "SPACES", "Block", "FieldText", "FileInfo",
           "Listing", "Part", "PathsLike", "ReadOptions", "RowLines", "SharedParse", "SmallFiles", "Source",
           "SplitError", "Spot", "compression_of", "count_by_part", "expand_paths", "file_key",
           "first_header", "first_values", "is_parquet", "iso_seconds", "iter_tables", "line_number",
           "locate_values", "long_reads", "na_counts", "naive_times", "named", "open_file",
           "options_salt", "part_key", "protocol", "read_options", "reading", "reads_now",
           "record_range", "refuse_missing_local", "relist", "stat_file", "url_credentials",
           "with_credentials"]

__getattr__, __dir__ = attach(__name__, {
    "url_credentials": "_credentials", "with_credentials": "_credentials",
    "ISO_DATE": "_dates", "SPACES": "_dates", "iso_seconds": "_dates",
    "Block": "_files", "FileInfo": "_files", "compression_of": "_suffixes", "expand_paths": "_files",
    "is_parquet": "_suffixes", "protocol": "_files", "refuse_missing_local": "_files",
    "relist": "_files", "stat_file": "_files",
    "Listing": "_listing", "PathsLike": "_listing",
    "RowLines": "_lines",
    "Spot": "_locate", "locate_values": "_locate",
    "Part": "_parts", "file_key": "_parts", "options_salt": "_parts", "part_key": "_parts",
    "ASK_SECONDS": "_now", "long_reads": "_now", "named": "_now", "reading": "_now", "reads_now": "_now",
    "NA_MARKERS": "_nulls", "count_by_part": "_nulls", "first_values": "_nulls", "na_counts": "_nulls",
    "naive_times": "_nulls",
    "line_number": "_records",
    "SharedParse": "_small_files", "SmallFiles": "_small_files",
    "Source": "_source", "first_header": "_source", "read_options": "_source",
    "SplitError": "_splits",
    "open_file": "_streams",
    "FieldText": "_tables", "ReadOptions": "_tables", "iter_tables": "_tables",
    "record_range": "_tables",
})
