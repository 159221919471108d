"""The monitor never stops the training (issue 40, item 4). GradSync's all-reduce callbacks
completing in any order (as gloo's futures may), hundreds of times, directly on its hook: every
bucket's value comes back right and a step's marks read back whole (each done mark after its
ready mark) or None, never a stale one. Then one two-rank gloo job (torch's elastic launcher)
trains the same DDP model, its buckets tiny (one per parameter), unmonitored and monitored: with
the communication hook; with the noise scale in float32, float64 and bfloat16 (default marks and
the hook); with a fault injected in the norms and in the marks. Every monitored run completes
its steps with the unmonitored run's losses and gradients; the noise scale is there in every
dtype; a fault is one note, once."""

from __future__ import annotations

import math
import random
import threading

import pytest

torch = pytest.importorskip("torch")

STEPS, WARMUP, WINDOW, BATCH, WIDTH = 30, 2, 5, 16, 16
CAP_MB = 0.0002  # 210 bytes: every parameter of the test net a bucket of its own (up to 13 buckets)
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


class _Bucket:
    """What DDP hands a communication hook: the bucket's flat gradient buffer."""

    def __init__(self, tensor) -> None:
        self._tensor = tensor

    def buffer(self):
        return self._tensor


class _Work:
    """An all-reduce's work handle whose future the test completes, in the order it picks."""

    def __init__(self, fut) -> None:
        self._fut = fut

    def get_future(self):
        return self._fut


def _sync_under_test(pending: list):
    """A GradSync of 2 ranks whose all-reduce leaves its future to the test: (tensor, future) in
    `pending`; the test completes it with the sum of two equal ranks' buffers (the rank's own
    gradient, as DDP's average of equal gradients is)."""
    from mgpu_bench.training.gradsync import GradSync

    sync = GradSync(False, noise=True)
    sync.world = 2

    def all_reduce(tensor, group=None, async_op=True):
        fut = torch.futures.Future()
        pending.append((tensor, fut))
        return _Work(fut)

    sync._all_reduce = all_reduce
    return sync


def _complete(pending: list, order: list[int], threads: int) -> None:
    """The futures completed in `order`; with threads > 1, split over that many threads at once
    (gloo's workers complete futures on their own threads)."""
    def run(part):
        for i in part:
            tensor, fut = pending[i]
            fut.set_result([tensor * 2])

    if threads == 1:
        run(order)
        return
    workers = [threading.Thread(target=run, args=(order[j::threads],)) for j in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def test_bucket_callbacks_completing_in_any_order_mark_each_bucket_by_its_index():
    from mgpu_bench.training.gradsync import Slot, _hook, read

    rng = random.Random(40)
    pending: list = []
    sync = _sync_under_test(pending)
    slot = Slot()  # one slot reused from step to step, as the monitor's pool does
    whole = partial = 0
    for trial in range(400):
        n = rng.randint(2, 14)
        slot.reset()
        sync.slot, sync.noise.active = slot, True
        pending.clear()
        grads = [torch.randn(rng.randint(1, 40)) for _ in range(n)]
        outs = [_hook(sync, _Bucket(g.clone())) for g in grads]  # buckets ready in order 0..n-1
        order = list(range(n))
        rng.shuffle(order)
        left_out = trial % 8 == 7  # a callback that has not run when the step is read
        if left_out:
            order.remove(rng.randrange(n))
        _complete(pending, order, threads=1 if trial % 2 else 3)
        for i in order:
            assert torch.allclose(outs[i].wait(), grads[i])  # DDP's value, whatever the marks did
        got = read(slot, 0.0, lambda a, b: b - a)
        if left_out:
            assert got is None  # not a figure made of an earlier step's marks
            partial += 1
            for i in set(range(n)) - set(order):  # let the step end (the noise's norms, its count)
                _complete(pending, [i], 1)
                outs[i].wait()
            sync.noise.end_step(BATCH)
            continue
        assert got is not None and slot.ndone == n
        assert all(slot.done[j] >= slot.ready[j] for j in range(n))
        assert got["bytes"] == 4 * sum(g.numel() for g in grads) and got["exposed_s"] >= 0 and got["busy_s"] >= 0
        sync.noise.end_step(BATCH)
        whole += 1
    assert sync.fault is None and sync.noise.error is None
    assert whole == 350 and partial == 50 and sync.noise.steps_total == 400
    sync.slot = None
    out = _hook(sync, _Bucket(torch.ones(3)))  # outside compute(): all-reduced, counted unmarked
    _complete(pending, [len(pending) - 1], 1)
    assert torch.equal(out.wait(), torch.ones(3)) and sync.unmarked == 1


def test_a_fault_in_the_hooks_bookkeeping_is_one_note_and_the_all_reduce_goes_on():
    from mgpu_bench.training.gradsync import Slot, _hook, read

    pending: list = []
    sync = _sync_under_test(pending)
    calls = [0]
    mark = sync._mark

    def failing(marks, k):
        calls[0] += 1
        if calls[0] == 8:  # the second step's second bucket ready mark (3 ready and 3 done marks a step)
            raise IndexError("injected")
        mark(marks, k)

    sync._mark = failing
    figures = []
    for step in range(4):
        slot = Slot()
        sync.slot, sync.noise.active = slot, True
        pending.clear()
        grads = [torch.randn(5) for _ in range(3)]
        outs = [_hook(sync, _Bucket(g.clone())) for g in grads]
        _complete(pending, [2, 0, 1], 1)
        assert all(torch.equal(o.wait(), g) for o, g in zip(outs, grads))
        figures.append(read(slot, 0.0, lambda a, b: b - a))
        sync.noise.end_step(BATCH)
    assert sync.fault == "IndexError: injected" and calls[0] == 8  # no mark after the fault
    assert figures[0] is not None and figures[1:] == [None, None, None]  # the struck step and the ones after
    assert sync.noise.error is None and sync.noise.steps_total == 4  # the norms are another part: they go on


def test_grad_marks_count_backwards_call_after_backward_and_survive_their_own_faults():
    from mgpu_bench.training.gradsync import GradMarks, read_marks

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    gm = GradMarks(False)
    assert gm.attach(model)
    called = []
    gm.after_backward = lambda: called.append(gm.slot.k)
    slot = gm.slots(1)[0]
    gm.slot = slot
    for _ in range(3):  # gradient accumulation: three backwards in one step
        model(torch.randn(8, 4)).square().mean().backward()
    assert slot.backwards == 3 and called == [3, 3, 3]  # after the backward-done mark, each time
    assert read_marks(slot, 0.0, lambda a, b: b - a) is not None
    slot.reset()
    assert slot.backwards == 0

    def broken():
        raise ValueError("owner's callback")

    gm.after_backward = broken
    model(torch.randn(8, 4)).square().mean().backward()  # the backward completes
    assert gm.after_backward is None and gm.fault == "after_backward: ValueError: owner's callback"
    assert read_marks(slot, 0.0, lambda a, b: b - a) is not None  # the marks go on
    slot.reset()
    mark = gm._mark

    def failing(s, k):
        if k == 2:
            raise RuntimeError("no mark")
        mark(s, k)

    gm._mark = failing
    model(torch.randn(8, 4)).square().mean().backward()
    assert read_marks(slot, 0.0, lambda a, b: b - a) is None and gm.fault == "after_backward: ValueError: owner's callback"
    slot.reset()
    gm._mark = mark
    model(torch.randn(8, 4)).square().mean().backward()  # the marks stopped: no step is marked again
    assert read_marks(slot, 0.0, lambda a, b: b - a) is None and all(p.grad is not None for p in model.parameters())
    gm.detach()


def test_norms_are_taken_in_each_gradient_dtype_and_summed_in_float64():
    from mgpu_bench.training.gradsync import Noise

    for dtype in DTYPES.values():
        noise = Noise(False)
        g = torch.randn(50, dtype=torch.float64)
        noise.local(g.to(dtype))
        noise.reduced_all([g.to(dtype)])
        noise.end_step(4)
        assert noise.error is None and noise._acc.dtype == torch.float64
        want = float(g.to(dtype).double().square().sum())
        assert noise._acc.tolist() == pytest.approx([want, want], rel=1e-5 if dtype != torch.float64 else 1e-12)


# ------------------------------------------------------------------------------------ two ranks


def _net(dtype):
    torch.manual_seed(0)
    layers: list = []
    for _ in range(6):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 1)).to(dtype)


def _train(rank: int, dtype, monitor: dict | None, fault=None) -> dict:
    """STEPS of SGD on a DDP net (a bucket per parameter) fitting a constant (a gradient with a
    strong common part: a positive noise scale), each rank its own data; per step the loss and the
    gradients after the backward; monitored with `monitor`'s StepMonitor arguments (None: not).
    `fault(step)` runs before each step."""
    from mgpu_bench import StepMonitor

    ddp = torch.nn.parallel.DistributedDataParallel(_net(dtype), bucket_cap_mb=CAP_MB)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02)
    data = torch.Generator().manual_seed(100 + rank)
    mon = None
    if monitor is not None:
        mon = StepMonitor("faults", model=ddp, warmup=WARMUP, window=WINDOW, store=False, print=False, **monitor)
    losses, grads = [], []
    for i in range(STEPS):
        x = torch.randn(BATCH, WIDTH, generator=data).to(dtype)
        y = (3.0 + 0.3 * torch.randn(BATCH, 1, generator=data)).to(dtype)
        if fault is not None:
            fault(i)
        if mon is None:
            loss = (ddp(x) - y).square().mean()
            loss.backward()
        else:
            with mon.step(samples=BATCH), mon.compute():
                loss = (ddp(x) - y).square().mean()
                loss.backward()
        losses.append(float(loss.detach()))
        grads.append([p.grad.detach().clone() for p in ddp.parameters()])
        opt.step()
        opt.zero_grad()
    out = {"losses": losses, "grads": grads, "buckets": None}
    if mon is not None:
        sync = mon._sync
        out.update(doc=mon.finish(), fault=getattr(sync, "fault", None), kind=type(sync).__name__,
                   noise_error=sync.noise.error if sync is not None and sync.noise is not None else None)
    return out


def _failing_once(cls, name: str, nth: int, exc: Exception):
    """cls.name raising `exc` at its nth call (counted on this rank), the original otherwise;
    returns the restore function."""
    original = getattr(cls, name)
    calls = [0]

    def patched(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth:
            raise exc
        return original(*args, **kwargs)

    setattr(cls, name, patched)
    return lambda: setattr(cls, name, original)


def job() -> dict:
    """One rank: each case's run, unmonitored twins first."""
    import datetime

    import torch.distributed as dist

    from mgpu_bench.training import gradsync

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    out = {}
    for name, dtype in DTYPES.items():
        out[f"plain-{name}"] = _train(rank, dtype, None)
    out["hook"] = _train(rank, torch.float32, {"comm_hook": True})
    for name, dtype in DTYPES.items():
        for hook in (None, True):
            out[f"noise-{name}-{hook}"] = _train(rank, dtype, {"noise_scale": True, "noise_every": 1,
                                                               "comm_hook": hook})
    for hook in (None, True):  # this rank's third norm fails (in the hook's bucket, or a parameter's hook)
        restore = _failing_once(gradsync.Noise, "local", 3, RuntimeError("injected norm fault"))
        try:
            out[f"fault-noise-{hook}"] = _train(rank, torch.float32, {"noise_scale": True, "noise_every": 1,
                                                                      "comm_hook": hook})
        finally:
            restore()
    state = {"armed": False}
    mark = gradsync.GradSync._mark

    def mark_fails_in_step_8(self, marks, k):
        if state["armed"]:
            state["armed"] = False
            raise IndexError("injected mark fault")
        mark(self, marks, k)

    gradsync.GradSync._mark = mark_fails_in_step_8
    try:
        out["fault-mark"] = _train(rank, torch.float32, {"comm_hook": True},
                                   fault=lambda i: state.update(armed=i == 8))
    finally:
        gradsync.GradSync._mark = mark
    dist.destroy_process_group()
    return out


def _start_method() -> str:
    """How the ranks start: forked from this process's imports, unless this process holds what a
    forked child must not inherit (a CUDA context from an earlier test on a GPU machine, a process
    group): then spawned."""
    import torch.distributed as dist

    return "spawn" if torch.cuda.is_initialized() or (dist.is_available() and dist.is_initialized()) else "fork"


@pytest.fixture(scope="module")
def ranks():
    """job() on two ranks, forked from this process where it can (_start_method), which has torch
    and the package imported already (spawned ranks import them again: about 3 s of CPU each on a
    2-core CI host). job() sets one thread before any work, so no OpenMP pool is used after the
    fork."""
    import uuid

    from torch.distributed.launcher.api import LaunchConfig

    from mgpu_bench.core import launch

    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=f"faults-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launch.free_port()}", max_restarts=0,
                      monitor_interval=0.1, start_method=_start_method())
    results = launch.run_elastic(lc, job, children="die")
    return [results[r] for r in sorted(results)]


def _same_training(run: dict, plain: dict) -> None:
    """Every step of `run` completed with the unmonitored run's loss and gradients."""
    assert len(run["losses"]) == len(plain["losses"]) == STEPS
    assert run["losses"] == pytest.approx(plain["losses"], rel=1e-6, abs=1e-6)
    for got, want in zip(run["grads"], plain["grads"], strict=True):
        assert all(torch.allclose(g, w) for g, w in zip(got, want, strict=True))


def _notes(doc: dict, text: str) -> list[str]:
    return [n for n in doc["notes"] if text in n]


def test_the_hook_with_a_bucket_per_parameter_trains_as_ddp_and_reads_whole_steps(ranks):
    params = sum(p.numel() for p in _net(torch.float32).parameters())
    for r, got in enumerate(ranks):
        run = got["hook"]
        _same_training(run, got["plain-float32"])
        assert run["kind"] == "GradSync" and run["fault"] is None
        doc = run["doc"]
        sync = doc["runs"][0]["ranks"][r]["sync"]
        assert len(sync["bytes"]) == STEPS - WARMUP
        for arrival, exposed, busy, nbytes in zip(sync["arrival"], sync["exposed"], sync["busy"], sync["bytes"],
                                                  strict=True):
            assert arrival is None or (arrival >= 0 and exposed >= 0 and busy >= 0 and nbytes == 4 * params)
        assert sum(a is not None for a in sync["arrival"]) == STEPS - WARMUP  # no fault: every step whole


@pytest.mark.parametrize("hook", [None, True])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_noise_scale_in_every_gradient_dtype(ranks, dtype, hook):
    for got in ranks:
        run = got[f"noise-{dtype}-{hook}"]
        _same_training(run, got[f"plain-{dtype}"])
        assert run["kind"] == ("GradSync" if hook else "GradMarks") and run["noise_error"] is None
        doc = run["doc"]
        ns = doc["job"].get("noise_scale")
        assert ns is not None, doc["notes"]
        assert ns["b_simple"] is not None and math.isfinite(ns["b_simple"]) and ns["windows"] >= 3
        assert not _notes(doc, "no gradient all-reduce") and not _notes(doc, "norms failed")


@pytest.mark.parametrize("hook", [None, True])
def test_a_fault_in_the_norms_is_one_note_and_the_training_goes_on(ranks, hook):
    for got in ranks:
        run = got[f"fault-noise-{hook}"]
        _same_training(run, got["plain-float32"])
        assert run["noise_error"] == "RuntimeError: injected norm fault" and run["fault"] is None
        doc = run["doc"]
        assert len(_notes(doc, "injected norm fault")) == 1  # both ranks' note, said once
        assert "noise_scale" not in doc["job"] and not _notes(doc, "no gradient all-reduce")


def test_a_fault_in_the_marks_stops_them_and_the_steps_before_it_are_kept(ranks):
    for r, got in enumerate(ranks):
        run = got["fault-mark"]
        _same_training(run, got["plain-float32"])
        assert run["fault"] == "IndexError: injected mark fault"
        arrival = run["doc"]["runs"][0]["ranks"][r]["sync"]["arrival"]
        assert all(a is not None for a in arrival[: 8 - WARMUP])  # the timed steps before step 8: whole
        assert all(a is None for a in arrival[8 - WARMUP:])  # step 8 (struck) and every one after: None
