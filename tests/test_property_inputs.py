"""Generated bad input, every command and every document loader: the answer is exit code 2 and one
line naming the fix, never a traceback, and no file is left behind (hypothesis, derandomized).

Options: every option of every command (each registered probe, report, topo, history, baseline,
compare), bad values made by its click type: text where a number goes, wrong words for a choice,
garbage for a size, a duration or a list, output paths in folders that do not exist. Values that
are bad for sure must be refused; values a command may legitimately take (a negative seed, a huge
count another check bounds later) must be refused or reach the measurement, which the test stops
there (each probe's `delegate`, called once the options, the outputs and the database are
checked and before any work) instead of measuring.

Loaders (`history add`, `report`, and a stored row read by `compare`, `history show` and `report
RUN`): real documents (fixtures, the 0.1.0 history, a fleet pass) with one declared field made
wrong (mgpu_bench.results.schema names what each field must be), and garbage documents with the right tag.

In process through click's CliRunner: about a thousand invocations in a few seconds."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import tempfile
import traceback
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import Measuring
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mgpu_bench.cli import cli
from mgpu_bench.history import History
from mgpu_bench.results import probe as registry
from mgpu_bench.results.probe import validate
from mgpu_bench.results.schema import ENVELOPE, AnyValue, Doc, List, Map, Obj, SchemaError, Tagged

FIX = Path(__file__).with_name("fixtures")
SETTINGS = {"deadline": None, "derandomize": True, "database": None,
            "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}
RUNNER = CliRunner()


@pytest.fixture
def stop_before_measuring(before_measuring):
    """before_measuring (conftest.py), with a private database that exists: a run that reaches it
    adds no file."""
    History.open().close()
    return before_measuring


def _verdict(result, args) -> str:
    """'refused' (exit 2, one line, no traceback) or 'accepted' (reached the measurement, or a
    query that answered); anything else fails the test with what it printed."""
    if isinstance(result.exception, Measuring) or (result.exit_code == 0 and result.exception is None):
        return "accepted"
    text = result.output.strip()
    crash = "" if result.exception is None or isinstance(result.exception, SystemExit) else \
        "".join(traceback.format_exception(result.exception))[-2500:]
    assert not crash, f"{args!r}: a traceback\n{crash}"
    assert result.exit_code == 2, f"{args!r}: exit code {result.exit_code}: {text}"
    assert len(text.splitlines()) == 1 and text.startswith("mgpu-bench: error: "), f"{args!r}: {text!r}"
    return "refused"


# -- the options ------------------------------------------------------------------------------------


def _commands(group: click.Group = cli, prefix: tuple[str, ...] = ()):
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


COMMANDS = list(_commands())
OUTPUTS = {"--json", "--csv", "--report", "--prometheus", "--db", "--out", "--exclude-file"}
# Options whose text is parsed (a size, a duration, a list of known names, a model, GPUs): text
# that starts with "?" is none of those.
PARSED = {"--sizes", "--size", "--copy-size", "--workspace", "--duration", "--step", "--shape", "--search-range",
          "--tolerance", "--rounds", "--ops", "--dtype", "--redop", "--engines", "--pattern", "--allocator",
          "--phases", "--gpus", "--scaling", "--max-batch", "--seq-lens", "--peak", "--layout",
          "--torch-allocators", "--model", "--expect"}
# The arguments a command needs besides the option under test; every other input is then fine or
# refused for its own reason (a run id that is not stored).
ARGS = {("report",): ["r1"], ("history", "add"): [str(FIX / "comm_2x_h200.json")],  # no run is stored: nothing drawn
        ("history", "show"): ["r1"], ("history", "trend"): ["comm.x"], ("baseline", "set"): ["r1"],
        ("compare",): ["r1"], ("side-by-side",): ["r1", "r2"]}
_TEXT = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")  # argv holds no NUL


def _kind(param: click.Parameter) -> str:
    name = param.opts[0]
    t = param.type
    if name in OUTPUTS:
        return "dir" if isinstance(t, click.Path) and not t.file_okay else "output"
    if isinstance(t, click.Choice):
        return "choice"
    if isinstance(t, (click.types.IntParamType, click.IntRange)):
        return "int"
    if isinstance(t, (click.types.FloatParamType, click.FloatRange)):
        return "float"
    return "parsed" if name in PARSED else "text"


def _not_int(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return True
    return False


def _not_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return True
    return False


def _bad(param: click.Parameter, scratch: Path):
    """(surely bad: must be refused, maybe bad: refused or taken) strategies for the option."""
    kind = _kind(param)
    missing = st.sampled_from(["/nonexistent-mgpu-bench/x/out", "/nonexistent-mgpu-bench/out", "x" * 300])
    if kind == "output":
        return st.one_of(missing, st.just(str(scratch))), st.nothing()  # a folder where a file goes
    if kind == "dir":
        return st.one_of(missing, st.just(str(FIX / "comm_2x_h200.json"))), st.nothing()  # a file where a folder goes
    if kind == "choice":
        choices = {c.casefold() for c in param.type.choices}
        return st.text(_TEXT, max_size=12).filter(lambda s: s.strip().casefold() not in choices), st.nothing()
    if kind == "int":
        return (st.text(_TEXT, max_size=12).filter(_not_int),
                st.integers(max_value=-1).map(str) | st.integers(min_value=10**6).map(str) | st.just("0"))
    if kind == "float":
        return (st.text(_TEXT, max_size=12).filter(_not_float),
                st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e400", "-1e-300", "1e30"])
                | st.floats(max_value=0).map(repr))
    garbage = st.text(_TEXT, max_size=20).map(lambda s: "?" + s) | st.sampled_from(
        ["1Q", "a/b", "99999999999999999999T", "-5M", "\x1b[31mred", "1,,?", "nan", "x" * 300])
    if kind == "parsed":
        return garbage, st.text(_TEXT, max_size=20)
    return st.nothing(), st.text(_TEXT, max_size=40) | garbage


def _invoke(path: tuple[str, ...], param: click.Parameter, value: str, scratch: Path):
    """The command with `value` for `param`; a probe also writes --json where the test looks."""
    args = [*path]
    if isinstance(param, click.Argument):
        args += [value]
    else:
        args += ARGS.get(path, []) + [param.opts[0], value]
        if path[0] in registry.REGISTRY and param.opts[0] != "--json":
            args += ["--json", str(scratch / "out.json")]
    return args, RUNNER.invoke(cli, args)


def _scratch_is_clean(scratch: Path) -> None:
    """Nothing written but the database the fixture made: no result, no temporary file."""
    left = sorted(p.name for p in scratch.iterdir() if not p.name.startswith("history.sqlite3"))
    assert left == [], left


def _params():
    for path, command in COMMANDS:
        for p in command.params:
            if getattr(p, "is_flag", False) or p.name == "help" or not p.opts:
                continue
            if isinstance(p, click.Argument) and path not in ARGS:
                continue
            yield path, p


PARAMS = list(_params())
CANONICAL = {"output": ["/nonexistent-mgpu-bench/x/out", "x" * 300], "dir": ["/nonexistent-mgpu-bench/x/rep"],
             "choice": ["bogus", ""], "int": ["abc", "1.5", ""], "float": ["abc", "1,5"],
             "parsed": ["1Q", "a/b", "?\x1b[31m", "99999999999999999999T"], "text": []}
MAYBE = {"int": ["-1", "0", "99999999999999999999"], "float": ["nan", "inf", "-1", "0", "1e400"],
         "parsed": ["", "0", "-5"], "text": ["", "a/b", "\udcff", "x" * 300]}


def test_every_option_with_its_canonical_bad_values(stop_before_measuring):
    """Each option of each command once with every canonical bad value of its type."""
    scratch = stop_before_measuring
    seen, counts = set(), {"refused": 0, "accepted": 0}
    for path, param in PARAMS:
        kind = _kind(param)
        for sure, values in ((True, CANONICAL[kind]), (False, MAYBE.get(kind, []))):
            for value in values:
                args, result = _invoke(path, param, value, scratch)
                verdict = _verdict(result, args)
                assert verdict == "refused" or not sure, f"{args!r} was taken: {result.output}"
                counts[verdict] += 1
                _scratch_is_clean(scratch)
        seen.add(path)
    assert seen >= {("comm",), ("gemm",), ("model",), ("suite",), ("report",), ("topo",), ("compare",),
                    ("history", "add"), ("history", "list"), ("baseline", "show")}
    assert counts["refused"] > 500, counts


@settings(max_examples=250, **SETTINGS)
@given(data=st.data())
def test_generated_bad_values_for_every_option(stop_before_measuring, data):
    scratch = stop_before_measuring
    path, param = data.draw(st.sampled_from(PARAMS), label="option")
    sure, maybe = _bad(param, scratch)
    bad_for_sure = maybe.is_empty or (not sure.is_empty and data.draw(st.booleans(), label="surely bad"))
    value = data.draw(sure if bad_for_sure else maybe, label="value")
    args, result = _invoke(path, param, value, scratch)
    verdict = _verdict(result, args)
    assert verdict == "refused" or not bad_for_sure, f"{args!r} was taken: {result.output}"
    _scratch_is_clean(scratch)


# -- the document loaders ---------------------------------------------------------------------------


def _documents() -> list[tuple[str, dict]]:
    from mgpu_bench.probes.fleet.document import node_documents

    out = [(n, json.loads((FIX / n).read_text())) for n in
           ("comm_2x_h200.json", "suite/suite.json", "gpu/gemm-shared.json", "gpu/model-healthy.json",
            "fleet/fleet-2-cpu-nodes.json")]
    out.append(("fleet node", node_documents(out[-1][1])[0]))
    con = sqlite3.connect(f"file:{FIX / 'history' / 'release-0.1.0.sqlite3'}?mode=ro&immutable=1", uri=True)
    out += [(f"release r{i}", json.loads(d)) for i, d in con.execute("SELECT id, document FROM runs")]
    con.close()
    for p in json.loads((FIX / "suite" / "suite.json").read_text())["probes"]:
        if p.get("document"):
            out.append((f"suite {p['name']}", p["document"]))
    return out


DOCUMENTS = _documents()


def _fields(value, spec, path: tuple) -> list[tuple[tuple, object, bool]]:
    """(path, spec, required) of every declared field present in `value` (lists: the first 3)."""
    if isinstance(spec, Tagged):
        spec = spec.cases.get(value.get(spec.key), spec.other) if isinstance(value, dict) else spec
    if isinstance(spec, Doc) and isinstance(value, dict):
        return _document_fields(value, path)
    out = []
    if isinstance(spec, Obj) and isinstance(value, dict):
        items = [(k, s, k in spec.required) for k, s in spec.fields.items() if k in value]
    elif isinstance(spec, List) and isinstance(value, list):
        items = [(i, spec.item, True) for i in range(min(3, len(value)))]
    elif isinstance(spec, Map) and isinstance(value, dict):
        items = [(k, spec.value, True) for k in list(value)[:3]]
    else:
        return out
    for key, sub, required in items:
        out.append(((*path, key), sub, required))
        out += _fields(value[key], sub, (*path, key))
    return out


def _document_fields(doc: dict, path: tuple = ()) -> list[tuple[tuple, object, bool]]:
    out = []
    for key, spec in ENVELOPE.items():
        if key in doc and key not in ("schema", "kind"):
            out.append(((*path, key), spec, key == "schema_version"))
            out += _fields(doc[key], spec, (*path, key))
    return out + _fields(doc, registry.for_document(doc).schema(), path)


FIELDS = [(name, f) for name, doc in DOCUMENTS for f in _document_fields(doc)]
# Values every spec refuses somewhere: wrong types, out of any bound, names that are paths.
WRONG = [None, True, -1, 1 << 62, 0.5, float("nan"), float("inf"), "", "a/b", "\x1b[2J", [], [None], [[]], {},
         {"x": 1}]


def _refuses(spec, value) -> bool:
    try:
        spec.check(value, "")
    except Exception:  # noqa: BLE001 - the spec's private problem type: refused
        return True
    return False


def _fmt(path: tuple) -> str:
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def _set(doc: dict, path: tuple, value) -> dict:
    doc = json.loads(json.dumps(doc))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if value is _DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


_DELETE = object()


@st.composite
def _broken(draw):
    """(source, the document with one declared field made wrong, the field's path)."""
    i = draw(st.integers(0, len(FIELDS) - 1), label="field")
    name, (path, spec, required) = FIELDS[i]
    doc = dict(DOCUMENTS)[name]
    options = [v for v in WRONG if _refuses(spec, v)] + ([_DELETE] if required and not isinstance(path[-1], int)
                                                         else [])
    assume(options)
    bad = _set(doc, path, draw(st.sampled_from(options), label="value"))
    try:
        validate(bad)
    except SchemaError:
        return name, bad, path
    assume(False)  # a kind tag changed into another kind's: a different document, not a broken one
    return None


@settings(max_examples=120, **SETTINGS)
@given(case=_broken())
def test_a_document_with_one_wrong_field_is_refused_by_every_loader(tmp_path_factory, case):
    _name, doc, path = case
    scratch = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    f = scratch / "result.json"
    f.write_text(json.dumps(doc))
    db, out = scratch / "h.sqlite3", scratch / "report"
    named = f"result.json: {_fmt(path)}" if "kind" in doc else "result.json: "  # without its kind: said first
    for args in (["history", "add", str(f), "--db", str(db)], ["report", str(f), "--out", str(out)]):
        result = RUNNER.invoke(cli, args)
        assert _verdict(result, args) == "refused", result.output
        assert named in result.output, (path, result.output)
    assert sorted(p.name for p in scratch.iterdir()) == ["result.json"]  # no database, no report, no temporary


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(_TEXT, max_size=8),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(_TEXT, max_size=8), kids,
                                                                               max_size=4), max_leaves=20)


@settings(max_examples=80, **SETTINGS)
@given(kind=st.sampled_from(registry.names()), body=st.dictionaries(st.text(_TEXT, max_size=12), _JSON, max_size=6))
def test_garbage_with_the_right_tag_is_refused(tmp_path_factory, kind, body):
    scratch = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    f = scratch / "g.json"
    f.write_text(json.dumps({**body, "schema": "mgpu-bench/result", "schema_version": 1, "kind": kind}))
    result = RUNNER.invoke(cli, ["history", "add", str(f), "--db", str(scratch / "h.sqlite3")])
    assert _verdict(result, ["history", "add", f]) == "refused", result.output
    assert sorted(p.name for p in scratch.iterdir()) == ["g.json"]


@settings(max_examples=25, **SETTINGS)
@given(case=_broken())
def test_a_stored_row_made_wrong_is_refused_where_it_is_read(tmp_path_factory, case):
    """A row changed outside mgpu-bench: compare (with --json), show and report RUN refuse it,
    naming the run and the field, and compare writes nothing."""
    name, doc, path = case
    scratch = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    db = scratch / "h.sqlite3"
    with History.open(db) as h:
        h.save(dict(DOCUMENTS)[name])
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET document = ?", (json.dumps(doc),))
    con.commit()
    con.close()
    out = scratch / "cmp.json"
    for args in (["compare", "r1", "--baseline", "r1", "--db", str(db), "--json", str(out)],
                 ["history", "show", "r1", "--db", str(db)],
                 ["report", "r1", "--db", str(db), "--out", str(scratch / "rep")]):
        result = RUNNER.invoke(cli, args)
        assert _verdict(result, args) == "refused", result.output
        assert "stored run r1" in result.output and (_fmt(path) in result.output or "kind" not in doc), result.output
    assert sorted(p.name for p in scratch.iterdir() if not p.name.startswith("h.sqlite3")) == []


def test_the_wrong_values_cover_every_kind_of_spec():
    """Each declared field of the real documents has a value that its spec refuses (or is
    required, so deleting it is wrong): no field escapes the loaders' test."""
    untested = [(n, _fmt(p)) for n, (p, spec, required) in FIELDS
                if not required and not isinstance(spec, AnyValue) and not any(_refuses(spec, v) for v in WRONG)]
    assert not untested, untested[:10]
    assert len(FIELDS) > 1000, len(FIELDS)


# -- issue 24: the classes an adversarial user found, generated ---------------------------------------
# Each class below draws its cases: 0 tracebacks and 0 losses across them (tests/test_hardening_outputs.py
# has the listed cases and the real processes: pipes, /dev/full, a closed stdout, SIGHUP).

DIGITS = "０１２３４５６７８９٠١٢٣٤٥٦٧٨٩۰۱۲۳٤٥६७८९০১২৩৪৫๐๑๒๓²³¹"  # fullwidth, Arabic-Indic, Devanagari, Bengali, Thai, superscript
GOOD = {"int": "2", "float": "0.5", "parsed": "1K"}  # a value of each kind that holds a digit


@settings(max_examples=120, **SETTINGS)
@given(data=st.data())
def test_a_digit_other_than_0_9_is_refused_in_every_option(stop_before_measuring, data):
    """Class 7: every option that takes a number, or text with numbers in it, of every command:
    a digit Python's int() and float() would read ('１', '٣', '²') is refused, never read."""
    params = [(p, q) for p, q in PARAMS if isinstance(q, click.Option) and _kind(q) in GOOD]
    path, param = data.draw(st.sampled_from(params), label="option")
    good = GOOD[_kind(param)]
    i = data.draw(st.sampled_from([k for k, c in enumerate(good) if c.isdigit()]), label="which digit")
    value = good[:i] + data.draw(st.sampled_from(DIGITS), label="digit") + good[i + 1:]
    args, result = _invoke(path, param, value, stop_before_measuring)
    assert _verdict(result, args) == "refused", f"{args!r} was taken: {result.output}"
    _scratch_is_clean(stop_before_measuring)


@settings(max_examples=150, **SETTINGS)
@given(data=st.data())
def test_a_blank_value_or_an_empty_entry_is_refused_in_every_text_option(stop_before_measuring, data):
    """`suite --duration ''` ran the default, `--rounds 1,,2` rounds 1 and 2, `model --scaling ''` the
    default count: every option of every command whose text the command parses (numbers.AsciiText),
    given blank, or as a list with an empty entry between its commas (or before the first), is
    refused in one line naming the option, exit 2, nothing written. One comma at the end stays
    allowed (`--gpus 2,` is GPU 2)."""
    from mgpu_bench.results.numbers import AsciiText

    params = [(p, q) for p, q in PARAMS if isinstance(q, click.Option) and isinstance(q.type, AsciiText)]
    path, param = data.draw(st.sampled_from(params), label="option")
    entries = data.draw(st.lists(st.sampled_from(["1", "2", "4K", "8", "bf16", "1,2"]), min_size=1, max_size=4),
                        label="entries")
    if data.draw(st.booleans(), label="blank"):
        value = data.draw(st.sampled_from(["", " ", "\t", "   "]), label="blank value")
    else:
        at = data.draw(st.integers(0, len(entries) - 1), label="where the empty entry goes")
        value = ",".join([*entries[:at], data.draw(st.sampled_from(["", " "]), label="empty"), *entries[at:]])
    args = [*path, *ARGS.get(path, []), *REQUIRED.get(path, []), param.opts[0], value]
    if path[0] in registry.REGISTRY and param.opts[0] != "--json":
        args += ["--json", str(stop_before_measuring / "out.json")]
    result = RUNNER.invoke(cli, args)
    assert _verdict(result, args) == "refused", f"{args!r} was taken: {result.output}"
    assert param.opts[-1] in result.output or param.opts[0] in result.output, result.output
    _scratch_is_clean(stop_before_measuring)


REQUIRED = {("plan",): ["--model", "tiny"]}  # a command's required options, so that the one under test decides


def test_one_comma_at_the_end_still_names_one_gpu_index(stop_before_measuring):
    """`--gpus 2,` (GPU 2; `--gpus 2` is the first two) and `--scaling 1,` pass the blank-entry rule."""
    for args in (["model", "--gpus", "0,"], ["model", "--scaling", "1,"], ["suite", "--rounds", "1,"]):
        result = RUNNER.invoke(cli, [*args, "--no-store"])
        assert "empty entry" not in result.output and "is blank" not in result.output, (args, result.output)


# Where an output may never go (class 4), and how an output can name the database (class 1).
SPECIAL = ["/dev", "/dev/pts", "/proc/self", "/proc/sys/kernel", "/sys/kernel", "/sys/fs/cgroup"]
MEASURING_OUTPUTS = [(("comm",), "--json"), (("comm",), "--csv"), (("comm",), "--prometheus"), (("comm",), "--report"),
                     (("model",), "--json"), (("model",), "--report"), (("suite",), "--json"), (("suite",), "--report"),
                     (("overlap",), "--json"), (("topo",), "--json")]
QUERY_OUTPUTS = [(("compare", "r2"), "--json"), (("history", "show", "r1"), "--prometheus"), (("report", "r1"), "--out"),
                 (("side-by-side", "r1", "r2"), "--json"), (("side-by-side", "r1", "r2"), "--csv")]


@pytest.mark.skipif(not Path("/proc/self/mountinfo").exists(), reason="reads the mount table (Linux)")
@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_no_output_goes_into_a_device_or_kernel_file_system(stop_before_measuring, data):
    path, flag = data.draw(st.sampled_from(MEASURING_OUTPUTS), label="output")
    folder = data.draw(st.sampled_from(SPECIAL), label="folder")
    target = folder if flag == "--report" and data.draw(st.booleans(), label="the folder itself") else \
        f"{folder}/mgpu-bench-{data.draw(st.sampled_from(['r.json', 'rep', 'x.prom']), label='name')}"
    args = [*path, flag, target, *(["--no-store"] if path[0] != "topo" else [])]
    result = RUNNER.invoke(cli, args)
    assert _verdict(result, args) == "refused", f"{args!r} was taken: {result.output}"
    assert not Path(target).exists() or target == folder
    _scratch_is_clean(stop_before_measuring)


def _db_spellings(db: Path) -> list[tuple[str, str]]:
    """(how, a path naming the database or one of its own files) that an output must never take."""
    (db.parent / "sub").mkdir(exist_ok=True)
    link = db.parent / "to-db"
    if not link.is_symlink():
        link.symlink_to(db.name)
    hard = db.parent / "same-inode"
    if not hard.exists():
        os.link(db, hard)
    return [("as given", str(db)), ("relative", db.name), ("dotdot", str(db.parent / "sub" / ".." / db.name)),
            ("symlink", str(link)), ("hard link", str(hard)), ("-wal", f"{db}-wal"), ("-shm", f"{db}-shm"),
            ("-journal", f"{db}-journal")]


@settings(max_examples=80, **SETTINGS)
@given(data=st.data())
def test_no_output_is_the_database_however_it_is_named(stop_before_measuring, data):
    """Class 1: every command's file outputs against the history database it uses, named through a
    relative path, .., a symbolic link, a hard link or its -wal/-shm/-journal, given by --db or
    MGPU_BENCH_DB: refused before measuring, the database unchanged."""
    db = stop_before_measuring / "history.sqlite3"  # the fixture's database is elsewhere: this one has runs
    if not db.exists():
        with History.open(db) as h:
            h.save(json.loads((FIX / "comm_2x_h200.json").read_text()))
            h.save(json.loads((FIX / "comm_2x_h200.json").read_text()))
    path, flag = data.draw(st.sampled_from([o for o in MEASURING_OUTPUTS + QUERY_OUTPUTS
                                            if o[0] != ("topo",) and o[1] not in ("--report", "--out")]),
                           label="output")
    how, target = data.draw(st.sampled_from(_db_spellings(db)), label="spelling")
    by_env = data.draw(st.booleans(), label="MGPU_BENCH_DB")
    before = db.read_bytes()
    args = [*path, flag, target, *([] if by_env else ["--db", str(db)])]
    result = RUNNER.invoke(cli, args, env={"MGPU_BENCH_DB": str(db)} if by_env else None)
    assert _verdict(result, args) == "refused", f"{how}: {args!r} was taken: {result.output}"
    assert "would replace" in result.output, result.output
    assert db.read_bytes() == before


# Documents that render in well under a second each (the whole suite page and a 6-op comm sweep
# take seconds: their parts are here one by one); a fleet pass's per-node document is stored but
# not drawn on its own (`report` says to give the pass), so it is left out.
FAST = [n for n in ("gpu/gemm-shared.json", "gpu/model-healthy.json", "fleet/fleet-2-cpu-nodes.json", "release r1",
                    "release r3", "suite gemm", "suite hbm+memory", "suite model-1gpu", "suite comm", "suite max-batch",
                    "suite gemm-sustained", "suite model-scaling") if n in dict(DOCUMENTS)]
# One field per declared place (the first entry of each list stands for all: _set_every reaches them).
NUMBERS = list({(name, tuple(k if isinstance(k, str) else 0 for k in f[0])): (name, f) for name, f in FIELDS
                if name in FAST and type(f[1]).__name__ in ("Num", "Int")}.values())
ODD = [float("nan"), float("inf"), float("-inf"), -1, 0, 1e300, -1e300, 2 ** 63, 0.5]


@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_what_history_add_takes_renders_and_what_would_not_render_is_refused(tmp_path_factory, data):
    """Class 7: the validation and the renderers agree. A real document with one number made odd
    (NaN, an infinity, negative, huge): either `history add` and `report FILE` both refuse it (one
    line, exit 2), or it is stored and `report RUN` draws it from the history."""
    name, (path, _spec, _required) = data.draw(st.sampled_from(NUMBERS), label="field")
    value = data.draw(st.sampled_from(ODD), label="value")
    every = data.draw(st.booleans(), label="in every entry")  # all the samples of a run, not one
    doc = _set_every(dict(DOCUMENTS)[name], path, value) if every else _set(dict(DOCUMENTS)[name], path, value)
    scratch = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    f = scratch / "d.json"
    f.write_text(json.dumps(doc))
    db = scratch / "h.sqlite3"
    add = RUNNER.invoke(cli, ["history", "add", str(f), "--db", str(db)])
    if _verdict(add, ["history", "add", _fmt(path)]) == "refused":
        drawn = RUNNER.invoke(cli, ["report", str(f), "--out", str(scratch / "rep")])
        assert _verdict(drawn, ["report", _fmt(path)]) == "refused", (name, _fmt(path), drawn.output)
        return
    drawn = RUNNER.invoke(cli, ["report", "r1", "--db", str(db), "--out", str(scratch / "rep")])
    assert drawn.exit_code == 0 and drawn.exception is None, (name, _fmt(path), drawn.output, drawn.exception)
    shown = RUNNER.invoke(cli, ["history", "show", "r1", "--db", str(db)])
    assert shown.exit_code == 0, shown.output


def _set_every(doc: dict, path: tuple, value) -> dict:
    """`doc` with the field at `path` set to `value` in every entry of each list on the way
    (measurements[*].burst_seconds[*]: a run whose samples are all NaN)."""
    doc = json.loads(json.dumps(doc))

    def walk(node, rest):
        key, more = rest[0], rest[1:]
        keys = range(len(node)) if isinstance(key, int) and isinstance(node, list) else [key]
        for k in keys:
            if more:
                walk(node[k], more)
            else:
                node[k] = value

    walk(doc, path)
    return doc


POISON = st.lists(st.sampled_from(["\x1b[2J", "\x07", "\r", "\x9b", "\u202e", "\u2066", "\ud800", "**b**", "_i_", "`c`",
                                   "[l](javascript:x)", "<b>x</b>", "|", "# ", "> ", "1. ", "$\\frac{$", "&amp;", "\\"]),
                  min_size=1, max_size=6).map("".join)
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _strings(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:2]):
            yield from _strings(v, (*path, i))
    elif isinstance(value, str) and path[-1:] not in (("schema",), ("kind",)):
        yield path


@settings(max_examples=12, **SETTINGS)
@given(name=st.sampled_from(FAST), poison=POISON)
def test_stored_text_is_escaped_in_every_medium(tmp_path_factory, name, poison):
    """Class 6: every string field a document may hold set to hostile text (controls, bidi
    overrides, a lone surrogate, Markdown, HTML, mathtext) at once; stored, then drawn from the
    history: report.html and summary.md hold no raw control character, no element and no
    Markdown syntax of it, and the plots draw it (mathtext never parses it)."""
    doc = json.loads(json.dumps(dict(DOCUMENTS)[name]))
    for path in list(_strings(doc)):
        trial = _set(doc, path, poison + "!")
        try:
            validate(trial)
        except SchemaError:
            continue
        doc = trial
    scratch = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    (scratch / "d.json").write_text(json.dumps(doc))
    db, rep = scratch / "h.sqlite3", scratch / "rep"
    assert RUNNER.invoke(cli, ["history", "add", str(scratch / "d.json"), "--db", str(db)]).exit_code == 0
    drawn = RUNNER.invoke(cli, ["report", "r1", "--db", str(db), "--out", str(rep)])
    assert drawn.exit_code == 0 and drawn.exception is None, drawn.output
    shown = RUNNER.invoke(cli, ["history", "show", "r1", "--db", str(db)])
    assert shown.exit_code == 0 and not RAW.search(shown.output), shown.output
    for page in (rep / "report.html", rep / "summary.md"):
        if not page.exists():
            continue
        text = page.read_text(encoding="utf-8", errors="strict")
        assert not RAW.search(text), (page.name, RAW.search(text))
        if page.suffix == ".html":
            assert "<b>x</b>" not in text
        else:
            for syntax in ("**b**", "[l](", "<b>", "`c`"):
                assert not re.search(r"(?<!\\)" + re.escape(syntax), text), (syntax, page.name)


ROW_DAMAGE = [("metrics", "samples", "'not json'"), ("metrics", "samples", "'[\"x\"]'"), ("metrics", "value", "'text'"),
              ("metrics", "labels", "'[]'"), ("metrics", "unit", "'parsecs'"), ("metrics", "better", "NULL"),
              ("runs", "document", "'[]'"), ("runs", "document", "'{'"), ("runs", "fingerprint", "'7'"),
              ("runs", "created", "'2026-13-45'"), ("runs", "command", "x'01'"), ("runs", "kind", "3")]


@settings(max_examples=30, **SETTINGS)
@given(damage=st.sampled_from(ROW_DAMAGE), read=st.sampled_from([["history", "show", "r1"], ["compare", "r1", "--baseline",
                                                                                               "r1"],
                                                                 ["history", "list"], ["baseline", "set", "r1"],
                                                                 ["history", "trend", "comm.allreduce.fp32.1GiB.out.2ranks.busbw"]]))
def test_a_row_edited_outside_is_named_or_skipped_never_a_traceback(tmp_path_factory, damage, read):
    """Class 5: a column of a stored row changed by another program; every read names the run and
    the field and exits 2, or (a listing) goes on without the row and says so."""
    table, column, value = damage
    scratch = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    db = scratch / "h.sqlite3"
    with History.open(db) as h:
        h.save(json.loads((FIX / "comm_2x_h200.json").read_text()))
    con = sqlite3.connect(db)
    con.execute("PRAGMA ignore_check_constraints = ON")
    try:
        con.execute(f"UPDATE {table} SET {column} = {value}")
        con.commit()
    except sqlite3.IntegrityError:  # NOT NULL holds even with the checks off
        assume(False)
    finally:
        con.close()
    result = RUNNER.invoke(cli, [*read, "--db", str(db)])
    if _verdict(result, read) == "refused":
        assert "stored run r1" in result.output and column in result.output, result.output
    elif read[1:2] in (["list"], ["trend"]) and "note: left out" in result.output:
        assert "stored run r1" in result.output
