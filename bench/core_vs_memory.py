"""Same model, same data, same run: daskfeed DaskSequence vs in-memory numpy fit.

    .venv/bin/python bench/core_vs_memory.py --rows 200000 --epochs 3 --out bench-out

Prints validation accuracy and per-epoch rows/s of both, and their ratios; writes JSON.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time


class EpochTimer:
    def __init__(self, keras):
        class _T(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.seconds = []

            def on_epoch_begin(self, epoch, logs=None):
                self._t0 = time.perf_counter()

            def on_test_begin(self, logs=None):
                if self._t0:
                    self.seconds.append(time.perf_counter() - self._t0)
                    self._t0 = None

            def on_epoch_end(self, epoch, logs=None):
                if self._t0:
                    self.seconds.append(time.perf_counter() - self._t0)
                    self._t0 = None

        self.cb = _T()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--validate-rows", type=int, default=50_000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--nworkers", type=int, default=2)
    ap.add_argument("--out", default="bench-out")
    args = ap.parse_args()

    import pandas as pd

    import daskfeed
    from daskfeed._keras import keras
    from daskfeed.cluster import Budget, close_client, start_local_cluster
    from daskfeed.demo import write_demo_data
    from daskfeed.feed import Encoding, encode_frame

    data = write_demo_data(os.path.join(args.out, "data"), rows=args.rows,
                           validate_rows=args.validate_rows)
    budget = Budget.split(args.memory_limit, nworkers=args.nworkers)
    client = start_local_cluster(budget, dashboard_address="")
    try:
        t0 = time.perf_counter()
        train = daskfeed.DaskSequence(data.train_glob, label="cleared", client=client,
                                      batch_size=args.batch_size, window_bytes=budget.window_bytes,
                                      prefetch_bytes=budget.prefetch * 2 // 3)
        scan_s = time.perf_counter() - t0
        val = daskfeed.DaskSequence(data.validate_glob, label="cleared", client=client,
                                    batch_size=args.batch_size, shuffle=False,
                                    reference=train.manifest)
        keras.utils.set_random_seed(0)
        model = daskfeed.default_model(train.manifest)
        timer = EpochTimer(keras).cb
        model.fit(train, validation_data=val, epochs=args.epochs, shuffle=False, verbose=2,
                  callbacks=[timer])
        dask_acc = model.evaluate(val, verbose=0, return_dict=True)["accuracy"]
        dask_secs = timer.seconds

        def load(pattern):
            df = pd.concat([pd.read_csv(p) for p in sorted(glob.glob(pattern, recursive=True))],
                           ignore_index=True)
            d = encode_frame(df, Encoding.from_manifest(train.manifest, train.features))
            return d.x, d.y

        t0 = time.perf_counter()
        x, y = load(data.train_glob)
        load_s = time.perf_counter() - t0
        vx, vy = load(data.validate_glob)
        keras.utils.set_random_seed(0)
        ref = daskfeed.default_model(train.manifest)
        timer = EpochTimer(keras).cb
        ref.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=True, verbose=2,
                validation_data=(vx, vy), callbacks=[timer])
        mem_acc = ref.evaluate(vx, vy, verbose=0, return_dict=True)["accuracy"]
        mem_secs = timer.seconds
        train.close()
        val.close()
    finally:
        close_client(client)

    n = args.rows
    result = {
        "rows": n, "epochs": args.epochs, "batch_size": args.batch_size,
        "daskfeed_val_accuracy": dask_acc, "in_memory_val_accuracy": mem_acc,
        "daskfeed_scan_seconds": scan_s, "in_memory_load_seconds": load_s,
        "daskfeed_rows_per_s": [n / s for s in dask_secs],
        "in_memory_fit_rows_per_s": [n / s for s in mem_secs],
    }
    result["ratio_per_epoch"] = [d / m for d, m in zip(result["daskfeed_rows_per_s"],
                                                        result["in_memory_fit_rows_per_s"], strict=False)]
    cold = n / (scan_s + dask_secs[0])
    warm_mem = n / (load_s + mem_secs[0])
    result["epoch1_incl_scan_vs_load_plus_fit"] = cold / warm_mem
    print(json.dumps(result, indent=1))
    print(f"\nvalidation accuracy: daskfeed {dask_acc:.4f}  in-memory {mem_acc:.4f}  "
          f"(diff {100 * (dask_acc - mem_acc):+.2f} points)")
    pairs = zip(result["daskfeed_rows_per_s"], result["in_memory_fit_rows_per_s"], strict=False)
    for e, (d, m) in enumerate(pairs):
        print(f"epoch {e + 1}: daskfeed {d:,.0f} rows/s  in-memory fit {m:,.0f} rows/s  ratio {d / m:.2f}")
    cold_ratio = result["epoch1_incl_scan_vs_load_plus_fit"]
    print(f"epoch 1 incl. scan vs in-memory load + fit: ratio {cold_ratio:.2f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "core_vs_memory.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
