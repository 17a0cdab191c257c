"""A Listing: the files listed in a thread (while a cluster starts), handed to Source."""

from __future__ import annotations

import warnings

import pytest

from daskfeed.core import DataNotFoundError
from daskfeed.reading import Listing, Source


def _write(root, n):
    for i in range(n):
        d = root / f"day={i % 3}"
        d.mkdir(exist_ok=True)
        (d / f"part-{i:03d}.csv").write_text("a,b\n" + "".join(f"{i},{j}\n" for j in range(i + 1)))


def test_a_source_of_a_listing_is_the_source_of_its_paths(tmp_path):
    _write(tmp_path, 30)
    pattern = str(tmp_path / "**" / "*.csv")
    listed, direct = Source(Listing(pattern), blocksize=64), Source(pattern, blocksize=64)
    assert len(direct.files) == 30
    assert listed.files == direct.files
    assert listed.given == direct.given
    assert listed.blocks == direct.blocks
    assert listed.fingerprint() == direct.fingerprint()


def test_the_files_are_those_listed_when_the_listing_began(tmp_path):
    _write(tmp_path, 4)
    listing = Listing([str(tmp_path / "day=0"), str(tmp_path / "day=1")])
    assert len(listing.files({})) == 3  # waits for the thread: the listing is done
    (tmp_path / "day=0" / "late.csv").write_text("a,b\n1,2\n")
    assert [f.path for f in Source(listing).files] == [f.path for f in listing.files({})]
    assert len(Source(listing.data).files) == 4  # listed again: the new file


def test_a_listing_error_is_raised_where_the_source_is_made(tmp_path):
    listing = Listing(str(tmp_path / "nothing" / "*.csv"))  # the thread fails, says nothing
    with pytest.raises(DataNotFoundError, match="nothing"):
        Source(listing)


def test_a_source_with_other_storage_options_lists_again(tmp_path):
    _write(tmp_path, 3)
    listing = Listing(str(tmp_path / "**" / "*.csv"), {"anon": True})
    source = Source(listing)  # read without them: the local files, listed again
    assert len(source.files) == 3
    assert listing.storage_options == {"anon": True}


def test_what_the_listing_says_is_warned_once_at_the_callers_line(tmp_path):
    _write(tmp_path, 3)
    (tmp_path / "day=0" / "README.txt").write_text("how these logs were made", encoding="utf-8")
    listing = Listing(str(tmp_path / "day=0"))
    with pytest.warns(UserWarning, match=r"Left out 1 \.txt file\(s\)") as caught:
        source = Source(listing)  # warned here, in this thread, not in the listing's
    assert [w.filename for w in caught] == [__file__]
    assert [f.path.rsplit("/", 1)[1] for f in source.files] == ["part-000.csv"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second Source of the same listing says nothing again
        assert Source(listing).files == source.files


def test_a_glimpse_is_one_file_the_pattern_names_found_by_its_walk(tmp_path):
    from daskfeed.reading._files import a_local_file

    _write(tmp_path, 30)
    wanted = {str(p) for p in tmp_path.glob("*/*.csv")}
    for pattern in (str(tmp_path / "**" / "*.csv"), str(tmp_path / "*" / "*")):
        found = a_local_file(pattern)  # the second pattern meets folders first: a file is taken
        assert found in wanted
    one = str(tmp_path / "day=1" / "part-001.csv")
    assert a_local_file([one]) == one
    assert a_local_file(str(tmp_path / "day=1")) is None  # a folder: the listing lists it
    assert a_local_file("s3://bucket/logs/*.csv") is None  # not local: the listing's
    listing = Listing(str(tmp_path / "**" / "*.csv"))
    glimpsed = listing.glimpse()  # during the listing (one file) or after it (all)
    assert glimpsed and {f.path for f in glimpsed} <= wanted
    assert len(listing.listed()) == 30 and listing.glimpse() == listing.listed()  # once listed: all
