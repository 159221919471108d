"""A self-contained HTML page: environment, findings, sections of images and tables, notes.

Everything from outside (host names, environment values, GPU names, findings) is escaped;
images are embedded as data URIs; the page loads nothing from the network.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

STYLE = ("body{font-family:sans-serif;max-width:72em;margin:2em auto}table{border-collapse:collapse;"
         "margin:1em 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
         ".kv td,.kv th,td.l{text-align:left}.finding{color:#a40}.mono{font-family:monospace}"
         "img{max-width:100%}")
ENV_KEYS = ("host", "nvidia_driver", "cuda_driver", "cuda_runtime", "nccl", "cublaslt", "torch", "mgpu_bench")


def image(name: str, png: bytes) -> str:
    return f"<p><img alt='{html.escape(name)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'></p>"


def images(pngs: Mapping[str, bytes], keys: Sequence[str] | None = None, grid: bool = False) -> str:
    """The PNGs (all, or those of `keys` that exist, in that order), side by side when `grid`."""
    names = list(pngs) if keys is None else [k for k in keys if k in pngs]
    body = "".join(image(k, pngs[k]) for k in names)
    return f"<div class=grid>{body}</div>" if grid and body else body


def ul(items: Sequence[object], cls: str = "") -> str:
    """A list of outside texts, escaped; "" for none."""
    if not items:
        return ""
    attr = f" class={cls}" if cls else ""
    return f"<ul{attr}>" + "".join(f"<li>{html.escape(str(i))}</li>" for i in items) + "</ul>"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], left: Sequence[int] = ()) -> str:
    """A table; cells are escaped; column indices in `left` are left-aligned."""
    e = html.escape
    head = "<tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td{' class=l' if i in left else ''}>{e(str(c))}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def page(title: str, environment: dict, findings: Sequence[str], sections: Sequence[tuple[str, str]],
         notes: Sequence[str] = (), stopped: str | None = None) -> str:
    """`sections`: (heading, trusted HTML built with image()/table()) pairs."""
    e = html.escape
    head = [f"<h1>{e(title)}</h1>", "<table class=kv>"]
    for key in ENV_KEYS:
        if key in environment:
            head.append(f"<tr><th>{e(key)}</th><td>{e(str(environment.get(key)))}</td></tr>")
    gpus = ", ".join(str(g.get("name")) for g in environment.get("gpus", []) if isinstance(g, dict))
    head.append(f"<tr><th>GPUs</th><td>{e(gpus)}</td></tr>")
    variables = " ".join(f"{k}={v}" for k, v in (environment.get("env") or {}).items())
    head.append(f"<tr><th>environment</th><td>{e(variables)}</td></tr></table>")
    head += [f"<p class=finding>finding: {e(f)}</p>" for f in findings]
    if stopped:
        head.append(f"<p class=finding>stopped early: {e(stopped)}</p>")
    body = [f"<h2>{e(h)}</h2>{content}" for h, content in sections]
    if notes:
        body.append("<h2>notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(head)}{''.join(body)}</body></html>")


_MD_SPECIAL = re.compile(r"([\\`\[\]<|])")


def md(text: object) -> str:
    """An outside string for Markdown: one line, with a backslash before what would start a
    link, an image, a code span or raw HTML, and before table pipes."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(md(c) for c in row) + " |" for row in rows)]


def write_bundle(out_dir: str | Path, images: dict[str, bytes], page_html: str, summary_md: str) -> list[Path]:
    """<name>.png per image, report.html and summary.md into out_dir (created; its parent must
    exist, FileNotFoundError otherwise); returns the paths in that order."""
    out = Path(out_dir)
    out.mkdir(exist_ok=True)
    written = []
    for name, png in images.items():
        p = out / f"{name}.png"
        p.write_bytes(png)
        written.append(p)
    (out / "report.html").write_text(page_html, encoding="utf-8")
    (out / "summary.md").write_text(summary_md, encoding="utf-8")
    return written + [out / "report.html", out / "summary.md"]
