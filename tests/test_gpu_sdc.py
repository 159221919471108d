"""sdc on real GPUs: the device hash is the host's definition, 100 repetitions give one hash (the
determinism proof), planted corruption is found and located in every work, the command writes its
documents, Ctrl-C keeps the checks, and two GPUs agree. Run with `pytest -m gpu` on a GPU machine."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import interrupt_cli

from mgpu_bench.machine.selection import require_gpus
from mgpu_bench.probes.sdc import analyse as an
from mgpu_bench.probes.sdc import measure as me
from mgpu_bench.results.probe import validate

pytestmark = pytest.mark.gpu


def _devices(n: int = 1) -> list[dict]:
    return require_gpus("sdc", str(n))[1]


@pytest.mark.parametrize("nbytes", [0, 5, 8 * 3000 + 3, 10 << 20])
def test_device_hash_is_the_host_definition(nbytes):
    from mgpu_bench import _native

    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    assert _native.sdc_hash(0, data) == an.hash_words(data)


def test_100_repetitions_give_one_hash():
    """The determinism proof: 100 repetitions of 8 GEMMs 8192^3 bf16 on one GPU, every output
    hashed, all equal; a fresh probe (new buffers, the pinned algorithm set again) gives the same
    hash; the HBM and allreduce checks find nothing."""
    from mgpu_bench import _native

    cfg = me.SdcConfig(gpus=(0,), gemms=8, repetitions=100, memory_fraction=0.25, comm_bytes=64 << 20)
    run = me.run_sdc(cfg, _devices())
    assert run.stopped is None, run.stop_message
    assert run.repetitions == 100 and run.algo["split_k"] <= 1 and run.algo["reduction"] == 0
    gemm = run.checks_of(0, "gemm")
    assert len(gemm) == 100 and sum(c.count for c in gemm) == 800
    assert {c.hash for c in gemm} == {run.references[0]} and not any(c.wrong for c in run.checks)
    assert len(run.checks_of(0, "hbm")) == len(run.checks_of(0, "collective")) == 100
    assert an.verdicts(run)[0]["verdict"] == "ok"
    fresh = _native.SdcProbe(0, cfg.dtype, *cfg.shape, cfg.seed)
    fresh.set_algo(bytes.fromhex(run.algo["blob"]))
    assert me.hex64(fresh.gemm(1)["hashes"][0]) == run.references[0]
    out = fresh.output(False)
    assert me.hex64(an.hash_words(out)) == run.references[0]  # the host agrees with the GPU's hash of D


def test_planted_corruption_is_found_and_located_in_every_work():
    cfg = me.SdcConfig(gpus=(0,), shape=(1024, 1024, 1024), gemms=4, repetitions=3, memory_fraction=0.1,
                       comm_bytes=1 << 20)
    run = me.run_sdc(cfg, _devices(), inject={"gemm": (0, 2, 12345), "hbm": (0, 3, 999), "collective": (0, 2, 0)})
    assert run.stopped is None, run.stop_message
    assert an.verdicts(run)[0]["issues"] == ["unstable", "wrong"]
    (gemm,) = [c for c in run.checks if c.wrong and c.work == "gemm"]
    assert (gemm.repetition, gemm.count, gemm.first["index"], gemm.first["differing"]) == (2, 1, 12345, 1)
    (hbm,) = [c for c in run.checks if c.wrong and c.work == "hbm"]
    assert (hbm.repetition, hbm.wrong, hbm.first["index"], hbm.first["bits"]) == (3, 1, 999, 1)
    (coll,) = [c for c in run.checks if c.wrong and c.work == "collective"]
    assert coll.repetition == 2 and coll.first["index"] == 0
    text = " ".join(f.text for f in an.findings(run))
    assert f"D[{12345 % 1024}, {12345 // 1024}]" in text and f"byte offset {999 * 8:#x}" in text
    assert "element 0:" in text


def test_command_writes_its_documents(tmp_path):
    j, c, r = tmp_path / "sdc.json", tmp_path / "sdc.csv", tmp_path / "rep"
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "sdc", "--gpus", "1", "--shape", "2048",
                           "--gemms", "4", "--repetitions", "3", "--memory-fraction", "0.2", "--json", str(j),
                           "--csv", str(c), "--report", str(r)], capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = validate(json.loads(j.read_text()), "sdc.json")
    assert doc["kind"] == "sdc" and doc["status"]["completed"] and doc["repetitions_done"] == 3
    assert len(doc["checks"]) == 9 and doc["gpus"][0]["verdict"] == "ok"
    assert doc["gpus"][0]["reference_hash"] in proc.stdout
    assert doc["gpus"][0]["hbm_bytes"] > 0 and doc["algo"]["blob"]
    from mgpu_bench.results.probe import headline

    names = {m.name for m in headline(doc)}
    assert {"sdc.gpu0.wrong_checks", "sdc.gpu0.gemm.tflops", "sdc.gpu0.hbm.check_bandwidth"} <= names
    assert c.read_text().splitlines()[1].startswith("0,")
    assert (r / "report.html").exists() and (r / "throughput.png").exists()


def test_ctrl_c_keeps_the_checks(tmp_path):
    j = tmp_path / "sdc.json"
    code, err = interrupt_cli(["sdc", "--gpus", "1", "--progress", "--duration", "120s", "--memory-fraction", "0.2",
                               "--json", str(j)], until=r"repetition 3 \(")
    assert code == 130, err
    assert "Traceback" not in err
    doc = json.loads(j.read_text())
    assert doc["status"]["stopped"] == "interrupted" and doc["checks"]


@pytest.mark.multi_gpu(2)
def test_two_gpus_agree():
    cfg = me.SdcConfig(gpus=(0, 1), gemms=8, repetitions=5, memory_fraction=0.25, comm_bytes=64 << 20)
    run = me.run_sdc(cfg, _devices(2))
    assert run.stopped is None, run.stop_message
    assert len(set(run.references.values())) == 1 and run.peer_differences == []
    assert {v["verdict"] for v in an.verdicts(run).values()} == {"ok"}
    assert len(run.checks_of(None, "collective")) == 10 and not any(c.wrong for c in run.checks)
