"""Bytes of ``manifest.json`` per block when the data are many small files.

    .venv/bin/python benchmarks/manifest_size.py --files 20000 --rows-per-file 100

Writes ``--files`` demo files (daskfeed's generator, ``--rows-per-file`` rows each, one block
per file) under ``--data-dir``, scans them on a LocalCluster and prints the manifest's size,
its bytes per block, and how long writing and reading it back take.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def main() -> None:
    """Generate, scan, and measure the manifest."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=20_000)
    p.add_argument("--rows-per-file", type=int, default=100)
    p.add_argument("--data-dir", default=None, help="[bench-out/manifest-size-FILES]")
    p.add_argument("--memory-limit", default="3GB")
    args = p.parse_args()

    import daskfeed
    from daskfeed import Budget, write_demo_data
    from daskfeed.cluster import close_client, start_local_cluster

    root = args.data_dir or os.path.join("bench-out", f"manifest-size-{args.files}")
    demo = write_demo_data(root, rows=args.files * args.rows_per_file, validate_rows=args.rows_per_file,
                           rows_per_file=args.rows_per_file)
    client = start_local_cluster(Budget.split(args.memory_limit), dashboard_address="")
    try:
        t0 = time.perf_counter()
        m = daskfeed.scan(demo.train_glob, label="cleared", client=client)
        scan_s = time.perf_counter() - t0
    finally:
        close_client(client)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "manifest.json")
        t0 = time.perf_counter()
        m.to_json(path)
        save_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        back = daskfeed.Manifest.from_json(path)
        load_s = time.perf_counter() - t0
        size = os.path.getsize(path)
    assert back.blocks == m.blocks
    n = len(m.blocks)
    print(f"{n:,} blocks, {m.rows:,} rows, scan {scan_s:.1f}s: manifest.json {size:,} bytes = "
          f"{size / n:.1f} bytes per block; save {save_s * 1e3:.0f} ms, load {load_s * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
