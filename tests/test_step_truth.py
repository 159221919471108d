"""The whole truth of a step, on CPU processes, each case a small training loop of its own around
StepMonitor: the headline throughput is the loop's own wall-clock rate (samples over the time the
timed steps took) with periodic stalls outside and inside compute(), and those stalls are named
with their period and share; a healthy loop gets no false finding; under torch.distributed (gloo
ranks started by torch's elastic launcher) a rank slowed inside its forward is named the
straggler with its lag, and DDP whose gradient sync is most of the step is communication-bound
with the share, measured in DDP's communication hook without a profiler."""

from __future__ import annotations

import statistics
import time

import pytest

pytestmark = pytest.mark.timing  # judges measured speed (against what the same run measured)

torch = pytest.importorskip("torch")

WARMUP, STEPS, EVERY, PAUSE = 3, 63, 10, 0.2  # 60 timed steps; every 10th pauses 0.2 s (a checkpoint)
BATCH = 64


def _mlp(width: int = 512, layers: int = 4):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def _loop(where: str | None, db: str | None = None, width: int = 512, batch: int = BATCH,
          pause: float = PAUSE) -> tuple[dict, float, list[float]]:
    """A plain loop monitored by StepMonitor, pausing `pause` every EVERY-th step `where`
    ("outside" or "inside" compute(), None: never); returns the document, the loop's own
    wall-clock rate over the timed steps (samples / its own perf_counter) and its own step times
    (start to the next start, as the monitor takes them)."""
    from mgpu_bench import StepMonitor

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = _mlp(width)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(batch, width)
        mon = StepMonitor(f"truth-{where}", model=model, warmup=WARMUP, window=20, store=db is not None, db=db,
                          print=False)
        t0, starts = 0.0, []
        for i in range(STEPS):
            if i == WARMUP:
                t0 = time.perf_counter()
            if i >= WARMUP:
                starts.append(time.perf_counter())
            with mon.step(samples=batch):
                if where == "outside" and i % EVERY == EVERY - 1:
                    time.sleep(pause)
                with mon.compute():
                    loss = model(x).square().mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    if where == "inside" and i % EVERY == EVERY - 1:
                        time.sleep(pause)
        end = time.perf_counter()
        own = batch * (STEPS - WARMUP) / (end - t0)
        steps = [b - a for a, b in zip(starts, [*starts[1:], end], strict=True)]
        return mon.finish(), own, steps
    finally:
        torch.set_num_threads(threads)


def _step_s() -> float:
    """The loop's median step on this host now (a loaded host's steps are several times longer)."""
    return statistics.median(_loop(None)[2])


@pytest.mark.parametrize("where,place", [("outside", "outside"), ("inside", "compute")])
def test_periodic_stalls_the_headline_is_the_wall_clock_and_the_stall_is_named(where, place, tmp_path):
    pause = max(PAUSE, 10 * _step_s())  # a stall ten steps long however loaded the host is
    doc, own, _ = _loop(where, str(tmp_path / "h.sqlite3"), pause=pause)
    (run,) = doc["runs"]
    d = run["derived"]
    assert d["samples_per_s"] == pytest.approx(own, rel=0.02)  # the loop's own rate, not batch / median
    assert d["measured_steps"] == STEPS - WARMUP
    assert d["steady_samples_per_s"] > 1.3 * d["samples_per_s"]  # the median step hides the pauses
    s = run["stalls"]
    # every pause on the period (one may be missed beside a busy neighbour: a step of its own slowed as much)
    assert s["period"] == EVERY and (STEPS - WARMUP) // EVERY - 1 <= s["on_period"] <= (STEPS - WARMUP) // EVERY
    assert s["period_excess_s"] == pytest.approx(pause, rel=0.25)
    assert s["main"] == place
    elapsed = d["elapsed_s"]
    assert s["share"] == pytest.approx(s["excess_s"] / elapsed)
    assert 0.8 * 6 * pause / elapsed < s["share"] < 1.3 * 6 * pause / elapsed + 0.05
    verdict = next(f for f in doc["findings"] if "stall-bound" in f)
    led = run["ledger"]["shares"]["stalls"]  # the step ledger's: the stalls' extra time over the steps less any lag
    assert led == pytest.approx(s["share"], abs=0.01)
    assert f"every {EVERY}th step" in verdict and f"{100 * led:.1f}% of the time" in verdict
    assert ("outside compute()" if where == "outside" else "inside compute()") in verdict
    gap = next(f for f in doc["findings"] if "the wall clock's throughput" in f)
    assert "below the steady-state rate" in gap
    # the stored metric is the wall clock's rate; the report draws the stalls over the run
    from mgpu_bench.history import History

    with History.open(str(tmp_path / "h.sqlite3")) as h:
        (info,) = h.list(5, kind="model")
        rate = {m.name: m for m in h.metrics(info.run_id)}[f"model.job:truth-{where}.job.1gpu.loader.samples_per_s"]
    assert rate.value == pytest.approx(own, rel=0.02) and len(rate.samples) == STEPS - WARMUP
    from mgpu_bench.results.probe import get

    out = tmp_path / "report"
    get("model").report(doc, out, None)
    assert (out / "steps.png").stat().st_size > 1000


def test_a_healthy_loop_has_no_false_finding():
    """Nothing is said that the loop's own clock does not say: on an idle host no stall and no gap;
    on a busy one (other processes' time in some steps) a gap only where its own steps show it."""
    doc, own, steps = _loop(None, width=1024, batch=128)  # steps of tens of ms: scheduling is small beside them
    (run,) = doc["runs"]
    d = run["derived"]
    assert d["samples_per_s"] == pytest.approx(own, rel=0.02)
    own_gap = 1 - statistics.median(steps) / statistics.fmean(steps)  # the loop's own wall clock against its median
    text = " ".join(doc["findings"])
    assert "straggler:" not in text
    if abs(own_gap) < 0.02:  # the loop's own clock sees no gap: nor may the monitor (its finding starts at 5%)
        assert "stall-bound" not in text
        assert d["stall_share"] < 0.05
        assert any(f.startswith("1 process(es): compute-bound") for f in doc["findings"]), doc["findings"]
        # the monitor's steady state is the median over its stable window: the loop's own over the same steps (on
        # a busy host the window is short and its median not the whole run's: 0.07 and 0.15 apart, seen)
        a, b = run["window"][:2]
        own_window_gap = 1 - statistics.median(steps[a:b]) / statistics.fmean(steps)
        assert abs((1 - d["samples_per_s"] / d["steady_samples_per_s"]) - own_window_gap) < 0.03, (run["window"], own_gap)
        if abs(own_window_gap) < 0.02:  # nor over the window's steps: the gap's finding (from 5%) cannot start
            assert "below the steady-state rate" not in text  # (beside test_fleet.py on two cores: a window 7% apart, seen)
    elif own_gap > 0.08:  # a busy host took time in some steps: the monitor says so (its median is its
        assert "below the steady-state rate" in text  # stable window's, not all steps', so its figure differs)


# ------------------------------------------------------------------------------------ two ranks

LAG_S = 0.05  # rank 1's extra time inside its forward, every step


def job(cases: tuple[str, ...], db: str) -> dict:
    """One rank of a user's DDP job on gloo, monitored once per case: `slow`: rank 1 sleeps LAG_S
    inside its forward every step; `comm`: many parameters and little compute (the sync most of the
    step); also the same steps timed with and without gradient sync (no_sync), unmonitored."""
    import torch.distributed as dist

    from mgpu_bench import StepMonitor

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = {}
    for case in cases:
        width, layers, batch = (256, 3, 32) if case == "slow" else (1024, 8, 2)
        model = torch.nn.parallel.DistributedDataParallel(_mlp(width, layers))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(batch, width)

        def step(case=case, model=model, opt=opt, x=x):
            if case == "slow" and rank == 1:
                time.sleep(LAG_S)  # inside compute(), before the forward: the others wait in the all-reduce
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()

        docs = []
        for hook in (None, True) if case == "comm" else (None,):  # the default marks, then the all-reduce in its hook
            mon = StepMonitor(f"ranks-{case}", model=model, warmup=3, window=10, db=db, print=rank == 0,
                              comm_hook=hook)
            for _ in range(33):
                with mon.step(samples=batch), mon.compute():
                    step()
            docs.append(mon.finish())
        ab = {}
        for sync in (True, False):  # the A/B the monitor does not do in the job: the same steps without sync
            with (model.no_sync() if not sync else torch.enable_grad()):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(10):
                    step()
                ab[sync] = (time.perf_counter() - t0) / 10
        out[case] = {"doc": docs[0], "hooked": docs[-1], "ab": ab}
    dist.destroy_process_group()
    return out


def _two_ranks(cases: tuple[str, ...], db: str) -> list[dict]:
    import uuid

    from torch.distributed.launcher.api import LaunchConfig

    from mgpu_bench.core import launch

    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=f"truth-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launch.free_port()}", max_restarts=0,
                      monitor_interval=0.1, start_method="spawn")
    results = launch.run_elastic(lc, job, cases, db, children="die")
    return [results[r] for r in sorted(results)]


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> dict:
    """Rank 0's result of each case, both cases in one job of two ranks (one launch, not one per
    case: each costs two processes that import torch, several CPU-seconds each), one after the
    other as a user's job runs its phases."""
    db = str(tmp_path_factory.mktemp("truth") / "h.sqlite3")
    return _two_ranks(("slow", "comm"), db)[0]


def test_a_rank_slow_inside_its_forward_is_named_with_its_lag(two):
    doc = two["slow"]["doc"]
    s = doc["job"]["straggler"]
    assert (s["rank"], s["by"], s["named"]) == (1, "compute", True), doc["findings"]
    assert 0.6 * LAG_S < s["lag_s"] < 2.0 * LAG_S
    assert s["compute_lag_s"] == pytest.approx(s["lag_s"]) and s["outside_lag_s"] < 0.3 * LAG_S
    lines = [f for f in doc["findings"] if f.startswith("straggler:")]
    assert len(lines) == 1 and "rank 1 (cpu on " in lines[0] and "inside compute()" in lines[0]
    assert doc["runs"][0]["comm_method"] == "marks"  # DDP's all-reduce untouched: marks on the model's tensors


def test_ddp_whose_sync_is_most_of_the_step_is_communication_bound_with_the_share(two):
    got = two["comm"]
    doc, ab = got["doc"], got["ab"]
    cost = 1 - ab[False] / ab[True]
    assert cost > 0.3  # the job itself: the sync is over 30% of its step
    # the default marks and the communication hook both see the communication the backward could not hide: a good
    # part of the sync's cost, never more than it (on CPU processes the all-reduce's threads also slow the backward
    # they overlap: the rest of it)
    for doc, method in ((got["doc"], "marks"), (got["hooked"], "hook")):
        (run,) = doc["runs"]
        d = run["derived"]
        assert run["comm_method"] == method and 0.15 < d["exposed_comm_share"] < cost + 0.1, (method, d)
        verdict = next(f for f in doc["findings"] if "communication-bound" in f)
        # the verdict's share is the step ledger's (of every timed step's time), the steady-state step's beside it
        led = run["ledger"]
        assert led["method"] == method and f"{100 * led['shares']['communication']:.1f}% of the time" in verdict
    d = got["hooked"]["runs"][0]["derived"]
    assert d["sync_bytes"] == pytest.approx(4 * sum(p.numel() for p in _mlp(1024, 8).parameters()), rel=0.01)
    assert d["sync_busy_s"] >= d["hook_exposed_s"]
    verdict = next(f for f in got["hooked"]["findings"] if "communication-bound" in f)
    assert "DDP's communication hook" in verdict and "GB/s bus bandwidth" in verdict
    assert "from hooks on the model's tensors" in next(f for f in got["doc"]["findings"] if "communication-bound" in f)
