"""fleet on the terminal: the ranked node table, then the pairings of the link pass."""

from __future__ import annotations

from collections.abc import Mapping

from .analyse import fmt, node_table
from .analyse import pct as _pct


def render_terminal(doc: Mapping, console) -> None:
    from rich.table import Table

    from mgpu_bench.output.tables import print_table

    verdicts = doc.get("verdicts") or {"suspects": [], "stats": {"gpu": {}}}
    rows = node_table(doc, verdicts)
    t = Table(title="Nodes, worst first: each node's weakest figure against the fleet median (same GPU model)",
              title_justify="left", pad_edge=False, box=None, header_style="bold")
    for name in ("node", "model", "of median", "deciding figure", "verdict"):
        t.add_column(name, justify="right" if name == "of median" else "left", overflow="fold")
    for r in rows:
        t.add_row(r["node"], str(r["model"] or "-"), _pct(r["ratio"]), r["deciding"], r["verdict"],
                  style="red" if r["suspect"] else None)
    print_table(console, t)
    pairs = doc.get("pairings") or []
    if pairs:
        names = {n["index"]: n["node"] for n in doc.get("nodes") or []}
        t = Table(title="Link pass: per pairing, the slowest rail's sendrecv and the pair's allreduce (busbw)",
                  title_justify="left", pad_edge=False, box=None, header_style="bold")
        for name in ("round", "pair", "rails", "slowest rail", "allreduce"):
            t.add_column(name, justify="left" if name == "pair" else "right")
        for p in pairs:
            rails = {r: f["busbw"] for r, f in (p.get("rails") or {}).items() if f.get("busbw")}
            low = min(rails, key=rails.get) if rails else None
            t.add_row(str(p["round"] + 1), f"{names.get(p['a'])} <-> {names.get(p['b'])}", str(len(rails)),
                      f"{low}: {fmt('sendrecv', rails[low])}" if low is not None else "-",
                      fmt("allreduce", (p.get("allreduce") or {}).get("busbw")))
        print_table(console, t)
    w = verdicts.get("world") or {}
    if w.get("busbw"):
        console.print(f"world allreduce {fmt('world', w['busbw'])} over {(doc.get('world') or {}).get('ranks')} ranks "
                      f"against {fmt('world', w.get('reference'))} between two nodes"
                      + ("; slow" if w.get("slow") else ""), highlight=False, soft_wrap=True)
