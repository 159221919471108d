"""The gradient noise scale from a user's DDP job, against a problem whose answer is known in closed
form: least squares y = w* . x + sigma e with Gaussian inputs x ~ N(0, I_d). The per-sample
gradient of 1/2 (w . x - y)^2 is g = (D . x - sigma e) x with D = w - w*, so G = E[g] = D and
E[g g^T] = (|D|^2 + sigma^2) I + 2 D D^T (Isserlis' theorem for Gaussian x): tr(Sigma) = d (|D|^2 +
sigma^2) + |D|^2 and B_simple = tr(Sigma) / |G|^2 = d + 1 + d sigma^2 / |D|^2, which grows as
training brings w to w*. StepMonitor(noise_scale=True) on 2 and 4 gloo ranks (torch's elastic
launcher) must come within 20% of it and follow it; off by default; misuse said once."""

from __future__ import annotations

import pytest

from mgpu_bench.training import noise_scale

torch = pytest.importorskip("torch")

D, SIGMA, BATCH, STEPS, WINDOW, LR = 32, 1.0, 32, 602, 100, 0.0015


def job(db: str, steps: int = STEPS, window: int = WINDOW, lr: float = LR, batch: int = BATCH) -> dict:
    """One rank: least squares under DDP, monitored with noise_scale=True; rank 0 also keeps the
    exact noise scale's two figures per timed step from the weights."""
    import torch.distributed as dist

    from mgpu_bench import StepMonitor

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(7)
    w_star = torch.randn(D, generator=g)
    model = torch.nn.Linear(D, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_((w_star + 2.0 * torch.randn(D, generator=g) / D ** 0.5).unsqueeze(0))  # |D|^2 about 4
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    data = torch.Generator().manual_seed(1000 + rank)
    warmup = 2
    mon = StepMonitor("least-squares", model=ddp, warmup=warmup, window=window, noise_scale=True, db=db,
                      print=rank == 0)
    exact = []  # per timed step: (|D|^2, tr(Sigma)) before the step's gradient
    for i in range(steps):
        delta2 = float((model.weight.detach().squeeze(0) - w_star).square().sum())
        if i >= warmup:
            exact.append((delta2, D * (delta2 + SIGMA ** 2) + delta2))
        x = torch.randn(batch, D, generator=data)
        y = x @ w_star + SIGMA * torch.randn(batch, generator=data)
        with mon.step(samples=batch), mon.compute():
            loss = 0.5 * (ddp(x).squeeze(1) - y).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    doc = mon.finish()
    dist.destroy_process_group()
    return {"doc": doc, "exact": exact}


def _start_method() -> str:
    """How the ranks start: forked from this process's imports, unless this process holds what a
    forked child must not inherit (a CUDA context from an earlier test on a GPU machine, a process
    group): then spawned."""
    import torch.distributed as dist

    return "spawn" if torch.cuda.is_initialized() or (dist.is_available() and dist.is_initialized()) else "fork"


def _run(nproc: int, db: str, *params) -> dict:
    """job() on `nproc` ranks. The ranks are forked from this process where it can
    (_start_method), which has torch and the package imported already: spawned ranks import them
    again, about 3 s of CPU each on a 2-core CI host (a third of the test's cost). job() sets one
    thread before any work, so no OpenMP pool is used after the fork; what is tested, the noise
    scale of a DDP job, does not depend on how its ranks were started."""
    import uuid

    from torch.distributed.launcher.api import LaunchConfig

    from mgpu_bench.core import launch

    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"noise-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launch.free_port()}", max_restarts=0,
                      monitor_interval=0.1, start_method=_start_method())
    return launch.run_elastic(lc, job, db, *params, children="die")[0]


def _exact(steps: list[tuple[float, float]]) -> float:
    """B_simple of the averaged figures, as the estimate takes them."""
    return sum(t for _, t in steps) / sum(g for g, _ in steps)


@pytest.mark.parametrize("nproc", [2, 4])
def test_the_estimate_is_within_20_percent_of_the_closed_form_and_follows_it(nproc, tmp_path):
    got = _run(nproc, str(tmp_path / "h.sqlite3"))
    ns = got["doc"]["job"]["noise_scale"]
    exact = got["exact"]
    assert ns["b_small"] == BATCH and ns["b_big"] == nproc * BATCH
    assert ns["b_simple"] == pytest.approx(_exact(exact), rel=0.20)
    assert ns["stderr"] is not None and ns["stderr"] < 0.5 * ns["b_simple"]
    # it follows the weights: the noise scale of the run's second half is larger, as the closed form's is, and
    # each half's estimate is within 20% of its own exact figure
    sums = ns["window_sums"]
    k = len(sums)
    assert k >= 6
    first, last = exact[: WINDOW * (k // 2)], exact[WINDOW * (k // 2):]
    early = noise_scale.from_windows(sums[: k // 2])["b_simple"]
    late = noise_scale.from_windows(sums[k // 2:])["b_simple"]
    assert _exact(last) > 1.3 * _exact(first) and late > 1.2 * early
    assert early == pytest.approx(_exact(first), rel=0.20) and late == pytest.approx(_exact(last), rel=0.20)
    line = next(f for f in got["doc"]["findings"] if f.startswith("gradient noise scale B_simple"))
    assert f"the global batch {nproc * BATCH}" in line and "its cost" in line and "% of the step" in line


def test_off_by_default_and_misuse_is_said_once_and_the_training_goes_on(tmp_path):
    from mgpu_bench import StepMonitor

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for noise in (False, True):  # one process: no DDP, no second batch size
        mon = StepMonitor("no-ddp", model=model, warmup=1, window=5, noise_scale=noise, store=False, print=False)
        for _ in range(12):
            with mon.step(samples=4), mon.compute():
                model(torch.randn(4, 4)).sum().backward()
                opt.step()
                opt.zero_grad()
        doc = mon.finish()
        assert "noise_scale" not in doc["job"]
        said = [n for n in doc["notes"] if "noise_scale=True" in n]
        assert len(said) == (1 if noise else 0)
        if noise:
            assert "2+ DDP ranks" in said[0]


def _marks_step(gm, model, micro: int = 1) -> None:
    """One step as StepMonitor drives GradMarks: a slot, the norms' hooks armed, `micro` backwards
    (gradient accumulation), the step's sums, the hooks gone."""
    gm.slot = gm.slots(1)[0]
    gm.noise.active = True
    gm.arm()
    for _ in range(micro):
        model(torch.randn(8, 4)).square().mean().backward()
    gm.noise.end_step(8 * micro)
    gm.disarm()
    gm.slot = None


def test_the_norms_without_a_communication_hook_are_taken_per_parameter_in_the_steps_that_take_them():
    """GradMarks' norms (the monitor's default for noise_scale=True): a post-accumulate-grad hook per
    parameter in an armed step, the multi-tensor norm after the backward. With no DDP between them
    the two are the same gradient; with accumulation, the step's accumulated one; unarmed steps
    leave no hook behind; a failing norm stops the norms, never the backward."""
    from mgpu_bench.training.gradsync import GradMarks

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    gm = GradMarks(False, noise=True)
    assert gm.attach(model)
    _marks_step(gm, model)
    local, big = gm.noise._acc.tolist()
    want = sum(float(p.grad.square().sum()) for p in model.parameters())
    assert local == pytest.approx(want, rel=1e-5) and big == pytest.approx(want, rel=1e-5)
    assert gm.nbytes == sum(p.numel() * 4 for p in model.parameters()) and not gm._norm_hooks
    model.zero_grad()
    _marks_step(gm, model, micro=3)  # three micro-batches: the norms of the gradient they accumulated
    want += sum(float(p.grad.square().sum()) for p in model.parameters())
    assert gm.noise._acc.tolist() == pytest.approx([want, want], rel=1e-5) and gm.noise.steps_total == 2
    model.zero_grad()
    model(torch.randn(8, 4)).sum().backward()  # a step that takes no norms: no hook of the noise scale fires
    assert not gm._fired and gm.noise.steps_total == 2
    model.require_backward_grad_sync = False  # as DDP under no_sync(): a backward that reduces nothing
    _marks_step(gm, model)
    assert gm.noise.steps_total == 2 and gm.noise.seen == 3  # no whole-batch gradient: the step gives no sums
    del model.require_backward_grad_sync

    def broken(_tensor):
        raise RuntimeError("no norm today")

    gm.noise.local = broken
    _marks_step(gm, model)  # the backward completes
    assert gm.noise.error == "RuntimeError: no norm today" and gm.noise.steps_total == 2
    assert all(p.grad is not None for p in model.parameters())


def test_the_rule_in_words():
    assert noise_scale.fewer_steps(batch=512, noise=1280) == pytest.approx((1 + 2.5) / (1 + 1.25))
    near = {"b_simple": 1280.0, "stderr": 90.0, "b_big": 512.0, "steps": 100, "windows": 4}
    assert "about 1.56x fewer steps" in noise_scale.words(near)
    far = {**near, "b_big": 6 * 1280.0}
    assert "buy samples/s, not convergence" in noise_scale.words(far)
    assert noise_scale.efficiency(noise=1000, b0=100, batch=1000) == pytest.approx(1100 / 2000)


def test_model_reports_the_synthetic_datas_noise_scale_and_refuses_one_rank(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "m.json"
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "model", "--noise-scale", "--nproc", "2",
                           "--steps", "12", "--warmup-steps", "1", "--batch-size", "2", "--seq-len", "32",
                           "--no-exposed-comm", "--json", str(out), "--no-store", "--no-progress"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = json.loads(out.read_text())["runs"]
    ns = run["noise_scale"]
    assert ns["b_small"] == 2 and ns["b_big"] == 4 and ns["steps"] == sum(w["steps"] for w in ns["window_sums"])
    assert "gradient noise scale" in proc.stdout and "of the synthetic data" in proc.stdout
    # the refusal comes before any rank starts: in process (a CLI process imports torch again for it)
    from click.testing import CliRunner

    from mgpu_bench.cli import cli

    one = CliRunner().invoke(cli, ["model", "--noise-scale", "--nproc", "1", "--no-store"])
    assert one.exit_code == 2 and one.stderr.count("\n") == 1 and "--nproc 2" in one.stderr, one.output
    assert one.stdout == ""
