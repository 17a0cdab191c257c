"""The benchmark's results as a table: ratios against the in-memory ceiling, JSON and a PNG chart.

Figures: epoch 1 timed from the method's start (reading, cluster start and scan included) and
the steady state (median of the epochs after the first, ≥ 3 of them). The ceiling is the
in-memory fit, run before and after daskfeed (A-B-A): its steady figure is the median of both
runs' steady epochs, its epoch-1 figure the mean of both runs' epoch 1 (load + fit).
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

from common import steady

# issue 15's targets on the one-run ratios: (key, description, threshold, higher is better)
TARGETS = (
    ("steady_vs_ceiling", "daskfeed steady ≥ 0.95× in-memory steady", 0.95, True),
    ("epoch1_vs_ceiling", "daskfeed epoch 1 from start ≥ 0.85× in-memory load + epoch 1", 0.85, True),
    ("epoch1_vs_tf_data", "daskfeed epoch 1 from start ≥ 1.3× tf.data's best variant", 1.3, True),
    ("peak_rss_in_budget", "daskfeed peak tree RSS ≤ its memory limit", 1.0, False),
)
FITS = ("in_memory_A1", "daskfeed", "in_memory_A2", "pydataset_floor", "daskfeed_batches",
        "tf_data_nocache",
        "tf_data_cache_disk", "tf_data_cache_ram", "old_recipe")
LABELS = {
    "in_memory_A1": "in-memory numpy fit (A1, before)",
    "daskfeed": "daskfeed fit (tf.data hand-off, as daskfeed train)",
    "daskfeed_batches": "daskfeed fit(DaskSequence) (PyDataset)",
    "in_memory_A2": "in-memory numpy fit (A2, after)",
    "pydataset_floor": "PyDataset slicing numpy (adapter floor)",
    "tf_data_nocache": "tf.data TextLine+decode_csv, no cache",
    "tf_data_cache_disk": "tf.data … .cache(file) on disk",
    "tf_data_cache_ram": "tf.data … .cache() in RAM",
    "old_recipe": "old recipe (pandas per file)",
    "feed_only": "daskfeed feed only (no model)",
}


def ceiling(methods: dict[str, Any]) -> dict[str, float]:
    """The in-memory ceiling from the A1 and A2 runs present (see the module's docstring)."""
    runs = [methods[k] for k in ("in_memory_A1", "in_memory_A2") if k in methods]
    if not runs:
        return {}
    later = [e["rows_per_s"] for r in runs for e in r["epochs"][1:]]
    return {"steady": float(statistics.median(later)),
            "epoch1": float(statistics.mean(r["epochs"][0]["rows_per_s_from_start"] for r in runs))}


def pooled(epochs: list[dict[str, Any]]) -> float:
    """Rows over seconds of the epochs after the first, together.

    The feed alone reads an epoch in milliseconds once its windows are here, and the next
    epoch's windows are computed meanwhile: one epoch waits for both, the next for none, so a
    median of epochs says nothing; their total does.
    """
    later = epochs[1:]
    return sum(e["rows"] for e in later) / sum(e["seconds"] for e in later)


def summarize(methods: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """Table rows, targets and sanity checks of one run.

    Parameters
    ----------
    methods
        What each method returned, by name.
    config
        The run's settings (kept as they are in the result).

    Returns
    -------
    dict
        ``config``, ``methods``, ``ceiling``, ``table``, ``targets``, ``sanity``.
    """
    ceil = ceiling(methods)
    parse = methods.get("pyarrow_parse")
    table = []
    for name in (*FITS, "feed_only"):
        m = methods.get(name)
        if m is None:
            continue
        e1 = m["epochs"][0]["rows_per_s_from_start"]
        st = steady(m["epochs"]) if name != "feed_only" else pooled(m["epochs"])
        row: dict[str, Any] = {
            "method": name, "label": LABELS[name],
            "epoch1_rows_per_s": e1, "steady_rows_per_s": round(st, 1),
            "steady_epochs": len(m["epochs"]) - 1,
            "epoch1_x_ceiling": round(e1 / ceil["epoch1"], 3) if ceil else None,
            "steady_x_ceiling": round(st / ceil["steady"], 3) if ceil and name != "feed_only" else None,
            "x_parse": None, "data_wait_fraction": None, "assembly_fraction": None,
            "peak_rss_bytes": m.get("peak_rss_bytes"),
        }
        if name in ("feed_only",) and parse:
            row["epoch1_x_ceiling"] = None
            row["x_parse"] = {"epoch1": round(e1 / parse["rows_per_s"], 3),
                              "steady": round(st / parse["rows_per_s"], 3)}
        if name in ("daskfeed", "daskfeed_batches"):
            row["data_wait_fraction"] = steady(m["epochs"], "data_wait_fraction")
            row["assembly_fraction"] = steady(m["epochs"], "assembly_fraction")
        table.append(row)
    if parse:
        table.append({"method": "pyarrow_parse", "label": f"pyarrow parse ({parse['reference']})",
                      "epoch1_rows_per_s": None, "steady_rows_per_s": parse["rows_per_s"],
                      "steady_epochs": len(next(iter(parse["variants"].values()))["passes_rows_per_s"]),
                      "epoch1_x_ceiling": None, "steady_x_ceiling": None, "x_parse": {"steady": 1.0},
                      "data_wait_fraction": None, "assembly_fraction": None, "peak_rss_bytes": None})
    return {"config": config, "methods": methods, "ceiling": ceil, "table": table,
            "targets": _targets(methods, ceil), "sanity": _sanity(methods)}


def _targets(methods: dict[str, Any], ceil: dict[str, float]) -> list[dict[str, Any]]:
    dsk = methods.get("daskfeed")
    if dsk is None or not ceil:
        return []
    tf_best = max((m["epochs"][0]["rows_per_s_from_start"] for k, m in methods.items()
                   if k.startswith("tf_data")), default=None)
    e1 = dsk["epochs"][0]["rows_per_s_from_start"]
    values = {"steady_vs_ceiling": steady(dsk["epochs"]) / ceil["steady"],
              "epoch1_vs_ceiling": e1 / ceil["epoch1"],
              "epoch1_vs_tf_data": e1 / tf_best if tf_best else None,
              "peak_rss_in_budget": dsk["peak_rss_bytes"] / dsk["budget"]["total"]}
    out = []
    for key, text, thr, higher in TARGETS:
        v = values[key]
        ok = None if v is None else bool(v >= thr if higher else v <= thr)
        out.append({"target": key, "description": text, "value": None if v is None else round(v, 4),
                    "threshold": thr, "pass": ok})
    return out


def _sanity(methods: dict[str, Any]) -> dict[str, Any]:
    """Same rows everywhere; every fit's loss within 10 % of the in-memory fit's."""
    rows = {k: m["rows"] for k, m in methods.items()}
    served = {f"{k}_epoch{e['epoch']}": e["rows_served"] for k, m in methods.items()
              for e in m.get("epochs", []) if e.get("rows_served") is not None}
    served.update({f"{k}_epoch{e['epoch']}": e["rows"] for k in ("feed_only",) if k in methods
                   for e in methods[k]["epochs"]})
    fits = {k: methods[k] for k in FITS if k in methods and "train_loss" in methods[k]}
    ref = methods.get("in_memory_A1")
    key = "val_loss" if ref and ref.get("val_loss") is not None else "train_loss"
    similar = None
    if ref:
        similar = all(abs(m[key] - ref[key]) <= 0.1 * ref[key] + 1e-3 for m in fits.values())
    drift = None
    if "in_memory_A1" in methods and "in_memory_A2" in methods:
        a1, a2 = (steady(methods[k]["epochs"]) for k in ("in_memory_A1", "in_memory_A2"))
        drift = round(a2 / a1, 3)
    return {"ceiling_drift": drift, "ceiling_stable": None if drift is None else abs(drift - 1) <= 0.1,
            "rows": rows, "rows_served": served,
            "rows_consistent": len(set(rows.values()) | set(served.values())) == 1,
            "losses": {k: {"train_loss": m["train_loss"], "val_loss": m["val_loss"]}
                       for k, m in fits.items()},
            "loss_compared": key, "losses_within_10pct": similar}


def _gb(n: float | None) -> str:
    return f"{n / 1e9:.2f}" if n else ""


def _x(v: float | None) -> str:
    return f"{v:.2f}×" if v is not None else ""


def format_table(result: dict[str, Any]) -> str:
    """The result as text: the table, the targets, the sanity checks, the command."""
    cfg = result["config"]
    ceil = result["ceiling"]
    lines = [f"{cfg['rows']:,} rows in {cfg['files']} files, batch {cfg['batch_size']}, {cfg['epochs']} "
             f"epochs per fit (steady = median of epochs 2..{cfg['epochs']}), {cfg['machine']['cpus']} CPUs, "
             f"daskfeed memory limit {cfg['memory_limit']}; load before/after: {cfg['load']}",
             f"order: {', '.join(cfg['order'])}"]
    if ceil:
        lines.append(f"ceiling (in-memory, A1+A2): epoch 1 from start {ceil['epoch1']:,.0f} rows/s, "
                     f"steady {ceil['steady']:,.0f} rows/s")
    lines += ["", f"{'method':<42} {'epoch 1':>10} {'×ceil':>6} {'steady':>10} {'×ceil':>6} "
                  f"{'×parse':>11} {'wait':>6} {'assembly':>8} {'peak GB':>7}",
              "-" * 114]
    for r in result["table"]:
        xp = r["x_parse"]
        xps = "/".join(_x(xp.get(k)) for k in ("epoch1", "steady") if xp.get(k) is not None) if xp else ""
        e1 = f"{r['epoch1_rows_per_s']:,.0f}" if r["epoch1_rows_per_s"] is not None else ""
        wait = f"{100 * r['data_wait_fraction']:.1f}%" if r["data_wait_fraction"] is not None else ""
        get = f"{100 * r['assembly_fraction']:.1f}%" if r["assembly_fraction"] is not None else ""
        lines.append(f"{r['label']:<42} {e1:>10} {_x(r['epoch1_x_ceiling']):>6} "
                     f"{r['steady_rows_per_s']:>10,.0f} {_x(r['steady_x_ceiling']):>6} {xps:>11} "
                     f"{wait:>6} {get:>8} {_gb(r['peak_rss_bytes']):>7}")
    m = result["methods"]
    if "in_memory_A1" in m and "in_memory_A2" in m:
        a1, a2 = (steady(m[k]["epochs"]) for k in ("in_memory_A1", "in_memory_A2"))
        lines.append(f"A-B-A drift: in-memory steady after / before daskfeed = {a2 / a1:.3f}"
                     + ("" if abs(a2 / a1 - 1) <= 0.1 else
                        " (over 10 %: the machine's load changed during the run; ratios are rough)"))
    if "daskfeed" in m:
        d = m["daskfeed"]
        total = d["epochs"][0]["seconds_from_start"]
        rest = total - d["cluster_start_seconds"] - d["scan_seconds"]
        lines.append(f"daskfeed epoch 1 from start {total:.1f}s = cluster "
                     f"{d['cluster_start_seconds']:.1f}s + scan {d['scan_seconds']:.1f}s + model and epoch "
                     f"{rest:.1f}s; "
                     f"{d['budget']['describe']}")
    if result["targets"]:
        lines += ["", "targets (issue 15):"]
        for t in result["targets"]:
            flag = "n/a " if t["pass"] is None else ("PASS" if t["pass"] else "FAIL")
            value = "—" if t["value"] is None else f"{t['value']:.2f}×"
            lines.append(f"  [{flag}] {t['description']}: {value}")
    s = result["sanity"]
    same = "yes" if s["rows_consistent"] else "NO " + json.dumps(s["rows"]) + json.dumps(s["rows_served"])
    lines += ["", f"sanity: rows the same in every method and epoch: {same}"
                  f"; {s['loss_compared'].replace('_', ' ')}es within 10 % of in-memory: "
                  f"{ {True: 'yes', False: 'NO', None: '—'}[s['losses_within_10pct']] }"]
    for k, v in s["losses"].items():
        val = f"{v['val_loss']:.4f}" if v["val_loss"] is not None else "—"
        lines.append(f"  {k:<20} train {v['train_loss']:.4f}  val {val}")
    code = cfg["machine"].get("code") or {}
    lines += ["", f"command: {cfg['command']}",
              f"code: {code.get('commit')}" + (f" + uncommitted {', '.join(code['uncommitted'])}"
                                               if code.get("uncommitted") else "")]
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: str) -> None:
    """``result`` as indented JSON at ``path`` (directories created)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


def write_png(result: dict[str, Any], path: str) -> None:
    """Bars of each method's epoch-1 and steady rows/s as a fraction of the in-memory ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["table"]
            if r["epoch1_x_ceiling"] is not None or r["steady_x_ceiling"] is not None]
    cfg = result["config"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.45 * len(rows) + 2), sharey=True)
    names = [r["label"] for r in rows]
    for ax, key, title in ((axes[0], "epoch1_x_ceiling", "epoch 1 from the method's start (raw CSV)"),
                           (axes[1], "steady_x_ceiling", "steady epochs (median of epochs 2..N)")):
        vals = [r[key] or 0.0 for r in rows]
        colors = ["#d62728" if r["method"] == "daskfeed" else
                  "#7f7f7f" if r["method"].startswith("in_memory") else "#1f77b4" for r in rows]
        ax.barh(names, vals, color=colors)
        ax.axvline(1.0, color="k", lw=0.8, ls="--")
        for y, (v, r) in enumerate(zip(vals, rows, strict=True)):
            rate = r["epoch1_rows_per_s"] if key.startswith("epoch1") else r["steady_rows_per_s"]
            if v:
                ax.text(v, y, f" {v:.2f}× ({rate / 1e3:,.0f}k/s)", va="center", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("rows/s ÷ in-memory ceiling (same run)")
        ax.set_xlim(0, max([*vals, 1.0]) * 1.45)
    axes[0].invert_yaxis()
    fig.suptitle(f"daskfeed bench: {cfg['rows']:,} rows, batch {cfg['batch_size']}, "
                 f"{cfg['machine']['cpus']} CPUs, memory limit {cfg['memory_limit']}", fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_scale(result: dict[str, Any]) -> str:
    """The scale run as text: rows/s and peak tree RSS per multiple of the data."""
    cfg = result["config"]
    lines = [f"daskfeed at {', '.join(f'{s}×' for s in cfg['scales'])} of {cfg['base_rows']:,} rows, "
             f"fixed memory limit {cfg['memory_limit']}, batch {cfg['batch_size']}, {cfg['epochs']} epochs",
             "", f"{'scale':>5} {'rows':>11} {'CSV GB':>7} {'CSV/budget':>10} {'epoch 1/s':>10} "
                 f"{'steady/s':>10} {'× 1× steady':>11} {'peak tree GB':>12} {'peak/budget':>11}",
             "-" * 96]
    base = None
    for r in result["scales"]:
        base = base or r["steady_rows_per_s"]
        lines.append(f"{r['scale']:>4}× {r['rows']:>11,} {r['data_bytes'] / 1e9:>7.2f} "
                     f"{r['data_bytes'] / r['budget_bytes']:>10.2f} {r['epoch1_rows_per_s']:>10,.0f} "
                     f"{r['steady_rows_per_s']:>10,.0f} {r['steady_rows_per_s'] / base:>11.2f} "
                     f"{r['peak_rss_bytes'] / 1e9:>12.2f} {r['peak_rss_bytes'] / r['budget_bytes']:>11.2f}")
    lines += ["", f"command: {cfg['command']}"]
    return "\n".join(lines)


def write_scale_png(result: dict[str, Any], path: str) -> None:
    """Steady rows/s and peak tree RSS against the multiple of the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = result["scales"]
    xs = [r["scale"] for r in rs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot(xs, [r["steady_rows_per_s"] for r in rs], "o-", label="steady")
    a.plot(xs, [r["epoch1_rows_per_s"] for r in rs], "s--", label="epoch 1 from start")
    a.set_xlabel("data (× base rows)")
    a.set_ylabel("rows/s")
    a.set_ylim(bottom=0)
    a.legend()
    b.plot(xs, [r["peak_rss_bytes"] / 1e9 for r in rs], "o-", label="peak tree RSS")
    b.axhline(rs[0]["budget_bytes"] / 1e9, color="k", ls="--", lw=0.8, label="memory limit")
    b.set_xlabel("data (× base rows)")
    b.set_ylabel("GB")
    b.set_ylim(bottom=0)
    b.legend()
    cfg = result["config"]
    fig.suptitle(f"daskfeed, fixed memory limit {cfg['memory_limit']}: base {cfg['base_rows']:,} rows",
                 fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
