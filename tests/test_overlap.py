"""`mgpu-bench overlap` on CPU: the window, slowdowns and their noise, NCCL's channels and the
training step from constructed samples; a real two-process gloo run through the command line
(document, tables, CSV, report, history, headline); a real in-process run on one rank, complete
and stopped by Ctrl-C after its first phase; bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import scaled

from mgpu_bench.cli import cli
from mgpu_bench.probes.overlap import PROBE, parse_shape
from mgpu_bench.probes.overlap import analyse as ov

FIXTURES = Path(__file__).parent / "fixtures"
MIB = 1 << 20


def _jitter(base: float, n: int) -> list[float]:
    """n seconds around `base`, +-2% in a cycle of 5 (its mean is `base` when 5 divides n)."""
    return [base * (1 + 0.01 * ((i % 5) - 2)) for i in range(n)]


def _rank(rank: int, world: int, comm_alone=1e-3, gemm_alone=2e-3, comm_together=1.25e-3, gemm_together=2.4e-3,
          **extra) -> dict:
    return {"rank": rank, "world": world, "device": f"cuda:{rank}", "error": None, "sm_count": 132,
            "nccl": {"coll_channels": 24, "nvls_channels": 0},
            "phases": {"comm_alone": {"comm": {"start_s": 0.0, "seconds": _jitter(comm_alone, 40)}},
                       "gemm_alone": {"gemm": {"start_s": 0.0, "seconds": _jitter(gemm_alone, 20)}},
                       "together": {"comm": {"start_s": 0.0, "seconds": _jitter(comm_together, 40)},
                                    "gemm": {"start_s": 0.0, "seconds": _jitter(gemm_together, 25)}}},
            **extra}


def _run(world: int = 2, model_ref: dict | None = None, **rank_args) -> ov.OverlapRun:
    cfg = ov.OverlapConfig(size=256 * MIB, m=8192, n=8192, k=8192, duration_s=5.0, device="cuda")
    return ov.OverlapRun(cfg, [_rank(r, world, **rank_args) for r in range(world)], tuple(range(world)), model_ref)


def test_the_window_keeps_what_ended_while_both_ran():
    w = ov.window(_run().ranks[0]["phases"]["together"])
    assert w.end_s == pytest.approx(40 * 1.25e-3) and w.span_s == pytest.approx(25 * 2.4e-3)
    assert len(w.comm) == 40 and len(w.gemm) == 20  # the GEMMs that ended after the allreduces did are left out
    assert w.share == pytest.approx(50 / 60)


def test_slowdowns_busbw_and_noise_from_constructed_samples():
    a = ov.analyse(_run())
    assert a.comm_alone.rate == pytest.approx(256 * MIB * 2 * (2 - 1) / 2 / 1e-3)  # busbw = algbw x 2(n-1)/n
    assert a.comm_slowdown.value == pytest.approx(0.25) and a.gemm_slowdown.value == pytest.approx(0.2)
    assert a.gemm_alone.rate == pytest.approx(2 * 8192**3 / 2e-3)
    assert 0 <= a.comm_slowdown.noise < 0.01 and a.comm_slowdown.significant
    assert a.channels == 24 and a.sm_count == 132
    assert ov.rel_se([1.0] * 4) is None and ov.rel_se([1.0] * 20) == 0.0
    assert not ov.Slowdown(0.03, 0.02).significant and ov.Slowdown(0.03, None).significant
    assert ov.Slowdown(0.03, 0.02).phrase("x").startswith("no change beyond noise (+3.0%")
    # both together took 60 ms where one after the other takes 40 + 50 ms: 30 of the shorter 40 ms hidden
    assert a.hidden == pytest.approx((40e-3 + 25 * 2e-3 - 60e-3) / 40e-3)


def test_findings_name_each_side_the_sms_and_the_training_step():
    ref = {"source": "m.json", "model": "350m", "parallel": "ddp", "device": "cuda", "world": 2, "step_s": 0.1,
           "exposed_comm_share": 0.05, "comm_kernel_share": 0.30, "comm_exposed_kernel_share": 0.05}
    run = _run(model_ref=ref)
    text = [f.text for f in ov.findings(run)]
    assert any("allreduce 256 MiB" in t and "each call takes 25.0% longer" in t for t in text), text
    assert any("each GEMM takes 20.0% longer" in t and "24 of 132 SMs (18%)" in t for t in text), text
    cost = ov.step_cost(ref, ov.analyse(run))
    assert cost["overlapped_s"] == pytest.approx(0.025)  # (30% - 5%) of a 100 ms step
    assert cost["compute_s"] == pytest.approx(0.025 * 0.2 / 1.2) and cost["explained"] == pytest.approx(0.25 / 0.3)
    assert any("the interference explains it (~83%" in t for t in text), text
    nothing = {**ref, "comm_kernel_share": 0.06}  # little NCCL beside compute: the rest is not interference
    assert "explains little" in ov.reference_text(nothing, ov.analyse(run), 2)[1]
    assert any("every 10 ms of communication" in t for t in (f.text for f in ov.findings(_run())))
    assert ov.key_figure(run)[0] == "allreduce +25.0%, GEMM +20.0% time when overlapped"


def test_little_hidden_says_whether_the_sides_ran_apart_or_slowed_each_other():
    """Seen on one H200: both sides ran 99% of the phase yet hid 24% of the shorter one, because
    each slowed the other; that is not "barely ran at once"."""
    slowed = [f.text for f in ov.findings(_run(comm_together=2.1e-3, gemm_together=3.4e-3))]
    line = next(t for t in slowed if t.startswith("running both together hid only 13%"))
    assert "they ran at once 99% of the phase" in line, line
    assert "slowed each other (allreduce +110.0%, GEMM +69.9%)" in line, line
    assert "barely ran at once" not in line
    # the allreduces start 45 ms in, as the GEMMs end at 50 ms: each ran alone most of the phase
    apart = _run(comm_together=1e-3, gemm_together=2e-3)
    apart.ranks[0]["phases"]["together"]["comm"]["start_s"] = 0.045
    text = [f.text for f in ov.findings(apart)]
    assert any("hid only 13%" in t and "barely ran at once (both ran 6% of the phase)" in t for t in text), text


def test_clocks_power_and_the_report_of_a_gpu_like_run(tmp_path):
    """Telemetry as NVML gives it, in the GEMM's finding, the per-rank table and the report."""
    from mgpu_bench.probes.overlap.report import write_report

    tel = {"comm_alone": {"sm_hz_median": 1.98e9, "power_w_mean": 400.0, "limiting": []},
           "gemm_alone": {"sm_hz_median": 1.98e9, "power_w_mean": 690.0, "limiting": []},
           "together": {"sm_hz_median": 1.83e9, "power_w_mean": 700.0, "limiting": ["power cap (software)"]}}
    series = {"t": [0.1 * i for i in range(60)], "sm_hz": [1.9e9] * 60, "power_w": [650.0] * 60,
              "temp_c": [50.0] * 60, "phases": {"comm_alone": [0, 2], "gemm_alone": [2, 4], "together": [4, 6]}}
    run = _run(telemetry=tel, telemetry_series=series, gpu_name="NVIDIA H200")
    gemm = next(f.text for f in ov.findings(run) if "GEMM" in f.text and "beside the allreduce" in f.text)
    assert "SM clock 1980 -> 1830 MHz (-7.6%), power 690 -> 700 W, together only: power cap (software)" in gemm
    paths = write_report(run, tmp_path / "rep", {"host": "node1"})
    assert {p.name for p in paths} == {"rates.png", "timeline.png", "clocks.png", "report.html", "summary.md"}
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert "1980 / 690" in md and "1830 / 700" in md  # per rank and phase: MHz / W
    assert f"{2 * 8192**3 / 2e-3 * (1 - 24 / 132) / 1e12:.1f} if NCCL's 24 of 132 SMs were taken from it" in md


def test_one_rank_says_it_needs_two_gpus_and_keeps_the_gemm_side():
    from mgpu_bench.probes.overlap.document import document, run_from_document
    from mgpu_bench.probes.overlap.headline import headline

    run = _run(world=1)
    assert ov.key_figure(run)[1] == "needs 2 GPUs to measure interference"
    assert any("needs 2 GPUs to measure interference" in f.text for f in ov.findings(run))
    doc = document(run, {})
    assert run_from_document(json.loads(json.dumps(doc))).ranks == run.ranks
    names = [m.name for m in headline(doc)]
    assert names == ["overlap.1ranks.gemm.bf16.8192x8192x8192.tflops_alone",
                     "overlap.1ranks.gemm.bf16.8192x8192x8192.tflops_overlapped",
                     "overlap.1ranks.gemm.bf16.8192x8192x8192.slowdown"]


def test_nccl_channels_from_its_info_log():
    log = (FIXTURES / "nccl_info_2x_h200.log").read_text()
    assert ov.nccl_channels(log) == {"coll_channels": 24, "nvls_channels": 0}
    assert ov.nccl_channels("host:1:2 [0] NCCL INFO Channel 00/08 : 0 1") == {"coll_channels": 8}
    assert ov.nccl_channels("nothing") == {}


def test_the_training_step_from_a_suite_document_and_the_suite_step():
    from mgpu_bench.results.probe import PlanContext

    suite = json.loads((FIXTURES / "suite" / "suite.json").read_text())
    ref = ov.model_reference(suite, "suite.json")
    assert ref["world"] == 2 and ref["parallel"] == "ddp" and ov.check_reference(ref) is None
    assert ov.check_reference({"source": "x"}).startswith("lacks")
    (step,) = PROBE.suite_steps(PlanContext(False, (0, 1), 60.0))
    assert step.round == 2 and step.min_gpus == 2 and step.order > 30  # after model-scaling (30)
    planned = step.prepare(step, [{"name": p["name"], "document": p["document"]} for p in suite["probes"]], None)
    figures = json.loads(planned.args[planned.args.index("--model-figures") + 1])
    assert figures["world"] == 2 and "model-scaling" in figures["source"]
    ctx = cli.commands["overlap"].make_context("overlap", list(planned.args[1:]) + ["--no-store"])
    assert json.loads(ctx.params["model_figures"]) == figures
    assert step.prepare(step, [], None).args == step.args  # no model run before it: nothing to pass


def test_two_gloo_processes_end_to_end(tmp_path):
    """A real run: 2 CPU processes (gloo) through torch's elastic launcher, beside the suite
    fixture's 2-process model step; stored in this test's history."""
    from mgpu_bench.history import History
    from mgpu_bench.machine.selection import visible_gpu_count
    from mgpu_bench.results.probe import headline

    if visible_gpu_count() > 0:
        pytest.skip("on GPU machines the GPU tests cover this")
    out, csv, rep = tmp_path / "o.json", tmp_path / "o.csv", tmp_path / "rep"
    proc = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "overlap", "--nproc", "2", "--duration", "0.05",
                           "--size", "256K", "--shape", "128", "--json", str(out), "--csv", str(csv), "--report",
                           str(rep), "--model-result", str(FIXTURES / "suite" / "suite.json"), "--no-progress"],
                          capture_output=True, text=True, timeout=280, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["kind"] == "overlap" and doc["status"]["completed"] and doc["world"] == 2
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        assert set(r["phases"]) == {"comm_alone", "gemm_alone", "together"}
        assert len(r["phases"]["comm_alone"]["comm"]["seconds"]) >= 10  # the noise estimate's minimum
    assert doc["model_ref"]["world"] == 2
    assert any(f.startswith("model tiny DDP on 2 processes") for f in doc["findings"]), doc["findings"]
    for words in ("Compute and communication together", "busbw GB/s", "GFLOP/s per process", "ms per GEMM"):
        assert words in proc.stdout
    run = PROBE.load(doc)
    a = ov.analyse(run)
    metrics = {m.name: m for m in headline(doc)}
    busbw = metrics["overlap.2ranks.allreduce.256KiB.busbw_alone"]
    assert busbw.unit == "B/s" and busbw.value == pytest.approx(a.comm_alone.rate) and len(busbw.samples) >= 10
    slow = metrics["overlap.2ranks.gemm.fp32.128x128x128.slowdown"]
    assert slow.value == pytest.approx(a.gemm_slowdown.value)
    assert f"{a.gemm_alone.rate / 1e9:.1f}" in proc.stdout  # the table prints what the analysis derives
    assert csv.read_text().count("\n") == 1 + 2 * 4  # per rank: comm alone, GEMM alone, both sides together
    assert (rep / "report.html").exists() and (rep / "rates.png").exists()
    with History.open() as h:  # MGPU_BENCH_DB: this test's own database
        (info,) = h.list(kind="overlap")
        assert any(m.name.endswith("busbw_overlapped") for m in h.metrics(info.run_id))


def test_one_rank_in_process_complete_and_stopped_after_its_first_phase(tmp_path, monkeypatch):
    """run_overlap on one rank in this process: a complete tiny run, then a longer one that a
    Ctrl-C (interrupt_main, once the rank has written its first phase) stops with that phase kept."""
    import _thread
    import tempfile
    import time

    from mgpu_bench.probes.overlap.measure import run_overlap

    cfg = ov.OverlapConfig(size=1 << 20, m=128, n=128, k=128, duration_s=0.05, device="cpu")
    run = run_overlap(cfg, 1, ())
    assert run.stopped is None and run.world == 1 and ov.analyse(run).gemm_slowdown is not None
    assert run.ranks[0]["comm_op"] == "elementwise stand-in"

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the run's sink folder lands here
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises here (conftest puts back the handler)
    done = threading.Event()
    seen: list = []  # what the watcher saw: the stop state and handler when it interrupted, for a failure's message

    def stop_after_first_phase():
        deadline = time.monotonic() + 120
        while not done.is_set() and time.monotonic() < deadline:
            for f in tmp_path.glob("mgpu-bench-overlap-*/rank0.json"):
                try:
                    if "comm_alone" in (json.loads(f.read_text()).get("phases") or {}):
                        from mgpu_bench.core import errors

                        seen.append((time.monotonic(), errors._stopping, errors._deferred, signal.getsignal(signal.SIGINT)))
                        _thread.interrupt_main()
                        return
                except (OSError, ValueError, AttributeError):  # not there yet, half written, an early form
                    pass
            time.sleep(0.01)

    watcher = threading.Thread(target=stop_after_first_phase, daemon=True)
    watcher.start()
    try:
        # phases of a second on an idle host, as much longer as the host is slower now: beside 8 busy
        # processes the watcher (a thread polling every 10 ms) once saw the first phase only after the last
        long = run_overlap(ov.OverlapConfig(size=1 << 20, m=128, n=128, k=128, duration_s=max(1.0, scaled(1.0)),
                                            device="cpu"), 1, ())
    finally:
        done.set()
    assert long.stopped == "interrupted", (long.stop_message, seen or "the watcher never saw the first phase")
    assert "comm_alone" in long.ranks[0]["phases"] and len(long.ranks[0]["phases"]) < 3
    assert ov.comm_side(long, "comm_alone") is not None
    assert not list(tmp_path.glob("mgpu-bench-overlap-*"))  # the sink folder is removed


@pytest.mark.parametrize("args,text", [
    (["--shape", "0"], "every dimension must be 1.."),
    (["--shape", "8x8"], "neither N (square) nor MxNxK"),
    (["--shape", "8q"], "not a whole number"),
    (["--size", "2"], "at least 4 bytes"),
    (["--duration", "0.001s"], "--duration"),
    (["--nproc", "0"], "--nproc"),
    (["--model-result", "/nonexistent/m.json"], "cannot read it"),
    (["--model-result", str(FIXTURES / "comm_2x_h200.json")], "not a model or suite result"),
    (["--model-figures", "{}"], "lacks source"),
    (["--model-figures", "[1"], "not JSON"),
])
def test_cli_bad_input_is_one_line_exit_2(args, text):
    res = CliRunner().invoke(cli, ["overlap", *args])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and text in lines[0], lines


def test_parse_shape():
    assert parse_shape("8k") == (8192, 8192, 8192) and parse_shape("4096x8192x1024") == (4096, 8192, 1024)
