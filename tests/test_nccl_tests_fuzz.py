"""The import of nccl-tests and rccl-tests logs under mutation (issue 41): the real 2x H200 logs
(tests/fixtures/nccl-tests) and the printf-format logs of the other forms (nccl_log_formats.py),
changed the way a damaged, edited or hostile file is (bytes flipped, lines duplicated, deleted or
swapped, numbers made huge, infinite or not numbers, fields made giant, header counts made bogus,
the text cut short), each given to the real `mgpu-bench history add` (CliRunner, a real SQLite
database). Every one ends with exit code 0 or 2, never a traceback; exit 2 is one line and leaves
the database as it was; exit 0 stores exactly the runs the file holds, whole; every file takes
under 2 s of CPU time (CPU, not wall-clock: a loaded neighbour does not slow the parser's work).

The examples are derandomized (the same ones on every run: a CI failure is reproducible) and
bounded: about 20 s here in all."""

from __future__ import annotations

import os
import re
import sqlite3
import tempfile
import time
from pathlib import Path

import nccl_log_formats as formats
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mgpu_bench.cli import cli
from mgpu_bench.core.errors import InputError
from mgpu_bench.history.records import prepare
from mgpu_bench.probes.comm import imported

FIX = Path(__file__).with_name("fixtures") / "nccl-tests"
SIZES = [1 << 20, 64 << 20, 256 << 20]
CPU_LIMIT_S = 2.0


def _seeds() -> list[tuple[str, str]]:
    """Real logs first, then one of each other form the reader knows."""
    out = [(p.name, p.read_text()) for p in sorted(FIX.glob("*.log"))]
    ranks = formats.h200_ranks(2, host="gpu07", pid=11) + formats.h200_ranks(2, host="gpu08", pid=12, first_rank=2)
    out.append(("multi.log", formats.nccl_log("all_reduce", ranks, SIZES, per_iter=True, graph=4, nthread=1, ngpus=2)))
    out.append(("old.log", formats.nccl_log("reduce_scatter", formats.h200_ranks(4), SIZES, version=False,
                                            old_devices=True)))
    out.append(("rccl.log", formats.rccl_log("all_reduce", 8, SIZES, new=True)))
    out.append(("sendrecv.log", formats.nccl_log("sendrecv", formats.h200_ranks(2), SIZES,
                                                 wrong=lambda s, i: None if i else 3)))
    return out


SEEDS = _seeds()
# What a hostile field is made of: huge and tiny numbers, non-finite ones, digits of other scripts,
# long runs of one character, control characters.
FIELDS = st.one_of(
    st.sampled_from(["1e400", "-1e400", "inf", "nan", "NaN", "1e-400", "0", "-0", "-1", "0.00", "1e+308", "9" * 40,
                     "9" * 5000, "1" * 40000, "٣", "１２", "N/A", "", "\x00", "\x1b[31m", "1e99999", "0e999",
                     "1.2.3", "+", ".", "e5"]),
    st.builds(lambda c, n: c * n, st.sampled_from(["9", " ", "x", "#", ".", "e", "\t", "["]),
              st.integers(1, 60_000)),
    st.text(max_size=40),
)
COUNTS = st.sampled_from(["0", "1", "1000", "100000", "2147483648", "99999999999999999999", "-1", "1" * 300])


@st.composite
def mutated(draw) -> tuple[str, bytes]:
    """One seed log with 1-4 mutations, as the bytes of a file."""
    name, text = draw(st.sampled_from(SEEDS))
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "dup", "del", "swap", "field", "header", "cut", "twice", "line"]))
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        if not lines:
            break
        if kind == "flip":  # one character replaced
            line = lines[i]
            at = draw(st.integers(0, max(len(line) - 1, 0)))
            lines[i] = line[:at] + draw(st.characters()) + line[at + 1:]
        elif kind == "dup":
            lines[i:i] = [lines[i]] * draw(st.integers(1, 3))
        elif kind == "del":
            del lines[i]
        elif kind == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "field":  # one whitespace-separated field replaced
            tokens = lines[i].split(" ")
            at = draw(st.integers(0, max(len(tokens) - 1, 0)))
            tokens[at] = draw(FIELDS)
            lines[i] = " ".join(tokens)
        elif kind == "header":  # a bogus count in the header line
            key = draw(st.sampled_from(["nThread", "nGpus", "iters:", "agg iters:", "graph:", "maxBytes"]))
            value = draw(COUNTS)
            lines = [re.sub(rf"({re.escape(key)}) \d+", lambda m: f"{m.group(1)} {value}", ln)  # noqa: B023
                     for ln in lines]
            if draw(st.booleans()):  # and its device lines gone: the header alone would say the ranks
                lines = [ln for ln in lines if " Rank " not in ln]
        elif kind == "cut":
            text = "\n".join(lines)
            lines = text[:draw(st.integers(0, len(text)))].splitlines()
        elif kind == "twice":
            lines = lines + lines
        else:  # a whole line of hostile text
            lines.insert(i, draw(FIELDS))
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    if draw(st.booleans()) and data:  # a raw byte flipped (the file may stop being UTF-8)
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    return name, data


def _state(db: Path) -> list[tuple]:
    """The whole database as rows: runs (id, kind, document) and metrics (run, name, value)."""
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        runs = conn.execute("SELECT id, kind, document FROM runs ORDER BY id").fetchall()
        metrics = conn.execute("SELECT run, name, value FROM metrics ORDER BY run, name").fetchall()
    return [("run", *r) for r in runs] + [("metric", *m) for m in metrics]


def _expected(files: list[tuple[str, bytes]], join: bool) -> list[int] | None:
    """The headline metric count of each run the files hold, read here the way the command reads
    them (the same reader, called directly); None where the files hold nothing to store."""
    try:
        logs = [(name, data.decode("utf-8")) for name, data in files]
        return [len(prepare(doc).metrics) for doc, _ in imported.documents(logs, join=join)]
    except (InputError, UnicodeDecodeError, ValueError):
        return None


def _check(root: Path, files: list[tuple[str, bytes]], join: bool = False) -> None:
    db = root / "h.sqlite3"
    paths = []
    for k, (name, data) in enumerate(files):
        path = root / f"{k}-{name}"
        path.write_bytes(data)
        paths.append(str(path))
    before = _state(db)
    t0 = time.process_time()
    r = CliRunner().invoke(cli, ["history", "add", *paths, *(["--join"] if join else []), "--db", str(db)])
    spent = time.process_time() - t0
    for p in paths:
        os.unlink(p)
    assert r.exit_code in (0, 2), (r.exit_code, r.output[-3000:], r.exception)
    assert "Traceback" not in r.output, r.output[-3000:]
    assert spent < CPU_LIMIT_S * len(files), f"{spent:.2f} s of CPU for {len(files)} file(s)"
    after = _state(db)
    if r.exit_code == 2:
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mgpu-bench: error: "), r.output[-3000:]
        assert after == before  # nothing stored, nothing changed
        return
    assert after[:len([x for x in before if x[0] == "run"])] == [x for x in before if x[0] == "run"]
    new_runs = [x for x in after if x[0] == "run" and x not in before]
    stored = re.findall(r"^stored (r\d+): comm, (\d+) headline metric", r.output, re.MULTILINE)
    assert [f"r{x[1]}" for x in new_runs] == [s for s, _ in stored]
    new_ids = {x[1] for x in new_runs}
    counts = [sum(1 for m in after if m[0] == "metric" and m[1] == run) for run in sorted(new_ids)]
    assert counts == [int(n) for _, n in stored]  # each run whole, with every metric it names
    assert counts == _expected(files, join)  # and the runs the file holds, all of them


@pytest.fixture(scope="module")
def root():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(mutated())
def test_a_mutated_log_is_stored_whole_or_refused_in_one_line(root, log):
    _check(root, [log])


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(st.lists(mutated(), min_size=2, max_size=3), st.booleans())
def test_several_mutated_logs_are_stored_all_or_none(root, logs, join):
    _check(root, [(f"{k}{name}", data) for k, (name, data) in enumerate(logs)], join)
