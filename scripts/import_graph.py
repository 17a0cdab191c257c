"""Figures of daskfeed's import graph: modules, arrows, levels, circles; and between subpackages.

    .venv/bin/python scripts/import_graph.py [ROOT]

ROOT: a checkout holding ``daskfeed/`` (default: this one). grimp comes with the ``lint`` extra.
TYPE_CHECKING imports count. Levels: the longest chain of imports after each circle is merged.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache

LAYERS = ["cli", "training", "checkpoint", "inference", "adapters", "batches", "scanning",
          "manifest", "cache", "reading", "cluster", "dashboard", "core"]


def _levels(nodes: list[str], edges: set[tuple[str, str]]) -> tuple[int, list[list[str]]]:
    """The longest chain after merging circles (Tarjan), and the circles."""
    sys.setrecursionlimit(10_000)
    adj = {n: [t for s, t in edges if s == n] for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(comp)

    for n in nodes:
        if n not in index:
            strong(n)
    comp_of = {n: i for i, c in enumerate(comps) for n in c}
    cadj: dict[int, set[int]] = {}
    for s, t in edges:
        if comp_of[s] != comp_of[t]:
            cadj.setdefault(comp_of[s], set()).add(comp_of[t])

    @lru_cache(None)
    def depth(i: int) -> int:
        return 1 + max((depth(j) for j in cadj.get(i, ())), default=0)

    return max(depth(i) for i in range(len(comps))), [sorted(c) for c in comps if len(c) > 1]


def main(root: str) -> dict[str, object]:
    """The figures of the checkout at ``root`` (a JSON-ready dict)."""
    sys.path.insert(0, root)
    import grimp

    g = grimp.build_graph("daskfeed", cache_dir=None)
    mods = sorted(g.modules)
    edges = {(m, t) for m in mods for t in g.find_modules_directly_imported_by(m)
             if t.startswith("daskfeed") and t != m}
    levels, circles = _levels(mods, edges)
    pkg = {m: m.split(".")[1] if "." in m else "(top)" for m in mods}
    between = {(pkg[s], pkg[t]) for s, t in edges if pkg[s] != pkg[t] and "(top)" not in (pkg[s], pkg[t])}
    rank = {p: i for i, p in enumerate(LAYERS)}
    upward = sorted((s, t) for s, t in between if s in rank and t in rank and rank[t] <= rank[s]
                    and {s, t} != {"cluster", "dashboard"})
    plevels, _ = _levels([p for p in LAYERS if p in set(pkg.values())], between)
    return {"modules": len(mods), "arrows": len(edges), "levels": levels, "circles": circles,
            "subpackages": len(set(pkg.values()) - {"(top)"}), "arrows_between": len(between),
            "upward_between": upward, "levels_between": plevels}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "."), indent=1))
