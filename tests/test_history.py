"""The history store (real SQLite files, real concurrent processes), the comparison rule, the
fingerprint differences, and the history / baseline / compare commands through CliRunner and a
real process."""

from __future__ import annotations

import copy
import itertools
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_headline import comm_document, gemm_document, model_document, suite_document

from mgpu_bench.core.errors import InputError
from mgpu_bench.history import History, compare, fingerprint_diff, noise, topology_hash
from mgpu_bench.history import store as hist
from mgpu_bench.results.metrics import Metric
from mgpu_bench.results.probe import headline as metrics_from_document

FIX = Path(__file__).with_name("fixtures")


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "h.sqlite3"


def _bytes(p: Path) -> bytes:
    return p.read_bytes()


# -- the store --------------------------------------------------------------------------------


def test_a_new_database_is_wal_with_our_id_and_schema_version(db):
    with History.open(db) as h:
        assert h.path == db
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("PRAGMA application_id").fetchone()[0] == hist.APPLICATION_ID
        assert (
            con.execute("PRAGMA user_version").fetchone()[0] == hist.SCHEMA_VERSION == 1
        )
        tables = {
            r[0]
            for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        assert {"runs", "metrics", "baselines"} <= tables
    finally:
        con.close()


def test_default_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MGPU_BENCH_DB", str(tmp_path / "x.sqlite3"))
    assert hist.default_path() == tmp_path / "x.sqlite3"
    monkeypatch.delenv("MGPU_BENCH_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert hist.default_path() == tmp_path / "data" / "mgpu-bench" / "history.sqlite3"
    with History.open() as h:  # the XDG folder is created
        h.save(comm_document())
    assert (tmp_path / "data" / "mgpu-bench" / "history.sqlite3").is_file()
    monkeypatch.delenv("XDG_DATA_HOME")
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert (
        hist.default_path()
        == tmp_path / "home" / ".local" / "share" / "mgpu-bench" / "history.sqlite3"
    )
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")  # the XDG rules: a relative path is ignored
    assert hist.default_path() == tmp_path / "home" / ".local" / "share" / "mgpu-bench" / "history.sqlite3"


def test_the_conftest_keeps_every_test_in_a_private_database():
    path = Path(os.environ["MGPU_BENCH_DB"])
    assert hist.default_path() == path and "history" in str(path.parent)


def test_save_get_metrics_and_ids_survive_reopening(db):
    doc = comm_document()
    with History.open(db) as h:
        r1 = h.save(doc)
        r2 = h.save(gemm_document())
    assert (r1, r2) == ("r1", "r2")
    with History.open(db) as h:
        rec = h.get("r1")
        assert rec.kind == "comm" and rec.document == json.loads(json.dumps(doc))
        assert (
            rec.fingerprint == doc["environment"]
            and rec.host == doc["environment"]["host"]
        )
        assert rec.command == "mgpu-bench comm" and rec.created == doc["created"]
        assert h.metrics("1") == metrics_from_document(
            doc
        )  # samples and labels round-trip
        assert h.get("R2").kind == "gemm" and h.resolve("latest") == "r2"
        for bad in ("r3", "0", "x1", "", "r-1", "r\u00b2", "r" + "9" * 30):
            with pytest.raises(InputError):
                h.get(bad)


def test_list_trend_and_baselines(db):
    with History.open(db) as h:
        ids = [h.save(comm_document(scale=s)) for s in (1.0, 1.1, 1.2)]
        g = h.save(gemm_document())
        runs = h.list(limit=10)
        assert [r.run_id for r in runs] == [g, *reversed(ids)]  # newest first
        assert [r.run_id for r in h.list(limit=2, kind="comm")] == [ids[2], ids[1]]
        assert runs[1].metric_count == len(metrics_from_document(comm_document()))
        points = h.trend("comm.allreduce.fp32.1GiB.out.2ranks.busbw", limit=2)
        assert [p.run_id for p in points] == ids[1:]  # the latest 2, oldest first
        assert points[0].value > points[1].value and points[0].unit == "B/s"
        assert h.trend("no.such.metric") == []
        assert h.baseline("comm") is None
        assert h.set_baseline(ids[0]) == "comm"
        assert h.set_baseline(ids[1]) == "comm"  # replaces
        assert h.set_baseline("latest") == "gemm"
        assert h.baseline("comm") == ids[1] and h.baselines() == {
            "comm": ids[1],
            "gemm": g,
        }
        assert [r.baseline for r in h.list(kind="comm")] == [False, True, False]


def test_save_refuses_what_is_not_a_result_and_keeps_a_run_whole(db):
    with History.open(db) as h:
        with pytest.raises(InputError):
            h.save({"schema": "something/else"})
        m = Metric("gemm.gpu0.bf16.tflops", 1.0, "FLOP/s", "higher")
        with pytest.raises(ValueError):
            h.save(gemm_document(), [m, m])
        assert h.list() == []  # nothing half-stored
        with pytest.raises(InputError, match="kind: is 'topo', not a kind of result"):  # issue 17: never stored
            h.save({"schema": "mgpu-bench/result", "schema_version": 1, "kind": "topo", "notes": []})
        assert h.list() == []


def test_a_file_that_is_not_sqlite_is_refused_and_untouched(db):
    db.write_text("name,value\nbusbw,361\n")
    before = _bytes(db)
    with pytest.raises(InputError, match="is not an SQLite database"):
        History.open(db)
    assert _bytes(db) == before and not Path(str(db) + "-wal").exists()


def test_an_sqlite_file_of_another_program_is_refused_and_untouched(db, tmp_path):
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE notes (x)")
    con.commit()
    con.close()
    before = _bytes(db)
    with pytest.raises(InputError, match="another program"):
        History.open(db)
    assert _bytes(db) == before
    other = tmp_path / "other.sqlite3"
    con = sqlite3.connect(other)
    con.execute("PRAGMA application_id = 1234")
    con.commit()
    con.close()
    before = _bytes(other)
    with pytest.raises(InputError, match="application_id 0x4d2"):
        History.open(other)
    assert _bytes(other) == before


def test_a_newer_schema_is_refused_and_untouched(db):
    with History.open(db) as h:
        h.save(comm_document())
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("PRAGMA user_version = 99")
    con.commit()
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    before = _bytes(db)
    with pytest.raises(InputError, match="newer mgpu-bench"):
        History.open(db)
    assert _bytes(db) == before


def test_a_corrupt_database_is_an_input_error(db):
    with History.open(db) as h:
        h.save(comm_document())
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = bytearray(_bytes(db))
    data[100:] = b"\xa5" * (len(data) - 100)  # keep the header, ruin every page
    db.write_bytes(bytes(data))
    with (
        pytest.raises(InputError, match="not a usable mgpu-bench history"),
        History.open(db) as h,
    ):
        h.list()


def test_a_missing_or_unwritable_folder_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        History.open(tmp_path / "nowhere" / "h.sqlite3")
    with pytest.raises(InputError, match="is a folder"):
        History.open(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    folder = (
        ro if not os.access(ro, os.W_OK) else Path("/proc/sys")
    )  # root ignores the mode bits
    if os.access(folder, os.W_OK):
        pytest.skip("no unwritable folder available to this user")
    with pytest.raises(InputError, match="not writable|on a proc file system"):  # root: /proc/sys
        History.open(folder / "h.sqlite3")


def test_migrations_apply_in_order_in_one_transaction(db, monkeypatch):
    with History.open(db) as h:
        h.save(comm_document())
    bad = (
        *hist.MIGRATIONS,
        ("ALTER TABLE runs ADD COLUMN note TEXT", "THIS IS NOT SQL"),
    )
    monkeypatch.setattr(hist, "MIGRATIONS", bad)
    monkeypatch.setattr(hist, "SCHEMA_VERSION", 2)
    with pytest.raises(InputError):
        History.open(db)
    con = sqlite3.connect(db)
    assert (
        con.execute("PRAGMA user_version").fetchone()[0] == 1
    )  # rolled back: no half-migrated file
    assert "note" not in [r[1] for r in con.execute("PRAGMA table_info(runs)")]
    con.close()
    good = (
        *hist.MIGRATIONS[:1],
        ("ALTER TABLE runs ADD COLUMN note TEXT", "UPDATE runs SET note = 'migrated'"),
    )
    monkeypatch.setattr(hist, "MIGRATIONS", good)
    with History.open(db) as h:
        assert h.get("r1").kind == "comm"
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 2
    assert con.execute("SELECT note FROM runs").fetchall() == [("migrated",)]
    con.close()


_WRITER = textwrap.dedent("""
    import sys, time
    from mgpu_bench.history.store import History
    from mgpu_bench.results.metrics import Metric
    db, tag, start, n = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    while time.time() < start:
        time.sleep(0.001)
    with History.open(db) as h:  # both processes may create the file at once
        for i in range(n):
            doc = {"schema": "mgpu-bench/result", "kind": "load", "environment": {"host": tag}, "i": i}
            h.save(doc, [Metric("load.value", float(i), "s", "lower", (1.0, 2.0)),
                         Metric("load.writer", float(tag == "b"), "fraction", "lower")])
""")


def test_two_processes_writing_200_runs_each_lose_none(db):
    start = time.time() + 3.0  # both wait for the same moment, after their imports
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(db), tag, str(start), "200"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    for p in procs:
        _out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    with History.open(db) as h:
        runs = h.list(limit=1000)
        assert len(runs) == 400 and len({r.run_id for r in runs}) == 400
        assert sorted(r.host for r in runs).count("a") == 200
        for host in ("a", "b"):
            docs = [h.get(r.run_id).document for r in runs if r.host == host]
            assert sorted(d["i"] for d in docs) == list(range(200))
        assert len(h.trend("load.value", limit=1000)) == 400
        interleaved = [r.host for r in reversed(runs)]
        switches = sum(1 for x, y in itertools.pairwise(interleaved) if x != y)
    assert switches >= 1  # the two really wrote into one file


_OPENER = textwrap.dedent("""
    import sys, time
    from mgpu_bench.history.store import History
    db, start = sys.argv[1], float(sys.argv[2])
    while time.time() < start:
        pass
    History.open(db).close()
""")


def test_processes_creating_one_database_at_once_all_open_it(tmp_path):
    # The owner check reads three marks; read one at a time, a database another process was
    # creating meanwhile looked foreign (tables there, application_id still 0) about 1 time in 6.
    for k in range(8):
        db = tmp_path / f"h{k}.sqlite3"
        start = time.time() + 1.0
        procs = [
            subprocess.Popen([sys.executable, "-c", _OPENER, str(db), str(start)],
                             stderr=subprocess.PIPE, text=True)
            for _ in range(3)
        ]
        for p in procs:
            _out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
        with History.open(db) as h:
            assert h.list() == []


# -- comparison -------------------------------------------------------------------------------


def _m(name, value, better="higher", unit="B/s", samples=()):
    return Metric(name, value, unit, better, tuple(samples))


def _status(base, new, tol=0.05):
    (c,) = [c for c in compare([base], [new], tol) if c.name == new.name]
    return c


@pytest.mark.parametrize(
    "better,base,new,status,gain",
    [
        ("higher", 100.0, 90.0, "regression", -0.10),
        ("higher", 100.0, 110.0, "improvement", 0.10),
        ("higher", 100.0, 97.0, "unchanged", -0.03),
        ("lower", 100.0, 110.0, "regression", -0.10),  # a latency that grew
        ("lower", 100.0, 90.0, "improvement", 0.10),
        ("lower", 100.0, 104.0, "unchanged", -0.04),
    ],
)
def test_change_is_signed_by_direction(better, base, new, status, gain):
    c = _status(
        _m("x.q", base, better, "s" if better == "lower" else "B/s"),
        _m("x.q", new, better, "s" if better == "lower" else "B/s"),
    )
    assert c.status == status and c.gain == pytest.approx(gain)
    assert c.change == pytest.approx((new - base) / base) and c.threshold == 0.05


def test_noise_widens_the_threshold():
    noisy = [
        100.0 * (1 + 0.04 * d) for d in (-2, -1, 0, 1, 2, 0, 1, -1)
    ]  # MAD 4 -> 5.9% robust spread
    assert noise(noisy) == pytest.approx(1.4826 * 4 / 100)
    base = _m("x.q", 100.0, samples=noisy)
    # a 5.5% drop is inside one spread: the runs agree
    c = _status(base, _m("x.q", 94.5, samples=noisy))
    assert c.status == "within noise" and c.threshold == pytest.approx(
        3 * 1.4826 * 0.04
    )
    # a 10% drop is beyond one spread, under three: neither a regression nor "within noise"
    assert _status(base, _m("x.q", 90.0, samples=noisy)).status == "cannot tell"
    assert _status(base, _m("x.q", 80.0, samples=noisy)).status == "regression"
    # only the new run has samples: its noise alone counts
    assert (
        _status(_m("x.q", 100.0), _m("x.q", 94.5, samples=noisy)).status
        == "within noise"
    )
    # fewer than 5 samples: no noise estimate, the tolerance alone decides
    assert noise(noisy[:4]) is None
    assert (
        _status(
            _m("x.q", 100.0, samples=noisy[:4]), _m("x.q", 90.0, samples=noisy[:4])
        ).status
        == "regression"
    )
    # a tighter tolerance does not make noise a regression
    assert (
        _status(base, _m("x.q", 97.0, samples=noisy), tol=0.01).status == "within noise"
    )


def test_fractions_change_in_points():
    c = _status(
        _m("model.x.exposed_comm", 0.02, "lower", "fraction"),
        _m("model.x.exposed_comm", 0.03, "lower", "fraction"),
    )
    assert (
        c.change == pytest.approx(0.01) and c.status == "unchanged" and c.absolute
    )  # +1 point, not +50%
    c = _status(
        _m("model.x.exposed_comm", 0.02, "lower", "fraction"),
        _m("model.x.exposed_comm", 0.12, "lower", "fraction"),
    )
    assert c.status == "regression" and c.gain == pytest.approx(-0.10)
    assert noise([0.50, 0.51, 0.49, 0.50, 0.52], absolute=True) == pytest.approx(
        1.4826 * 0.01
    )


def test_zero_base_and_added_and_missing():
    assert _status(_m("x.q", 0.0), _m("x.q", 0.0)).status == "unchanged"
    assert _status(_m("x.q", 0.0), _m("x.q", 5.0)).status == "improvement"
    out = compare([_m("a.x", 1.0), _m("b.x", 1.0)], [_m("b.x", 1.0), _m("c.x", 1.0)])
    assert [(c.name, c.status) for c in out] == [
        ("b.x", "unchanged"),
        ("c.x", "added"),
        ("a.x", "missing"),
    ]


def test_no_shared_metric_gives_added_and_missing_and_bad_tolerance_is_an_input_error():
    assert [c.status for c in compare([_m("a.x", 1.0)], [_m("b.x", 1.0)])] == ["added", "missing"]
    for tol in (0, 1, -0.1, 1.5):
        with pytest.raises(InputError):
            compare([_m("a.x", 1.0)], [_m("a.x", 1.0)], tol)


def test_real_documents_compare_as_expected():
    base = metrics_from_document(comm_document())
    slower = metrics_from_document(comm_document(scale=1.25))  # every time 25% longer
    changes = compare(base, slower)
    assert {c.status for c in changes} == {"regression"}
    assert len(changes) == len(base)
    busbw = next(
        c for c in changes if c.name == "comm.allreduce.fp32.1GiB.out.2ranks.busbw"
    )
    assert busbw.change == pytest.approx(1 / 1.25 - 1) and busbw.noise_base is not None
    same = compare(base, metrics_from_document(comm_document()))
    assert {c.status for c in same} == {"unchanged"}


# -- fingerprints -----------------------------------------------------------------------------


def _fp(**over):
    fp = {
        "host": "gpu07",
        "nvidia_driver": "550.54.15",
        "cuda_runtime": "12.4",
        "cuda_driver": "12.4",
        "nccl": "2.21.5",
        "torch": "2.4.0",
        "gpus": [
            {
                "index": i,
                "name": "NVIDIA H200",
                "uuid": f"GPU-{i}",
                "pci_bus_id": f"0000:{i:02x}:00.0",
            }
            for i in range(2)
        ],
    }
    fp.update(over)
    return fp


def test_fingerprint_diff_names_what_changed():
    a = _fp()
    assert fingerprint_diff(a, copy.deepcopy(a)) == []
    b = _fp(nvidia_driver="580.159.04", nccl="2.28.9", torch=None)
    assert fingerprint_diff(a, b) == [
        "driver 550.54.15 vs 580.159.04",
        "NCCL 2.21.5 vs 2.28.9",
        "torch 2.4.0 vs unknown",
    ]
    c = _fp(host="gpu08")
    c["gpus"][1] = {**c["gpus"][1], "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-x"}
    lines = fingerprint_diff(a, c)
    assert lines[0] == "host gpu07 vs gpu08"
    assert "GPUs 2x NVIDIA H200 vs 1x NVIDIA H200, 1x NVIDIA H100 80GB HBM3" in lines
    assert any(line.startswith("GPU UUIDs differ (1 GPU(s))") for line in lines)
    assert not any(line.startswith("topology") for line in lines)


def test_fingerprint_diff_names_changed_nccl_variables():
    a = _fp(env={"NCCL_NVLS_ENABLE": "0", "OMP_NUM_THREADS": "8"})
    b = _fp(env={"NCCL_P2P_DISABLE": "1", "OMP_NUM_THREADS": "8"})
    assert fingerprint_diff(a, b) == [
        "NCCL_NVLS_ENABLE=0 vs unset",
        "NCCL_P2P_DISABLE=unset vs 1",
    ]


def test_topology_hash_follows_bus_ids_and_links():
    a = _fp()
    moved = _fp()
    moved["gpus"][1]["pci_bus_id"] = "0000:9a:00.0"
    assert topology_hash(a) != topology_hash(moved)
    assert any(line.startswith("topology ") for line in fingerprint_diff(a, moved))
    topo = json.loads(
        (Path(__file__).parent / "fixtures" / "topo_2x_h200.json").read_text()
    )
    with_topo = _fp(topology=topo)
    degraded = copy.deepcopy(with_topo)
    degraded["topology"]["gpus"][0]["pcie"]["width"] = 8  # a downgraded PCIe link
    assert topology_hash(with_topo) != topology_hash(degraded)
    assert topology_hash({}) is None


# -- the commands -----------------------------------------------------------------------------


@pytest.fixture
def cli():
    from mgpu_bench.cli import cli as main
    from mgpu_bench.history.cli import register

    register(main)
    return main


def _write(tmp_path: Path, name: str, doc: dict) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def _one_error_line(r, words: str) -> None:
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("mgpu-bench: error: ")
        and words in lines[0]
    ), r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_add_list_show_trend_baseline_compare(cli, tmp_path, db):
    run = CliRunner().invoke
    base = _write(tmp_path, "base.json", model_document())
    slow = _write(tmp_path, "slow.json", model_document(step_1=0.100, step_2=0.140))
    r = run(cli, ["history", "add", base, slow, "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert (
        "stored r1: model, 22 headline metric(s)" in r.output  # 10, and the step ledger's 6 causes per configuration
        and "stored r2: model" in r.output
    )
    r = run(cli, ["history", "list", "--db", str(db)])
    assert r.exit_code == 0 and r.output.index(" r2 ") < r.output.index(" r1 ")
    r = run(cli, ["history", "show", "r2", "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert (
        "model.350m.ddp.2gpu.synthetic.tokens_per_s" in r.output and "tok" in r.output
    )
    assert "12.00 GiB" in r.output and "%" in r.output  # peak memory, MFU
    r = run(
        cli,
        [
            "history",
            "trend",
            "model.350m.ddp.2gpu.synthetic.tokens_per_s",
            "--db",
            str(db),
        ],
    )
    assert (
        r.exit_code == 0 and "+0.0%" in r.output and "-25.0%" in r.output
    )  # 0.105 s -> 0.140 s per step
    assert r.output.index(" r1 ") < r.output.index(" r2 ")  # oldest first
    r = run(cli, ["compare", "r2", "--db", str(db)])
    _one_error_line(
        r, "no baseline for model runs: set one with `mgpu-bench baseline set RUN`"
    )
    r = run(cli, ["baseline", "set", "r1", "--db", str(db)])
    assert r.exit_code == 0 and "r1 is now the baseline for model runs" in r.output
    r = run(cli, ["baseline", "show", "--db", str(db)])
    assert r.exit_code == 0 and "model: r1" in r.output
    r = run(cli, ["compare", "r1", "--db", str(db)])
    assert r.exit_code == 0, r.output  # the baseline against itself
    out = tmp_path / "cmp.json"
    r = run(cli, ["compare", "latest", "--db", str(db), "--json", str(out)])
    assert r.exit_code == 1, (
        r.output
    )  # 2 GPUs got 25% slower: a regression, exit code 1
    assert "regression: model.350m.ddp.2gpu.synthetic.tokens_per_s" in r.output
    assert "regression: model.350m.ddp.1gpu" not in r.output
    doc = json.loads(out.read_text())
    assert doc["base"] == "r1" and doc["new"] == "r2" and doc["regressions"] >= 1
    statuses = {c["name"]: c["status"] for c in doc["changes"]}
    assert statuses["model.350m.ddp.2gpu.synthetic.tokens_per_s"] == "regression"
    assert statuses["model.350m.ddp.1gpu.synthetic.tokens_per_s"] == "unchanged"
    r = run(
        cli,
        ["compare", "r2", "--baseline", "r1", "--tolerance", "50%", "--db", str(db)],
    )
    assert r.exit_code == 0, r.output  # a 25% drop is inside a 50% tolerance


def test_compare_warns_about_a_different_setup_first(cli, tmp_path, db):
    base = comm_document(nvidia_driver="550.54.15")
    new = comm_document(nvidia_driver="580.159.04")
    with History.open(db) as h:
        h.save(base)
        h.save(new)
    r = CliRunner().invoke(cli, ["compare", "r2", "--baseline", "r1", "--db", str(db)])
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]
    assert first.startswith(
        "warning: r1 and r2 ran on different setups: driver 550.54.15 vs 580.159.04"
    )


@pytest.mark.parametrize(
    "args, words",
    [
        (["history", "show", "r9"], "no run r9 in"),
        (["history", "show", "run-nine"], "is not a run id"),
        (["baseline", "set", "r9"], "no run r9 in"),
        (["baseline", "show", "--kind", "gemm"], "no baseline for gemm runs"),
        (
            ["compare", "r1", "--baseline", "r1", "--tolerance", "0"],
            "--tolerance '0' must be more than 0",
        ),
        (
            ["compare", "r1", "--baseline", "r1", "--tolerance", "100%"],
            "less than 100%",
        ),
        (
            ["compare", "r1", "--baseline", "r1", "--tolerance", "5"],
            "write e.g. 5% or 0.05",
        ),
        (
            ["compare", "r1", "--baseline", "r1", "--tolerance", "five"],
            "is not a number",
        ),
        (
            [
                "compare",
                "r1",
                "--baseline",
                "r1",
                "--json",
                "/nonexistent-folder/c.json",
            ],
            "does not exist",
        ),
        (
            ["history", "trend", "comm.allreduce.fp32.1GiB.out.2ranks.busbw_typo"],
            "did you mean",
        ),
        (["history", "list", "--limit", "0"], "Invalid value for '--limit'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, db, args, words):
    with History.open(db) as h:
        h.save(comm_document())
        h.save(gemm_document())
    _one_error_line(CliRunner().invoke(cli, [*args, "--db", str(db)]), words)


def test_bad_databases_are_one_line_and_exit_2(cli, tmp_path):
    junk = tmp_path / "junk.sqlite3"
    junk.write_text("not a database at all")
    for args in (["history", "list"], ["compare", "r1"], ["baseline", "show"]):
        _one_error_line(
            CliRunner().invoke(cli, [*args, "--db", str(junk)]),
            "is not an SQLite database",
        )
    assert junk.read_text() == "not a database at all"
    _one_error_line(  # a read never creates a database, nor a folder for one
        CliRunner().invoke(
            cli, ["history", "list", "--db", str(tmp_path / "no" / "h.sqlite3")]
        ),
        f"no history database at {tmp_path / 'no' / 'h.sqlite3'}",
    )
    assert not (tmp_path / "no").exists()
    _one_error_line(
        CliRunner().invoke(
            cli, ["history", "add", str(FIX / "comm_2x_h200.json"), "--db", str(tmp_path / "no" / "h.sqlite3")]
        ),
        "does not exist: create it first",
    )
    doc = _write(tmp_path, "bad.json", {"schema": "other"})
    _one_error_line(
        CliRunner().invoke(
            cli, ["history", "add", doc, "--db", str(tmp_path / "h.sqlite3")]
        ),
        "is not an mgpu-bench result document",
    )


def test_outside_text_is_not_read_as_markup(cli, tmp_path, db):
    doc = gemm_document()
    doc["command"] = ["mgpu-bench", "gemm", "--peak", "[red]bf16=989[/red]"]
    doc["environment"]["host"] = "[bold]node[/bold]"
    with History.open(db) as h:
        h.save(doc)
    r = CliRunner().invoke(cli, ["history", "show", "r1", "--db", str(db)])
    assert (
        r.exit_code == 0
        and "[red]bf16=989[/red]" in r.output
        and "[bold]node[/bold]" in r.output
    )


def test_compare_help_states_the_rule_and_the_exit_codes(cli):
    r = CliRunner().invoke(cli, ["compare", "--help"])
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert "max(--tolerance, 3 x the larger noise" in text
    assert "1 at least one regression" in text and "2 bad input" in text
    r = CliRunner().invoke(cli, ["history", "--help"])
    assert r.exit_code == 0 and "trend" in r.output and "show" in r.output


def test_show_writes_a_prometheus_textfile(cli, tmp_path, db):
    with History.open(db) as h:
        h.save(suite_document())
    prom = tmp_path / "mgpu_bench.prom"
    r = CliRunner().invoke(
        cli, ["history", "show", "r1", "--prometheus", str(prom), "--db", str(db)]
    )
    assert r.exit_code == 0, r.output
    text = prom.read_text()
    assert 'mgpu_bench_info{host="' in text and 'run="r1"' in text
    assert "mgpu_bench_gemm_flops_per_second{" in text and 'probe="gemm-hot"' in text


def _cli_proc(*args: str, db: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, MGPU_BENCH_DB=str(db), CUDA_VISIBLE_DEVICES="")
    return subprocess.run(
        [sys.executable, "-m", "mgpu_bench.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.mark.timing
def test_real_processes_store_a_real_sweep_and_gate_on_it(tmp_path, db):
    """A real gloo comm sweep written by the real command, stored, made the baseline, compared
    with itself (exit 0) and with a copy 1000x slower (exit 1: gloo's small-message times on CPU
    spread widely, 128% beside 8 busy processes, so 3x their noise passed ln 20; no relative
    spread of positive times, 1.4826 x MAD / median, reaches ln(1000) / 3)."""
    j = tmp_path / "comm.json"
    sweep = [
        "comm",
        "--backend",
        "torch",
        "--ops",
        "allreduce",
        "--sizes",
        "1K,8K",
        "--min-time",
        "0.01",
        "--json",
    ]
    r = subprocess.run(
        [sys.executable, "-m", "mgpu_bench.cli", *sweep, str(j)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
        check=False,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(j.read_text())
    slow = copy.deepcopy(doc)
    for m in slow["measurements"]:
        m["burst_seconds"] = [1000 * x for x in m["burst_seconds"]]
        m["samples"] = [[1000 * x for x in row] for row in m["samples"]]
    s = tmp_path / "slow.json"
    s.write_text(json.dumps(slow))
    r = _cli_proc("history", "add", str(j), str(s), db=db)
    assert r.returncode == 0, r.stderr
    assert "stored r1: comm, 2 headline metric(s)" in r.stdout
    r = _cli_proc("baseline", "set", "r1", db=db)
    assert r.returncode == 0, r.stderr
    r = _cli_proc("compare", "r1", db=db)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 regression" in r.stdout
    r = _cli_proc("compare", "r2", db=db)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "regression: comm.allreduce.fp32.1KiB.out.2ranks.latency" in r.stdout
    r = _cli_proc("compare", "r7", db=db)
    assert (
        r.returncode == 2
        and r.stderr.strip()
        == f"mgpu-bench: error: no run r7 in {db}: see `mgpu-bench history list`"
    )
    assert "Traceback" not in r.stderr


# -- issue 41: what `history show` says a run used, and what `history list` folds ----------------------------

def test_show_names_only_the_software_a_run_used(cli, db):
    gloo = FIX / "gpu" / "comm-small-1xh200.json"  # torch-gloo on a machine with an H200, CUDA 13.0, NCCL 2.28.3
    gemm = FIX / "gpu" / "gemm-dtypes-1xh200.json"
    assert json.loads(gloo.read_text())["environment"]["cuda_runtime"] == "13.0"
    r = CliRunner().invoke(cli, ["history", "add", str(gloo), str(gemm), str(FIX / "comm_2x_h200.json"), "--db", str(db)])
    assert r.exit_code == 0, r.output
    shown = {run: CliRunner().invoke(cli, ["history", "show", run, "--db", str(db)]).output for run in ("r1", "r2", "r3")}
    assert "torch 2.11.0 (torch-gloo): CPU processes, no GPU driver, CUDA or NCCL used" in shown["r1"], shown["r1"]
    assert "CUDA 13.0" not in shown["r1"] and "NCCL 2." not in shown["r1"]
    assert "driver 580.159.04, CUDA 13.0, torch" in shown["r2"] and "NCCL" not in shown["r2"]  # a GEMM calls no NCCL
    assert "driver 580.159.04, CUDA 13.0, NCCL 2.28.9, torch 2.11.0" in shown["r3"]  # an NCCL comm run: all of it


def test_list_folds_plan_runs_into_one_line_that_names_the_options_that_show_them(cli, db):
    plan = FIX / "gpu" / "plan-1xh200.json"
    files = [str(FIX / "comm_2x_h200.json"), str(plan), str(plan)]
    r = CliRunner().invoke(cli, ["history", "add", *files, "--db", str(db)])
    assert r.exit_code == 0 and "stored r3: plan" in r.output, r.output
    r = CliRunner().invoke(cli, ["history", "list", "--db", str(db)])
    assert r.exit_code == 0 and " r1 " in r.output and " r2 " not in r.output and " r3 " not in r.output, r.output
    assert "2 plan run(s) not listed: --kind plan lists them, --all lists every run" in r.output
    r = CliRunner().invoke(cli, ["history", "list", "--all", "--db", str(db)])
    assert all(f" r{i} " in r.output for i in (1, 2, 3)) and "not listed" not in r.output, r.output
    r = CliRunner().invoke(cli, ["history", "list", "--kind", "plan", "--limit", "1", "--db", str(db)])
    assert " r3 " in r.output and " r2 " not in r.output and " r1 " not in r.output and "not listed" not in r.output
    r = CliRunner().invoke(cli, ["history", "list", "--help"])
    assert "--all" in r.output and "plan" in r.output
    with History.open(db) as h:  # only plans: the listing says so, not "no runs"
        h.prune(keep=None, older_than="2999-01-01T00:00:00+00:00", kind="comm")
    r = CliRunner().invoke(cli, ["history", "list", "--db", str(db)])
    assert "no measured runs stored in" in r.output and "2 plan run(s) not listed" in r.output, r.output
