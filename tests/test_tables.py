"""Terminal tables never cut a figure (output/tables.py): real result documents rendered at narrow
and wide consoles, to a file and to a terminal, keep every number whole and never show an
ellipsis."""

from __future__ import annotations

import copy
import io
import json
from collections import Counter
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.table import Table

from mgpu_bench.machine import topo_view
from mgpu_bench.output.tables import print_table
from mgpu_bench.results import probe as registry

FIXTURES = Path(__file__).parent / "fixtures"
WIDTHS = (40, 60, 100, 200)


def _load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _slow_comm() -> dict:
    """The 2x H200 comm document with every time 10^4 times longer: figures as a CPU run's
    (p99 of millions of us), the ones a file output used to cut to '153133...'."""
    doc = copy.deepcopy(_load("comm_2x_h200.json"))
    for m in doc["measurements"]:
        m["burst_seconds"] = [s * 1e4 for s in m["burst_seconds"]]
        m["samples"] = [[s * 1e4 for s in rank] for rank in m["samples"]]
    return doc


def _fleet() -> dict:
    """A judged fleet document: 8 nodes with long names, 4 rails, one slow node."""
    from mgpu_bench.probes.fleet import analyse, schedule

    nodes = [{"index": i, "node": f"gpu-node-{i:02d}.cluster.example.org", "host": f"h{i}", "model": "H200",
              "answered": True, "ranks": list(range(4 * i, 4 * i + 4)),
              "gpus": [{"local": g, "flops_per_s": 720.123e12 * (0.5 if i == 3 else 1.0) * (1 + g / 1000),
                        "copy_bytes_per_s": 4.2e12, "health": []} for g in range(4)]} for i in range(8)]
    pairings = []
    for k, pairs in enumerate(schedule.pairing_rounds(8, schedule.default_rounds(8), 0)):
        for a, b in pairs:
            rails = {str(r): {"busbw": 48.3e9 * (0.5 if 3 in (a, b) else 1.0) * (1 + r / 100)} for r in range(4)}
            pairings.append({"round": k, "a": a, "b": b, "rails": rails,
                             "allreduce": {"busbw": 0.9 * min(v["busbw"] for v in rails.values())}})
    doc = {"kind": "fleet", "nodes": nodes, "pairings": pairings, "world": None}
    doc["verdicts"] = analyse.judge(doc)
    return doc


def _documents() -> list[tuple[str, dict]]:
    docs = [("comm", _load("comm_2x_h200.json")), ("comm-slow", _slow_comm()),
            ("model-shared", _load("gpu/model-shared.json")), ("model-healthy", _load("gpu/model-healthy.json")),
            ("gemm-shared", _load("gpu/gemm-shared.json"))]
    for p in _load("suite/suite.json")["probes"]:
        if p["document"]:
            docs.append((f"suite-{p['name']}", p["document"]))
    return docs


DOCS = _documents()


def _console(width: int, terminal: bool) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=terminal, color_system=None,
                   soft_wrap=False, markup=False, legacy_windows=False)


def _figures(text: str) -> Counter:
    """Every word with a digit, without the punctuation around it, up to 20 characters (longer
    ones are names and paths, which may fold)."""
    words = (w.strip("()[],;") for w in text.split())
    return Counter(w for w in words if any(c.isdigit() for c in w) and len(w) <= 20)


def _check(draw, width: int, terminal: bool) -> str:
    """Draws at `width` and at a width where nothing needs to fit; no ellipsis, every figure of
    the wide drawing in the narrow one."""
    wide, narrow = _console(10_000, terminal), _console(width, terminal)
    draw(wide)
    draw(narrow)
    text = narrow.file.getvalue()
    assert "…" not in text and "..." not in text, text
    missing = _figures(wide.file.getvalue()) - _figures(text)
    assert not missing, f"cut or broken at {width} columns: {sorted(missing)}\n{text}"
    return text


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name,doc", DOCS, ids=[n for n, _ in DOCS])
def test_probe_tables_keep_every_figure(name, doc, width, terminal):
    probe = registry.for_document(doc)
    assert probe is not None and probe.name != "suite"
    _check(lambda c: probe.render(doc, c), width, terminal)


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize("width", (60, 100))
def test_slow_comm_figures_are_the_documents(width, terminal):
    """The figures themselves, formatted from the document: time, median and p99 in us."""
    doc = _slow_comm()
    text = _check(lambda c: registry.for_document(doc).render(doc, c), width, terminal)
    words = set(text.split())
    from mgpu_bench.probes.comm import render as comm_render

    run = registry.get("comm").load(doc)
    assert max(m.p99_s for m in run.measurements) * 1e6 > 1e7  # 8-digit figures
    for m in run.measurements:
        r = comm_render.row(m)
        for key in ("time_us", "median_us", "p99_us"):
            col = next(c for c in comm_render.COLUMNS if c.key == key)
            assert comm_render.format_cell(col, r[key]) in words


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize("width", WIDTHS)
def test_fleet_tables_keep_every_figure(width, terminal):
    doc = _fleet()
    _check(lambda c: registry.get("fleet").render(doc, c), width, terminal)


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize("width", WIDTHS)
def test_eight_gpu_links_matrices_keep_every_figure(width, terminal):
    from mgpu_bench.probes.links.render import render_terminal as render
    from mgpu_bench.probes.links.result import LinkMeasurement, LinkSpec, LinksRun

    run = LinksRun(gpus=list(range(8)))
    for a in range(8):
        for b in range(8):
            if a != b:
                t = (1 << 28) / ((380.0 + a + b / 10) * 1e9)
                run.measurements.append(LinkMeasurement(LinkSpec("copy", a, b, "ce", False, None, 1 << 28),
                                                        (t, t * 1.01, t * 0.99)))
    _check(lambda c: render(run, c), width, terminal)


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize("width", WIDTHS)
def test_topo_tables_keep_every_figure(width, terminal):
    snap = _load("topo_2x_h200.json")
    _check(lambda c: topo_view.render(snap, c, print_table=print_table), width, terminal)


@pytest.fixture(scope="module")
def history_db(tmp_path_factory):
    from mgpu_bench.history import History

    path = tmp_path_factory.mktemp("history") / "h.sqlite3"
    with History.open(path) as h:
        for _, doc in DOCS:
            h.save(doc)
        h.save(_load("suite/suite.json"))
    return path


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize("width", (40, 60, 100))
def test_history_tables_keep_every_figure(history_db, monkeypatch, width, terminal):
    from mgpu_bench.history import cli as hcli
    from mgpu_bench.history import cli_compare

    metric = "comm.allreduce.fp32.1GiB.out.2ranks.busbw"
    commands = (["history", "list"], ["history", "show", "latest"], ["history", "show", "r2"],
                ["history", "trend", metric], ["compare", "r2", "--baseline", "r1"])
    group = click.Group()
    hcli.register(group)
    for args in commands:
        def draw(console, args=args):
            for module in (hcli, cli_compare):  # history's commands, and baseline's and compare's
                monkeypatch.setattr(module, "_out", lambda: console)
            r = CliRunner().invoke(group, [*args, "--db", str(history_db)])
            assert r.exit_code in (0, 1), r.output

        text = _check(draw, width, terminal)
        assert text.strip()


def test_a_table_fits_the_console_when_its_figures_do():
    """Text wraps (whole words) to fit; the figures stay whole; nothing is wider than the console."""
    t = Table(box=None, pad_edge=False)
    t.add_column("what")
    t.add_column("p99 us", justify="right")
    t.add_column("size", justify="right")
    words = "an explanation long enough that it must wrap over several lines of the column"
    t.add_row(words, "212522.4", "1 GiB")
    t.add_row("short", "3338000.1", "64 MiB")
    c = _console(40, False)
    print_table(c, t)
    text = c.file.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 40
    assert "212522.4" in text.split() and "3338000.1" in text.split()
    assert "1 GiB" in text and "64 MiB" in text  # a figure stays on one line with its unit
    assert text.split().count("explanation") == 1 and "…" not in text


def test_a_table_whose_figures_cannot_fit_is_printed_wider_uncut():
    t = Table(box=None, pad_edge=False)
    for k in range(6):
        t.add_column(f"col {k}", justify="right")
    t.add_row(*[f"{12345678.9 * (k + 1):.1f}" for k in range(6)])
    for terminal in (False, True):
        c = _console(30, terminal)
        print_table(c, t)
        text = c.file.getvalue()
        assert all(f"{12345678.9 * (k + 1):.1f}" in text.split() for k in range(6)), text
        assert "…" not in text


def test_no_column_is_left_to_ellipsize():
    t = Table()
    t.add_column("a")
    t.add_column("b", overflow="crop")
    t.add_row("x" * 50, "y" * 50)
    c = _console(30, False)
    print_table(c, t)
    assert {col.overflow for col in t.columns} == {"fold"}
    assert c.file.getvalue().count("x") == 50 and c.file.getvalue().count("y") == 50


def _cpu_comm() -> dict:
    """The 2x H200 comm document with every time 300 times longer: a 2-core CPU run's (1 GiB in
    about a second), whose table at 100 columns is just too wide for every word to fit."""
    doc = copy.deepcopy(_load("comm_2x_h200.json"))
    for m in doc["measurements"]:
        m["burst_seconds"] = [s * 300 for s in m["burst_seconds"]]
        m["samples"] = [[s * 300 for s in rank] for rank in m["samples"]]
    return doc


HEADED = [*DOCS, ("comm-cpu", _cpu_comm()), ("fleet", _fleet())]


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize("width", (40, 100))
@pytest.mark.parametrize("name,doc", HEADED, ids=[n for n, _ in HEADED])
def test_every_header_word_stays_whole(name, doc, width, terminal, monkeypatch):
    """`#wrong` came out as `#wr`/`ong`, and one letter per line down the right edge of a CPU run's
    allgather table in a pipe: a header word is kept whole like a figure, in every table."""
    from mgpu_bench.output import tables

    heads: list[str] = []
    fit = tables.fit

    def recording(console, table, w):
        heads.extend(str(col.header) for col in table.columns if table.show_header)
        return fit(console, table, w)

    monkeypatch.setattr(tables, "fit", recording)
    console = _console(width, terminal)
    registry.for_document(doc).render(doc, console)
    words = set(console.file.getvalue().split())
    broken = {w for h in heads for w in h.split() if w not in words}
    assert not broken, f"header words broken at {width} columns: {sorted(broken)}\n{console.file.getvalue()}"


@pytest.mark.parametrize("name,doc", HEADED, ids=[n for n, _ in HEADED])
def test_every_table_fits_80_columns_wrapped_by_column(name, doc, monkeypatch):
    """At 80 columns every row of a wide table wrapped onto two lines (a terminal folds a line past
    its edge), so that one row read as two. Rendered to stdout's console as a pipe with COLUMNS=80,
    each table is now split by column into stacked tables repeating the row's keys: no line of a
    table passes 80 characters, and every figure of the wide drawing is still there."""
    from mgpu_bench.output import console as out
    from mgpu_bench.output import tables

    monkeypatch.setenv("COLUMNS", "80")
    drawn: list[str] = []
    original = tables.print_table

    def recording(console, table):
        before = len(console.file.getvalue())
        original(console, table)
        drawn.append(console.file.getvalue()[before:])

    monkeypatch.setattr(tables, "print_table", recording)
    console = out.out_console()
    assert console.width == 80
    console.file = io.StringIO()
    registry.for_document(doc).render(doc, console)
    if not drawn:
        pytest.skip(f"{name} renders no table")
    for text in drawn:
        wide = [line for line in text.splitlines() if len(line) > 80]
        assert not wide, f"{name}: {len(wide)} table line(s) past 80 columns:\n{text}"
    wide = _console(10_000, False)
    monkeypatch.setattr(tables, "print_table", original)
    registry.for_document(doc).render(doc, wide)
    missing = _figures(wide.file.getvalue()) - _figures(console.file.getvalue())
    assert not missing, f"lost at 80 columns: {sorted(missing)}"


def test_a_split_table_repeats_the_keys_of_each_row_in_every_part():
    """The comm table of a CPU run (figures of millions of us) at 80 columns: two stacked tables,
    both with the row's size, count, type, reduction and placement (the columns before the first
    with a unit), the first with the title; each row's p99 in the second part beside its size."""
    doc = _cpu_comm()
    c = _console(80, False)
    registry.for_document(doc).render(doc, c)
    text = c.file.getvalue()
    heads = [line for line in text.splitlines() if line.split()[:1] == ["size"]]
    assert len(heads) >= 2 and all("place" in h for h in heads), text
    assert text.startswith("allreduce") and text.count("allreduce  (") == 1, text  # the title once
    from mgpu_bench.probes.comm import render as comm_render

    run = registry.get("comm").load(doc)
    key = comm_render.COLUMNS[0]
    for m in run.measurements[:3]:
        r = comm_render.row(m)
        col = next(col for col in comm_render.COLUMNS if col.key == "p99_us")
        rows = [line for line in text.splitlines() if comm_render.format_cell(col, r["p99_us"]) in line.split()]
        size = comm_render.format_cell(key, r[key.key])
        assert any(line.split()[:len(size.split())] == size.split() for line in rows), (size, rows)
