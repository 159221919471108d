"""sdc without a GPU: the host copy of the GPU's hash, locating a difference, the peer comparison with
a planted differing buffer, verdicts (unstable, mismatch, wrong) and the findings that name the GPU, the
work and the first differing element; the document, headline, report and CLI input checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from mgpu_bench.cli import cli
from mgpu_bench.probes.sdc import PROBE
from mgpu_bench.probes.sdc import analyse as an
from mgpu_bench.probes.sdc import measure as me
from mgpu_bench.probes.sdc.document import document, run_from_document
from mgpu_bench.probes.sdc.headline import headline
from mgpu_bench.results.probe import PROBLEM, PlanContext, validate

M, N, K = 64, 48, 32  # small GEMM: the buffers are made here, not by a GPU
H200 = {"name": "NVIDIA H200", "multiprocessors": 132}


def _mix(x: int) -> int:  # splitmix64's finaliser in plain Python integers: the spec, written out
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def _hash_loop(data: bytes) -> int:
    """The hash as csrc/sdc.cu defines it, one word at a time."""
    data += b"\0" * (-len(data) % 8)
    words = [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8)]
    chunk = -(-len(words) // 1024)
    sums = [0] * 1024
    for i, w in enumerate(words):
        b = i // chunk
        sums[b] = (sums[b] + _mix(w ^ _mix(i))) & ((1 << 64) - 1)
    h = _mix(len(words))
    for s in sums:
        h = _mix(h ^ s)
    return h


@pytest.mark.parametrize("nbytes", [0, 5, 8 * 100, 8 * 3000 + 3])
def test_host_hash_follows_the_block_definition(nbytes):
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    assert an.hash_words(data) == _hash_loop(data)


def test_hash_sees_one_bit_a_swap_and_the_length():
    data = bytearray(np.random.default_rng(1).integers(0, 256, 8 * 5000, dtype=np.uint8).tobytes())
    h = an.hash_words(bytes(data))
    flipped = bytearray(data)
    flipped[12345] ^= 0x10
    swapped = bytearray(data)
    swapped[0:8], swapped[8:16] = data[8:16], data[0:8]
    assert len({h, an.hash_words(bytes(flipped)), an.hash_words(bytes(swapped)),
                an.hash_words(bytes(data) + bytes(8))}) == 4
    assert an.hash_words(b"abc") == an.hash_words(b"abc\0\0\0\0\0")  # zero-padded to whole words


def test_locate_names_the_first_element_and_both_values():
    rng = np.random.default_rng(7)
    want = rng.integers(0, 1 << 16, M * N, dtype=np.uint16)
    got = want.copy()
    got[[1000, 2000]] ^= 1
    f = an.locate_gemm(got, want, M, "bf16", "GPU 0's result")
    assert f["index"] == 1000 and f["where"] == f"D[{1000 % M}, {1000 // M}]"
    assert f"0x{int(got[1000]):04x}" in f["got"] and f"0x{int(want[1000]):04x}" in f["want"]
    assert f["differing"] == 2 and f["elements"] == M * N
    assert an.locate_gemm(want, want.copy(), M, "bf16", "x")["index"] is None
    assert an.bits_value(0x3F80, "bf16") == 1.0 and an.bits_value(0x3C00, "fp16") == 1.0
    w = an.locate_word(5, 0x10, 0x13, 1 << 30)
    assert w["where"].startswith("byte offset 0x28") and w["bits"] == 2


class _Probe:
    """Stands in for _native.SdcProbe (no GPU here): a reference output and its real hash."""

    def __init__(self, out: np.ndarray) -> None:
        self.out = out
        self.has_reference = True
        self.reference_hash = an.hash_words(out)

    def output(self, reference: bool) -> np.ndarray:
        return self.out


def _run(n: int = 3, names=None, reps: int = 3) -> me.SdcRun:
    cfg = me.SdcConfig(gpus=tuple(range(n)), shape=(M, N, K), gemms=4, repetitions=reps, comm_bytes=1 << 20)
    devs = [{"index": g, **H200, **({"name": names[g]} if names else {})} for g in range(n)]
    run = me.SdcRun(cfg, devs, algo={"blob": "00" * 64, "algo_id": 66, "tile": 20, "stages": 8, "split_k": 1,
                                     "reduction": 0, "swizzle": 0, "custom": 0, "cluster": 0, "workspace": 0,
                                     "chosen_on": 0})
    for rep in range(1, reps + 1):
        for g in range(n):
            run.checks += [me.Check(g, rep, "gemm", 4, 4 * 2 * M * N, 4e-4, hash="0x" + "1" * 16),
                           me.Check(g, rep, "collective", 1 << 19, 1 << 20, 1e-4),
                           me.Check(g, rep, "hbm", 1 << 27, 1 << 30, 5e-4)]
    run.repetitions = reps
    run.hbm_bytes = {g: 1 << 30 for g in range(n)}
    return run


def _planted(n: int, bad: dict[int, int]) -> dict[int, _Probe]:
    """n GPUs with the same output, but element bad[g] of GPU g flipped in its lowest bit."""
    base = np.random.default_rng(3).integers(0, 1 << 16, M * N, dtype=np.uint16)
    probes = {}
    for g in range(n):
        out = base.copy()
        if g in bad:
            out[bad[g]] ^= 1
        probes[g] = _Probe(out)
    return probes


def test_a_planted_buffer_makes_its_gpu_mismatch_its_peers():
    run = _run(3)
    me._compare_peers(run, _planted(3, {1: 777}))
    assert len(set(run.references.values())) == 2
    assert {g: v["verdict"] for g, v in an.verdicts(run).items()} == {0: "ok", 1: "mismatch", 2: "ok"}
    (f,) = an.findings(run)
    assert f.severity == PROBLEM and "GPU 1 (NVIDIA H200) mismatches its peers" in f.text
    assert "GEMM 64x48x32" in f.text and f"D[{777 % M}, {777 // M}]" in f.text and "GPUs 0 and 2" in f.text
    assert "1 of 3072 elements differ" in f.text
    assert PROBE.failure(document(run, {"host": "h"})) == \
        "silent data corruption: GPU 1 mismatches its peers (see the findings)"


def test_no_majority_names_both_and_other_models_are_not_peers():
    run = _run(2)
    me._compare_peers(run, _planted(2, {1: 5}))
    assert {v["verdict"] for v in an.verdicts(run).values()} == {"mismatch"}
    texts = [f.text for f in an.findings(run)]
    assert len(texts) == 2 and all("no majority" in t and "D[5, 0]" in t for t in texts)
    mixed = _run(2, names=["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
    me._compare_peers(mixed, _planted(2, {1: 5}))
    assert mixed.peer_differences == [] and {v["verdict"] for v in an.verdicts(mixed).values()} == {"ok"}
    (warning,) = an.findings(mixed)
    assert warning.severity == "ok" and "GPUs 0 and 1 had no peer" in warning.text  # information, not a warning


def test_disagreeing_with_itself_is_unstable_and_known_answers_are_wrong():
    run = _run(2)
    me._compare_peers(run, _planted(2, {}))
    first = np.arange(M * N, dtype=np.uint16)
    later = first.copy()
    later[300] ^= 0x8000  # the sign bit
    bad = next(c for c in run.checks if (c.gpu, c.repetition, c.work) == (0, 3, "gemm"))
    bad.wrong, bad.hash = 1, "0x" + "2" * 16
    bad.first = {**an.locate_gemm(later, first, M, "fp16", "its own first result (repetition 1, GEMM 1)"), "gemm": 3}
    hbm = next(c for c in run.checks if (c.gpu, c.repetition, c.work) == (1, 2, "hbm"))
    hbm.wrong, hbm.first = 2, an.locate_word(1234, 0xFF, 0xFE, hbm.bytes)
    coll = next(c for c in run.checks if (c.gpu, c.repetition, c.work) == (1, 1, "collective"))
    coll.wrong, coll.first = 1, an.locate_element(0, 3.0, 4.0)
    assert {g: v["issues"] for g, v in an.verdicts(run).items()} == {0: ["unstable"], 1: ["wrong"]}
    texts = [f.text for f in an.findings(run)]
    assert "GPU 0 (NVIDIA H200) is unstable" in texts[0] and "1 of 3 repetition(s)" in texts[0]
    assert "repetition 3, GEMM 3" in texts[0] and f"D[{300 % M}, {300 // M}]" in texts[0]
    assert "GPU 1 (NVIDIA H200) HBM: 2 8-byte word(s)" in texts[1] and "byte offset 0x2690" in texts[1]
    assert "(1 bit differs)" in texts[1]
    assert "GPU 1 (NVIDIA H200) collective" in texts[2] and "element 0: 3 read, 4 in the exact sum" in texts[2]
    assert "GPU 0 unstable, GPU 1 wrong data" in an.failure(run)


def test_document_round_trip_headline_and_schema():
    run = _run(3)
    me._compare_peers(run, _planted(3, {2: 9}))
    doc = json.loads(json.dumps(document(run, {"host": "h"}, ["mgpu-bench", "sdc"])))
    validate(doc, "sdc.json")
    back = run_from_document(doc)
    assert an.verdicts(back) == an.verdicts(run) and [f.text for f in an.findings(back)] == doc["findings"]
    assert back.config.shape == (M, N, K) and back.references == run.references
    metrics = {m.name: m for m in headline(doc)}
    assert metrics["sdc.gpu0.wrong_checks"].value == 0.0
    assert metrics["sdc.gpu2.wrong_checks"].value == pytest.approx(1 / 3)  # every GEMM check of 9
    assert metrics["sdc.gpu0.gemm.tflops"].value == pytest.approx(4 * 2 * M * N * K / 4e-4)
    assert metrics["sdc.gpu1.hbm.check_bandwidth"].value == pytest.approx(2 * (1 << 30) / 5e-4)
    assert metrics["sdc.gpu1.hbm.checked_bytes"].value == 1 << 30
    doc["checks"][0]["work"] = "dgemm"
    with pytest.raises(Exception, match=r"checks\[0\]\.work"):
        validate(doc, "sdc.json")


def test_clean_run_judges_ok_and_renders(tmp_path):
    from rich.console import Console

    run = _run(2)
    me._compare_peers(run, _planted(2, {}))
    assert PROBE.failure(document(run, {})) is None
    (ok,) = an.judge(run)
    assert ok.severity == "ok" and "3 repetition(s) on 2 GPU(s)" in ok.text and "HBM 1.0 GiB per GPU written and read back 3 time(s)" in ok.text
    console = Console(record=True, width=100)
    doc = document(run, {"host": "h"})
    PROBE.render(doc, console)
    text = console.export_text()
    assert run.references[0] in text and "algo 66" in text
    assert PROBE.csv(doc).splitlines()[1].startswith("0,NVIDIA H200,ok,,3,12,")
    paths = PROBE.report(doc, tmp_path / "rep")
    assert {p.name for p in paths} == {"throughput.png", "report.html", "summary.md"}
    assert "no silent data corruption" in (tmp_path / "rep" / "report.html").read_text()


def test_suite_runs_a_short_version_in_round_1():
    (step,) = PROBE.suite_steps(PlanContext(True, (0, 1), 60.0))
    assert (step.round, step.name, step.min_gpus) == (1, "sdc", 1)
    assert step.args == ("sdc", "--repetitions", "3", "--gemms", "16", "--gpus", "2")
    (cpu,) = PROBE.suite_steps(PlanContext(False, (), 60.0))
    assert cpu.args == ("sdc", "--repetitions", "5")


@pytest.mark.parametrize("args,text", [
    (["--duration", "soon"], "not a duration"),
    (["--memory-fraction", "0.99"], "--memory-fraction 0.99: at most 0.95"),
    (["--shape", "8x8"], "neither N"),
    (["--shape", "0"], "from 1 to"),
    (["--gemms", "0"], "--gemms 0: at least 1"),
    (["--repetitions", "2", "--duration", "1m"], "not both"),
    (["--comm-size", "1K"], "from 4K"),
    (["--dtype", "fp8"], "fp8"),
])
def test_cli_bad_input_is_one_line_exit_2(args, text):
    res = CliRunner().invoke(cli, ["sdc", *args])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and text in lines[0] and "Traceback" not in res.output


def test_cli_without_gpu_says_what_runs_here():
    from mgpu_bench.machine.selection import visible_gpu_count

    if visible_gpu_count() > 0:
        pytest.skip("this machine has GPUs")
    res = CliRunner().invoke(cli, ["sdc", "--gpus", "2"])
    assert res.exit_code == 2
    assert "sdc needs NVIDIA GPUs" in res.output and "suite run on CPU processes (gloo)" in res.output
