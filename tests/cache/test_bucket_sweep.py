"""Bucket files left unsealed by a build cut short are removed once stale, and nothing else."""

from __future__ import annotations

import json
import os
import time

from daskfeed.cache._buckets import MARKER, STALE_SECONDS, remove_unsealed


def _generation(base, key, name, *, sealed, age):
    """A generation's directory with a bucket file and a run; its times ``age`` s ago."""
    g = base / key / name
    (g / "runs-abc").mkdir(parents=True)
    (g / "runs-abc" / "r000000.arrow").write_bytes(b"run")
    (g / "b0.arrow").write_bytes(b"bucket")
    if sealed:
        (g / MARKER).write_text(json.dumps({"parts": ["p"]}))
    then = time.time() - age
    for path in [g / "runs-abc" / "r000000.arrow", g / "runs-abc", g / "b0.arrow", g]:
        os.utime(path, (then, then))
    return g


def test_an_unsealed_generation_untouched_past_the_stale_age_goes_the_rest_stays(tmp_path):
    base = tmp_path / "buckets"
    old = _generation(base, "set1", "gold", sealed=False, age=STALE_SECONDS + 60)
    young = _generation(base, "set1", "gyoung", sealed=False, age=60)  # a build going on
    sealed = _generation(base, "set2", "gsealed", sealed=True, age=STALE_SECONDS + 60)
    # a build still writing its runs: the generation's own directory is old, a run is new
    busy = _generation(base, "set2", "gbusy", sealed=False, age=STALE_SECONDS + 60)
    os.utime(busy / "runs-abc", None)
    os.symlink(old, base / "set2" / "glink")  # (a link is never followed)

    assert remove_unsealed(str(base), time.time() - STALE_SECONDS) == 1
    assert not old.exists()
    assert young.exists() and sealed.exists() and busy.exists()
    assert (base / "set2" / "glink").is_symlink()
