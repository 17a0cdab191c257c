"""Demo data: quest logs split into many files, learnable but noisy.

``log_quest/splited/split_data_00000.csv …`` and ``log_quest_validate/splited/…``: one row per
quest attempt; numeric columns, string categories (non-ASCII text, values with commas), missing
values, an integer column (``gold_spent``) that has blanks only in the last files, and the label
``cleared`` drawn from a logistic model of the features. Every file is generated from
``(seed, split, file index)`` alone, so any size is reproducible and files can be written in any
order.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import numpy as np

from daskfeed.core import write_file, writing

CLASSES = np.array(["warrior", "mage", "rogue", "cleric", "ranger", "paladin", "死霊術師"])
REGIONS = np.array(["Stormwind, East", "Île-de-Fer", "東京", "Zürich", "São Paulo, BR",
                    "Ironforge", "Ñandú Plains", "Kraków"])
N_QUESTS = 300
COLUMNS = ["quest_id", "class", "region", "level", "party_size", "gear_score", "attempt",
           "duration_s", "gold_spent", "deaths", "hour", "cleared"]


@dataclass(frozen=True)
class DemoData:
    """Where the demo data lie."""

    root: str
    train_glob: str
    validate_glob: str
    train_rows: int
    validate_rows: int


def _world(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 7])
    difficulty = rng.normal(0.0, 1.2, N_QUESTS)
    popularity = 1.0 / np.arange(1, N_QUESTS + 1) ** 0.8
    class_fx = rng.normal(0.0, 0.5, len(CLASSES))
    region_fx = rng.normal(0.0, 0.4, len(REGIONS))
    return difficulty, popularity / popularity.sum(), class_fx, region_fx


def generate_rows(n: int, *, seed: int, stream: int, late_blanks: bool = False,
                  row_id_start: int | None = None) -> dict[str, np.ndarray]:
    """Generate ``n`` quest attempts as columns (deterministic in seed and stream).

    Parameters
    ----------
    n
        Rows.
    seed, stream
        The random streams (the world's quests, classes and regions depend on ``seed`` alone).
    late_blanks
        Blanks in ``gold_spent`` (an integer column missing values only in later files).
    row_id_start
        Start of a ``row_id`` column; None: no such column.

    Returns
    -------
    dict of numpy.ndarray
        Column name to values (``None`` for missing ones), in :data:`COLUMNS` order.
    """
    difficulty, popularity, class_fx, region_fx = _world(seed)
    rng = np.random.default_rng([seed, stream])
    q = rng.choice(N_QUESTS, n, p=popularity)
    c = rng.integers(0, len(CLASSES), n)
    r = rng.integers(0, len(REGIONS), n)
    level = rng.integers(1, 61, n)
    party = rng.integers(1, 6, n)
    gear = np.round(rng.normal(450 + 6 * level, 60), 1)
    attempt = rng.geometric(0.45, n)
    diff = difficulty[q]
    deaths = rng.poisson(np.exp(0.35 * diff - 0.2))
    duration = np.round(np.exp(rng.normal(6.0 + 0.25 * diff, 0.35)), 2)
    gold = rng.integers(0, 5000, n)
    hour = rng.integers(0, 24, n)
    z = (0.06 * (level - 30) + 0.35 * (party - 3) + 0.006 * (gear - (450 + 6 * 30))
         - 0.45 * deaths - 1.1 * diff + class_fx[c] + region_fx[r] + 0.12 * (attempt - 1)
         + 0.3 * np.sin(hour / 24 * 2 * np.pi))
    cleared = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(np.int64)
    gear_col = gear.astype(object)
    gear_col[rng.random(n) < 0.05] = None
    gold_col = gold.astype(object)
    if late_blanks:
        gold_col[rng.random(n) < 0.1] = None
    cls_col = CLASSES[c].astype(object)
    cls_col[rng.random(n) < 0.02] = None
    cols = {
        "quest_id": np.char.add("Q", np.char.zfill(q.astype(str), 4)),
        "class": cls_col,
        "region": REGIONS[r],
        "level": level,
        "party_size": party,
        "gear_score": gear_col,
        "attempt": attempt,
        "duration_s": duration,
        "gold_spent": gold_col,
        "deaths": deaths,
        "hour": hour,
        "cleared": cleared,
    }
    if row_id_start is not None:
        cols = {"row_id": np.arange(row_id_start, row_id_start + n), **cols}
    return cols


def _write_split(directory: str, rows: int, rows_per_file: int, seed: int, split: int,
                 row_ids: bool) -> None:
    import pandas as pd

    os.makedirs(directory, exist_ok=True)
    nfiles = max(1, -(-rows // rows_per_file))
    for i in range(nfiles):
        n = min(rows_per_file, rows - i * rows_per_file)
        cols = generate_rows(n, seed=seed, stream=split * 1_000_000 + i,
                             late_blanks=i >= int(nfiles * 0.8) and nfiles > 1,
                             row_id_start=i * rows_per_file if row_ids else None)
        with writing(os.path.join(directory, f"split_data_{i:05d}.csv"), "w",
                     encoding="utf-8") as f:
            pd.DataFrame(cols).to_csv(f, index=False)


def write_demo_data(root: str | os.PathLike[str], *, rows: int = 200_000,
                    validate_rows: int = 50_000, rows_per_file: int = 1000, seed: int = 0,
                    row_ids: bool = False) -> DemoData:
    """Write the demo quest logs under ``root`` (skipped if the same set is already there).

    Parameters
    ----------
    root
        The directory; ``log_quest/`` and ``log_quest_validate/`` are written in it.
    rows, validate_rows
        Rows of the training and of the validation files.
    rows_per_file
        Rows per CSV file (the old hand-split layout).
    seed
        Makes the data; the same seed, the same files.
    row_ids
        Add a ``row_id`` column (0, 1, ... in each split).

    Returns
    -------
    DemoData
        Where the files are and their globs.
    """
    root = os.fspath(root)
    stamp = os.path.join(root, ".daskfeed-demo")
    key = f"{rows} {validate_rows} {rows_per_file} {seed} {row_ids}"
    if _stamp(stamp) != key:
        for sub in ("log_quest", "log_quest_validate"):
            shutil.rmtree(os.path.join(root, sub), ignore_errors=True)
        _write_split(os.path.join(root, "log_quest", "splited"), rows, rows_per_file, seed, 0, row_ids)
        _write_split(os.path.join(root, "log_quest_validate", "splited"), validate_rows,
                     rows_per_file, seed, 1, row_ids)
        write_file(stamp, key)
    return DemoData(
        root=root,
        train_glob=os.path.join(root, "log_quest", "**", "*.csv"),
        validate_glob=os.path.join(root, "log_quest_validate", "**", "*.csv"),
        train_rows=rows,
        validate_rows=validate_rows,
    )


def _stamp(path: str) -> str | None:
    """What the last complete write of the demo data recorded (None: none there)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None
