"""StepMonitor in a real two-process job: gloo ranks started by torch's elastic launcher (through
mgpu_bench.core.launch, as `mgpu-bench model` starts its own), each training the package's GPT under
DDP with its own DataLoader. Two monitored runs in the same job: both ranks' loaders slowed on
purpose (the verdict: input-bound), then rank 1's alone (rank 1 named the straggler, its lag the
sleep). Rank 0 stores both runs; every rank gets rank 0's document; the history shows them and
compares them (the same job twice)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timing  # judges measured speed (against what the same run measured)

torch = pytest.importorskip("torch")

SLEEP_S = 0.04  # a slowed loader's cost per batch on an idle host; the fixture scales it (sleep_s)
MAX_SCALE = 8.0
BATCH, SEQ = 4, 32


class Tokens(torch.utils.data.Dataset):
    """Random token samples; the first sample of each batch sleeps `sleep_s` (a slow decoder)."""

    def __init__(self, vocab: int, n: int, sleep_s: float) -> None:
        self.vocab, self.n, self.sleep_s = vocab, n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.sleep_s and i % BATCH == 0:
            time.sleep(self.sleep_s)
        t = torch.randint(0, self.vocab, (SEQ + 1,), generator=torch.Generator().manual_seed(i))
        return t[:-1], t[1:]


def job(db: str, sleep_s: float) -> list[dict]:
    """One rank of the job: the user's own training script, monitored twice; a slowed loader
    sleeps `sleep_s` per batch."""
    import torch.distributed as dist

    from mgpu_bench import StepMonitor
    from mgpu_bench.workloads import gpt as models

    torch.set_num_threads(1)  # as torchrun sets OMP_NUM_THREADS=1 for several processes on a host
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spec = models.ModelSpec("mini", layers=2, d_model=64, heads=2, vocab=512, max_seq=64)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(models.GPT(spec, device=torch.device("cpu")))
    opt = models.make_optimizer(model)
    docs = []
    for slow in (True, rank == 1):  # both ranks' loaders slowed, then rank 1's alone
        loader = torch.utils.data.DataLoader(Tokens(spec.vocab, BATCH * 24, sleep_s if slow else 0.0),
                                             batch_size=BATCH)
        mon = StepMonitor("ranks", tokens_per_sample=SEQ, model=model, optimizer=opt, warmup=2, window=5,
                          db=db, print=rank == 0)
        for x, y in loader:
            with mon.step(samples=x.shape[0]), mon.compute():
                models.train_step(model, opt, x, y, None)
        docs.append(mon.finish())
    dist.destroy_process_group()
    return docs


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The job on two gloo ranks. The slowed loader's sleep is SLEEP_S times the host's slowdown
    measured now (tests/conftest.py: 1 idle, about 5 beside 8 busy processes): a busy host holds
    a rank off its core for tens of milliseconds at random, a lag that does not shrink with the
    step, so against a 0.04 s sleep it made one rank of two slowed alike look late in 9% of the
    time (a straggler named) and hid the one rank slowed alone. Scaled, the sleep stays the
    larger part of each step there as it is on an idle host; the tests judge against it."""
    import uuid

    from conftest import slowdown
    from torch.distributed.launcher.api import LaunchConfig

    from mgpu_bench.core import launch

    db = str(tmp_path_factory.mktemp("ranks") / "h.sqlite3")
    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=f"monitor-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launch.free_port()}", max_restarts=0,
                      monitor_interval=0.1, start_method="spawn")
    sleep_s = SLEEP_S * min(MAX_SCALE, slowdown())
    results = launch.run_elastic(lc, job, db, sleep_s, children="die")
    return {"db": db, "ranks": [results[r] for r in sorted(results)], "sleep_s": sleep_s}


def test_both_loaders_slowed_the_job_is_input_bound(two_ranks):
    from mgpu_bench.results.probe import validate

    doc = two_ranks["ranks"][0][0]
    validate(json.loads(json.dumps(doc)), "rank 0's document")
    assert doc["config"]["model"] == "job:ranks" and doc["config"]["parallel"] == "ddp"
    assert doc["gpu_counts"] == [2] and len(doc["runs"][0]["ranks"]) == 2
    verdict = next(f for f in doc["findings"] if f.startswith("2 process(es): input-bound: the input pipeline costs"))
    assert "--num-workers" not in verdict and "give the DataLoader more workers" in verdict  # the job's own lever
    assert doc["runs"][0]["derived"]["data_s"] == pytest.approx(two_ranks["sleep_s"], rel=0.6)
    assert not doc["job"]["straggler"]["named"]  # both as slow: nobody waits for one rank


def test_one_rank_slowed_is_named_the_straggler_with_its_lag(two_ranks):
    doc, sleep_s = two_ranks["ranks"][0][1], two_ranks["sleep_s"]
    s = doc["job"]["straggler"]
    assert (s["rank"], s["by"], s["named"]) == (1, "arrival", True)
    assert 0.6 * sleep_s < s["lag_s"] < 2.5 * sleep_s
    assert s["per_rank_lag_s"][0] < 0.5 * s["lag_s"]  # rank 0 waits for it (beside 8 busy processes: a third)
    assert any(f.startswith("straggler: rank 1 (cpu on ") for f in doc["findings"])
    # drawn again from the document (mgpu-bench report rN, the suite page): the same finding
    from mgpu_bench.results.probe import get

    again = [f.text for f in get("model").findings(json.loads(json.dumps(doc)))]
    assert sum(t.startswith("straggler: rank 1 (cpu on ") for t in again) == 1
    per_rank = {r["rank"]: r for r in doc["job"]["ranks"]}
    assert per_rank[1]["data_s"] > per_rank[0]["data_s"] + 0.5 * sleep_s  # rank 1 waits for data, rank 0 for rank 1


def test_every_rank_gets_rank_0s_document(two_ranks):
    zero, one = two_ranks["ranks"]
    assert [d["created"] for d in zero] == [d["created"] for d in one]
    assert one[1]["job"]["straggler"] == zero[1]["job"]["straggler"]


def test_the_history_stores_both_runs_and_compares_them(two_ranks):
    from click.testing import CliRunner

    from mgpu_bench.cli import cli
    from mgpu_bench.history import History

    db = two_ranks["db"]
    with History.open(db) as h:
        runs = sorted(r.run_id for r in h.list(10, kind="model"))
    assert len(runs) == 2
    show = CliRunner().invoke(cli, ["history", "show", runs[1], "--db", db])
    metric = "model.job:ranks.ddp.2gpu.loader.tokens_per_s"
    assert show.exit_code == 0 and metric in show.output
    # the same job twice: compare holds the second run's figures against the first's, with their noise
    out = Path(db).with_name("compare.json")
    cmp = CliRunner().invoke(cli, ["compare", runs[1], "--baseline", runs[0], "--db", db, "--json", str(out)])
    assert cmp.exit_code in (0, 1) and f"{runs[1]} against {runs[0]}" in cmp.output, cmp.output
    changes = {c["name"]: c for c in json.loads(out.read_text())["changes"]}
    assert changes[metric]["base"] > 0 and changes[metric]["new"] > 0
    trend = CliRunner().invoke(cli, ["history", "trend", metric, "--db", db])
    assert trend.exit_code == 0 and runs[0] in trend.output and runs[1] in trend.output
