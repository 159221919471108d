"""A self-contained HTML page: environment, findings, sections of images and tables, notes.

Everything from outside (host names, environment values, GPU names, findings) is escaped, by
one function per medium, each the only way stored text reaches it:

    esc(text)   HTML: control characters (ESC, BEL, CR, C1, bidirectional overrides such as U+202E,
                lone surrogates) shown as their escapes (console.safe_text), then html.escape
    md(text)    Markdown: the same escapes, one line, a backslash before every character that
                Markdown would read as syntax (** _ ` [ ] < > | # ~ &, and a leading - + = or 1.)

(matplotlib text: plotting.plain; the terminal: console.safe_text; Prometheus label values:
prometheus.escape_value.) Images are embedded as data URIs; the page loads nothing from the
network.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from mgpu_bench.results.probe import SEVERITIES

# The one page layout: a centred column with room on both sides however narrow the window
# (margin:auto alone leaves none once the window is narrower than max-width), wide tables
# scrolling inside it; findings tagged by severity as the suite page shows them.
STYLE = ("body{font-family:sans-serif;max-width:72em;margin:2em auto;padding:0 1.5em}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
         ".kv td,.kv th,td.l{text-align:left}.finding{color:#a40}.mono{font-family:monospace}"
         "img{max-width:100%}.wide{overflow-x:auto}.wide table{margin:0}.sub{color:#555}"
         "ul.findings{list-style:none;padding:0}ul.findings li{margin:4px 0;padding:4px 8px}"
         ".problem{background:#fdecea;border-left:6px solid #c62828}"
         ".warning{background:#fff8e1;border-left:6px solid #f9a825}"
         ".ok{background:#edf7ed;border-left:6px solid #2e7d32}"
         ".tag{font-weight:bold;font-family:monospace;display:inline-block;min-width:6.5em}"
         ".verdict{font-size:1.15em;padding:8px 10px;margin:8px 0}")
ENV_KEYS = ("host", "nvidia_driver", "cuda_driver", "cuda_runtime", "nccl", "cublaslt", "torch", "mgpu_bench")
# The GPU stack's versions: left out of a CPU run's header, where none of it was used (the
# native library still reports the NCCL and CUDA runtime it was built with).
GPU_STACK = ("nvidia_driver", "cuda_driver", "cuda_runtime", "nccl", "torch_nccl", "cublaslt")


def esc(text: object) -> str:
    """Outside text for HTML: every control character a terminal would obey (`cat report.html`) or
    that reorders a line shown as its escape (console.safe_text; newlines and tabs kept, which HTML
    shows as spaces), then html.escape with quotes, so that it is text in an element or an
    attribute, never markup."""
    from .console import safe_text

    return html.escape(safe_text(text, lines=True), quote=True)


def image(name: str, png: bytes) -> str:
    return f"<p><img alt='{esc(name)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'></p>"


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
    return f"<ul{attr}>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], left: Sequence[int] = ()) -> str:
    """A table; cells are escaped; column indices in `left` are left-aligned."""
    e = esc
    head = "<tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td{' class=l' if i in left else ''}>{e(str(c))}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _given(value: object) -> bool:
    """A value worth a row: not None, not empty, not the text 'None'."""
    return value is not None and str(value).strip() not in ("", "None") and value != [] and value != {}


def gpu_names(environment: Mapping) -> str:
    """The GPUs' names, one per GPU ("" when none is recorded)."""
    return ", ".join(str(g.get("name")) for g in environment.get("gpus") or []
                     if isinstance(g, dict) and _given(g.get("name")))


def ran_on_cpu(environment: Mapping, processes: object = None, backend: str = "gloo") -> str:
    """The plain sentence for a run on CPU processes (`processes`: how many, where known: a
    number or a text such as "1, 2")."""
    who = "CPU processes" if not processes else "1 CPU process" if str(processes) == "1" else \
        f"{processes} CPU processes"
    seen = " (none visible on this host)" if environment.get("gpus") == [] else ""
    return f"{who} (torch.distributed, {backend}); no GPU was used{seen}"


def environment_rows(environment: Mapping, keys: Sequence[str] = ENV_KEYS,
                     cpu: str | None = None) -> list[tuple[str, str]]:
    """(name, value) for the header: only the keys with a value, the GPUs where there are any,
    the allow-listed environment variables where set. `cpu`: the run was on CPU processes, and
    this says so (ran_on_cpu()) in place of the GPU stack's versions; without it, an environment
    that recorded no GPU says that."""
    rows = [(k, str(environment[k])) for k in keys if _given(environment.get(k)) and not (cpu and k in GPU_STACK)]
    gpus = gpu_names(environment)
    if cpu:
        rows.append(("ran on", cpu))
    elif gpus:
        rows.append(("GPUs", gpus))
    elif environment.get("gpus") == []:
        rows.append(("ran on", "no GPU visible on this host"))
    env = environment.get("env")
    variables = " ".join(f"{k}={v}" for k, v in env.items()) if isinstance(env, Mapping) else ""
    if variables:
        rows.append(("environment", variables))
    return rows


def environment_table(environment: Mapping, keys: Sequence[str] = ENV_KEYS, cpu: str | None = None) -> str:
    """environment_rows() as a two-column table; "" when there is nothing to show."""
    e = esc
    rows = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in environment_rows(environment, keys, cpu))
    return f"<table class=kv>{rows}</table>" if rows else ""


def findings_list(findings: Sequence[object]) -> str:
    """Findings that carry a severity (probe.Finding), tagged and problems first, as the suite
    page lists them; plain texts as "finding: ..." lines after them. "" for none."""
    e = esc
    tagged = sorted((f for f in findings if getattr(f, "severity", None) in SEVERITIES),
                    key=lambda f: SEVERITIES.index(f.severity))
    out = "".join(f"<li class={f.severity}><span class=tag>{f.severity.upper()}</span>{e(str(f.text))}</li>"
                  for f in tagged)
    out = f"<ul class=findings>{out}</ul>" if out else ""
    return out + "".join(f"<p class=finding>finding: {e(str(getattr(f, 'text', f)))}</p>"
                         for f in findings if getattr(f, "severity", None) not in SEVERITIES)


def wide(content: str) -> str:
    """A block (a wide table) that scrolls sideways inside the page instead of widening it."""
    return f"<div class=wide>{content}</div>"


def page(title: str, environment: dict, findings: Sequence[object], sections: Sequence[tuple[str, str]],
         notes: Sequence[str] = (), stopped: str | None = None, *, summary: str = "",
         keys: Sequence[str] = ENV_KEYS, cpu: str | None = None) -> str:
    """The title, then what the run found (`summary`: trusted HTML; `findings`: texts or
    probe.Finding, findings_list(); where it stopped early), then the environment table, then
    `sections`: (heading, trusted HTML built with image()/table()) pairs, then the notes.
    `cpu`: the run was on CPU processes (ran_on_cpu())."""
    e = esc
    head = [f"<h1>{e(title)}</h1>", summary, findings_list(findings)]
    if stopped:
        head.append(f"<p class=finding>stopped early: {e(stopped)}</p>")
    head.append(environment_table(environment, keys, cpu))
    body = [f"<h2>{e(h)}</h2>{content}" for h, content in sections]
    if notes:
        body.append("<h2>notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(head)}{''.join(body)}</body></html>")


def environment_markdown(environment: Mapping, keys: Sequence[str] = ENV_KEYS, cpu: str | None = None) -> str:
    """environment_rows() but the variables, as one Markdown list line."""
    return "- " + "; ".join(f"{k}: {md(v)}" for k, v in environment_rows(environment, keys, cpu)
                            if k != "environment")


# What Markdown reads as syntax anywhere in a line: emphasis (* _ ~), code (`), links and images
# ([ ]), raw HTML and autolinks (<), table cells (|), entities (&) and the escape itself; and at
# the start of a line only: a heading (# ), a block quote (>), a list item (- + or 1. followed by
# a space) or a setext rule (= ). CommonMark lets a backslash escape any ASCII punctuation
# character. A lone "-" (a table cell's "no figure") is left as it is.
_MD_SPECIAL = re.compile(r"([\\`*_~\[\]<|&])")
_MD_LEADING = re.compile(r"^(?:(\d{1,9})([.)])(?=\s)|([-+=])(?=\s)|(#{1,6})(?=\s|$)|(>))")


def _md_lead(m: re.Match) -> str:
    if m.group(1):
        return f"{m.group(1)}\\{m.group(2)}"
    return "\\" + m.group(0)


def md(text: object) -> str:
    """An outside string for Markdown: one line, control characters shown as their escapes
    (console.safe_text, so `cat summary.md` never obeys one), and a backslash before every
    character Markdown would read as syntax (_MD_SPECIAL, _MD_LEADING): a stored **x** is shown as
    **x**, never bold; a stored [a](b) never becomes a link, <b> never an element."""
    from .console import safe_text

    line = _MD_SPECIAL.sub(r"\\\1", safe_text(" ".join(str(text).split())))
    return _MD_LEADING.sub(_md_lead, line)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(md(c) for c in row) + " |" for row in rows)]


def write_bundle(out_dir: str | Path, images: dict[str, bytes], page_html: str, summary_md: str) -> list[Path]:
    """<name>.png per image, report.html and summary.md into out_dir (created; its parent must
    exist, FileNotFoundError otherwise); returns the paths in that order. Each file is written by
    paths.write_output (replaced atomically, through a symbolic link, never over a FIFO)."""
    from mgpu_bench.core.paths import write_output
    from mgpu_bench.results.schema import file_stem

    out = Path(out_dir)
    out.mkdir(exist_ok=True)
    written = []
    for name, png in images.items():
        p = out / f"{file_stem(name)}.png"  # names come from documents (an op, a dtype): never a path
        write_output(p, png)
        written.append(p)
    write_output(out / "report.html", page_html)
    write_output(out / "summary.md", summary_md)
    return written + [out / "report.html", out / "summary.md"]
