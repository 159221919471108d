"""check's report folder (`--report DIR`, `mgpu-bench report rN`): report.html and summary.md with
the verdict and its findings (the processes found on the GPUs among them), one row per part with
its figures or why it was skipped, the floors and how each was derived, and what the figures were
judged against. No plots: a check is a handful of figures."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mgpu_bench.output import html_page
from mgpu_bench.results.probe import Finding

from .analyse import OK, floor_lines
from .render import _figures

HEADERS = ["part", "status", "s", "figures, or why"]


def _rows(doc: Mapping) -> list[list[object]]:
    rows = []
    for p in doc.get("parts") or []:
        what = _figures(p) if p["status"] == "measured" else str(p.get("why") or "")
        if p["status"] != "measured" and p.get("figures"):
            what = f"{_figures(p)}; {what}"
        rows.append([p["part"], p["status"], f"{p.get('seconds', 0.0):.1f}", what or "-"])
    return rows


def _findings(doc: Mapping) -> list[Finding]:
    v = doc.get("verdict") or {}
    out = [Finding(f["severity"], f["text"]) for f in v.get("findings") or []]
    if v.get("state") == OK:
        out.append(Finding(OK, f"{doc.get('node')}: ok: {', '.join(v.get('judged') or [])} judged"))
    elif v.get("state") == "unknown" and v.get("fix"):
        out.append(Finding("warning", f"{doc.get('node')}: cannot tell: {v['fix']}"))
    return out


def _judged(doc: Mapping) -> str:
    ref = doc.get("reference")
    return f"judged against {ref['label']}" if ref else "judged against the floors alone (no reference stored " \
                                                         "for this node)"


def _title(doc: Mapping) -> str:
    v = doc.get("verdict") or {}
    return (f"mgpu-bench check of {doc.get('node')}: {v.get('state', 'unknown')} in "
            f"{doc.get('wall_seconds') or 0.0:.1f} s of --budget {doc.get('budget_s', 0):g}s")


def page(doc: Mapping, environment: dict) -> str:
    e = html_page.esc
    v = doc.get("verdict") or {}
    sections = [("parts", html_page.wide(html_page.table(HEADERS, _rows(doc), left=(0, 1, 3))))]
    lines = floor_lines(v.get("floors") or []) + [_judged(doc)]
    sections.append(("floors and reference", "<ul>" + "".join(f"<li>{e(x)}</li>" for x in lines) + "</ul>"))
    return html_page.page(_title(doc), environment, _findings(doc), sections, doc.get("notes") or [])


def markdown(doc: Mapping, environment: dict) -> str:
    md = html_page.md
    v = doc.get("verdict") or {}
    lines = [f"# {md(_title(doc))}", "", html_page.environment_markdown(environment), ""]
    lines += [f"- {f.severity}: {md(f.text)}" for f in _findings(doc)]
    lines += ["", *html_page.md_table(HEADERS, _rows(doc)), ""]
    lines += [f"- {md(x)}" for x in floor_lines(v.get("floors") or []) + [_judged(doc)]]
    lines += [f"- note: {md(n)}" for n in doc.get("notes") or []]
    return "\n".join(lines) + "\n"


def write_report(doc: Mapping, out_dir: str | Path, environment: dict) -> list[Path]:
    return html_page.write_bundle(out_dir, {}, page(doc, environment), markdown(doc, environment))


def section(doc: Mapping, pngs: dict[str, bytes]) -> str:
    """The check's part of a suite page: its parts table and the floors."""
    e = html_page.esc
    v = doc.get("verdict") or {}
    return (html_page.wide(html_page.table(HEADERS, _rows(doc), left=(0, 1, 3))) + "<ul>"
            + "".join(f"<li>{e(x)}</li>" for x in floor_lines(v.get("floors") or []) + [_judged(doc)]) + "</ul>")
