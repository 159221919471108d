"""StepMonitor in one CPU process: a real training loop of a small GPT with a DataLoader slowed on
purpose (input-bound, the data wait against the sleep), the FLOPs counted on the first step against
the workload's own count, the run stored and shown by the history, the profiled window and only
it; the window arithmetic on exact marks; the straggler's rule; the rank exchange over a real
TCPStore; every misuse (a warning and the training goes on, or MonitorError with strict=True);
an exception in a step re-raised untouched with the steps before it kept; importing the package
stays light."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
import warnings

import pytest

from mgpu_bench.monitor import MonitorError, MonitorWarning, StepMonitor, clock, ranks

torch = pytest.importorskip("torch")

SLEEP_S = 0.08  # the slowed DataLoader's cost per batch: several times a step of the model here


def _mini():
    """A real GPT of the package, small enough for a loaded CPU (2 blocks, width 64, 512 tokens)."""
    from mgpu_bench.workloads import gpt as models

    spec = models.ModelSpec("mini", layers=2, d_model=64, heads=2, vocab=512, max_seq=64)
    torch.manual_seed(0)
    model = models.GPT(spec, device=torch.device("cpu"))
    return spec, model, models.make_optimizer(model)


class SlowTokens(torch.utils.data.Dataset):
    """Random token samples; every `every`-th sample sleeps `sleep_s` (a slow decoder)."""

    def __init__(self, vocab: int, seq: int, n: int, sleep_s: float, every: int) -> None:
        self.vocab, self.seq, self.n, self.sleep_s, self.every = vocab, seq, n, sleep_s, every

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.sleep_s and i % self.every == 0:
            time.sleep(self.sleep_s)
        g = torch.Generator().manual_seed(i)
        t = torch.randint(0, self.vocab, (self.seq + 1,), generator=g)
        return t[:-1], t[1:]


def _train(mon, model, opt, loader, spec, on_step=None):
    from mgpu_bench.workloads import gpt as models

    for i, (x, y) in enumerate(loader):
        with mon.step(samples=x.shape[0]):
            with mon.compute():
                models.train_step(model, opt, x, y, None)
            if on_step is not None:
                on_step(i)


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    """One monitored loop: batches of 4 at seq 32, the loader sleeping SLEEP_S per batch, the
    profiled window on (CPU activity), stored in a fresh history, the document written."""
    tmp = tmp_path_factory.mktemp("monitor")
    spec, model, opt = _mini()
    loader = torch.utils.data.DataLoader(SlowTokens(spec.vocab, 32, 4 * 24, SLEEP_S, 4), batch_size=4)
    db, out = tmp / "h.sqlite3", tmp / "job.json"
    mon = StepMonitor("slow loader/test", tokens_per_sample=32, model=model, optimizer=opt, warmup=2, window=5,
                      profile=True, profile_steps=2, db=str(db), json=str(out), print=True)
    profiled = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a step of a few ms on a loaded host, not hundreds spent in thread contention
    try:
        _train(mon, model, opt, loader, spec, lambda i: profiled.append(torch._C._autograd._profiler_enabled()))
    finally:
        torch.set_num_threads(threads)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        doc = mon.finish()
    return {"doc": doc, "db": db, "json": out, "mon": mon, "profiled": profiled, "model": model, "spec": spec,
            "printed": printed.getvalue()}


def test_a_slowed_loader_is_input_bound_with_its_data_wait(slow_run, capsys):
    doc = slow_run["doc"]
    from mgpu_bench.results.probe import validate

    validate(json.loads(json.dumps(doc)), "the monitor's document")
    assert doc["kind"] == "model" and doc["config"]["model"] == "job:slow-loader-test"
    assert doc["workload"]["kind"] == "job" and doc["status"]["completed"]
    run = doc["runs"][0]
    d = run["derived"]
    # the sleep sits between steps (in `for x, y in loader`), so it is the data wait
    assert d["data_s"] == pytest.approx(SLEEP_S, rel=0.5)
    assert d["data_share"] > 0.10
    assert d["tokens_per_s"] == pytest.approx(d["samples_per_s"] * 32)
    # the wall clock's rate: every timed step's samples over the time they took; the median step's beside it
    (rank,) = doc["runs"][0]["ranks"]
    assert d["samples_per_s"] == pytest.approx(rank["totals"]["samples"] / rank["totals"]["elapsed_s"])
    assert d["samples_per_s"] == pytest.approx(4 * d["measured_steps"] / d["elapsed_s"])
    assert d["steady_samples_per_s"] == pytest.approx(4 / d["step_s"])
    assert any(f.startswith("1 process(es): input-bound: the input pipeline costs") for f in doc["findings"])
    # the ledger's input share is the wall clock outside compute(): gross against effective
    assert run["ledger"]["shares"]["input"] == pytest.approx(1 - job_gross_over_effective(doc), abs=0.02)
    job = doc["job"]
    assert job["effective_samples_per_s"] > job["gross_samples_per_s"]
    assert job["effective_samples_per_s"] == pytest.approx(rank["totals"]["samples"] / rank["totals"]["compute_s"])
    assert d["step_s"] == pytest.approx(d["data_s"] + d["compute_s"], rel=0.3)  # medians: near, not equal


def test_the_flops_are_counted_once_on_the_first_step_as_the_workload_counts_them(slow_run):
    from mgpu_bench.workloads import count_flops
    from mgpu_bench.workloads import gpt as models

    spec = slow_run["spec"]
    torch.manual_seed(1)
    model = models.GPT(spec, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    x, y = models.synthetic_batch(spec, 4, 32, torch.device("cpu"), g)
    theirs = count_flops(model, (x, y), lambda m, b: m(b[0], b[1]), 4, "cpu")
    job = slow_run["doc"]["job"]
    assert job["flops_per_step"] == pytest.approx(theirs.flops, rel=1e-9)
    assert slow_run["doc"]["workload"]["flops"]["per_sample"] == pytest.approx(theirs.per_sample, rel=1e-9)
    assert slow_run["mon"].flop_count.dense_ops  # the shapes the ceiling replays on a GPU


def test_the_profiler_runs_in_its_window_only(slow_run):
    profiled = slow_run["profiled"]
    assert [i for i, on in enumerate(profiled) if on] == [2, 3]  # profile_at defaults to the first step after warm-up
    job = slow_run["doc"]["job"]
    assert job["profile_steps"] == [2, 3]
    # the profiled steps are not timed: the first timed step comes after them
    assert slow_run["mon"].windows[0]["first"] == 4


def test_the_run_is_stored_and_shown_by_the_history(slow_run):
    from click.testing import CliRunner

    from mgpu_bench.cli import cli
    from mgpu_bench.history import History

    with History.open(slow_run["db"]) as h:
        runs = h.list(10, kind="model")
        assert len(runs) == 1
        names = {m.name for m in h.metrics(runs[0].run_id)}
    assert "model.job:slow-loader-test.job.1gpu.loader.tokens_per_s" in names
    res = CliRunner().invoke(cli, ["history", "show", runs[0].run_id, "--db", str(slow_run["db"])])
    assert res.exit_code == 0 and "job:slow-loader-test" in res.output
    written = json.loads(slow_run["json"].read_text())
    assert written["runs"][0]["derived"]["step_s"] == slow_run["doc"]["runs"][0]["derived"]["step_s"]


def job_gross_over_effective(doc: dict) -> float:
    return doc["job"]["gross_samples_per_s"] / doc["job"]["effective_samples_per_s"]


def test_finish_printed_the_table_the_findings_and_the_verdict(slow_run):
    printed = slow_run["printed"]
    assert "job:slow-loader-test training steps" in printed
    share = slow_run["doc"]["runs"][0]["ledger"]["shares"]["input"]
    assert f"finding: 1 process(es): input-bound: the input pipeline costs {100 * share:.1f}%" in printed
    assert "step ledger over " in printed and f"the input pipeline {100 * share:.1f}%" in printed
    assert "gross " in printed and "samples/s (samples / the time inside compute())" in printed
    assert printed.rstrip().splitlines()[-1].startswith("verdict: 1 process(es): input-bound")
    assert slow_run["mon"].finish() is slow_run["doc"]  # a second finish() returns the same document, stores nothing


# -- the window arithmetic on exact marks --------------------------------------------------------------


def _pool(rows):
    """A host pool filled by hand: rows of (index, start, compute start, compute end, end, computed)."""
    p = clock.HostPool(len(rows))
    for k, (i, s, cs, ce, e, comp) in enumerate(rows):
        p.index[k], p.samples[k], p.computed[k] = i, 2, comp
        p.marks[k] = [s, cs, ce, e]
    p.n = len(rows)
    return p


def test_a_step_runs_to_the_next_steps_start_and_its_wait_is_outside_compute():
    p = _pool([(10, 0.0, 0.1, 0.5, 0.6, True), (11, 0.9, 0.95, 1.4, 1.45, True), (13, 2.0, 2.0, 2.3, 2.4, True)])
    nxt = _pool([(14, 2.6, 2.6, 2.9, 3.0, True)])
    cols = p.read(nxt)
    # step 10 runs to 11's start (the batch fetched between them is its wait); 11's next step (12)
    # is missing (it raised, or was profiled): it ends at its own end; 13 runs to the next pool's 14
    assert cols["wall_s"] == pytest.approx([0.9, 0.55, 0.6])
    assert cols["compute_s"] == pytest.approx([0.4, 0.45, 0.3])
    assert cols["data_s"] == pytest.approx([0.5, 0.1, 0.3])
    assert p.read(None)["wall_s"][-1] == pytest.approx(0.4)  # the last step of all: to its own end
    cols = _pool([(1, 0.0, 0.0, 0.0, 0.5, False)]).read(None)
    assert cols["data_s"] == [0.0] and cols["compute_s"] == [0.0]  # no compute(): counted as compute only
    s = clock.summary(p.read(nxt), 0)
    assert (s["first"], s["last"], s["steps"], s["samples"]) == (10, 13, 3, 6)
    assert s["step_s"] == pytest.approx(0.6) and s["data_s"] == pytest.approx(0.3)


# -- the straggler -------------------------------------------------------------------------------------


def test_the_straggler_is_the_rank_the_others_wait_for():
    # data-parallel: equal walls; rank 2 reaches compute 30 ms late at every step, the others wait inside compute
    walls = [[0.100 + 0.001 * (i % 3) for i in range(10)] for _ in range(3)]
    outside = [[0.005] * 10, [0.006] * 10, [0.035] * 10]
    s = ranks.straggler(walls, outside)
    assert (s["rank"], s["by"], s["named"]) == (2, "arrival", True)
    assert s["lag_s"] == pytest.approx(0.030) and s["lag_share"] == pytest.approx(0.030 / 0.102, rel=0.02)
    assert "straggler: rank 2" in ranks.straggler_text(s, "")
    # no collective in the step: rank 0's steps are longer
    s = ranks.straggler([[0.2] * 10, [0.1] * 10], [[0.0] * 10, [0.0] * 10])
    assert (s["rank"], s["by"], s["named"]) == (0, "wall", True) and s["lag_s"] == pytest.approx(0.1)
    # a lag within the limit is said, not named
    s = ranks.straggler([[0.1] * 10] * 2, [[0.010] * 10, [0.013] * 10])
    assert s["rank"] == 1 and not s["named"] and ranks.straggler_text(s, "").startswith("no straggler")
    # noise: the ranks take turns being late, by as much as a straggler would be: nobody is named
    outside = [[0.04 * (i % 2) for i in range(10)], [0.04 * ((i + 1) % 2) for i in range(10)]]
    s = ranks.straggler([[0.1] * 10] * 2, outside)
    assert s["lag_share"] > ranks.STRAGGLER_LIMIT and s["last_share"] == 0.5 and not s["named"]
    assert "take turns" in ranks.straggler_text(s, "")
    # a slower GPU shows in the profiled window: its compute kernels run longer
    s = ranks.straggler([[0.1] * 10] * 2, [[0.01] * 10] * 2, kernels=[0.080, 0.092])
    assert (s["rank"], s["by"]) == (1, "kernels") and s["lag_s"] == pytest.approx(0.012)
    assert ranks.straggler([[0.1] * 3], [[0.0] * 3]) is None  # one rank: no straggler to name


def test_the_ranks_meet_in_a_real_store_without_waiting_for_each_other():
    import datetime

    from torch.distributed import TCPStore

    from mgpu_bench.core.launch import free_port

    store = TCPStore("127.0.0.1", free_port(), None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    a, b = (ranks.Exchange(store, "t/job/0", r, 2) for r in (0, 1))
    a.put_window({"window": 0, "step_s": 0.1})
    assert a.windows() is None  # rank 1 has no window yet: rank 0 does not wait, it reads later
    b.put_window({"window": 0, "step_s": 0.2})
    assert [w["step_s"] for w in a.windows()] == [0.1, 0.2]
    b.put_window({"window": 1, "step_s": 0.3})  # overwritten: the latest only
    assert a.windows()[1]["window"] == 1
    a.put_final({"rank": 0})
    t0 = time.monotonic()
    got = a.finals(0.3)  # rank 1 never sends its record: None after the timeout
    assert got == [{"rank": 0}, None] and 0.3 <= time.monotonic() - t0 < 5
    assert not store.check(["t/job/0/final/0"])  # read keys are removed
    a.put_doc({"kind": "model"})
    assert b.doc(1.0) == {"kind": "model"}


# -- misuse ----------------------------------------------------------------------------------------------


def _bare(**kw):
    return StepMonitor("misuse", warmup=0, window=4, count_flops=False, store=False, print=False, **kw)


def test_misuse_is_a_warning_once_and_the_training_goes_on():
    mon = _bare()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            with mon.compute():  # outside a step
                pass
        for _ in range(6):
            with mon.step(samples=2), mon.step(samples=3), mon.compute(), mon.compute():
                pass
        with mon.step(samples=0):
            pass
        with mon.step(samples=torch.tensor(2)):
            pass
        with mon.step(samples=2):  # never enters compute()
            pass
    texts = [str(w.message) for w in seen if issubclass(w.category, MonitorWarning)]
    assert len(texts) == 5, texts  # once per kind: outside, nested step, nested compute, samples, no compute
    assert all(t.startswith("mgpu-bench monitor: ") and "\n" not in t for t in texts)
    assert all(w.filename == __file__ for w in seen)  # each points at the training's own line
    assert mon.steps == 7  # the 6 good steps and the one without compute(); the ones without samples not
    notes = mon.misuse_notes()
    assert "3 x compute() outside a step (ignored)" in notes and "6 x step() inside a step (ignored)" in notes
    assert "1 timed step(s) never entered compute(): their data wait counts as 0" in notes


def test_strict_misuse_raises_the_packages_error():
    mon = _bare(strict=True)
    with pytest.raises(MonitorError, match="compute\\(\\) outside a step"):
        mon.compute()
    with mon.step(samples=1), mon.compute(), pytest.raises(MonitorError, match="inside a step"):
        mon.step(samples=1)
    with pytest.raises(MonitorError, match="ran without mon.compute"), mon.step(samples=1):
        pass
    assert issubclass(MonitorError, ValueError)  # an InputError: the package's bad-input class


@pytest.mark.parametrize("kw, text", [
    ({"name": ""}, "give the job's name"), ({"tokens_per_sample": 0}, "tokens_per_sample=0"),
    ({"warmup": -1}, "warmup=-1"), ({"window": 0}, "window=0"), ({"peak_tflops": -5}, "peak_tflops=-5"),
    ({"profile": "yes"}, "profile='yes'"), ({"dtype": "fp7"}, "dtype='fp7'"),
    ({"json": "/nonexistent-dir/x.json"}, "json"),
])
def test_bad_arguments_fail_at_once_in_one_line(kw, text, tmp_path):
    args = {"name": "job", **kw}
    with pytest.raises(MonitorError) as err:
        StepMonitor(store=False, **args)
    assert text in str(err.value) and "\n" not in str(err.value)


def test_finish_without_a_step_warns_and_says_so_in_the_document(tmp_path):
    db = tmp_path / "h.sqlite3"
    mon = StepMonitor("nothing", db=str(db), print=False)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        doc = mon.finish()
    assert doc["status"]["stopped"] == "failed" and "no step measured" in doc["status"]["message"]
    assert doc["runs"] == []
    from mgpu_bench.history import History

    with History.open(db) as h:
        assert h.list(10) == []  # nothing measured, nothing stored
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with mon.step(samples=1):
            pass
    assert any("after finish()" in str(w.message) for w in seen)


def test_an_exception_in_a_step_is_reraised_untouched_and_the_steps_before_are_kept():
    mon = _bare()
    boom = RuntimeError("the user's own error")
    with pytest.raises(RuntimeError) as got:
        for i in range(20):
            with mon.step(samples=2), mon.compute():
                time.sleep(0.001)
                if i == 13:
                    raise boom
    assert got.value is boom and got.value.__traceback__ is not None
    assert mon.steps == 13
    with mon.step(samples=2), mon.compute():  # the training may go on after catching it
        pass
    doc = mon.finish()
    assert doc["config"]["steps"] == 14 and doc["status"]["completed"]
    assert "1 step(s) raised an exception and are left out" in doc["notes"]


def test_importing_the_package_stays_light():
    code = ("import sys, mgpu_bench; assert 'torch' not in sys.modules; m = mgpu_bench.StepMonitor; "
            "assert 'torch' not in sys.modules; from mgpu_bench import MonitorWarning; print(m.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "StepMonitor"


def test_given_flops_and_peak_make_the_mfu_and_tokens_per_step_make_tokens_per_s():
    mon = StepMonitor("given", flops_per_step=2e6, peak_tflops=1e-3, warmup=1, window=4, store=False, print=False)
    for _ in range(12):
        with mon.step(samples=2, tokens=100), mon.compute():
            time.sleep(0.002)
    doc = mon.finish()
    d = doc["runs"][0]["derived"]
    # FLOPs per step / the wall clock's step / 1 TFLOP/s x 1e-3; tokens over the time the timed steps took
    assert d["mfu"] == pytest.approx(2e6 / d["wall_step_s"] / 1e9)
    assert d["tokens_per_s"] == pytest.approx(100 * d["measured_steps"] / d["elapsed_s"])
    assert d["steady_tokens_per_s"] == pytest.approx(100 / d["step_s"]) and doc["config"]["seq_len"] == 50
    assert doc["job"]["flops_source"] == "given (flops_per_step)" and "flops" not in doc["workload"]
    assert doc["peak"]["source"] == "user override"


def test_without_counted_shapes_the_ceiling_is_a_stored_gemm_run_of_this_gpu(tmp_path):
    from pathlib import Path

    from mgpu_bench.history import History
    from mgpu_bench.monitor import result

    fixture = json.loads((Path(__file__).parent / "fixtures" / "gpu" / "gemm-shared.json").read_text())
    db = tmp_path / "h.sqlite3"
    with History.open(db) as h:
        run_id = h.save(fixture)
        best = max(m.value for m in h.metrics(run_id) if m.name.endswith(".bf16.tflops"))
    mon = StepMonitor("ceiling", db=str(db), print=False)
    host, gpu = fixture["environment"]["host"], fixture["results"][0]["gpu_name"]
    c = result._stored_gemm(mon, gpu, host, 0.5 * best)
    assert c["flops_per_s"] == best and c["of_ceiling"] == pytest.approx(0.5)
    assert f"stored gemm run {run_id}" in c["source"] and gpu in c["source"]
    assert result._stored_gemm(mon, "NVIDIA B200", host, best) is None  # another GPU model: no reference
    assert result._stored_gemm(mon, gpu, "another-host", best) is None
