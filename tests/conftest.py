from __future__ import annotations

import pytest


def _gpu_count() -> int:
    from mgpu_bench.machine.selection import visible_gpu_count

    return visible_gpu_count()


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run the tests marked slow (as `-m slow` does for them alone)")


def _slow_wanted(config) -> bool:
    """`slow` tests run when asked for: --run-slow, or a -m expression that names slow."""
    import re

    return bool(config.getoption("--run-slow")) or re.search(r"\bslow\b", config.getoption("markexpr") or "") is not None


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need one NVIDIA GPU, `multi_gpu(n)` tests n; without them they skip with
    the reason (CI has no GPU; run `pytest -m gpu` on a GPU machine). `slow` tests (minutes on
    their hardware) skip unless asked for, so that `pytest -m gpu` stays within its 5 minutes
    on one H200: `pytest -m slow` runs them (README, the test paragraph)."""
    slow = _slow_wanted(config)
    count = None
    for item in items:
        if item.get_closest_marker("slow") and not slow:
            item.add_marker(pytest.mark.skip(reason="slow: run with `python -m pytest -m slow` (or --run-slow)"))
            continue
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


# The optional extra `[models]` (torchvision, transformers): a test that fails only because the tool
# said one of them is missing ("torchvision workloads need torchvision ... pip install
# 'mgpu-bench[models]'", mgpu_bench/workloads) is reported as skipped, with the reason and the
# install line, and only when the package is indeed missing (a test that needs it and says so in
# its own words fails as it should, and no test is skipped where the extra is installed).
MODELS_EXTRA = {"torchvision": "torchvision workloads need torchvision", "transformers": "hf: workloads need transformers"}


def models_install(missing: list[str]) -> str:
    """The install line for the missing part of the [models] extra, with the torchvision release of
    the torch installed here: torchvision 0.N goes with torch 2.(N-15) (PyTorch's compatibility
    table, github.com/pytorch/vision#installation), a CPU build of torch with torchvision's CPU build
    from the same index; a bare `pip install torchvision` takes the newest, which replaces a CPU
    torch with the CUDA build it was made for."""
    import re
    from importlib.metadata import PackageNotFoundError, version

    lines, why = [], ""
    if "torchvision" in missing:
        try:
            torch_version = version("torch")
        except PackageNotFoundError:
            torch_version = ""
        m = re.match(r"2\.(\d+)", torch_version)
        vision = f"0.{int(m.group(1)) + 15}" if m else ""
        index = " --index-url https://download.pytorch.org/whl/cpu" if "+cpu" in torch_version else ""
        lines.append(f"pip install 'torchvision=={vision}.*'{index}" if vision else "pip install torchvision")
        why = f"torchvision {vision} is the release of this torch {torch_version}; " if vision else ""
    if "transformers" in missing:
        lines.append("pip install 'transformers>=4.46'")
    return f"{' && '.join(lines)} ({why}README: Run the tests)"


def _missing(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed or report.when not in ("setup", "call"):
        return
    text = str(report.longrepr)
    missing = [m for m, said in MODELS_EXTRA.items() if said in text and _missing(m)]
    if missing:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           f"Skipped: needs {' and '.join(missing)} (the [models] extra): {models_install(missing)}")


# What `comm --progress` prints once it has measured a size (matched with escape codes removed):
# the count, "1/22" after the first of 22, in the bar a terminal draws (AS_A_TERMINAL) or as
# "[1/22]" in a plain progress line.
FIRST_SIZE = r"(?:^|[\s\[])[1-9]\d*/\d+(?:[\s\]]|$)"
# `comm` shows its progress as a rich bar, drawn only on a terminal; rich's documented
# TTY_COMPATIBLE=1 has it drawn into a pipe too, so that a test can see the count.
AS_A_TERMINAL = {"TTY_COMPATIBLE": "1"}
DEADLINE_S = 120.0  # generous on an idle machine (~10 s to the first gloo measurement); scaled(): by the load


def slowdown(cpu_s: float = 0.25) -> float:
    """How many times slower than on an idle machine a CPU-bound process runs here now, measured
    when called: the wall time this process takes to spend `cpu_s` seconds of CPU in a busy loop,
    over `cpu_s` (1 on an idle machine, about 2 beside one other busy process on 2 cores, about 5
    beside 8). A test that waits for processes scales its idle deadlines by it (scaled()), so that
    a deadline says "hung", never "the machine is busy"."""
    import time

    w0, c0 = time.monotonic(), time.process_time()
    while time.process_time() - c0 < cpu_s:
        pass
    return max(1.0, (time.monotonic() - w0) / cpu_s)


def scaled(seconds: float) -> float:
    """`seconds` (a deadline that holds on an idle machine) times slowdown() now."""
    return seconds * slowdown()


def start_s() -> float:
    """Seconds this machine takes now to start a process that imports the CLI and torch.distributed
    (3-5 s idle on 2 cores, 20-40 s beside 8 busy processes): the reference, measured in the same
    test, for how far apart processes started together may arrive."""
    import subprocess
    import sys
    import time

    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import mgpu_bench.cli, torch.distributed"], check=True,
                   capture_output=True, timeout=scaled(600))
    return time.monotonic() - t0


def plain(text: str) -> str:
    """Text without the terminal's escape codes (colours, cursor moves)."""
    import re

    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def wait_for_output(proc, pattern: str, stream: str = "stderr", deadline_s: float | None = None) -> bytes:
    """Reads `stream` of `proc` (a binary pipe) as it comes, not line by line (a progress bar
    rewrites one line with \\r), until `pattern` matches what was read; returns the bytes read
    (the caller's later communicate() returns the rest). Fails the test, the process killed,
    when it ends first or nothing matches within `deadline_s` [default: scaled(DEADLINE_S)]."""
    import os
    import re
    import select
    import time

    deadline_s = scaled(DEADLINE_S) if deadline_s is None else deadline_s
    fd = (proc.stdout if stream == "stdout" else proc.stderr).fileno()
    seen = b""
    deadline = time.monotonic() + deadline_s
    while not re.search(pattern, plain(seen.decode(errors="replace"))):
        left = deadline - time.monotonic()
        chunk = None
        if left > 0 and select.select([fd], [], [], min(left, 1.0))[0]:
            chunk = os.read(fd, 1 << 16)
            seen += chunk
        if chunk == b"" or left <= 0:
            proc.kill()
            proc.wait()
            why = (f"it ended (exit code {proc.returncode}) before {pattern!r} appeared" if chunk == b"" else
                   f"{pattern!r} did not appear within {deadline_s:g} s")
            pytest.fail(f"{why} on the {stream} of {proc.args}; it said:\n{plain(seen.decode(errors='replace'))[-3000:]}")
    return seen


def interrupt_comm(args: list[str], after_s: float | None = None, env: dict | None = None):
    """Runs `mgpu-bench comm --progress ARGS` in a real process, sends SIGINT once the first size
    is measured (or, given `after_s`, after that many seconds) and returns (exit code, stderr)."""
    if after_s is not None:
        return interrupt_cli(["comm", *args], after_s, env)
    return interrupt_cli(["comm", "--progress", *args], env=env, until=FIRST_SIZE)


def interrupt_cli(args: list[str], after_s: float | None = None, env: dict | None = None, *,
                  until: str | None = None, sig=None, cwd=None, deadline_s: float | None = None):
    """Runs `mgpu-bench ARGS` in a real process, sends `sig` (SIGINT) once `until` (a pattern)
    appears on its stderr, drawn as on a terminal, within `deadline_s` (or, without `until`,
    after `after_s` seconds) and returns (exit code, stderr without escape codes)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    if until is not None:
        env = {**(os.environ if env is None else env), **AS_A_TERMINAL}
    proc = subprocess.Popen([sys.executable, "-m", "mgpu_bench.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=cwd)
    try:
        if until is not None:
            seen = wait_for_output(proc, until, deadline_s=deadline_s)
        else:
            seen = b""
            time.sleep(after_s)
        assert proc.poll() is None, "it ended before the signal: " + plain((seen + proc.stderr.read()).decode())
        proc.send_signal(signal.SIGINT if sig is None else sig)
        _out, err = proc.communicate(timeout=scaled(DEADLINE_S))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, plain((seen + err).decode(errors="replace"))


@pytest.fixture(autouse=True)
def _private_history(tmp_path_factory, monkeypatch):
    """Every test (and every process it starts) stores runs in a database of its own, never in
    the user's data directory."""
    monkeypatch.setenv("MGPU_BENCH_DB", str(tmp_path_factory.mktemp("history") / "history.sqlite3"))


_STOP_STATE = ("_terminated", "_term_signal", "_interrupted", "_stopping", "_installed", "_deferred",
               "_agent_exc", "_last_press", "_presses", "_noted", "_redeliver")


def _pristine_stop_state() -> dict:
    from mgpu_bench.core import errors

    return {k: getattr(errors, k) for k in _STOP_STATE}


_PRISTINE = _pristine_stop_state()  # as the module defines it: read before any test runs


@pytest.fixture(autouse=True)
def _stop_state_per_test():
    """One CLI process handles one run's stop signals (errors.py keeps them in module state);
    tests run many in this one process: each test ends with the state and the SIGINT, SIGTERM
    and SIGHUP handlers it began with, so a Ctrl-C one test simulates (interrupt_main) is never
    a later test's interruption (exit 130)."""
    import signal

    from mgpu_bench.core import errors

    state = {k: getattr(errors, k) for k in _STOP_STATE}
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for k, v in _PRISTINE.items():  # and begins with it as a new process has it (a module's fixture may have moved it)
        setattr(errors, k, v)
    yield
    for s, h in handlers.items():
        signal.signal(s, h)
    for k, v in state.items():
        setattr(errors, k, v)


class Measuring(Exception):
    """Raised where a probe would start its work (before_measuring): everything before it was taken."""


@pytest.fixture
def before_measuring(monkeypatch, tmp_path):
    """CPU ranks, no launcher, the current folder a scratch one, each probe stopped where it would
    start measuring (its delegate raises Measuring)."""
    from mgpu_bench.results import probe as registry

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS",
                "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)

    def stop(self, cfg):
        raise Measuring()

    for name in registry.names():
        monkeypatch.setattr(type(registry.get(name)), "delegate", stop)
    return tmp_path


# Where the minutes go (issue 42): each test file's seconds (set-up, call and tear-down of its tests, module
# fixtures included, summed over the workers) after the run, the largest first, so that CI's log says which
# files to make cheaper before the suite crosses its 10 minutes.
_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + getattr(report, "duration", 0.0)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _file_seconds or hasattr(config, "workerinput"):  # the controller prints it, not each xdist worker
        return
    total = sum(_file_seconds.values())
    top = sorted(_file_seconds.items(), key=lambda kv: -kv[1])[:15]
    terminalreporter.write_sep("=", f"seconds per test file: {total:.0f} s over {len(_file_seconds)} files, "
                                    "summed over the workers (the 15 largest)")
    for path, s in top:
        terminalreporter.write_line(f"{s:8.1f} s  {100 * s / total:5.1f}%  {path}")
