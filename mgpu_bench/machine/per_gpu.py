"""Native work on every GPU at once, one host thread each, with Ctrl-C still heard.

The probes that drive the native module per GPU (gemm, sdc) run each GPU's work in its own
thread while the main thread waits in 0.1 s slices: a blocking native call holds no Python
frame of the main thread, so a KeyboardInterrupt reaches it; it then stops every probe object
(their stop() makes the native loops return what they have), waits for the threads and
re-raises. faults_end_the_run() turns what stops such a run into its status, the same for
every such probe.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from mgpu_bench.core.errors import MgpuError, OutOfMemoryError, interruption


class Stopped(Exception):
    """A probe's native loop returned early because stop() was called: the run was asked to end."""


@contextlib.contextmanager
def faults_end_the_run(run: Any, probes: Mapping[int, Any], kept: str) -> Iterator[None]:
    """Around a run's measurements: Ctrl-C (or Stopped) stops every probe and ends the run as
    "interrupted"; out of memory and any other native error end it as "failed"; `run.stopped`
    and `run.stop_message` say so, and what was measured stays in `run` (`kept` says what that
    is, in the message). Nothing is raised."""
    try:
        yield
    except (KeyboardInterrupt, Stopped) as exc:
        for p in list(probes.values()):
            p.stop()
        run.stopped, run.stop_message = "interrupted", f"{interruption(exc)}: {kept}"
    except OutOfMemoryError as exc:
        run.stopped, run.stop_message = "failed", f"out of memory: {str(exc).split(' [', 1)[0]}"
    except MgpuError as exc:
        run.stopped, run.stop_message = "failed", str(exc)


def on_gpus(devices: Sequence[dict], fn: Callable[[dict], Any], probes: Mapping[int, Any],
            one_at_a_time: bool = False) -> dict[int, Any]:
    """fn(device) for every GPU, each in its own thread: all at once, or one after another.
    The main thread waits in 0.1 s slices so that Ctrl-C reaches it while a GPU works in native
    code; it then stops every probe, lets the threads return what they have, and re-raises.
    The first exception of a worker is raised here."""
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def work(dev: dict, done: threading.Event) -> None:
        try:
            results[dev["index"]] = fn(dev)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors.append(exc)
            for p in list(probes.values()):
                p.stop()
        finally:
            done.set()

    # Completion is awaited on Events, not Thread.join: on Python <= 3.12 a KeyboardInterrupt
    # inside join() can mark a still-running thread as finished (bpo-45274's clean-up), and a
    # later join() would then return while the GPU is still working.
    batches = [[d] for d in devices] if one_at_a_time else [list(devices)]
    for batch in batches:
        events = [threading.Event() for _ in batch]
        for d, ev in zip(batch, events, strict=True):
            threading.Thread(target=work, args=(d, ev), daemon=True).start()
        try:
            for ev in events:
                while not ev.wait(0.1):
                    pass
        except KeyboardInterrupt:
            for p in list(probes.values()):
                p.stop()
            for ev in events:
                ev.wait()
            raise
        if errors:
            raise errors[0]
    return results
