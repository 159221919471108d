"""MkDocs hook: the parts of the docs that come from the tool itself, made at build time.

- `::: options COMMAND [SUBCOMMAND]` on a line of its own becomes that command's reference: its
  usage, its help and a table of its options, from the CLI's own click definitions (the same
  text `mgpu-bench COMMAND --help` prints, defaults included). A group (`::: options history`)
  gives every one of its commands. The build fails when a command of the CLI has no such line on
  any page, or a line names a command the CLI does not have.
- `::: include PATH` on a line of its own is replaced by that file of the repository (PATH from
  the folder of mkdocs.yml): benchmarks/RESULTS.md is shown as it is, never copied by hand.
- `::: layout` on a line of its own becomes the picture of the package's layout and its table
  (docs/hooks/layout.py reads the import graph: the same reader tests/test_layers.py uses). The
  picture is drawn at every build and served as assets/layout.svg; the build fails when the code
  breaks the layer order (an import cycle between folders, an import pointing up the order, a
  folder the order does not place).
- The pictures: `mgpu-bench report` draws the result documents of tests/fixtures (REPORTS) into a
  temporary folder, and every PNG and HTML page it writes is served under assets/report/NAME/;
  the shipped configurations of mgpu_bench/data (Grafana, NHC, node-problem-detector) are served
  under assets/data/. A page that links to a picture the tool no longer draws fails the build.

The package never imports mkdocs; this file imports the package (from the tree beside mkdocs.yml
when it is not installed).
"""

from __future__ import annotations

import contextlib
import html
import importlib.util
import inspect
import io
import re
import shutil
import sys
import tempfile
from pathlib import Path

import layout  # docs/hooks/layout.py: MkDocs puts this folder on the path while it loads the hook
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

# assets/report/NAME/ <- `mgpu-bench report FIXTURE`
REPORTS = {
    "comm": "tests/fixtures/comm_2x_h200.json",  # 2x H200, every collective, 1 MiB - 1 GiB
    "suite": "tests/fixtures/gpu/suite-quick-1xh200.json",  # the GPU smoke run's `suite --quick`, 1x H200
}
SERVED = (".png", ".html", ".json")  # what a report folder holds that the site serves (not summary.md)
DATA = ("grafana", "nhc", "npd")  # folders of mgpu_bench/data served under assets/data/

LAYOUT_SVG = "assets/layout.svg"  # the layout's picture, served from here

DIRECTIVE = re.compile(r"^::: (options|include|layout)(?: (.*))?$")
_state: dict = {}


def _root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def on_config(config):
    root = _root(config)
    if importlib.util.find_spec("mgpu_bench") is None:  # not installed: the tree the docs sit in
        sys.path.insert(0, str(root))
    return config


# -- the command reference --------------------------------------------------------------------


def _cli():
    from mgpu_bench.cli import cli

    return cli


def _walk(cmd, path=()):
    """(path, command) for every command under `cmd`, groups before their commands."""
    import click

    yield path, cmd
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.commands):
            yield from _walk(cmd.commands[name], (*path, name))


def _resolve(words: tuple[str, ...]):
    """The click command and context at `words` ("history", "add"), or PluginError."""
    import click

    cli = _cli()
    ctx = click.Context(cli, info_name="mgpu-bench", **cli.context_settings)  # -h/--help as the CLI has it
    cmd = cli
    for word in words:
        sub = cmd.commands.get(word) if isinstance(cmd, click.Group) else None
        if sub is None:
            raise PluginError(f"::: options {' '.join(words)}: mgpu-bench has no command {word!r} there")
        ctx = click.Context(sub, info_name=word, parent=ctx)
        cmd = sub
    return cmd, ctx


def _inline(text: str) -> str:
    """Help text as HTML: escaped, `code` as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


def _help_html(text: str) -> str:
    """click's help text: paragraphs, and the ones click keeps as written (a `\\b` line first) as
    preformatted text; anything after `\\f` is not help."""
    text = inspect.cleandoc(text or "").split("\f")[0]
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = para.splitlines()
        if lines and lines[0].strip() == "\b":
            out.append("<pre><code>" + html.escape("\n".join(lines[1:])) + "</code></pre>")
        elif para.strip():
            out.append("<p>" + _inline(" ".join(line.strip() for line in lines)) + "</p>")
    return "\n".join(out)


def _command_markdown(words: tuple[str, ...], level: int) -> str:
    import click

    cmd, ctx = _resolve(words)
    usage = " ".join([ctx.command_path, *cmd.collect_usage_pieces(ctx)])
    parts = []
    if level:
        parts.append(f"{'#' * level} `{ctx.command_path}`\n")
    parts.append(f'<pre class="mgpu-usage"><code>{html.escape(usage)}</code></pre>')
    parts.append(_help_html(cmd.help))
    rows = []
    for param in cmd.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None or isinstance(param, click.Argument):  # arguments: named in the usage line
            continue
        flags, text = record
        rows.append(f"<tr><td><code>{html.escape(flags)}</code></td><td>{_inline(text)}</td></tr>")
    if rows:
        parts.append('<div class="mgpu-options"><table><thead><tr><th>option</th><th>what it does</th></tr></thead>'
                     "<tbody>" + "".join(rows) + "</tbody></table></div>")
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.commands):
            parts.append(_command_markdown((*words, name), max(level, 2) + 1))
    return "\n\n".join(parts) + "\n"


def _options(words: tuple[str, ...]) -> str:
    return "*Generated from the CLI's own definitions: the same text as `--help`.*\n\n" + _command_markdown(words, 0)


# -- pictures and shipped files ----------------------------------------------------------------


def _report(src: Path, out: Path) -> None:
    """`mgpu-bench report SRC --out OUT`, run in this process as the command line runs it."""
    cli = _cli()
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
        code = cli.main(["report", str(src), "--out", str(out)], prog_name="mgpu-bench", standalone_mode=False)
    if code != 0:
        raise PluginError(f"mgpu-bench report {src} exited {code}: {captured.getvalue().strip()}")


# -- the package's layout ------------------------------------------------------------------------


def _layout_markdown(page) -> str:
    """The picture (from the page's folder to the served SVG) and the table under it."""
    read = _state["layout"]
    src = "../" * page.file.src_uri.count("/") + LAYOUT_SVG
    alt = "The folders of mgpu_bench as layers, the top one first, and the imports between them"
    return ("*Drawn from the code at every build of this site (`docs/hooks/layout.py` reads the import graph): "
            "a box per folder, the top layer first, each file with its lines; an arrow from a folder to each one it "
            "imports, lazy imports included, wider the more imports it stands for (open the picture for each "
            "arrow's count and examples). The build fails when an arrow would point up.*\n\n"
            f"[![{alt}]({src}){{ .mgpu-picture }}]({src})\n\n"
            "The folders from the bottom layer up:\n\n" + layout.table(read))


def on_files(files, config):
    root = _root(config)
    # The layout first: a package that breaks its layer order stops the build before anything is drawn.
    try:
        read = layout.read(root / "mgpu_bench")
        picture = layout.svg(read)
    except layout.LayoutError as exc:
        raise PluginError(str(exc)) from None
    _state["layout"] = read
    files.append(File.generated(config, LAYOUT_SVG, content=picture))
    # Every command of the CLI has a page: the `::: options` lines of all pages cover them.
    covered = set()
    for f in files.documentation_pages():
        for line in Path(f.abs_src_path).read_text(encoding="utf-8").splitlines():
            m = DIRECTIVE.match(line)
            if m and m.group(1) == "options":
                words = tuple((m.group(2) or "").split())
                cmd, _ = _resolve(words)
                covered |= {(*words, *p) for p, _ in _walk(cmd)}
    missing = [" ".join(p) for p, _ in _walk(_cli()) if p and p not in covered]
    if missing:
        raise PluginError("commands with no reference on any page (add a `::: options ...` line): "
                          + ", ".join(missing))

    tmp = Path(tempfile.mkdtemp(prefix="mgpu-bench-docs-"))
    _state["tmp"] = tmp
    for name, fixture in REPORTS.items():
        _report(root / fixture, tmp / name)
        for p in sorted((tmp / name).iterdir()):
            if p.suffix in SERVED:
                files.append(File.generated(config, f"assets/report/{name}/{p.name}", abs_src_path=str(p)))
    import mgpu_bench

    data = Path(mgpu_bench.__file__).parent / "data"  # the package data, as installed
    for folder in DATA:
        for p in sorted((data / folder).iterdir()):
            if p.is_file():
                files.append(File.generated(config, f"assets/data/{folder}/{p.name}", abs_src_path=str(p)))
    return files


def on_page_markdown(markdown, page, config, files):
    root = _root(config)
    out = []
    for line in markdown.splitlines():
        m = DIRECTIVE.match(line)
        if not m:
            out.append(line)
        elif m.group(1) == "options":
            out.append(_options(tuple((m.group(2) or "").split())))
        elif m.group(1) == "layout":
            out.append(_layout_markdown(page))
        else:
            path = (root / (m.group(2) or "")).resolve()
            if root not in path.parents or not path.is_file():
                raise PluginError(f"{page.file.src_uri}: ::: include {m.group(2)}: no such file in the repository")
            out.append(path.read_text(encoding="utf-8"))
    return "\n".join(out) + "\n"


def on_post_build(config):
    tmp = _state.pop("tmp", None)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
