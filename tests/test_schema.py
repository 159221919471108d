"""Result documents against their declared shape (mgpu_bench.results.schema): every kind declares one;
what the writers produce and every stored version (the fixtures, the 0.1.0 history) passes it; a
document with the right schema tag but the wrong shape is exit code 2 with one line naming the
file and the field, at `history add`, at `report` and when a stored row is read back, and nothing
is stored or drawn from it; names from documents never become paths.

Real documents: the stored fixtures (GPU runs, a CPU suite, a real fleet pass of two emulated
nodes on this machine) and the release database; the writers run on the runs rebuilt from them."""

from __future__ import annotations

import copy
import json
import os
import sqlite3
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.core.errors import InputError
from mgpu_bench.history import History
from mgpu_bench.results import probe as registry
from mgpu_bench.results.probe import load_document as load
from mgpu_bench.results.probe import validate
from mgpu_bench.results.schema import SchemaError, file_stem

FIX = Path(__file__).with_name("fixtures")
RELEASE = FIX / "history" / "release-0.1.0.sqlite3"
FLEET = FIX / "fleet" / "fleet-2-cpu-nodes.json"


def _fixture(name: str) -> dict:
    return json.loads((FIX / name).read_text())


def _suite_part(name: str) -> dict:
    return next(p["document"] for p in _fixture("suite/suite.json")["probes"] if p["name"] == name)


def _release_documents() -> list[dict]:
    con = sqlite3.connect(f"file:{RELEASE}?mode=ro&immutable=1", uri=True)
    try:
        return [json.loads(d) for (d,) in con.execute("SELECT document FROM runs ORDER BY id")]
    finally:
        con.close()


def _one_line(result, *words: str) -> str:
    """The CLI's answer to bad input: exit code 2, one line, no traceback, naming `words`."""
    text = result.output.strip()
    assert result.exit_code == 2 and result.exception is None or isinstance(result.exception, SystemExit), text
    assert len(text.splitlines()) == 1 and text.startswith("mgpu-bench: error: ") and "Traceback" not in text, text
    for w in words:
        assert w in text, text
    return text


def test_every_kind_declares_its_shape():
    for name in registry.names():
        assert registry.get(name).schema() is not None, f"{name}: no SCHEMA in its shape module"


def test_every_stored_version_loads():
    """The fixtures (GPU documents, links and comm before the kind field, a CPU suite), the real
    fleet pass with its per-node documents, and the 0.1.0 history's runs."""
    from mgpu_bench.probes.fleet.document import node_documents

    docs = [_fixture(n) for n in ("comm_2x_h200.json", "suite/suite.json", "gpu/gemm-shared.json",
                                  "gpu/model-healthy.json", "gpu/model-shared.json")]
    fleet = json.loads(FLEET.read_text())
    docs += [fleet, *node_documents(fleet), *_release_documents()]
    kinds = set()
    for doc in docs:
        validate(doc)
        kinds.add(registry.for_document(doc).name)
        kinds.update(registry.for_document(p["document"]).name for p in doc.get("probes") or [] if p.get("document"))
    assert kinds == {"comm", "gemm", "memory", "links", "model", "fleet", "suite"}


def test_the_writers_produce_their_declared_shape():
    """Each probe's writer on a run rebuilt from a real document: what it writes passes the schema
    that reading it back checks (writer and schema cannot drift apart)."""
    from mgpu_bench.probes.comm import document as comm
    from mgpu_bench.probes.fleet import document as fleet
    from mgpu_bench.probes.fleet.measure import FleetConfig, FleetRun
    from mgpu_bench.probes.gemm import document as gemm
    from mgpu_bench.probes.links import document as links
    from mgpu_bench.probes.memory import document as memory
    from mgpu_bench.probes.model import document as model
    from mgpu_bench.suite import run as suite

    written = []
    for doc in (_fixture("comm_2x_h200.json"), _suite_part("comm"), _release_documents()[0]):
        written.append(comm.result_document(comm.run_from_document(doc), doc["environment"], doc["command"]))
    for doc in (_fixture("gpu/gemm-shared.json"), _suite_part("gemm"), _suite_part("gemm-sustained")):
        written.append(gemm.document(gemm.run_from_document(doc), doc["environment"], doc["command"],
                                     doc.get("occupancy")))
    for doc in (_suite_part("hbm+memory"), _suite_part("max-batch")):
        written.append(memory.document(memory.run_from_document(doc), doc["environment"], doc["command"]))
    for doc in (_fixture("gpu/model-healthy.json"), _fixture("gpu/model-shared.json"), _suite_part("model-scaling")):
        written.append(model.document(model.run_from_document(doc), doc["environment"], doc["command"],
                                      doc.get("occupancy")))
    doc = _suite_part("links")
    run, hops = links.run_from_document(doc)
    written.append(links.document(run, hops, doc["environment"], doc["command"]))
    doc = json.loads(FLEET.read_text())
    c = doc["config"]
    cfg = FleetConfig(size=c["size"], iters=c["iters"], warmup=c["warmup"], rounds=c["rounds"], seed=c["seed"],
                      timeout_s=c["timeout_s"], gemm_n=c["gemm_n"], copy_bytes=c["copy_bytes"],
                      phases=tuple(c["phases"]), device=c["device"])
    run = FleetRun(cfg, **{k: doc[k] for k in ("nodes", "pairings", "intra", "world", "isolation", "schedule",
                                                "phase_seconds", "notes", "wall_seconds", "verdicts")})
    written.append(fleet.document(run, doc["environment"], doc["command"]))
    written += fleet.node_documents(written[-1])
    s = _fixture("suite/suite.json")
    srun = suite.SuiteRun(suite.SuiteConfig(quick=s["quick"], rounds=tuple(s["rounds"]), duration_s=s["duration_s"]),
                          probes=s["probes"], wall_seconds=s.get("wall_seconds", 0.0))
    written.append(suite.document(srun, s["environment"], s["command"]))
    for doc in written:
        validate(json.loads(json.dumps(doc)))  # as the file holds it
    assert {d["kind"] for d in written} == {"comm", "gemm", "memory", "links", "model", "fleet", "suite"}


def test_the_issues_document_is_one_line_naming_the_field_and_nothing_is_stored(tmp_path):
    bad = tmp_path / "r.json"
    bad.write_text(json.dumps({"schema": "mgpu-bench/result", "schema_version": 1, "kind": "gemm", "config": {},
                               "status": {"completed": True, "stopped": None, "message": None}, "devices": [],
                               "wall_seconds": 1.0, "notes": [], "results": [{"flops_per_s": 1e12}]}))
    db = tmp_path / "h.sqlite3"
    run = CliRunner().invoke
    text = _one_line(run(cli, ["history", "add", str(bad), "--db", str(db)]), "r.json: results[0].gpu: missing")
    assert "a gemm result needs gpu, dtype, m, n, k and flops" in text
    _one_line(run(cli, ["report", str(bad), "--out", str(tmp_path / "rep")]), "results[0].gpu: missing")
    assert not db.exists() and not (tmp_path / "rep").exists()
    bad.write_text(json.dumps({"schema": "mgpu-bench/result", "kind": "gemm", "results": [{}]}))  # the issue's own
    _one_line(run(cli, ["history", "add", str(bad), "--db", str(db)]), "schema_version: missing")


@pytest.mark.parametrize(("change", "field", "says"), [
    (lambda d: d["measurements"][0]["spec"].update(op="a/b"), "measurements[0].spec.op", "is 'a/b', not one of"),
    (lambda d: d["measurements"][0]["spec"].update(dtype="fp7"), "measurements[0].spec.dtype", "not one of"),
    (lambda d: d["measurements"][0]["spec"].update(size=1 << 60), "measurements[0].spec.size",
     "not an integer from 0 to"),
    (lambda d: d.update(kind="nope"), "kind", "is 'nope', not a kind of result"),
    (lambda d: d.update(schema_version=99), "schema_version", "upgrade mgpu-bench"),
    (lambda d: d["measurements"][0]["spec"].update(bogus=1), "measurements[0].spec.bogus", "is not a field of"),
    (lambda d: d["measurements"][0].update(samples=[[1e-3, 2e-3], [1e-3]]), "measurements[0].samples",
     "rows of different lengths"),
    (lambda d: d["environment"].update(gpus=["x"]), "environment.gpus[0]", "not an object"),
])
def test_unknown_names_absurd_sizes_and_wrong_types_are_refused(tmp_path, change, field, says):
    doc = copy.deepcopy(_release_documents()[0])  # a real comm sweep
    change(doc)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    db = tmp_path / "h.sqlite3"
    _one_line(CliRunner().invoke(cli, ["history", "add", str(path), "--db", str(db)]), f"c.json: {field}: ", says)
    with pytest.raises(SchemaError, match=field.replace("[", r"\[").replace("]", r"\]")):
        History.open(db).save(doc)  # the store checks what it reads its metrics from, whoever calls it
    with History.open(db) as h:
        assert h.list() == []


def test_a_stored_row_changed_outside_is_refused_on_read(tmp_path):
    db = tmp_path / "h.sqlite3"
    docs = _release_documents()
    with History.open(db) as h:
        h.save(docs[0])
        h.save(docs[1])
    forged = copy.deepcopy(docs[1])
    forged["measurements"][0]["burst_seconds"] = "fast"
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET document = ? WHERE id = 2", (json.dumps(forged),))
    con.commit()
    con.close()
    out = tmp_path / "cmp.json"
    run = CliRunner().invoke
    _one_line(run(cli, ["compare", "r2", "--baseline", "r1", "--db", str(db), "--json", str(out)]),
              "stored run r2", "measurements[0].burst_seconds: is 'fast', not a non-empty list")
    assert not out.exists()
    _one_line(run(cli, ["history", "show", "r2", "--db", str(db)]), "stored run r2")
    assert run(cli, ["history", "show", "r1", "--db", str(db)]).exit_code == 0  # the others still read


def test_names_from_documents_never_become_paths():
    assert file_stem("busbw_a/b") == "busbw_a_b"
    assert file_stem("../../etc/passwd") == "_.._etc_passwd"
    assert file_stem(".hidden") == "hidden" and file_stem("") == "figure" and file_stem("x" * 300) == "x" * 100
    assert "/" not in file_stem("gemm_\x00/\\..") and file_stem("gemm_bf16") == "gemm_bf16"


def test_a_fifo_given_as_a_document_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "doc.json"
    os.mkfifo(fifo)
    errors: list[Exception] = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(InputError, load, fifo).value), daemon=True)
    t.start()
    t.join(timeout=30)
    if t.is_alive():  # unblock the reader before failing: open the other end
        with open(fifo, "w"):
            pass
        pytest.fail("reading a FIFO as a document waited for a writer")
    assert "not a regular file" in str(errors[0])


def test_a_fleet_report_draws_a_node_lost_after_its_first_pairings():
    """A node lost mid-pass has pairings from the rounds before but no row in the heatmap."""
    from mgpu_bench.probes.fleet.report import plot_pairs

    doc = json.loads(FLEET.read_text())
    lost = {**copy.deepcopy(doc["nodes"][1]), "index": 2, "node": "gpu3", "host": "gpu3", "answered": False,
            "lost": "lost in the links phase"}
    doc["nodes"].append(lost)
    doc["pairings"].append({**copy.deepcopy(doc["pairings"][0]), "a": 0, "b": 2, "round": 1})
    validate(doc)
    assert plot_pairs(doc).startswith(b"\x89PNG")


# -- what the messages say (issue 23: "is an object, not an object or a number") ---------------------

def _problem(spec, value) -> str:
    from mgpu_bench.results.schema import _Problem

    try:
        spec.check(value, "x")
    except _Problem as p:
        return f"{p.path}: {p.problem}"
    raise AssertionError(f"{value!r} passed {spec.describe()}")


def test_the_latency_shape_is_named_in_its_readers_terms():
    from mgpu_bench.probes.memory.shape import LATENCY

    assert _problem(LATENCY, {"alloc": 3}) == (
        "x.alloc: is 3, not a map of size classes, each {count, p50, p99, max} in seconds")
    assert _problem(LATENCY, {"alloc": {"<= 1 GiB": 5e-4}}) == (
        "x.alloc.<= 1 GiB: is 0.0005, not an object with count, p50, p99 and max")
    assert _problem(LATENCY, {"free": {"<= 4 MiB": {"count": 3, "p50": 1e-5, "max": 2e-5}}}) == (
        "x.free.<= 4 MiB.p99: missing (a size class's latency needs count, p50, p99 and max)")
    assert _problem(LATENCY, {"alloc": {"> 1 GiB": {"count": 1, "p50": None, "p99": 1e-3, "max": 1e-3}}}) == (
        "x.alloc.> 1 GiB.p50: is null, not a number of at least 0")


def test_one_of_reports_the_problem_inside_the_option_of_the_values_type():
    from mgpu_bench.results.schema import Int, List, Map, Num, Obj, OneOf, Str

    either = OneOf(Map(Num(), keys_what="a size class"), Num())
    assert _problem(either, {"a": 1, "b": "fast"}) == "x.b: is 'fast', not a number"
    assert _problem(either, "fast") == "x: is 'fast', not a map from a size class to a number or a number"
    assert _problem(OneOf(Int(), Str(max_len=4)), True) == "x: is true, not an integer or a string of at most 4 characters"
    assert _problem(OneOf(Int(), Str(max_len=4)), "label") == "x: is 'label', not a string of at most 4 characters"
    # of two options of the value's type, the one that got furthest into it
    rows = OneOf(List(Int(0)), List(List(Num()), min_len=1))
    assert _problem(rows, [[1.0], ["a"]]) == "x[1][0]: is 'a', not a number"
    assert _problem(OneOf(Obj({"a": Int()}, required=("a",), what="a pair"), Num()), {}) == (
        "x.a: missing (a pair needs a)")


def _specs(spec, seen=None):
    """Every spec reachable from `spec` (the nested documents of a suite are their own kinds')."""
    from mgpu_bench.results.schema import List, Map, Obj, OneOf, Tagged

    seen = set() if seen is None else seen
    if id(spec) in seen:
        return
    seen.add(id(spec))
    yield spec
    subs = (list(spec.fields.values()) if isinstance(spec, Obj) else [spec.item] if isinstance(spec, List)
            else [spec.value] if isinstance(spec, Map) else list(spec.options) if isinstance(spec, OneOf)
            else [*spec.cases.values(), spec.other] if isinstance(spec, Tagged) else [])
    for s in subs:
        yield from _specs(s, seen)


def test_no_message_contradicts_itself():
    """Every declared spec of every kind, given values of every JSON type: an object or a list
    the spec takes is never refused as "is an object, not ..." (the issue's "is an object, not
    an object or a number"): the problem is a field inside it, its length, or a rule; and a
    message of the form "is X, not D" describes D as something X is not."""
    from mgpu_bench.results.schema import ENVELOPE, Obj

    values = [{}, {"x": 1}, {"count": "n"}, [], [None], [[]], "", "x" * 300, 0, -1, 1.5, float("nan"), True]
    specs = [s for k in registry.names() for s in _specs(registry.get(k).schema())]
    specs += [s for s in _specs(Obj(ENVELOPE))]
    checked = 0
    for spec in specs:
        for v in values:
            try:
                spec.check(v, "")
            except Exception as exc:  # noqa: BLE001 - the spec's private problem type
                if exc.path:  # a problem inside the value: that field's own message
                    continue
                text = exc.problem
                shown = {dict: "an object", list: "a list"}.get(type(v))
                if shown and spec.takes(v):
                    assert not text.startswith(f"is {shown}, not"), (spec.describe(), v, text)
                if text.startswith("is ") and ", not " in text:
                    said = text.split(", not ", 1)[1]
                    assert said != "an object or a number" and not (shown and said.startswith(shown + " or ")), text
                checked += 1
    assert checked > 1000, checked


def test_the_issues_refusals_now_name_the_field_and_the_shape():
    """What the H200 runs wrote, made wrong where a reader would choke: each refusal names the
    field and the shape expected (the real documents themselves pass: tests/test_gpu_documents.py)."""
    from mgpu_bench.probes.gemm.shape import CANDIDATE

    candidate = {"index": 4, "algo_id": 66, "tile": 248, "stages": 35, "split_k": -1, "cluster": 5}
    CANDIDATE.check(candidate, "")  # cuBLASLt's -1
    assert _problem(CANDIDATE, {**candidate, "split_k": 1 << 40}) == (
        "x.split_k: is 1099511627776, not an integer from -2147483648 to 2147483647")
    assert _problem(CANDIDATE, {**candidate, "split_k": "auto"}) == (
        "x.split_k: is 'auto', not an integer from -2147483648 to 2147483647")
    assert _problem(CANDIDATE, {**candidate, "tile": {"x": 1}}) == (
        "x.tile: is an object, not an integer or a string of at most 100 characters")
