"""The documentation a user reads: every fenced `mgpu-bench ...` command line of README.md and
docs/ parses with the CLI's own click definitions (nothing is run), the README stays short and
its links resolve, the site builds with `mkdocs build --strict`, every link and picture of the
built site resolves and nothing is loaded from the network, and headless Chromium shows the
index and a command page with their navigation and the report picture.

benchmarks/RESULTS.md, which the Results page includes as it is, is a dated log of what was run
then: its command lines are not held to today's options."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SHELL = {"sh", "bash", "shell", "console"}
PNG = b"\x89PNG\r\n\x1a\n"


def sources() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


# -- the examples ----------------------------------------------------------------------------


def fences(text: str) -> list[tuple[str, int, list[str]]]:
    """(language, first line number, lines) of every fenced block (``` or ~~~, indented or not)."""
    out, current = [], None
    for number, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", line)
        if current is None and m:
            current = (m.group(2), m.group(3).lower(), number + 1, [], len(m.group(1)))
        elif current is not None and m and m.group(2).startswith(current[0]) and not m.group(3):
            out.append((current[1], current[2], current[3]))
            current = None
        elif current is not None:
            current[3].append(line[current[4]:] if line[:current[4]].strip() == "" else line)
    assert current is None, f"a fence opened on line {current[2] - 1} is never closed"
    return out


def _is_program(tokens: list[str], i: int) -> bool:
    """tokens[i] starts mgpu-bench: the script (by any path) or `python -m mgpu_bench.cli`."""
    return tokens[i].rsplit("/", 1)[-1] == "mgpu-bench" or (
        tokens[i] == "mgpu_bench.cli" and i > 0 and tokens[i - 1] == "-m")


def commands(lines: list[str]) -> list[tuple[int, list[str]]]:
    """(line offset, the arguments after the program) of every mgpu-bench command in shell lines:
    continuation lines joined, comments, redirections and what follows a control operator
    (|, &&, ||, ;) of the shell left out."""
    out, offset, logical, start = [], 0, "", 0
    for offset, line in enumerate(lines):
        if not logical:
            start = offset
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        logical += line
        text, logical = re.sub(r"(?<!\S)\d*[<>]{1,2}&?\s*\S+", " ", logical), ""  # 2>&1, >/dev/null
        lex = shlex.shlex(text, posix=True, punctuation_chars=";&|")
        lex.whitespace_split = True
        tokens, command = list(lex), []
        for token in [*tokens, ";"]:
            if token in {";", "&", "&&", "|", "||", ";;"}:
                at = next((i for i in range(len(command)) if _is_program(command, i)), None)
                if at is not None:
                    out.append((start, command[at + 1:]))
                command = []
            else:
                command.append(token)
    return out


def examples() -> list[tuple[str, list[str]]]:
    """("file:line", arguments) of every mgpu-bench command line in a fence of README.md and docs/:
    all of them in shell fences, and in other fences a line that starts with the program (after a
    `$ ` or `# name: ` prompt, as the Python example's comment has it)."""
    out = []
    for path in sources():
        for lang, first, lines in fences(path.read_text(encoding="utf-8")):
            where = f"{path.relative_to(ROOT)}:{first}"
            if lang in SHELL:
                out += [(f"{path.relative_to(ROOT)}:{first + n}", args) for n, args in commands(lines)]
                continue
            for n, line in enumerate(lines):
                m = re.match(r"^\s*(?:[$#]\s*)?(?:[\w.-]+:\s+)?(mgpu-bench\s.*)$", line)
                if m:
                    out += [(f"{where.rsplit(':', 1)[0]}:{first + n}", args) for _, args in commands([m.group(1)])]
    return out


def parse(args: list[str]) -> str:
    """`mgpu-bench ARGS` resolved and parsed by the CLI's own click definitions, as click does it
    before it calls a command (make_context with resilient_parsing off: every option, choice and
    value type checked), stopping before any callback; the command's path. A usage error raises."""
    from mgpu_bench.cli import cli

    cmd, name, parent, args = cli, "mgpu-bench", None, list(args)
    while True:
        try:
            ctx = cmd.make_context(name, args, parent=parent, resilient_parsing=False)
        except click.exceptions.Exit as stop:  # --help or --version (eager) exit 0; a group alone prints its help, 2
            if stop.exit_code != 0:
                raise click.UsageError(f"exits {stop.exit_code} before it runs (a group without a command)") from None
            return " ".join([*(parent.command_path.split() if parent else []), name])
        if not isinstance(cmd, click.Group):
            return ctx.command_path
        protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args  # click < 8.2
        rest = [*protected, *ctx.args]
        if not rest:
            raise click.UsageError("a command is missing", ctx)
        name, cmd, args = cmd.resolve_command(ctx, rest)
        parent = ctx


def test_fences_and_commands_are_read_as_the_shell_reads_them():
    block = [
        "```sh",
        "srun --nodes 2 mgpu-bench fleet --drain \\",
        "    --exclude-file drain.txt   # a comment",
        "exec /opt/mgpu-bench/bin/mgpu-bench check --budget 20s >/dev/null 2>&1",
        "torchrun --nproc-per-node 8 -m mgpu_bench.cli comm --json run.json | tee log && echo done",
        "sbatch --exclude=\"$(cat drain.txt)\" train.sbatch",
        "```",
        "   ```",
        "   mgpu-bench in an output block is text",
        "   ```",
    ]
    (lang, first, lines), (other, _, text_lines) = fences("\n".join(block))
    assert (lang, first, other) == ("sh", 2, "") and text_lines == ["mgpu-bench in an output block is text"]
    assert commands(lines) == [
        (0, ["fleet", "--drain", "--exclude-file", "drain.txt"]),
        (2, ["check", "--budget", "20s"]),
        (3, ["comm", "--json", "run.json"]),
    ]


def test_the_parser_refuses_what_the_cli_refuses():
    assert parse(["comm", "--sizes", "1M-1G", "--backend", "torch"]) == "mgpu-bench comm"
    assert parse(["history", "prune", "--keep", "100", "--kind", "gemm", "--drop-samples"]) == "mgpu-bench history prune"
    assert parse(["comm", "--help"]) == "mgpu-bench comm"
    for bad in (["comm", "--no-such-option"], ["comm", "--backend", "cuda"], ["comm", "--iters", "many"],
                ["no-such-command"], ["history"], ["report"], ["compare", "r1", "r2"]):
        with pytest.raises(click.UsageError):
            parse(bad)


def test_every_documented_command_line_parses():
    found = examples()
    assert len(found) >= 80, len(found)  # the tours, the recipes, every command page's examples
    failed = []
    for where, args in found:
        try:
            parse(args)
        except click.UsageError as exc:
            failed.append(f"{where}: mgpu-bench {shlex.join(args)}: {exc.format_message()}")
    assert not failed, "examples the CLI no longer takes:\n" + "\n".join(failed)
    # Every command of the CLI is shown at least once in an example.
    from mgpu_bench.cli import cli

    def leaves(cmd, path):
        if isinstance(cmd, click.Group):
            return [leaf for name, sub in sorted(cmd.commands.items()) for leaf in leaves(sub, f"{path} {name}")]
        return [path]

    shown = {parse(args) for _, args in found}
    assert set(leaves(cli, "mgpu-bench")) - shown == set()


# -- the README ------------------------------------------------------------------------------


def _following(path: Path, line_text: str) -> tuple[list[str], list[str]]:
    """The shell fence of `path` that holds `line_text`, and the output fence right after it."""
    blocks = fences(path.read_text(encoding="utf-8"))
    for i, (lang, _, lines) in enumerate(blocks):
        if lang in SHELL and line_text in lines:
            return lines, blocks[i + 1][2] if i + 1 < len(blocks) else []
    raise AssertionError(f"{path.name} has no shell fence with {line_text!r}")


@pytest.mark.parametrize("page", ["README.md", "docs/commands/side-by-side.md"])
def test_the_side_by_side_lines_run_as_written_from_the_checkout(page, tmp_path):
    """The README's `history add --join` line named logs that are not where the reader stands (they
    are under tests/fixtures/nccl-tests/): the block is run as written, by bash (its glob
    expanded as a reader's shell expands it), from a folder that sees the checkout's tests/ as the
    checkout's root does, with a history of its own: every line exits 0, and the output the page
    shows after it is what side-by-side prints (but the import's own time)."""
    lines, shown = _following(ROOT / page, "mgpu-bench side-by-side r1 r2 --report side-by-side/")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    env = {**os.environ, "MGPU_BENCH_DB": str(tmp_path / "history.db"), "PYTHONPATH": str(ROOT),
           "CUDA_VISIBLE_DEVICES": ""}
    # `mgpu-bench` as the script a reader has installed: the package of this checkout
    script = f'mgpu-bench() {{ {shlex.quote(sys.executable)} -m mgpu_bench.cli "$@"; }}\nset -e\n' + "\n".join(lines)
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
                       check=False)
    assert r.returncode == 0, f"{page}'s lines as written: exit {r.returncode}\n{r.stderr[-3000:]}"
    assert "stored r1" in r.stdout and "stored r2" in r.stdout and "all_reduce_perf_2xh200.log" in r.stdout
    assert (tmp_path / "side-by-side" / "report.html").is_file()
    printed = [" ".join(line.split()) for line in r.stdout.splitlines()]
    # (the "created" of an imported log is the time it was imported; "..." marks lines left out)
    for line in (" ".join(x.split()) for x in shown if x.strip() and x.strip() != "..." and
                 not x.startswith("created")):
        assert line in printed, f"{page} shows {line!r}, which side-by-side no longer prints:\n{r.stdout}"



def test_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 150
    assert "pip install . && mgpu-bench comm" in text and "python -m pytest" in text
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) > 20
    for link in links:
        target, _, anchor = link.partition("#")
        if "://" in target:
            continue
        path = ROOT / unquote(target)
        assert path.is_file(), f"README links to {link}, which is not a file"
        if anchor and path.suffix == ".md":
            slugs = {_slug(h) for h in re.findall(r"^#+\s+(.*)$", path.read_text(encoding="utf-8"), re.MULTILINE)}
            assert anchor in slugs, f"README links to {link}: no heading gives #{anchor}"


def _slug(heading: str) -> str:
    """The anchor MkDocs' toc extension gives a heading (its default slugify)."""
    text = re.sub(r"[^\w\s-]", "", re.sub(r"`", "", heading)).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


# -- the site --------------------------------------------------------------------------------


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []  # (tag, attribute, url)
        self.ids: set[str] = set()
        self.nav: list[str] = []
        self._in_nav = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "nav" and (self._in_nav or "md-nav--primary" in (a.get("class") or "")):
            self._in_nav += 1  # the site's navigation, and the navs nested in it
        for attr in ("href", "src"):
            if a.get(attr):
                self.refs.append((tag, attr, a[attr]))
                if tag == "a" and self._in_nav:
                    self.nav.append(a[attr])

    def handle_endtag(self, tag):
        if tag == "nav" and self._in_nav:
            self._in_nav -= 1


def _read(page: Path) -> _Refs:
    p = _Refs()
    p.feed(page.read_text(encoding="utf-8"))
    return p


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip('mkdocs and mkdocs-material are not installed: pip install -e ".[docs]"')
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(out)], check=False, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def _nav_pages() -> list[str]:
    import yaml

    def walk(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from walk(v)
        elif isinstance(node, list):
            for v in node:
                yield from walk(v)

    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    return list(walk(config["nav"]))


def test_every_link_and_picture_of_the_site_resolves_and_nothing_comes_from_the_network(site):
    pages = sorted(site.rglob("*.html"))
    ids = {p: _read(p).ids for p in pages}
    checked = 0
    for page in pages:
        if "assets/report" in page.as_posix() or page.name == "404.html":
            continue  # the tool's own pages (tested by test_suite_report.py); 404.html is served at any depth
        refs = _read(page)
        for tag, attr, url in refs.refs:
            parts = urlsplit(url)
            if parts.scheme or url.startswith("//"):
                assert tag == "a", f"{page.relative_to(site)}: <{tag} {attr}={url}> loads from the network"
                continue
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            assert target.exists(), f"{page.relative_to(site)}: <{tag} {attr}={url}>: no {target}"
            if target.is_dir():
                target = target / "index.html"
                assert target.exists(), f"{page.relative_to(site)}: {url} is a folder without index.html"
            if parts.fragment and target.suffix == ".html" and target in ids:
                assert unquote(parts.fragment) in ids[target], f"{page.relative_to(site)}: {url}: no such anchor"
            if tag == "img":
                data = target.read_bytes()
                assert data[:8] == PNG or target.suffix == ".svg", f"{url} is not a picture"
            checked += 1
    assert checked > 1000


def test_every_page_is_in_the_navigation_with_its_pictures(site):
    index = _read(site / "index.html")
    nav = {unquote(urlsplit(u).path) for u in index.nav}
    for md in _nav_pages():
        html = md[:-3] + ".html"
        assert (site / html).is_file(), html
        assert html in nav, f"{html} is not in the navigation"
    pictures = [u for tag, _, u in index.refs if tag == "img" and "assets/report/" in u]
    frames = [u for tag, _, u in index.refs if tag == "iframe"]
    assert pictures and frames == ["assets/report/suite/report.html"]
    comm = _read(site / "commands" / "comm.html")
    assert "../assets/report/comm/busbw_allreduce.png" in [u for tag, _, u in comm.refs if tag == "img"]
    # The reference is there, generated: the option table of comm has every option of the command.
    from mgpu_bench.cli import cli

    html = (site / "commands" / "comm.html").read_text(encoding="utf-8")
    flags = [o for p in cli.commands["comm"].params for o in p.opts if o.startswith("--")]
    assert flags and all(f"<code>{f}" in html or f"{f} " in html or f"{f}<" in html for f in flags)
    # The Results page is benchmarks/RESULTS.md itself.
    results = (site / "results.html").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.*)$", (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8"), re.MULTILINE)
    assert headings and all(f'id="{_slug(h)}"' in results for h in headings[:5])


def test_the_layout_picture_is_drawn_from_the_tree_at_build_time(site):
    """The Contributing page shows the picture the build drew from the package as it is now (the same
    SVG docs/hooks/layout.py draws from the tree), and its table: a row per folder."""
    sys.path.insert(0, str(DOCS / "hooks"))
    import layout

    read = layout.read()
    served = site / "assets" / "layout.svg"
    assert served.read_text(encoding="utf-8") == layout.svg(read)
    page = _read(site / "contributing.html")
    assert "assets/layout.svg" in [u for tag, _, u in page.refs if tag == "img"]
    html = (site / "contributing.html").read_text(encoding="utf-8")
    for folder in read.folders.values():
        assert f"<td><code>{folder.label}</code></td>" in html, folder.label
    assert "<p>::: layout</p>" not in html  # the directive replaced, not left as text


# -- in a browser ----------------------------------------------------------------------------


def _chromium_or_skip() -> str:
    from test_suite_report import _chromium

    exe = _chromium()
    if exe is None:
        pytest.skip("no headless Chromium on PATH (chromium-headless-shell, chromium or google-chrome): "
                    "Debian's chromium-headless-shell provides one")
    return exe


def _near(img, rgb: str, tol: float = 0.04):
    import numpy as np

    colour = np.array([int(rgb[i:i + 2], 16) for i in (0, 2, 4)]) / 255
    return np.abs(img - colour).max(axis=-1) < tol


@pytest.mark.parametrize("page", ["index.html", "commands/comm.html"])
def test_a_browser_shows_the_page_with_its_navigation_and_the_report_picture(site, page, tmp_path):
    import matplotlib.image
    import numpy as np
    from test_suite_report import HEIGHT, WIDTH, _png_size, _screenshot

    exe = _chromium_or_skip()
    shots = {}
    for offline in (False, True):
        out = tmp_path / f"shot_{offline}.png"
        _screenshot(exe, site / page, out, tmp_path / f"profile_{offline}", offline)
        assert _png_size(out.read_bytes()) == (WIDTH, HEIGHT)
        shots[offline] = matplotlib.image.imread(out)[..., :3]
    img = shots[True]
    # The header: the theme's indigo band across the top of the page.
    assert _near(img[5:40], "4051b5").mean() > 0.8
    # The navigation: a column of dark link text on the left, the current page in the theme's colour.
    left = img[80:900, :260]
    assert (left < 0.4).all(axis=-1).sum() > 1500 and _near(left, "4051b5", 0.15).sum() > 20  # about 3600 and 60
    # The report picture: the tool's plot, its out-of-place line in matplotlib's first colour.
    assert _near(img[:, 260:], "1f77b4", 0.06).sum() > 400
    if page == "index.html":  # and the suite's page in its frame: its problem marked in red
        assert _near(img, "c62828", 0.05).sum() > 100
    # Network blocked or not, the page looks the same: it loads nothing from the network.
    assert np.array_equal(shots[False], shots[True])


def test_a_browser_shows_the_layout_picture(site, tmp_path):
    """Headless Chromium, offline, shows the Contributing page with the layout's picture in it: every
    folder's colour (its box and the arrows that leave it) is on the screen, beside the navigation."""
    import matplotlib.image
    from test_suite_report import HEIGHT, WIDTH, _png_size, _screenshot

    sys.path.insert(0, str(DOCS / "hooks"))
    import layout

    exe = _chromium_or_skip()
    out = tmp_path / "contributing.png"
    _screenshot(exe, site / "contributing.html", out, tmp_path / "profile", True)
    assert _png_size(out.read_bytes()) == (WIDTH, HEIGHT)
    img = matplotlib.image.imread(out)[..., :3][:, 260:]  # right of the navigation
    shown = {name: int(_near(img, layout.PALETTE[layout.PLACES.index(name)][1:], 0.03).sum())
             for name in layout.read().folders}
    assert min(shown.values()) > 100, shown  # each box's bar alone is about 4 x 45 pixels at the page's scale
