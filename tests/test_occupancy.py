"""Who else is on the GPUs: ours told from others by the real process tree, a foreign process named
first and as the cause of a slow GPU, a run on shared GPUs not compared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from mgpu_bench.history import History, compare_runs
from mgpu_bench.machine import occupancy
from mgpu_bench.probes.gemm import analyse as gemm_analyse
from mgpu_bench.probes.gemm.measure import GemmConfig, GemmRun
from mgpu_bench.run.runner import _because

BUS = "00000000:18:00.0"
GIB = 1 << 30


class FakeNvml:
    """pynvml's names for one GPU whose compute processes the test sets."""

    NVMLError = RuntimeError

    def __init__(self, pids: list[int]):
        self.pids = pids

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        if str(bus if isinstance(bus, str) else bus.decode()).upper() != BUS.upper():
            raise self.NVMLError("Not Found")
        return SimpleNamespace(bus=bus)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=2 * GIB) for p in self.pids]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=141 * GIB, used=len(self.pids) * 2 * GIB)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlSystemGetProcessName(self, pid):
        return b"python3"


@pytest.fixture
def orphan():
    """A real process that is not ours: started by a shell that exits, so it is reparented away
    from this process's tree."""
    out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                         check=True)
    pid = int(out.stdout.strip())
    yield pid
    os.kill(pid, 9)


def test_ours_is_this_process_and_its_children_others_are_foreign_unseen_are_unknown(orphan):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert occupancy.owner(os.getpid(), launched=False) == "ours"
        assert occupancy.owner(child.pid, launched=False) == "ours"
        assert occupancy.owner(orphan, launched=False) == "foreign"
        assert occupancy.owner(4_000_000, launched=False) == "unknown"  # beyond pid_max: in no namespace here
    finally:
        child.kill()


def test_a_sibling_under_a_launcher_is_ours(orphan):
    """Under torchrun every rank is a child of the node's agent: a sibling's process is the job's."""
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        code = (f"import os; from mgpu_bench.machine.occupancy import owner; "
                f"print(owner({sibling.pid}, launched=True), owner({sibling.pid}, launched=False))")
        # a child of this process is the sibling of `sibling`: both share this process as parent
        got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
        assert got == ["ours", "foreign"]
    finally:
        sibling.kill()


def test_watch_reports_the_foreign_before_and_the_visibly_foreign_after(orphan):
    nv = FakeNvml([os.getpid(), orphan, 4_000_001])
    w = occupancy.Watch({1: BUS}, nvml=nv)
    assert {p["owner"] for p in w.before["gpus"]["1"]["processes"]} == {"ours", "foreign", "unknown"}
    nv.pids = [os.getpid(), orphan, 4_000_002]  # an unseen pid that came during the run may be ours
    found = w.check()
    assert [(p.gpu, p.pid) for p in found] == [(1, orphan), (1, 4_000_001)]
    doc = {"occupancy": w.to_dict()}
    (line,) = occupancy.findings_text(occupancy.from_document(doc), doc["occupancy"]["before"])
    assert line.startswith(f"GPU 1 shared with pid {orphan} (sleep, 2.0 GiB), pid 4000001 (python3, 2.0 GiB); "
                           "they hold 4.0 of 141 GiB")


def test_the_process_holding_the_most_memory_is_named_first(orphan):
    """Seen on one H200: the pytest process (the lower pid, a few GiB left from earlier tests) was
    named before the 24 GiB GEMM beside it; the largest holder comes first, ties by pid."""

    class Sized(FakeNvml):
        def nvmlDeviceGetComputeRunningProcesses(self, h):
            return [SimpleNamespace(pid=orphan, usedGpuMemory=2 * GIB),
                    SimpleNamespace(pid=4_000_001, usedGpuMemory=24 * GIB),
                    SimpleNamespace(pid=4_000_002, usedGpuMemory=2 * GIB)]

    found = occupancy.Watch({0: BUS}, nvml=Sized([])).check()
    assert [p.pid for p in found] == [4_000_001, orphan, 4_000_002]
    assert occupancy.cause(0, found).startswith("GPU 0 shared with pid 4000001 (python3, 24.0 GiB)")


def test_a_process_that_only_holds_memory_is_not_the_cause(orphan):
    """Seen on one H200: the pytest process that launched `model` held 3.1 GiB and ran nothing,
    and the verdict said "shared GPU". Idle when the run started (0% utilisation): it lowers
    what fits, but the figures are the GPU's own, so it is named as such and never the cause."""

    class Idle(FakeNvml):
        def nvmlDeviceGetUtilizationRates(self, h):
            return SimpleNamespace(gpu=0, memory=0)

    w = occupancy.Watch({0: BUS}, nvml=Idle([orphan]))
    (p,) = w.check()
    assert p.pid == orphan and p.busy is False
    assert occupancy.cause(0, [p]) is None and occupancy.competing([p]) == []
    (line,) = occupancy.findings_text([p])
    assert line.startswith(f"GPU 0 holds memory of pid {orphan} (sleep, 2.0 GiB), which ran no kernels")
    busy = occupancy.Watch({0: BUS}, nvml=FakeNvml([orphan])).check()  # 97% utilisation before the run
    assert busy[0].busy is True and occupancy.cause(0, busy) == f"GPU 0 shared with pid {orphan} (sleep, 2.0 GiB)"
    doc = {"occupancy": w.to_dict()}
    assert occupancy.from_document(doc)[0].busy is False  # stored and read back


def test_without_nvml_there_is_nothing_to_report():
    class Broken(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("no driver")

    w = occupancy.Watch({0: BUS}, nvml=Broken([]))
    assert "no driver" in w.before["error"] and w.check() == []


def test_the_slow_gpu_is_named_shared_before_anything_its_clocks_say():
    from test_gemm import result

    capped = {"sm_hz_median": 1.41e9, "sm_max_hz": 1.98e9, "power_limit_w": 700.0, "limiting": ["power cap (software)"],
              "reasons": ["power cap (software)"]}
    ok = dict(capped, sm_hz_median=1.6e9)
    run = GemmRun(GemmConfig(), devices=[])
    run.results = [result(0, 717.2, telemetry=ok), result(1, 334.8, telemetry=capped)]
    shared = [occupancy.GpuProcess(1, 4242, "python3", int(2.1 * GIB), "foreign")]
    (slow,) = [f.text for f in gemm_analyse.findings(run, shared)]
    assert slow.endswith("; GPU 1 shared with pid 4242 (python3, 2.1 GiB)") and "power-capped" not in slow
    (before,) = [f.text for f in gemm_analyse.findings(run)]
    assert "power-capped" in before


def test_an_out_of_memory_line_names_who_holds_the_memory():
    shared = [occupancy.GpuProcess(0, 4242, "python3", 120 * GIB, "foreign")]
    assert _because("1 configuration(s) failed: out of memory: CUDA", shared).endswith(
        "; other processes hold memory on the GPU: pid 4242 (python3, 120.0 GiB)")
    assert _because("4 wrong element(s)", shared) == "4 wrong element(s)"


def _doc(created: str, shared: bool) -> dict:
    fixture = json.loads((__import__("pathlib").Path(__file__).parent / "fixtures" / "comm_2x_h200.json").read_text())
    doc = dict(fixture, created=created)
    if shared:
        doc["occupancy"] = {"foreign": [{"gpu": 1, "pid": 4242, "name": "python3", "used_bytes": 2 * GIB,
                                         "owner": "foreign"}]}
    return doc


def test_a_run_on_shared_gpus_is_not_compared(tmp_path):
    db = tmp_path / "h.sqlite3"
    with History.open(db) as h:
        base = h.save(_doc("2026-12-01T00:00:00+00:00", shared=False))
        new = h.save(_doc("2026-12-01T01:00:00+00:00", shared=True))
        clean = h.save(_doc("2026-12-01T02:00:00+00:00", shared=False))
        c = compare_runs(h, base, new)
        assert c.regressions == [] and c.failed
        assert c.not_comparable[0].startswith(f"{new}: GPU 1 shared with pid 4242")
        assert not compare_runs(h, base, clean).failed
    from mgpu_bench.cli import cli

    r = CliRunner().invoke(cli, ["compare", new, "--baseline", base, "--db", str(db)])
    assert r.exit_code == 1 and f"not comparable: {new}: GPU 1 shared with pid 4242" in r.output


def test_nvls_switched_off_by_the_user_is_said_on_an_nvswitch_node_only():
    from mgpu_bench.probes.comm.analyse import nvls_note

    switched = {"gpus": [{"nvlinks": [{"remote_type": "switch"}]}]}
    direct = {"gpus": [{"nvlinks": [{"remote_type": "gpu"}]}]}
    assert "NVLS" in nvls_note(switched, {"NCCL_NVLS_ENABLE": "0"})
    assert nvls_note(direct, {"NCCL_NVLS_ENABLE": "0"}) is None
    assert nvls_note(switched, {}) is None


def test_the_tool_sets_no_nccl_variable_for_itself_or_its_children():
    """DESIGN: NVLS and every NCCL_* setting is the user's; no default is written anywhere."""
    import pathlib
    import re

    pkg = pathlib.Path(occupancy.__file__).parent
    offenders = [f"{p.relative_to(pkg)}:{i}" for p in pkg.rglob("*.py") for i, line in
                 enumerate(p.read_text().splitlines(), 1)
                 if re.search(r"(setdefault|environ\[)\(?\s*[\"']NCCL_", line)]
    assert offenders == []
