"""Headline metrics of every kind of result document, built by the modules' own dataclasses and
document() functions (the shapes the commands write), plus a real comm document from gloo."""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

import numpy as np
import pytest

from mgpu_bench.machine import env, hardware
from mgpu_bench.probes.comm import analyse as comm_analyse
from mgpu_bench.probes.comm import document as comm_docs
from mgpu_bench.probes.comm.headline import LARGE
from mgpu_bench.probes.comm.plan import CommRun
from mgpu_bench.probes.gemm import document as gemm_docs
from mgpu_bench.probes.gemm import measure as gemm
from mgpu_bench.probes.links import document as links_docs
from mgpu_bench.probes.links import result as links
from mgpu_bench.probes.memory import document as memory_docs
from mgpu_bench.probes.memory import measure as memory
from mgpu_bench.probes.model import document as model_docs
from mgpu_bench.probes.model import figures as model_figures
from mgpu_bench.probes.model import measure as mb
from mgpu_bench.results import document
from mgpu_bench.results.document import document_kind
from mgpu_bench.results.measurement import CommMeasurement, CommSpec
from mgpu_bench.results.metrics import Metric
from mgpu_bench.results.probe import headline as metrics_from_document

GiB = 1 << 30
MiB = 1 << 20
H200 = hardware.Figure(989e12, "FLOP/s", "nvidia-h200-datasheet")


def _environment(**over) -> dict:
    """This host's fingerprint, its load set to an idle host's: the documents built here stand for
    quiet runs, whatever the machine running the tests is doing (compare reads a busy host as noisy)."""
    fp = env.fingerprint()
    fp["host_load"] = {"load_1m": 0.0, "cpus": os.cpu_count()}
    fp.update(over)
    return fp


# -- document builders (also used by test_history and test_prometheus) -------------------------


def comm_measurement(
    op: str,
    size: int,
    seconds: float,
    *,
    inplace=False,
    nranks=2,
    spread=0.01,
    nsamples=12,
) -> CommMeasurement:
    spec = CommSpec(
        op=op,
        dtype="fp32",
        redop="sum" if op in ("allreduce", "reducescatter") else None,
        size=size,
        bytes=size,
        count=size // 4,
        nranks=nranks,
        inplace=inplace,
        backend="native",
        devices=tuple(f"cuda:{i}" for i in range(nranks)),
    )
    per = [seconds * (1 + spread * ((i % 5) - 2)) for i in range(nsamples)]
    samples = np.array([per] + [[s * 0.99 for s in per] for _ in range(nranks - 1)])
    return CommMeasurement(
        spec,
        iters=50,
        batch=1,
        burst_seconds=(seconds,) * nranks,
        samples=samples,
        wrong=(0,) * nranks,
    )


def comm_document(scale: float = 1.0, **env_over) -> dict:
    """allreduce and allgather, both placements, at 8 KiB, 1 MiB, 64 MiB and 1 GiB on 2 GPUs;
    `scale` multiplies every time (2.0: half the bandwidth)."""
    ms = []
    for op in ("allreduce", "allgather"):
        for size, sec in (
            (8 << 10, 20e-6),
            (1 * MiB, 40e-6),
            (64 * MiB, 200e-6),
            (GiB, 3e-3),
        ):
            for inplace in (False, True):
                ms.append(comm_measurement(op, size, sec * scale, inplace=inplace))
    run = CommRun(backend="native", devices=["cuda:0", "cuda:1"], requests=[])
    run.measurements = ms
    return comm_docs.result_document(run, _environment(**env_over), ["mgpu-bench", "comm"])


BIG = gemm.Shape(8192, 8192, 8192)


def gemm_result(gpu: int, tflops: float, shape=BIG, dtype="bf16", series=None):
    s = shape.flops / (tflops * 1e12)
    seconds = [s * (1 + 0.002 * d) for d in (-2, -1, 0, 1, 2)]
    ident = {
        "algo_id": 66,
        "tile": 20,
        "stages": 35,
        "split_k": 1,
        "reduction": 0,
        "swizzle": 0,
        "custom": 0,
        "cluster": 2,
        "workspace": 0,
        "waves": 1.0,
    }
    cands = [
        gemm.Candidate(0, ident, [x * 1.1 for x in seconds], 10, 1e-4, None),
        gemm.Candidate(1, ident, seconds, 10, 1e-4, None),
    ]
    return gemm.GemmResult(
        gpu=gpu,
        gpu_name="NVIDIA H200",
        dtype=dtype,
        shape=shape,
        layout="NN",
        candidates=cands,
        buffer_sets=1,
        checked_elements=1024,
        seconds_wall=0.5,
        peak=H200,
        series=series,
    )


def gemm_document(tflops=(700.0, 690.0)) -> dict:
    small = gemm.Shape(4096, 4096, 4096)
    results = [gemm_result(g, t) for g, t in enumerate(tflops)]
    results.append(
        gemm_result(0, tflops[0] * 0.8, shape=small)
    )  # a slower shape: not the headline
    sustained = [
        (0.5 * i, small.flops / (500e12 * (1 + 0.01 * (i % 3)))) for i in range(10)
    ]
    results.append(gemm_result(1, 600.0, shape=small, dtype="fp16", series=sustained))
    run = gemm.GemmRun(
        gemm.GemmConfig(gpus=(0, 1)),
        [{"index": 0, "name": "NVIDIA H200"}, {"index": 1, "name": "NVIDIA H200"}],
        results=results,
    )
    return gemm_docs.document(run, _environment(), ["mgpu-bench", "gemm"])


def memory_document() -> dict:
    run = memory.MemoryRun(memory.MemoryConfig(), [{"index": 0, "name": "NVIDIA H200"}])
    run.hbm = [
        memory.HbmResult(
            0,
            "copy_ce",
            4 * GiB,
            4 * GiB,
            [2e-3, 2.1e-3, 1.9e-3, 2e-3, 2.05e-3],
            4.8e12,
        ),
        memory.HbmResult(0, "read", 4 * GiB, 0, [1e-3] * 5, 4.8e12),
    ]
    raw = {
        "allocator": "cudaMalloc",
        "pattern": "interleaved",
        "free_before": 140 * GiB,
        "total": 141 * GiB,
        "free_after_pattern": 40 * GiB,
        "held_bytes": 100 * GiB,
        "allocations_done": 500,
        "allocations_failed": 0,
        "largest_block": 30 * GiB,
        "search_seconds": 0.4,
        "pool_reserved": None,
        "pool_used": None,
        "events": [],
    }
    run.churn = [memory.ChurnResult(0, "cudaMalloc", "interleaved", raw)]
    run.max_batch = [
        {
            "model": "350m",
            "seq_len": 2048,
            "checkpointing": False,
            "max_batch": 12,
            "trials": [],
            "seconds": 3.0,
        },
        {"model": "350m", "seq_len": 2048, "checkpointing": True, "error": "timed out"},
    ]
    return memory_docs.document(run, _environment(), ["mgpu-bench", "memory"])


def _ranks(
    step_s: list[float], world: int, nosync_s: float | None = None
) -> list[dict]:
    n = len(step_s)
    phases = {
        "data": [0.001] * n,
        "forward": [s * 0.3 for s in step_s],
        "backward": [s * 0.6 for s in step_s],
        "optimizer": [s * 0.1 for s in step_s],
        "step": list(step_s),
    }
    out = []
    for r in range(world):
        d = {
            "rank": r,
            "world": world,
            "error": None,
            "phases": phases,
            "peak_allocated": 10 * GiB,
            "peak_reserved": 12 * GiB,
            "total_memory": 140 * GiB,
        }
        if nosync_s is not None:
            d["no_sync_phases"] = {**phases, "step": [nosync_s] * n}
        out.append(d)
    return out


def model_document(step_1=0.100, step_2=0.105) -> dict:
    cfg = mb.ModelConfig(
        model="350m", seq_len=2048, batch_size=8, steps=12, device="cuda"
    )
    jitter = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0, 1.0, 1.0]
    per_sample = 2048 * (6 * 356e6 + 12 * 24 * 1024 * 2048)  # FLOPs of a 350m sample, as counted within 1%
    st1 = model_figures.analyse(cfg, 1, _ranks([step_1 * j for j in jitter], 1), H200.value, per_sample, 2048)
    st2 = model_figures.analyse(
        cfg,
        2,
        _ranks([step_2 * j for j in jitter], 2, nosync_s=step_2 * 0.95),
        H200.value,
        per_sample,
        2048,
    )
    run = model_figures.ModelRun(cfg, [1, 2], ["synthetic"], "NVIDIA H200", H200, stats=[st1, st2])
    return model_docs.document(run, _environment(), ["mgpu-bench", "model"])


def links_document() -> dict:
    size = 256 * MiB
    ms = []
    for a, b in ((0, 1), (1, 0)):
        for bidir in (False, True):
            ms.append(
                links.LinkMeasurement(
                    links.LinkSpec("copy", a, b, "ce", bidir, None, size),
                    tuple(size / 360e9 * (1 + 0.01 * i) for i in range(10)),
                )
            )
        ms.append(
            links.LinkMeasurement(
                links.LinkSpec("latency", a, b),
                tuple(1e-6 * (1 + 0.01 * i) for i in range(5)),
            )
        )
    for g in (0, 1):
        for direction in ("h2d", "d2h"):
            ms.append(
                links.LinkMeasurement(
                    links.LinkSpec("host", g, None, direction=direction, bytes=size),
                    tuple(size / 50e9 for _ in range(10)),
                )
            )
    run = links.LinksRun(gpus=[0, 1], measurements=ms)
    return {
        "schema": document.RESULT_SCHEMA,
        "schema_version": document.RESULT_SCHEMA_VERSION,
        "command": ["mgpu-bench", "links"],
        "environment": _environment(),
        "topology": None,
        **links_docs.document(run),
    }


def suite_document() -> dict:
    probes = [
        {"name": "gemm", "round": 1, "status": "ok", "document": gemm_document()},
        {"name": "memory", "round": 1, "status": "ok", "document": memory_document()},
        {
            "name": "links",
            "round": 1,
            "status": "skipped",
            "document": None,
            "reason": "1 GPU",
        },
        {"name": "comm", "round": 2, "status": "ok", "document": comm_document()},
        {
            "name": "model",
            "round": 2,
            "status": "failed",
            "document": None,
            "error": "out of memory",
        },
        {
            "name": "gemm-hot",
            "round": 3,
            "status": "ok",
            "document": gemm_document((650.0, 640.0)),
        },
    ]
    return {
        "schema": document.RESULT_SCHEMA,
        "schema_version": document.RESULT_SCHEMA_VERSION,
        "kind": "suite",
        "environment": _environment(),
        "command": ["mgpu-bench", "suite"],
        "probes": probes,
    }


def by_name(metrics: list[Metric]) -> dict[str, Metric]:
    names = [m.name for m in metrics]
    assert len(names) == len(set(names)), "metric names must be unique within a run"
    return {m.name: m for m in metrics}


# -- comm -------------------------------------------------------------------------------------


def test_comm_busbw_at_large_sizes_and_latency_at_the_smallest():
    doc = comm_document()
    got = by_name(metrics_from_document(doc))
    busbw = sorted(n for n in got if n.endswith(".busbw"))
    assert busbw == sorted(
        f"comm.{op}.fp32.{size}.{p}.2ranks.busbw"
        for op in ("allreduce", "allgather")
        for size in ("64MiB", "1GiB")
        for p in ("in", "out")
    )
    lat = sorted(n for n in got if n.endswith(".latency"))
    assert lat == sorted(
        f"comm.{op}.fp32.8KiB.{p}.2ranks.latency"
        for op in ("allreduce", "allgather")
        for p in ("in", "out")
    )
    ms = {
        (m.spec.op, m.spec.size, m.spec.inplace): m
        for m in (CommMeasurement.from_dict(d) for d in doc["measurements"])
    }
    m = got["comm.allreduce.fp32.1GiB.out.2ranks.busbw"]
    ref = ms[("allreduce", GiB, False)]
    assert (
        m.value == pytest.approx(ref.busbw) and m.unit == "B/s" and m.better == "higher"
    )
    # per-iteration busbw from the raw seconds: bytes x 2(n-1)/n / the slowest rank's seconds
    assert m.samples == pytest.approx([GiB * 1.0 / s for s in ref.per_sample])
    assert statistics.median(m.samples) == pytest.approx(ref.busbw, rel=0.03)
    assert dict(m.labels) == {
        "op": "allreduce",
        "dtype": "fp32",
        "placement": "out",
        "ranks": "2",
        "backend": "native",
        "size": "1GiB",
    }
    gather = got["comm.allgather.fp32.64MiB.in.2ranks.busbw"]
    assert gather.value == pytest.approx(64 * MiB / 200e-6 * 0.5)  # (n-1)/n for 2 ranks
    small = got["comm.allreduce.fp32.8KiB.out.2ranks.latency"]
    assert (
        small.value == pytest.approx(20e-6)
        and small.unit == "s"
        and small.better == "lower"
    )
    assert len(small.samples) == 12
    assert all(m.name.startswith("comm.") for m in got.values())


def test_comm_document_of_a_real_gloo_sweep(tmp_path):
    """The real command's document (2 CPU processes): no size reaches 64 MiB, so only the
    smallest size's latency per op and placement, with its per-iteration seconds."""
    from click.testing import CliRunner

    from mgpu_bench.cli import cli

    out = tmp_path / "comm.json"
    r = CliRunner().invoke(
        cli,
        [
            "comm",
            "--backend",
            "torch",
            "--ops",
            "allreduce",
            "--sizes",
            "1K,4K",
            "--min-time",
            "0.01",
            "--json",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert document_kind(doc) == "comm"
    got = by_name(metrics_from_document(doc))
    assert sorted(got) == [
        "comm.allreduce.fp32.1KiB.in.2ranks.latency",
        "comm.allreduce.fp32.1KiB.out.2ranks.latency",
    ]
    for m in got.values():
        assert m.value > 0 and len(m.samples) >= 5 and all(s > 0 for s in m.samples)
        assert m.labels["backend"] == "torch-gloo"


def test_comm_subcommunicators_get_their_own_names():
    m = comm_measurement("allreduce", GiB, 3e-3)
    if "scope" not in CommSpec.__dataclass_fields__:
        pytest.skip("this CommSpec has no communicator scope")
    from dataclasses import replace

    sub = CommMeasurement(
        replace(m.spec, scope="intra-node", group="node gpu07"),
        m.iters,
        m.batch,
        m.burst_seconds,
        m.samples,
        m.wrong,
    )
    run = CommRun(backend="native", devices=["cuda:0", "cuda:1"], requests=[])
    run.measurements = [m, sub]
    names = [
        x.name for x in metrics_from_document(comm_docs.result_document(run, {}, None))
    ]
    assert names == [
        "comm.allreduce.fp32.1GiB.out.2ranks.busbw",
        "comm.allreduce.fp32.1GiB.out.2ranks.intra-node.node-gpu07.busbw",
    ]


# -- gemm, memory, model, links ---------------------------------------------------------------


def test_gemm_best_candidate_of_the_fastest_shape_per_gpu_and_dtype():
    doc = gemm_document()
    got = by_name(metrics_from_document(doc))
    assert sorted(got) == [
        "gemm.gpu0.bf16.tflops",
        "gemm.gpu1.bf16.tflops",
        "gemm.gpu1.fp16.sustained_tflops",
        "gemm.gpu1.fp16.tflops",
    ]
    g0 = got["gemm.gpu0.bf16.tflops"]
    assert (
        g0.value == pytest.approx(700e12)
        and g0.unit == "FLOP/s"
        and g0.better == "higher"
    )
    assert (
        g0.labels["shape"] == "8192x8192x8192"
        and g0.labels["gpu"] == "0"
        and g0.labels["dtype"] == "bf16"
    )
    assert len(g0.samples) == 5 and statistics.median(g0.samples) == pytest.approx(
        700e12
    )  # the best candidate's
    sus = got["gemm.gpu1.fp16.sustained_tflops"]
    assert len(sus.samples) == 10 and sus.value == pytest.approx(
        505e12
    )  # median of 500, 505, 510


def test_memory_hbm_fragmentation_and_max_batch():
    got = by_name(metrics_from_document(memory_document()))
    assert sorted(got) == [
        "memory.350m.seq2048.nockpt.max_batch",
        "memory.gpu0.cudaMalloc.interleaved.fragmentation",
        "memory.gpu0.hbm.copy_ce",
        "memory.gpu0.hbm.read",
    ]
    hbm = got["memory.gpu0.hbm.copy_ce"]
    assert hbm.value == pytest.approx(8 * GiB / 2e-3) and hbm.unit == "B/s"
    assert len(hbm.samples) == 5 and max(hbm.samples) == pytest.approx(8 * GiB / 1.9e-3)
    frag = got["memory.gpu0.cudaMalloc.interleaved.fragmentation"]
    assert (
        frag.value == pytest.approx(0.25)
        and frag.unit == "fraction"
        and frag.better == "lower"
    )
    mb_ = got["memory.350m.seq2048.nockpt.max_batch"]
    assert (
        mb_.value == 12 and mb_.unit == "samples"
    )  # the failed checkpointing search gives none


def test_model_tokens_mfu_exposed_comm_memory_and_scaling():
    doc = model_document()
    got = by_name(metrics_from_document(doc))
    assert sorted(got) == sorted(
        [
            "model.350m.ddp.1gpu.synthetic.samples_per_s",
            "model.350m.ddp.1gpu.synthetic.tokens_per_s",
            "model.350m.ddp.1gpu.synthetic.mfu",
            "model.350m.ddp.1gpu.synthetic.peak_memory",
            "model.350m.ddp.2gpu.synthetic.samples_per_s",
            "model.350m.ddp.2gpu.synthetic.tokens_per_s",
            "model.350m.ddp.2gpu.synthetic.mfu",
            "model.350m.ddp.2gpu.synthetic.exposed_comm",
            "model.350m.ddp.2gpu.synthetic.peak_memory",
            "model.350m.ddp.2gpu.scaling_efficiency",
        ]
        # the step ledger's shares, one per cause (ledger.py), of each configuration
        + [f"model.350m.ddp.{n}gpu.synthetic.ledger_{c}" for n in (1, 2)
           for c in ("straggler", "stalls", "input", "communication", "host", "gpu")]
    )
    run2 = next(r for r in doc["runs"] if r["world"] == 2)
    tps = got["model.350m.ddp.2gpu.synthetic.tokens_per_s"]
    assert (
        tps.value == pytest.approx(run2["derived"]["tokens_per_s"])
        and tps.unit == "tokens/s"
    )
    start, end, _ = run2["window"]
    assert len(tps.samples) == end - start
    assert statistics.median(tps.samples) == pytest.approx(tps.value, rel=1e-3)
    mfu = got["model.350m.ddp.2gpu.synthetic.mfu"]
    assert mfu.unit == "fraction" and 0 < mfu.value < 1
    assert [s / mfu.value for s in mfu.samples] == pytest.approx(
        [s / tps.value for s in tps.samples]
    )
    assert got["model.350m.ddp.2gpu.synthetic.exposed_comm"].value == pytest.approx(
        0.05
    )
    assert got["model.350m.ddp.2gpu.synthetic.exposed_comm"].better == "lower"
    assert got["model.350m.ddp.2gpu.synthetic.peak_memory"].value == 12 * GiB
    assert got["model.350m.ddp.2gpu.scaling_efficiency"].value == pytest.approx(
        doc["scaling"]["2"]
    )


def test_links_pairs_latency_and_host_copies():
    doc = links_document()
    assert document_kind(doc) == "links"
    got = by_name(metrics_from_document(doc))
    assert (
        "links.gpu0-gpu1.ce.uni.bandwidth" in got
        and "links.gpu1-gpu0.ce.bidir.bandwidth" in got
    )
    assert got["links.gpu0-gpu1.ce.uni.bandwidth"].value == pytest.approx(
        256 * MiB / (256 * MiB / 360e9 * 1.045)
    )
    assert (
        got["links.gpu0-gpu1.latency"].unit == "s"
        and got["links.gpu0-gpu1.latency"].better == "lower"
    )
    assert got["links.gpu1.d2h.host_bandwidth"].value == pytest.approx(50e9)
    assert (
        len(got) == 2 * 2 + 2 + 2 * 2
    )  # (pairs x uni/bidir) + latencies + (GPUs x h2d/d2h)


# -- suite and unknown kinds ------------------------------------------------------------------


def test_suite_is_the_union_of_its_probes_with_repeats_qualified():
    doc = suite_document()
    got = by_name(metrics_from_document(doc))
    alone = {
        m.name
        for d in (gemm_document(), memory_document(), comm_document())
        for m in metrics_from_document(d)
    }
    assert alone <= set(got)  # the first probe of each kind keeps the plain names
    hot = [n for n in got if n.endswith("@gemm-hot")]
    assert sorted(hot) == sorted(
        f"{n}@gemm-hot" for n in alone if n.startswith("gemm.")
    )
    assert got["gemm.gpu0.bf16.tflops@gemm-hot"].value == pytest.approx(650e12)
    assert got["gemm.gpu0.bf16.tflops"].value == pytest.approx(700e12)
    assert (
        got["gemm.gpu0.bf16.tflops"].labels["probe"] == "gemm"
        and got["gemm.gpu0.bf16.tflops"].labels["round"] == "1"
    )
    assert not any(
        n.startswith(("links.", "model.")) for n in got
    )  # skipped and failed probes gave no document


@pytest.mark.parametrize(
    "doc",
    [
        {"schema": "mgpu-bench/result", "kind": "topo"},
        {"schema": "mgpu-bench/result"},
        {},
        {"kind": "suite", "probes": []},
        {"kind": "comm", "backend": "native", "measurements": []},
    ],
)
def test_unknown_or_empty_documents_give_no_metrics(doc):
    assert metrics_from_document(doc) == []


def test_empty_comm_and_links_documents_are_still_recognised():
    assert document_kind({"backend": "native", "measurements": []}) == "comm"
    assert document_kind({"peer_access": [], "measurements": []}) == "links"


def test_the_stored_suite_fixture_if_present():
    """The suite document another part of the project stores as a fixture (real gloo runs plus
    constructed GPU probes): every probe that has a document contributes, a failed one not."""
    path = Path(__file__).parent / "fixtures" / "suite" / "suite.json"
    if not path.exists():
        pytest.skip("no suite fixture in this checkout")
    doc = json.loads(path.read_text())
    got = by_name(metrics_from_document(doc))
    probes = {m.labels["probe"] for m in got.values()}
    for p in doc["probes"]:
        has = isinstance(p.get("document"), dict) and bool(
            metrics_from_document(p["document"])
        )
        assert (p["name"] in probes) == has, p["name"]
    assert all(m.labels["round"] in ("1", "2", "3") for m in got.values())


def test_metric_checks_its_direction_and_unit():
    with pytest.raises(ValueError):
        Metric("x.y", 1.0, "B/s", "up")
    with pytest.raises(ValueError):
        Metric("x.y", 1.0, "GB/s", "higher")
    m = Metric("gemm.gpu0.bf16.tflops@hot", 1.0, "FLOP/s", "higher")
    assert m.kind == "gemm" and m.quantity == "tflops"


def test_non_finite_values_are_left_out():
    doc = memory_document()
    doc["hbm"][0]["bandwidth"] = math.nan
    names = [m.name for m in metrics_from_document(doc)]
    assert "memory.gpu0.hbm.copy_ce" not in names and "memory.gpu0.hbm.read" in names


def test_large_threshold_matches_the_comm_summary():
    assert LARGE == comm_analyse.LARGE
