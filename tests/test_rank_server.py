"""The rank server (mgpu_bench.core.children.rank_start_method): a run's ranks forked from
multiprocessing's fork server, which imported torch once. A forked rank has the launching
process's environment as it is at the launch (not as it was when the server started), ends when
the launching process ends (SIGKILL included), and the server with it; the module that makes the
server end at once does nothing in any other process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import scaled

pytest.importorskip("torch")
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server and /proc are Linux's")


def _rank_facts() -> dict:
    from mgpu_bench.core import children

    return {"late": os.environ.get("MGPU_TEST_LATE"), "gone": os.environ.get("MGPU_TEST_GONE"),
            "rank": os.environ.get("RANK"), "server": children.forked_by_server(os.getppid()),
            "torch_before": "torch" in sys.modules}


@linux
def test_a_forked_rank_has_the_launching_processs_environment_of_the_launch(monkeypatch):
    import uuid

    from torch.distributed.launcher.api import LaunchConfig

    from mgpu_bench.core import children, launch

    monkeypatch.setenv("MGPU_TEST_GONE", "set before the server started")
    assert children.rank_start_method() == "forkserver"  # started here, or running since an earlier test
    monkeypatch.setenv("MGPU_TEST_LATE", "set after it")
    monkeypatch.delenv("MGPU_TEST_GONE")
    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=f"server-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launch.free_port()}", max_restarts=0,
                      monitor_interval=0.1, start_method="spawn")
    got = launch.run_elastic(lc, _rank_facts, children="die")
    assert sorted(got) == [0, 1]
    for r, facts in got.items():
        assert facts["server"], facts  # forked from the server, whatever the config asked for
        assert facts["torch_before"], facts  # torch came with the fork, not imported by the rank
        assert facts["rank"] == str(r) and facts["late"] == "set after it" and facts["gone"] is None, facts


_LAUNCHER = textwrap.dedent("""
    import sys, time, uuid
    from torch.distributed.launcher.api import LaunchConfig
    from mgpu_bench.core import launch

    def sleeper():
        print("rank up", flush=True)
        time.sleep(300)

    if __name__ == "__main__":
        lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=uuid.uuid4().hex[:8],
                          rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{launch.free_port()}", max_restarts=0,
                          monitor_interval=0.1, start_method="spawn")
        launch.run_elastic(lc, sleeper, children="die")
""")


def _below(pid: int) -> list[int]:
    from mgpu_bench.core import children

    return children.descendants(pid)


@linux
def test_sigkill_of_the_launching_process_ends_its_forked_ranks_and_the_server(tmp_path):
    script = tmp_path / "launcher.py"
    script.write_text(_LAUNCHER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path, start_new_session=True)
    try:
        seen, end = 0, time.monotonic() + scaled(60.0)
        while seen < 2:
            assert time.monotonic() < end and proc.poll() is None, proc.stderr.read() if proc.poll() else "no ranks"
            seen += proc.stdout.readline() == b"rank up\n"
        below = _below(proc.pid)
        from mgpu_bench.core import children

        servers = [p for p in below if children.forked_by_server(p)]
        assert servers and len(below) >= 3, below  # the server and the two ranks under it
        proc.kill()
        proc.wait()
        end = time.monotonic() + scaled(10.0)
        while (left := [p for p in below if children.alive(p)]) and time.monotonic() < end:
            time.sleep(0.1)
        assert left == [], f"still running after their launcher was killed: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_servers_quick_exit_is_installed_in_the_server_alone():
    """Imported in an ordinary process, rank_server leaves its exit alone: an exit hook registered
    before it still runs (in the server, os._exit, registered last and so run first, skips them)."""
    code = "import atexit; atexit.register(print, 'earlier hook ran'); import mgpu_bench.core.rank_server"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and out.stdout == "earlier hook ran\n", (out.stdout, out.stderr[-2000:])
