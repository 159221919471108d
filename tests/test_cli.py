"""The CLI through click's CliRunner: help, and every bad input a user can type (exit code 2,
one line naming the fix, no traceback)."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from conftest import interrupt_comm

from mgpu_bench.cli import cli


def invoke(*args):
    return CliRunner().invoke(cli, list(args))


def test_help_lists_comm_and_its_stopping_rule():
    r = invoke("--help")
    assert r.exit_code == 0 and "comm" in r.output
    r = invoke("comm", "--help")
    assert r.exit_code == 0
    from mgpu_bench.results.measurement import TimingOptions

    assert f"--min-time ({TimingOptions.min_time_s:g} s)" in r.output and "busbw = algbw x 2(n-1)/n" in r.output


@pytest.mark.parametrize(
    "args, words",
    [
        (["--sizes", "12Q"], "cannot read size '12Q'"),
        (["--sizes", "1G-1M"], "ends below its start"),
        (["--sizes", "1M-1G", "--factor", "0"], "--factor must be a finite number greater than 1"),
        (["--sizes", "1M-1G", "--factor", "-3"], "--factor must be a finite number greater than 1"),
        (["--sizes", "1M-1G", "--step", "-1"], "--step '-1' is negative"),
        (["--ops", "allsum"], "unknown op 'allsum'"),
        (["--dtype", "fp12"], "unknown dtype 'fp12'"),
        (["--redop", "prod"], "unknown --redop 'prod'"),
        (["--iters", "-1"], "--iters and --warmup-iters must be between 0 and"),
        (["--iters", "99999999999"], "--iters and --warmup-iters must be between 0 and"),
        (["--min-time", "0"], "--min-time must be a positive number"),
        (["--min-time", "nan"], "--min-time must be a positive number"),
        (["--timeout", "0", "--sizes", "1K"], "--timeout must be a positive number"),
        (["--timeout", "inf", "--sizes", "1K"], "--timeout must be a positive number"),
        (["--sizes", "1M-1G", "--factor", "inf"], "finite number greater than 1"),
        (["--sizes", "99999999999T"], "above 1 PiB"),
        (["--sizes", "1-1G", "--step", "1"], "more than 1000 sizes"),
        (["--ops", "alltoall,sendrecv", "--inplace", "--sizes", "1K"], "no in-place form"),
        (["--json", "/nonexistent-folder/r.json"], "does not exist: create it first"),
        (["--csv", "/tmp"], "is a directory"),
        (["--sizes", "1T"], "lower the largest --sizes"),
        (["--nproc", "1", "--sizes", "1K"], "at least 2 ranks"),
        (["--backend", "tpu"], "Invalid value for '--backend'"),
        (["--bogus"], "No such option '--bogus'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, words):
    r = invoke("comm", *args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    assert lines[0].startswith("mgpu-bench: error: ") and words in lines[0]
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_gpu_requests_without_gpus_say_so(monkeypatch):
    from mgpu_bench.machine import selection

    monkeypatch.setattr(selection, "visible_gpu_count", lambda: 0)
    r = invoke("comm", "--gpus", "0,1", "--sizes", "1K")
    assert r.exit_code == 2 and "--gpus needs NVIDIA GPUs and none is usable here" in r.output and "--nproc" in r.output
    r = invoke("comm", "--graph", "--sizes", "1K")
    assert r.exit_code == 2 and "--graph needs the native backend" in r.output


def test_native_backend_without_a_driver_names_what_is_missing():
    from mgpu_bench import _native

    if _native.driver_version() != 0:
        pytest.skip("a driver is present")
    r = invoke("comm", "--backend", "native", "--sizes", "1K")
    assert r.exit_code == 2
    assert "no NVIDIA driver found" in r.output and "--backend torch" in r.output


def test_gloo_sweep_end_to_end_writes_json_and_csv(tmp_path, monkeypatch):
    """The whole command on 2 real CPU processes (torch.distributed with gloo)."""
    from mgpu_bench.machine import selection

    monkeypatch.setattr(selection, "visible_gpu_count", lambda: 0)
    j, c = tmp_path / "r.json", tmp_path / "r.csv"
    r = invoke("comm", "--ops", "allreduce,sendrecv", "--sizes", "1K,4K,1001", "--min-time", "0.01",
               "--json", str(j), "--csv", str(c))
    assert r.exit_code == 0, r.output
    assert "allreduce  (2 ranks, torch-gloo, cpu)" in r.output
    assert "rounded down to 1000 B" in r.output  # 1001 bytes of fp32 -> 250 elements
    doc = json.loads(j.read_text())
    assert doc["schema"] == "mgpu-bench/result" and doc["backend"] == "torch-gloo"
    assert doc["status"] == {"completed": True, "stopped": None, "message": None}
    got = [(m["spec"]["op"], m["spec"]["bytes"], m["spec"]["inplace"]) for m in doc["measurements"]]
    assert got == [("allreduce", 1024, False), ("allreduce", 1024, True), ("allreduce", 4096, False),
                   ("allreduce", 4096, True), ("allreduce", 1000, False), ("allreduce", 1000, True),
                   ("sendrecv", 1024, False), ("sendrecv", 4096, False), ("sendrecv", 1000, False)]
    assert all(m["wrong"] == [0, 0] for m in doc["measurements"])
    assert all(len(m["samples"]) == 2 for m in doc["measurements"])
    assert len(c.read_text().strip().splitlines()) == 10
    for key in ("host", "nccl", "torch", "gpus", "env", "libraries"):
        assert key in doc["environment"]


def test_ctrl_c_keeps_finished_sizes(tmp_path):
    """A real SIGINT to a real process: exit 130, the sizes finished so far written."""
    j = tmp_path / "r.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    # start-up ~5 s (longer on a loaded machine), then ~1 s per size and placement: all 22 would take
    # ~22 s; SIGINT goes as soon as the progress bar counts the first size measured
    rc, err = interrupt_comm(["--backend", "torch", "--ops", "allreduce", "--sizes", "1K-1M", "--min-time", "0.5",
                              "--json", str(j)], env=env)
    assert rc == 130, err
    doc = json.loads(j.read_text())
    assert doc["status"]["stopped"] == "interrupted"
    assert 1 <= len(doc["measurements"]) < 22


def test_summary_lines_are_not_wrapped(tmp_path, monkeypatch):
    from mgpu_bench.machine import selection

    monkeypatch.setattr(selection, "visible_gpu_count", lambda: 0)
    r = invoke("comm", "--ops", "reducescatter", "--sizes", "64M", "--outofplace", "--iters", "2",
               "--warmup-iters", "1")
    assert r.exit_code == 0, r.output
    (line,) = [ln for ln in r.output.splitlines() if ln.startswith("reducescatter out-of-place: busbw")]
    assert line.endswith("0 wrong")
