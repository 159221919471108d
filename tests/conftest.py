from __future__ import annotations

import pytest


def _gpu_count() -> int:
    from mgpu_bench.selection import visible_gpu_count

    return visible_gpu_count()


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need one NVIDIA GPU, `multi_gpu(n)` tests n; without them they skip with
    the reason (CI has no GPU; run `pytest -m gpu` on a GPU machine)."""
    count = None
    for item in items:
        need = 0
        if item.get_closest_marker("gpu"):
            need = 1
        marker = item.get_closest_marker("multi_gpu")
        if marker:
            need = max(need, int(marker.args[0]))
        if need:
            if count is None:
                count = _gpu_count()
            if count < need:
                item.add_marker(pytest.mark.skip(reason=f"needs {need} NVIDIA GPU(s), {count} visible"))


def interrupt_comm(args: list[str], after_s: float, env: dict | None = None):
    """Runs `mgpu-bench comm ARGS` in a real process, sends SIGINT after `after_s` seconds and
    returns (exit code, stderr)."""
    return interrupt_cli(["comm", *args], after_s, env)


def interrupt_cli(args: list[str], after_s: float, env: dict | None = None):
    """Runs `mgpu-bench ARGS` in a real process, sends SIGINT after `after_s` seconds and
    returns (exit code, stderr)."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "mgpu_bench.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.fixture(autouse=True)
def _private_history(tmp_path_factory, monkeypatch):
    """Every test (and every process it starts) stores runs in a database of its own, never in
    the user's data directory."""
    monkeypatch.setenv("MGPU_BENCH_DB", str(tmp_path_factory.mktemp("history") / "history.sqlite3"))
