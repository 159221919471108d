"""nccl-tests and rccl-tests logs into the history (mgpu_bench/results/nccl_tests.py, probes/comm/imported.py,
`mgpu-bench history add LOG`): the real 2x H200 logs of nccl-tests 2.19.6 figure for figure, the
other collectives and forms from the tests' own printf formats (nccl_log_formats.py), the
logs that are stored with a problem said and those refused with one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nccl_log_formats as logs
import pytest
from click.testing import CliRunner

from mgpu_bench.history import History
from mgpu_bench.probes.comm import imported
from mgpu_bench.results import nccl_tests
from mgpu_bench.results.probe import get as probe

FIX = Path(__file__).with_name("fixtures")
SHARED = FIX / "nccl-tests"
SIZES = [1 << 20, 64 << 20, 256 << 20, 1 << 30]


@pytest.fixture
def cli():
    from mgpu_bench.cli import cli as main

    return main


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "h.sqlite3"


def _run(cli, *args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _one_line_exit_2(r, words: str) -> None:
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mgpu-bench: error: ") and words in lines[0], r.output


def _import(text: str, name: str = "x.log", **kw):
    return [d for d, _ in imported.documents([(name, text)], **kw)]


def _printed_rows(path: Path) -> list[list[str]]:
    """The table's rows as the log prints them, split by whitespace (read here, not by the importer)."""
    return [ln.split() for ln in path.read_text().splitlines() if ln.strip() and ln.split()[0].isdigit()]


def _decimals(token: str) -> int:
    return len(token.partition(".")[2])


# -- the shared logs: every figure as printed ------------------------------------------------------------

@pytest.mark.parametrize("name, op, ranks_factor", [("all_reduce_perf_2xh200.log", "allreduce", 1.0),
                                                    ("all_gather_perf_2xh200.log", "allgather", 0.5)])
def test_the_shared_logs_import_with_every_figure_as_printed(name, op, ranks_factor):
    path = SHARED / name
    (doc,) = _import(path.read_text(), name)
    run = doc.run
    by_key = {(m.spec.size, m.spec.inplace): m for m in run.measurements}
    rows = _printed_rows(path)
    assert len(rows) == 4 and len(run.measurements) == 8
    for size, count, typ, redop, root, *cells in rows:
        for inplace, (t, a, b, wrong) in ((False, cells[0:4]), (True, cells[4:8])):
            m = by_key[(int(size), inplace)]
            assert m.spec.op == op and m.spec.count == int(count) and m.spec.dtype == "fp32" and typ == "float"
            assert m.spec.redop == (None if redop == "none" else redop) and int(root) == -1
            assert m.spec.nranks == 2 and m.spec.devices == ("cuda:0", "cuda:1") and m.spec.backend == "nccl-tests"
            assert f"{m.time_s * 1e6:.{_decimals(t)}f}" == t  # time, algbw and busbw at their printed precision
            assert f"{m.algbw / 1e9:.{_decimals(a)}f}" == a
            assert f"{m.busbw / 1e9:.{_decimals(b)}f}" == b
            assert m.busbw / m.algbw == pytest.approx(ranks_factor)
            assert m.total_wrong == int(wrong) == 0
    src = doc["source"]
    assert src["tool"] == "nccl-tests" and src["version"] == "2.19.6" and src["library"] == "2.28.3"
    log = src["logs"][0]
    avg = re.search(r"Avg bus bandwidth\s*:\s*(\S+)", path.read_text()).group(1)
    assert f"{log['average_busbw'] / 1e9:.3f}" == avg and log["out_of_bounds"] == {"count": 0, "ok": True}
    assert log["params"]["nthread"] == 2 and log["params"]["iters"] == 20 and log["program"] == name.removesuffix("_2xh200.log")
    env = doc["environment"]
    assert env["host"] == "vm" and [g["name"] for g in env["gpus"]] == ["NVIDIA H200"] * 2
    assert [g["pci_bus_id"] for g in env["gpus"]] == ["0000:00:06", "0000:00:07"] and env["nccl"] == "2.28.3"
    assert {"nvidia_driver", "topology", "cuda_runtime"} <= set(env["not_in_log"]) and env.get("nvidia_driver") is None
    assert run.findings == [] and doc["status"]["completed"] is True
    # the datasheet platform of an H200 (HGX: NVSwitch), said as assumed
    assert doc["theory"]["bandwidth"] == 450e9 and "assumed" in doc["theory"]["summary"]


def test_an_imported_run_lists_shows_trends_compares_and_reports_like_one_of_ours(cli, db, tmp_path):
    log = SHARED / "all_reduce_perf_2xh200.log"
    r = _run(cli, "history", "add", log, FIX / "comm_2x_h200.json", "--db", db)
    assert r.exit_code == 0, r.output
    assert "stored r1: comm, 8 headline metric(s)" in r.output and "nccl-tests 2.19.6, 2 rank(s)" in r.output
    r = _run(cli, "history", "list", "--db", db)
    assert r.exit_code == 0 and re.search(r"r1 .* comm .* vm .* 8 .* complete .* all_reduce_perf", r.output), r.output
    r = _run(cli, "history", "show", "r1", "--db", db)
    assert r.exit_code == 0 and "comm.allreduce.fp32.4GiB.out.2ranks.busbw" in r.output and "346.29 GB/s" in r.output
    assert "driver -, CUDA -, NCCL 2.28.3" in r.output
    r = _run(cli, "history", "trend", "comm.allreduce.fp32.1GiB.out.2ranks.busbw", "--db", db)
    assert r.exit_code == 0 and "331.71 GB/s" in r.output and "330.77 GB/s" in r.output, r.output
    r = _run(cli, "compare", "r1", "--baseline", "r2", "--db", db)  # the same metric names as mgpu-bench comm's
    assert r.exit_code == 0, r.output
    assert "2 metric(s) compared" in r.output and "comm.allreduce.fp32.64MiB.out.2ranks.busbw" in r.output
    r = _run(cli, "report", "r1", "--db", db, "--out", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "nccl-tests" in html and "346.29" in html and (tmp_path / "rep" / "busbw_allreduce.png").stat().st_size
    with History.open(db, readonly=True) as h:
        doc = h.get("r1").document
    from rich.console import Console

    console = Console(width=100, record=True, file=open(tmp_path / "out.txt", "w"))  # noqa: SIM115
    probe("comm").render(doc, console)
    text = console.export_text()
    assert "12402.6" in text and "346.29" in text and "read from nccl-tests 2.19.6 log(s) all_reduce_perf_2xh200.log" \
        in text and "NCCL rings reach about 360 GB/s (80%)" in text


def test_joined_logs_are_one_run_of_one_machine(cli, db):
    r = _run(cli, "history", "add", "--join", SHARED / "all_reduce_perf_2xh200.log", SHARED / "all_gather_perf_2xh200.log",
             "--db", db)
    assert r.exit_code == 0 and "stored r1: comm, 16 headline metric(s)" in r.output, r.output
    with History.open(db, readonly=True) as h:
        doc = h.get("r1").document
    assert {m["spec"]["op"] for m in doc["measurements"]} == {"allreduce", "allgather"}
    assert [x["program"] for x in doc["source"]["logs"]] == ["all_reduce_perf", "all_gather_perf"]
    other = logs.nccl_log("all_reduce", logs.h200_ranks(4, host="other"), SIZES)
    with pytest.raises(ValueError, match="different ranks or devices"):
        imported.documents([("a.log", (SHARED / "all_reduce_perf_2xh200.log").read_text()), ("b.log", other)],
                           join=True)


# -- the other collectives and forms, from the printf formats ---------------------------------------------

@pytest.mark.parametrize("coll, op, opname, root", [
    ("reduce_scatter", "reducescatter", "sum", -1), ("broadcast", "broadcast", "none", 0),
    ("reduce", "reduce", "max", 1), ("alltoall", "alltoall", "none", -1), ("sendrecv", "sendrecv", "sum", -1)])
def test_every_collective_with_its_size_semantics_and_bus_factor(coll, op, opname, root):
    text = logs.nccl_log(coll, logs.h200_ranks(4), SIZES, opname=opname, root=root,
                         wrong=(lambda s, i: None if i else 0) if coll == "sendrecv" else (lambda s, i: 0))
    (doc,) = _import(text, f"{coll}.log")
    rows = [ln.split() for ln in text.splitlines() if ln.strip() and ln.split()[0].isdigit()]
    got = {(m.spec.size, m.spec.inplace): m for m in doc.run.measurements}
    for size, count, *_, in rows:
        m = got[(int(size), False)]
        assert m.spec.op == op and m.spec.count == int(count) and m.spec.root == max(root, 0)
        assert m.spec.redop == (None if opname == "none" else opname)
    for row in rows:
        for inplace, cell in ((False, row[5:9]), (True, row[9:13])):
            m = got[(int(row[0]), inplace)]
            assert f"{m.algbw / 1e9:.{_decimals(cell[1])}f}" == cell[1]
            assert f"{m.busbw / 1e9:.{_decimals(cell[2])}f}" == cell[2]
            assert m.wrong == (None if cell[3] == "N/A" else (int(cell[3]),))
    assert doc.run.findings == []


def test_graph_multi_process_per_iteration_and_every_type():
    ranks = logs.h200_ranks(2, host="gpu07", pid=11) + logs.h200_ranks(2, host="gpu08", pid=12, first_rank=2)
    text = logs.nccl_log("all_reduce", ranks, SIZES, graph=10, per_iter=True, nthread=1, ngpus=2,
                         types=[("float", "sum"), ("bfloat16", "sum"), ("uint8", "sum"), ("float", "prod")])
    (doc,) = _import(text)
    ms = doc.run.measurements
    assert {m.spec.dtype for m in ms} == {"fp32", "bf16"} and all(m.spec.graph for m in ms)
    assert ms[0].iters == 20 * 10 and ms[0].spec.nranks == 4
    assert ms[0].spec.devices == ("gpu07:cuda:0", "gpu07:cuda:1", "gpu08:cuda:0", "gpu08:cuda:1")
    assert doc["environment"]["host"] == "gpu07,gpu08"
    notes = " ".join(doc["notes"])
    assert "row(s) of type uint8 left out" in notes and "row(s) of redop prod left out" in notes
    assert doc["theory"]["bandwidth"] is None and "2 hosts" in doc["theory"]["summary"]  # the log names no network
    assert doc.run.findings == []  # its average line agrees with every row, those left out included


def test_cpu_time_columns_follow_the_bandwidths():
    text = logs.nccl_log("all_reduce", logs.h200_ranks(2), SIZES, cputime=True)
    (doc,) = _import(text)
    row = next(ln.split() for ln in text.splitlines() if ln.startswith("    67108864"))
    m = next(m for m in doc.run.measurements if m.spec.size == 64 << 20 and not m.spec.inplace)
    assert f"{m.busbw / 1e9:.2f}" == row[7] and f"{m.time_s * 1e6:.2f}" != row[5]
    assert any("CPU time" in n for n in doc["notes"]) and doc.run.findings == []


@pytest.mark.parametrize("new", [False, True])
def test_rccl_tests_logs_on_mi300x_get_infinity_fabric_theory(new):
    text = logs.rccl_log("all_reduce", 8, SIZES, new=new)
    (doc,) = _import(text, "rccl.log")
    assert doc["source"]["tool"] == "rccl-tests" and doc["source"]["version"] == "develop:5272cd1"
    assert doc["source"]["logs"][0]["program"] == ("all_reduce_perf" if new else None) or not new
    m = max(doc.run.measurements, key=lambda m: m.spec.size)
    assert m.spec.op == "allreduce" and m.spec.nranks == 8 and m.spec.backend == "rccl-tests"
    # 7 Infinity Fabric links x 64 GB/s to the 7 peers of a fully connected 8-GPU MI300X platform; AMD's 75%
    assert doc["theory"]["bandwidth"] == 7 * 64e9 and doc["theory"]["practical"] == pytest.approx(0.75 * 7 * 64e9)
    row = next(ln.split() for ln in text.splitlines() if ln.startswith("  1073741824"))
    assert f"{m.busbw / 1e9:.2f}" == row[7] and f"{m.time_s * 1e6:.1f}" == row[5]
    assert [g["name"] for g in doc["environment"]["gpus"]] == ["AMD Instinct MI300X"] * 8
    assert doc.run.findings == []


def test_rccl_tests_without_a_program_line_is_told_by_its_table():
    (doc,) = _import(logs.rccl_log("all_reduce", 8, SIZES))  # 2024 format: no program line
    assert doc.run.measurements[0].spec.op == "allreduce"
    assert any("fits allreduce alone" in n for n in doc["notes"])


def test_old_nccl_tests_logs_name_the_collective_by_their_table_or_an_echoed_command(cli, db, tmp_path):
    ranks = logs.h200_ranks(4)
    rs = logs.nccl_log("reduce_scatter", ranks, SIZES, version=False, old_devices=True)
    (doc,) = _import(rs)
    assert doc.run.measurements[0].spec.op == "reducescatter" and doc["source"]["version"] is None
    assert doc["environment"]["gpus"][0]["pci_bus_id"] == "0x07"
    ag = tmp_path / "ag.log"
    ag.write_text(logs.nccl_log("all_gather", ranks, SIZES, opname="none", version=False))
    _one_line_exit_2(_run(cli, "history", "add", ag, "--db", db), "allgather and alltoall alike: give --op")
    assert not db.exists()
    r = _run(cli, "history", "add", ag, "--op", "all_gather", "--db", db)
    assert r.exit_code == 0 and "stored r1" in r.output, r.output
    echoed = tmp_path / "echoed.log"
    echoed.write_text("$ mpirun -np 4 ./build/all_gather_perf -b 1M -e 1G -f 2 -g 1\n" + ag.read_text())
    (doc,) = _import(echoed.read_text())
    assert doc.run.measurements[0].spec.op == "allgather" and doc["source"]["logs"][0]["program"] == "all_gather_perf"


# -- problems said, or refused ------------------------------------------------------------------------------

def test_a_truncated_log_is_stored_with_that_said(cli, db, tmp_path):
    text = (SHARED / "all_reduce_perf_2xh200.log").read_text()
    cut = text[: text.index("  1073741824") + 40]  # mid-row: the last row is cut short
    p = tmp_path / "cut.log"
    p.write_text(cut)
    r = _run(cli, "history", "add", p, "--db", db)
    assert r.exit_code == 0 and "stored r1: comm, 4 headline metric(s)" in r.output, r.output
    assert "warning: cut.log truncated: the log ends at line 14" in r.output and "cut short" in r.output
    r = _run(cli, "history", "list", "--db", db)
    assert "stopped:" in r.output and "truncated" in r.output


def test_wrong_elements_and_a_failed_check_are_stored_with_that_said(cli, db, tmp_path):
    p = tmp_path / "wrong.log"
    p.write_text(logs.nccl_log("all_reduce", logs.h200_ranks(2), SIZES, wrong=lambda s, i: 7 if s == 64 << 20 and
                               not i else 0))
    r = _run(cli, "history", "add", p, "--db", db)
    assert r.exit_code == 0, r.output
    assert "7 wrong element(s) out-of-place" in r.output and "Out of bounds values : 1 FAILED" in r.output
    with History.open(db, readonly=True) as h:
        doc = h.get("r1").document
    assert probe("comm").failure(doc) == "7 wrong element(s): the data did not arrive intact"


def test_a_log_whose_rows_do_not_add_up_to_its_average_is_said_to_be_mixed():
    text = (SHARED / "all_gather_perf_2xh200.log").read_text()
    lines = text.splitlines()
    dropped = "\n".join(ln for ln in lines if not ln.startswith("   268435456")) + "\n"
    (doc,) = _import(dropped)
    assert any("mixed or incomplete" in f and "265.063" in f for f in doc.run.findings)


def test_a_failed_run_keeps_its_rows_and_says_why():
    text = (SHARED / "all_reduce_perf_2xh200.log").read_text()
    head = text[: text.index("  4294967296")]
    failed = head + "vm: Test NCCL failure common.cu:1005 'unhandled cuda error (run with NCCL_DEBUG=INFO for details)'\n"
    (doc,) = _import(failed)
    assert doc["status"]["stopped"] == "nccl_error" and "Test NCCL failure" in doc["status"]["message"]
    assert len(doc.run.measurements) == 6


@pytest.mark.parametrize("content, words", [
    (("nccom-test -r 2 allr\n     size(B)    count(elems)     type    time(us)    algbw(GB/s)    busbw(GB/s)\n"
      "    33554432        33554432    uint8         768          40.69          40.69\nAvg bus bandwidth: 40.6901GB/s\n"),
     "neither a result document (JSON) nor the output of nccl-tests or rccl-tests"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "is not text"),
    (None, "the output of 2 runs is interleaved"),
    ("header-only", "no result rows"),
    ("failed-first", "the run failed before its first result"),
    ("gather", "gather_perf measures gather, a collective mgpu-bench comm does not"),
])
def test_corrupt_truncated_and_foreign_logs_are_one_line_exit_2_and_nothing_stored(cli, db, tmp_path, content, words):
    real = (SHARED / "all_reduce_perf_2xh200.log").read_text()
    if content is None:  # a build without MPI started twice by mpirun: both headers, then rows
        one = logs.nccl_log("all_reduce", [(0, 0, 11, "n1", 0, "NVIDIA H200")], SIZES).splitlines()
        table = next(i for i, ln in enumerate(one) if ln.strip() and ln.split()[0].isdigit())
        content = "\n".join(one[:table] + one[:table] + [x for ln in one[table:] for x in (ln, ln)]) + "\n"
    elif content == "header-only":
        content = real[: real.index("#  Rank  1")]
    elif content == "failed-first":
        content = real[: real.index("    67108864")] + "vm: Test CUDA failure common.cu:892 'out of memory'\n"
    elif content == "gather":
        content = real.replace("all_reduce_perf", "gather_perf")
    p = tmp_path / "x.log"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    _one_line_exit_2(_run(cli, "history", "add", p, "--db", db), words)
    assert not db.exists()


def test_no_file_is_stored_when_one_of_them_is_refused(cli, db, tmp_path):
    bad = tmp_path / "bad.log"
    bad.write_text("just some text\n")
    r = _run(cli, "history", "add", SHARED / "all_reduce_perf_2xh200.log", bad, "--db", db)
    _one_line_exit_2(r, "bad.log is neither")
    assert not db.exists()
    _one_line_exit_2(_run(cli, "history", "add", "--op", "gather", SHARED / "all_reduce_perf_2xh200.log", "--db", db),
                     "--op gather: choose from allreduce")
    _one_line_exit_2(_run(cli, "history", "add", "--join", FIX / "comm_2x_h200.json", "--db", db),
                     "--join and --op are for nccl-tests and rccl-tests logs")


def test_fit_seconds_agrees_with_every_printed_figure_or_says_it_does_not():
    cell = nccl_tests.Cell(nccl_tests.figure("156.60"), nccl_tests.figure("428.53"), nccl_tests.figure("214.27"), 0)
    seconds, agrees = imported.fit_seconds(cell, 67108864, 0.5)
    assert agrees and f"{seconds * 1e6:.2f}" == "156.60" and f"{67108864 / seconds / 1e9:.2f}" == "428.53"
    # the time alone would give 428.54: the figure kept is the one all three round to
    assert f"{67108864 / 156.60e-6 / 1e9:.2f}" == "428.54"
    _, agrees = imported.fit_seconds(cell, 67108864, 1.0)  # another bus factor: no time fits
    assert not agrees
    assert nccl_tests.figure("1e+06").half == 5e5 and nccl_tests.figure("12402.6").half == pytest.approx(0.05)


def test_history_add_help_and_the_stored_source_field_are_declared(cli):
    r = _run(cli, "history", "add", "--help")
    assert r.exit_code == 0 and "nccl-tests" in r.output and "--join" in r.output and "--op" in r.output
    from mgpu_bench.probes.comm.shape import SCHEMA

    assert "source" in SCHEMA.fields
    (doc,) = _import((SHARED / "all_reduce_perf_2xh200.log").read_text())
    probe("comm").schema().check(json.loads(json.dumps(doc)), "")


def test_the_newest_rccl_tests_header_and_gpus_without_link_figures_get_no_theory():
    # rccl-tests 2.18.3 (2026) prints nccl-tests' header with its own version line
    text = logs.nccl_log("all_reduce", [(i, 0, 1409, "host", i, "AMD Instinct MI325X") for i in range(4)], SIZES)
    text = text.replace("# nccl-tests version 2.19.6 nccl-headers=22803 nccl-library=22803",
                        "# rccl-tests version 2.18.3-HEAD:418cd5f rccl-headers=23004 rccl-library=23004")
    (doc,) = _import(text)
    assert doc["source"]["tool"] == "rccl-tests" and doc["source"]["version"] == "2.18.3-HEAD:418cd5f"
    assert doc["environment"]["nccl"] == "2.30.4 (RCCL)"
    assert doc["theory"]["bandwidth"] is None and "no platform topology for AMD Instinct MI325X" in \
        doc["theory"]["summary"]
    unknown = text.replace("AMD Instinct MI325X", "AMD Instinct MI60 / MI50")
    (doc,) = _import(unknown)
    assert doc["environment"]["gpus"][0]["name"] == "AMD Instinct MI60 / MI50"
    assert "AMD Instinct MI60 / MI50 is not in hardware.json" in doc["theory"]["summary"]


def test_plan_names_the_gpu_of_an_imported_rccl_tests_run(cli, db, tmp_path):
    log = tmp_path / "mi300x.log"
    log.write_text(logs.rccl_log("all_reduce", 8, SIZES, new=True))
    assert _run(cli, "history", "add", log, "--db", db).exit_code == 0
    r = _run(cli, "plan", "--model", "350m", "--tokens", "300B", "--gpus", "64", "--db", db, "--no-store")
    assert "of 192.00 GiB on a AMD Instinct MI300X" in r.output, r.output
    assert re.search(r"allreduce\s+\S+ GB/s\s+r1 \(allreduce, 8 ranks within a node\)", r.output), r.output


def test_a_failed_attempt_before_a_rerun_in_one_file_is_said_and_the_rerun_stored():
    real = (SHARED / "all_reduce_perf_2xh200.log").read_text()
    failed = real[: real.index("    67108864")] + "vm: Test NCCL failure common.cu:1005 'unhandled system error'\n"
    (doc,) = _import(failed + real)
    assert len(doc.run.measurements) == 8 and doc["status"]["completed"] is True
    assert any("the run failed before its first result" in f and "(left out)" in f for f in doc.run.findings)


# -- issue 41: a file stored whole or not at all, the log's own facts, bounds, linear time, finite numbers ----

def _state(db: Path) -> list:
    """Every row of the database (runs and metrics), to compare before and after a refused add."""
    import sqlite3

    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT id, kind, document FROM runs ORDER BY id").fetchall() + \
            conn.execute("SELECT run, name, value FROM metrics ORDER BY run, name").fetchall()


def _real() -> str:
    return (SHARED / "all_reduce_perf_2xh200.log").read_text()


def test_a_log_whose_second_run_is_malformed_stores_neither_run_nor_the_files_before_it(cli, db, tmp_path):
    assert _run(cli, "history", "add", FIX / "comm_2x_h200.json", "--db", db).exit_code == 0
    before = _state(db)
    second = _real().replace("on         vm device  1", "on " + "h" * 200 + " device  1")  # a host Linux cannot name
    p = tmp_path / "two.log"
    p.write_text(_real() + second)
    _one_line_exit_2(_run(cli, "history", "add", p, "--db", db), "host name (200 characters; at most 64)")
    _one_line_exit_2(_run(cli, "history", "add", FIX / "comm_2x_h200.json", SHARED / "all_gather_perf_2xh200.log", p,
                          "--db", db), "two.log: line 28")
    _one_line_exit_2(_run(cli, "history", "add", "--join", SHARED / "all_gather_perf_2xh200.log", p, "--db", db),
                     "two.log")
    assert _state(db) == before  # neither the JSON nor the good log nor the first run of two.log
    r = _run(cli, "history", "add", FIX / "comm_2x_h200.json", SHARED / "all_gather_perf_2xh200.log", "--db", db)
    assert r.exit_code == 0 and "stored r2" in r.output and "stored r3" in r.output, r.output


def test_the_logs_own_collective_wins_over_op_and_a_conflict_is_refused(cli, db, tmp_path):
    r = _run(cli, "history", "add", "--op", "allgather", SHARED / "all_reduce_perf_2xh200.log", "--db", db)
    _one_line_exit_2(r, "--op allgather, but the run at line 1 is the log of all_reduce_perf (allreduce)")
    assert not db.exists()
    r = _run(cli, "history", "add", "--op", "allreduce", SHARED / "all_reduce_perf_2xh200.log", "--db", db)
    assert r.exit_code == 0 and "stored r1: comm, 8 headline metric(s)" in r.output, r.output
    with History.open(db, readonly=True) as h:  # stored as allreduce, its busbw as printed (not halved)
        assert any(m.name == "comm.allreduce.fp32.4GiB.out.2ranks.busbw" and round(m.value / 1e9, 2) == 346.29
                   for m in h.metrics("r1"))
    old = tmp_path / "old.log"  # no program line: the table tells allgather or alltoall, never allreduce
    old.write_text(logs.nccl_log("all_gather", logs.h200_ranks(4), SIZES, opname="none", version=False))
    _one_line_exit_2(_run(cli, "history", "add", "--op", "allreduce", old, "--db", db),
                     "--op allreduce, but the table of the run at line 1 fits allgather or alltoall")
    assert _run(cli, "history", "add", "--op", "alltoall", old, "--db", db).exit_code == 0


def test_a_runs_ranks_are_the_ones_its_device_lines_show(cli, db, tmp_path):
    claimed = _real().replace("nThread 2 nGpus 1", "nThread 1000 nGpus 1000")
    (doc,) = _import(claimed)  # 2 device lines: 2 ranks, whatever the header claims
    assert {m.spec.nranks for m in doc.run.measurements} == {2} and len(doc["environment"]["gpus"]) == 2
    assert any("claims 1000000 GPU(s) per process" in f and "show 2: 2 rank(s) taken" in f for f in doc.run.findings)
    for threads in ("1000", "100000"):  # no device lines: the header alone may not make a million ranks
        p = tmp_path / f"claims{threads}.log"
        p.write_text("".join(ln for ln in claimed.replace("nThread 1000 nGpus 1000", f"nThread {threads} nGpus "
                                                          f"{threads}").splitlines(True) if " Rank " not in ln))
        assert p.stat().st_size < 1500
        _one_line_exit_2(_run(cli, "history", "add", p, "--db", db), "and the log has no device lines")
        assert not db.exists()
    small = tmp_path / "small.log"  # a header of 2 GPUs without device lines: 2 ranks, said
    small.write_text("".join(ln for ln in _real().splitlines(True) if " Rank " not in ln))
    r = _run(cli, "history", "add", small, "--db", db)
    assert r.exit_code == 0 and "2 rank(s) from its nThread x nGpus" in r.output and db.stat().st_size < 200_000


@pytest.mark.parametrize("edit, words", [
    (("nThread 2 nGpus 1", "nThread 0 nGpus 0"), "the header says nThread 0, which nccl-tests cannot print"),
    (("iters: 20", "iters: 99999999999999999999"), "the header says iters 99999999999999999999"),
    (("device  1 [0000:00:07]", "device 99999 [0000:00:07]"), "a device line whose device (at most 65536)"),
    (("NVIDIA H200\n#  Rank  1", "NVIDIA " + "H" * 300 + "\n#  Rank  1"), "GPU name (307 characters; at most 255)"),
])
def test_counts_and_fields_beyond_what_nccl_tests_prints_are_refused_before_anything_is_built(cli, db, tmp_path, edit,
                                                                                              words):
    p = tmp_path / "x.log"
    p.write_text(_real().replace(*edit))
    _one_line_exit_2(_run(cli, "history", "add", p, "--db", db), words)
    assert not db.exists()


@pytest.mark.parametrize("column", ["time", "busbw", "#wrong"])
@pytest.mark.parametrize("value", ["1e400", "nan", "-1", "1" * 40])
def test_a_figure_that_is_no_finite_number_leaves_its_row_out_with_that_said(cli, db, tmp_path, column, value):
    line = next(ln for ln in _real().splitlines() if ln.startswith("    67108864"))
    tokens = line.split()
    at = {"time": 5, "busbw": 7, "#wrong": 8}[column]
    tokens[at] = value
    p = tmp_path / "x.log"
    p.write_text(_real().replace(line, "  ".join(tokens)))
    r = _run(cli, "history", "add", p, "--db", db)
    assert r.exit_code == 0 and "stored r1: comm, 6 headline metric(s)" in r.output, r.output  # both placements
    assert "line 12: a row whose figures are not what nccl-tests prints there" in r.output
    with History.open(db, readonly=True) as h:
        values = [m.value for m in h.metrics("r1")]
    import math

    assert values and all(math.isfinite(v) and v > 0 for v in values)


def test_the_reader_takes_linear_time_on_giant_fields(cli, db, tmp_path):
    import time

    real = _real()
    cases = [  # (name, text, exit code, words)
        ("number", real.replace("248.87", "2" * 40_000), 0, "line 12: 40,"),  # 169 s before
        ("name", real.replace("NVIDIA H200\n#  Rank  1", "NVIDIA" + " " * 100_000 + "H200\n#  Rank  1"), 0,
         "line 6: 100,"),  # 182 s before
        ("field", real.replace("248.87", "2" * 3000), 0, "line 12: a row whose figures are not what"),
        ("spaces", real.replace("NVIDIA H200\n#  Rank  1", "NVIDIA H200" + " " * 3000 + "\n#  Rank  1"), 0, "stored r"),
        ("inner", real.replace("NVIDIA H200\n#  Rank  1", "NVIDIA" + " " * 3000 + "H200\n#  Rank  1"), 2,
         "GPU name (3010 characters; at most 255)"),
        ("lines", real + ("#" + " " * 4000 + "size\n") * 500 + ("1" * 4000 + "\n") * 500, 0, "stored r"),
    ]
    for name, text, code, words in cases:
        p = tmp_path / f"{name}.log"
        p.write_text(text)
        t0 = time.process_time()
        r = _run(cli, "history", "add", p, "--db", db)
        spent = time.process_time() - t0
        assert r.exit_code == code and words in r.output and "Traceback" not in r.output, (name, r.output)
        assert code or "characters, more than any line" in r.output or name in ("field", "spaces", "lines")
        assert spent < 2.0, f"{name}: {spent:.1f} s of CPU"
    t0 = time.process_time()
    for text in ("9" * 4000, "1." * 2000, "1e" + "9" * 4000, "." + "1" * 4000 + "x"):
        with pytest.raises(ValueError):
            nccl_tests.figure(text)
    assert time.process_time() - t0 < 0.5


def test_a_log_larger_than_any_log_is_refused_unread(cli, db, tmp_path):
    p = tmp_path / "huge.log"
    with open(p, "wb") as fh:
        fh.write(_real().encode())
        fh.truncate(nccl_tests.MAX_LOG_BYTES + 1)  # a sparse file: no disk spent
    _one_line_exit_2(_run(cli, "history", "add", p, "--db", db), "more than a nccl-tests or rccl-tests log holds")
    assert not db.exists()


def test_an_imported_run_carries_its_wrong_elements_and_plan_takes_no_figure_from_it(cli, db, tmp_path):
    log = tmp_path / "wrong.log"
    log.write_text(logs.nccl_log("all_reduce", logs.h200_ranks(8), SIZES,
                                 wrong=lambda s, i: 7 if s == SIZES[0] and not i else 0))  # one figure: 7 wrong
    r = _run(cli, "history", "add", log, "--db", db)
    assert r.exit_code == 0 and "7 wrong element(s)" in r.output, r.output
    with History.open(db, readonly=True) as h:
        doc = h.get("r1").document
    assert doc["source"]["logs"][0]["wrong_elements"] == 7
    assert sum(sum(m["wrong"] or []) for m in doc["measurements"]) == 7
    r = _run(cli, "plan", "--model", "350m", "--tokens", "300B", "--gpus", "64", "--db", db, "--no-store")
    assert "left out: r1, comm: 7 wrong element(s) in its figures" in r.output, r.output
    assert not re.search(r"r1 \(allreduce", r.output), r.output


def test_an_imported_runs_time_is_the_one_its_log_states_or_the_import_never_the_files_mtime(cli, db, tmp_path):
    import datetime as dt
    import os

    p = tmp_path / "old.log"
    p.write_text(_real())
    os.utime(p, (978307200, 978307200))  # 2001-01-01: a copy's mtime says nothing of the run
    r = _run(cli, "history", "add", p, "--db", db)
    assert r.exit_code == 0 and "the time of the import: the log states no time of its own" in r.output, r.output
    with History.open(db, readonly=True) as h:
        rec = h.get("r1")
    created = dt.datetime.fromisoformat(rec.created)
    assert abs((dt.datetime.now(dt.UTC) - created).total_seconds()) < 600
    assert rec.document["source"]["created_from"] == imported.CREATED_AT_IMPORT
    r = _run(cli, "history", "show", "r1", "--db", db)
    assert "(the time of the import" in r.output and "2001" not in r.output, r.output
    # -S 1: nccl-tests prints the time after each row (the host's local time, no zone)
    lines = []
    for k, ln in enumerate(_real().splitlines()):
        if ln.lstrip().startswith("#       size"):
            ln += "  timestamp"
        elif ln.strip() and ln.split()[0].isdigit():
            ln += f"  2025-06-0{k % 9 + 1} 12:0{k % 10}:00"
        lines.append(ln)
    stamped = tmp_path / "stamped.log"
    stamped.write_text("\n".join(lines) + "\n")
    os.utime(stamped, (978307200, 978307200))
    r = _run(cli, "history", "add", stamped, "--db", db)
    assert r.exit_code == 0, r.output
    with History.open(db, readonly=True) as h:
        rec = h.get("r2")
    first = next(ln for ln in lines if ln.startswith("    67108864")).split()[-2:]
    assert rec.created == f"{first[0]}T{first[1]}+00:00" and rec.document["source"]["created_from"] == \
        imported.CREATED_FROM_LOG
    assert len(rec.document["measurements"]) == 8  # the timestamp column read past, every figure kept
