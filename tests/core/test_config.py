"""daskfeed's ``daskfeed.*`` keys (daskfeed.core._config), set every way docs/configuration.md
names, whenever: ``dask.config.set``, ``DASK_DASKFEED__…`` environment variables and a YAML file
in ``~/.config/dask/``, before and after ``import daskfeed``.

Every shipped key is set in turn and every key read back through daskfeed: the one set has the
value set, the others their shipped defaults (also once a ``dask.config.set`` is left). Before
import, a fresh interpreter per key (the defaults are registered on first use, not on ``import
daskfeed``; dask reads the environment and its YAML files when it is first imported); after
import, one interpreter sets each key in turn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

import daskfeed

SHIPPED = yaml.safe_load((Path(daskfeed.__file__).parent / "core" / "daskfeed.yaml").read_text())["daskfeed"]

# a value for each shipped key, other than its default, that reads back the same whichever way it
# is set (an environment variable's text is read by dask as a Python literal, else as text)
VALUES = {
    "batch-size": 777, "blocksize": "33MiB", "window-bytes": "77MiB", "prefetch-bytes": "99MiB",
    "window-reads": "workers", "buckets-in-memory": False, "handoff": "pydataset",
    "checkpoint-every": 55, "timeout": "123s",
    "rank-wait": "3h",
    "cache-dir": "/tmp/daskfeed-config-test", "cache-compression": "zstd", "cache-max-size": "5GB",
    "cache-lock-timeout": "7minutes", "vocabulary-size": 321, "max-columns": 4321,
    "trainer-reserve": "2GiB", "worker-nice": 3, "dashboard-address": "127.0.0.1:9999",
    "local-tls": False, "allow-plaintext-credentials": True, "warnings": "line",
}

# Reads every shipped key through daskfeed and prints {"set": the key set (None: none), "got": ...}.
_READ = """
def read(key):
    from daskfeed.core import config
    print(json.dumps({"set": key, "got": {k: config.get(k) for k in KEYS}}), flush=True)
"""

# "before import": a fresh interpreter per key, KEY set to VALUE (an environment variable and the
# YAML file are set up before it starts; HOME is where ~/.config/dask/ is)
_BEFORE = {
    "dask.config.set": """
import dask.config
with dask.config.set({"daskfeed." + KEY: VALUE}):
    import daskfeed
    read(KEY)
read(None)
with dask.config.set({"daskfeed." + KEY: VALUE}):  # (the defaults were registered meanwhile)
    read(KEY)
read(None)
""",
    "environment": """
import daskfeed
read(KEY)
""",
    "YAML file": """
import daskfeed
read(KEY)
""",
}

# "after import": one interpreter sets each key in turn after ``import daskfeed`` (the first key
# before daskfeed read any setting, the others after); dask reads a changed environment and its
# YAML files again on dask.config.refresh()
_AFTER = {
    "dask.config.set": """
import daskfeed
import dask.config
for key, value in VALUES.items():
    with dask.config.set({"daskfeed." + key: value}):
        read(key)
    read(None)
""",
    "environment": """
import daskfeed
import dask.config
for key, value in VALUES.items():
    name = "DASK_DASKFEED__" + key.upper().replace("-", "_")
    os.environ[name] = str(value)
    dask.config.refresh()
    read(key)
    del os.environ[name]
    dask.config.refresh()
    read(None)
""",
    "YAML file": """
import daskfeed
import dask.config
import yaml
os.makedirs(os.path.join(HOME, ".config", "dask"))
mine = os.path.join(HOME, ".config", "dask", "mine.yaml")
for key, value in VALUES.items():
    with open(mine, "w") as f:
        f.write(yaml.safe_dump({"daskfeed": {key: value}}))
    dask.config.refresh()
    read(key)
    os.remove(mine)
    dask.config.refresh()
    read(None)
""",
}


def _python(code: str, home: Path, env_key: str | None = None, key: str | None = None,
            ) -> tuple[subprocess.CompletedProcess, str]:
    """Run ``code`` in a fresh interpreter (no DASK_* variables but ``env_key``'s; HOME at ``home``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}  # (DASK_CONFIG too)
    env["HOME"] = str(home)
    if env_key is not None:
        env["DASK_DASKFEED__" + env_key.upper().replace("-", "_")] = str(VALUES[env_key])
    code = (f"import json, os\nKEYS, VALUES = {list(SHIPPED)!r}, {VALUES!r}\n"
            f"KEY = {key!r}\nVALUE = VALUES.get(KEY)\nHOME = {str(home)!r}\n" + _READ + code)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300), code


def _check(out: subprocess.CompletedProcess, code: str, reads: list[str | None], what: str) -> None:
    """Each read (the key set, or None: none) has that key's value set and the others' defaults."""
    assert out.returncode == 0, f"{what}:\n{code}\n{out.stderr[-3000:]}"
    got = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["set"] for r in got] == reads, out.stdout
    for r in got:
        want = {k: VALUES[k] if k == r["set"] else SHIPPED[k] for k in SHIPPED}
        assert r["got"] == want, f"{what}: {r['set']} set"


def test_every_shipped_key_has_a_value_here():
    assert set(VALUES) == set(SHIPPED), "give a new key a value in VALUES"
    assert all(VALUES[k] != SHIPPED[k] for k in SHIPPED)


@pytest.mark.parametrize("way", sorted(_BEFORE))
def test_each_key_set_before_import_is_read_and_the_others_are_the_defaults(way, tmp_path):
    def run(key):
        home = tmp_path / key
        (home / ".config" / "dask").mkdir(parents=True)
        if way == "YAML file":
            mine = home / ".config" / "dask" / "mine.yaml"
            mine.write_text(yaml.safe_dump({"daskfeed": {key: VALUES[key]}}))
        return _python(_BEFORE[way], home, key if way == "environment" else None, key)

    with ThreadPoolExecutor(4) as pool:  # (a fresh interpreter per key)
        runs = dict(zip(SHIPPED, pool.map(run, SHIPPED), strict=True))
    for key, (out, code) in runs.items():
        reads = [key, None, key, None] if way == "dask.config.set" else [key]
        _check(out, code, reads, f"{way} before import, {key}")


@pytest.mark.parametrize("way", sorted(_AFTER))
def test_each_key_set_after_import_is_read_and_the_others_are_the_defaults(way, tmp_path):
    out, code = _python(_AFTER[way], tmp_path)
    _check(out, code, [r for key in SHIPPED for r in (key, None)], f"{way} after import")


def test_each_key_is_looked_up_in_one_place():
    """A ``daskfeed.*`` key is read by one call in the package (issue 43: one place per key).

    The entries that share a key (scan, predict, DataSettings, ClusterSpec, the CLI) call its
    accessor in ``daskfeed.core._config`` (``config.timeout()``...); the CLI's help shows each
    flag's configured default through its key, which is a display, not a read.
    """
    import re
    from collections import defaultdict

    calls = r"(?:get|get_bytes|get_seconds|get_flag|get_renamed|configured)\(\s*\"([a-z][a-z-]*)\""
    bare, called = re.compile(r"(?<![.\w])" + calls), re.compile(r"\bconfig\." + calls)
    where: dict[str, list[str]] = defaultdict(list)
    package = Path(daskfeed.__file__).parent
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        read = bare if path.name == "_config.py" and path.parent.name == "core" else called
        for m in read.finditer(text):
            if m.group(1) in SHIPPED:
                line = text.count("\n", 0, m.start()) + 1
                where[m.group(1)].append(f"{path.relative_to(package)}:{line}")
    assert where["timeout"] and where["vocabulary-size"]  # (the pattern finds the reads)
    # a key made at run time escapes the count: only core/_config.py and the CLI's help (which
    # shows each flag's configured default) may read one
    computed = re.compile(r"\bconfig\.(?:get|get_bytes|get_seconds|get_flag|get_renamed|configured)"
                          r"\(\s*(?!\")")
    hidden = [f"{path.relative_to(package)}:{text.count(chr(10), 0, m.start()) + 1}"
              for path in sorted(package.rglob("*.py"))
              if path.name != "_config.py" and path.name != "_flag_types.py"
              for text in [path.read_text(encoding="utf-8")] for m in computed.finditer(text)]
    assert hidden == [], f"config keys made at run time: {hidden}"
    twice = {key: places for key, places in where.items() if len(places) > 1}
    allowed = {"blocksize": 3}  # config.blocksize(), resolve_blocksize's configured() test and
    # the CLI's help, which shows whether the cap was configured (a display)
    assert {k: p for k, p in twice.items() if len(p) > allowed.get(k, 1)} == {}
