"""check on the terminal: one row per part (what it measured, or why it was skipped), the floors
and how each was derived, what the figures were judged against, and the closing line."""

from __future__ import annotations

from collections.abc import Mapping

from .analyse import SHORT, _label, floor_lines, fmt


def _figures(part: Mapping) -> str:
    return ", ".join(f"{_label(f['device'])} {SHORT[f['kind']]} {fmt(f['kind'], f['value'])}"
                     for f in part.get("figures") or [])


def render_terminal(doc: Mapping, console) -> None:
    from rich.table import Table

    from mgpu_bench.output.console import safe_text
    from mgpu_bench.output.tables import print_table

    t = Table(title=f"check of {safe_text(doc.get('node'))}: {len(doc.get('devices') or [])} device(s)",
              title_justify="left")
    for col in ("part", "status", "s", "figures, or why"):
        t.add_column(col, justify="right" if col == "s" else "left")
    for p in doc.get("parts") or []:
        what = _figures(p) if p["status"] == "measured" else safe_text(p.get("why") or "")
        if p["status"] != "measured" and p.get("figures"):
            what = f"{_figures(p)}; {what}"
        t.add_row(p["part"], p["status"], f"{p.get('seconds', 0.0):.1f}", what or "-")
    print_table(console, t)
    v = doc.get("verdict") or {}
    for line in floor_lines(v.get("floors") or []):
        console.print(line, highlight=False, soft_wrap=True)
    ref = doc.get("reference")
    console.print(f"judged against {ref['label']}" if ref else "judged against the floors alone (no reference "
                  "stored for this node)", highlight=False, soft_wrap=True)
    state = v.get("state", "unknown")
    wall = doc.get("wall_seconds") or 0.0
    from .budget import command_age_s

    age = command_age_s(float(doc.get("budget_s") or 0.0))  # drawn by the check itself: its whole time so far
    when = f"{age:.1f} s ({wall:.1f} s of it measuring)" if age is not None and age > wall else f"{wall:.1f} s"
    tail = {"ok": f"{', '.join(v.get('judged') or [])} judged", "problem": v.get("reason") or "",
            "unknown": v.get("fix") or ""}[state]
    console.print(f"check {safe_text(doc.get('node'))}: {state} in {when} of --budget {doc.get('budget_s', 0):g}s: "
                  f"{safe_text(tail)}", highlight=False, soft_wrap=True)
