"""The scan's records are JSON data, checked on load: a planted or damaged record is never run,
and a record read back gives the manifest a full scan gives, for every kind of column."""

from __future__ import annotations

import glob
import json
import os
import pickle

from daskfeed.cache import open_cache
from daskfeed.reading import Source
from daskfeed.scanning import ScanStore, scan_source
from daskfeed.scanning._store import RECORD_VERSION

_HEADER = "n,x,word,day,at,local,flag,rare,empty,y\n"


def _write(path, rows: int, seed: int) -> None:
    """Every kind of column the scan keeps statistics of, missing values and markers included."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for r in range(rows):
        k = r + seed
        lines.append(",".join([
            str(k * 7 - 50), "" if k % 9 == 0 else f"{k / 3:.6g}", ["ok", "né", "x,y", ""][k % 4]
            if k % 4 != 2 else '"x,y"', f"2024-01-{1 + k % 28:02d}",
            f"2024-02-03T04:05:{k % 60:02d}Z", f"2024-02-03 04:05:{k % 60:02d}",
            ["true", "false"][k % 2], "?" if k % 5 else "7", "", str(k % 3)]) + "\n")
    path.write_text(_HEADER + "".join(lines), encoding="utf-8")


def _scan(pattern: str, cache_root, client):
    src = Source(pattern, blocksize=2048, na_values=["?"])
    cache, line = open_cache(src, str(cache_root), client=client, required=True)
    assert cache is not None, line
    manifest = scan_source(src, label="y", client=client, vocabulary_size=5, timeout=120,
                           parse_cache=cache)
    cache.release()
    return manifest


def _same(a, b) -> None:
    left, right = a.plain(), b.plain()
    for key in ("created", "scan_seconds", "scan_line"):
        left.pop(key), right.pop(key)
    assert left == right


def test_records_read_back_give_a_full_scans_manifest_for_every_kind(tmp_path, client):
    data = tmp_path / "data"
    _write(data / "a" / "one.csv", 300, 0)
    _write(data / "b" / "two.csv", 250, 1000)
    pattern = str(data / "**" / "*.csv")
    root = tmp_path / "cache"
    _scan(pattern, root, client)
    records = glob.glob(str(root / "scans" / "parts" / "*"))
    assert records and all(p.endswith(".json") for p in records), records
    for path in records:  # data with a name and a version, no code
        with open(path, encoding="utf-8") as f:
            body = json.load(f)
        assert body["format"] == "daskfeed scan record" and body["version"] == RECORD_VERSION
        assert os.path.basename(path) == f"{body['key']}.json"
        assert (os.stat(path).st_mode & 0o777) == 0o600
    _write(data / "c" / "three.csv", 120, 5000)  # grown: the first parts' records are read back
    grown = _scan(pattern, root, client)
    assert "unchanged reused" in grown.scan_line, grown.scan_line
    _same(grown, _scan(pattern, tmp_path / "fresh", client))


def test_a_planted_pickle_or_forged_record_is_never_run_nor_believed(tmp_path, client):
    data = tmp_path / "data"
    _write(data / "a" / "one.csv", 200, 0)
    pattern = str(data / "**" / "*.csv")
    root = tmp_path / "cache"
    first = _scan(pattern, root, client)
    parts = root / "scans" / "parts"
    (path,) = glob.glob(str(parts / "*.json"))
    key = os.path.basename(path).removesuffix(".json")
    ran = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {ran}",))

    (parts / f"{key}.pkl").write_bytes(pickle.dumps(Payload()))  # an older daskfeed's name
    store = ScanStore(str(root))
    good = store.load(key)
    assert good is not None
    forgeries = ({"format": "daskfeed scan record", "version": 3, "key": "f" * 32,
                  "record": good},  # another key's record
                 {"format": "daskfeed scan record", "version": 2, "key": key, "record": good},
                 {"format": "daskfeed scan record", "version": 3, "key": key,
                  "record": {"facts": [{"rows": -5, "columns": [], "kinds": {}}], "stats": {}}},
                 ["not", "a", "record"], None)
    for i, forged in enumerate(forgeries):
        with open(path, "w" if forged is not None else "wb") as f:
            if forged is None:
                f.write(pickle.dumps(Payload()))  # a pickle under the record's own name
            else:
                json.dump(forged, f)
        assert store.load(key) is None, forged
        _write(data / f"d{i}" / "more.csv", 50, 100 * i)  # the data grew: every record is merged
        again = _scan(pattern, root, client)  # the forged one scanned again, never believed
        assert "1 new file" in again.scan_line, again.scan_line
        _same(again, _scan(pattern, tmp_path / f"fresh{i}", client))
        assert store.load(key) == good  # (kept again, as scanned)
    assert not ran.exists() and first.rows == 200
