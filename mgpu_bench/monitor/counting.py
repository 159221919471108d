"""What the monitor measures once, outside the timed steps: the FLOPs of the job's first step and
the profiled window.

FLOPs: torch.utils.flop_counter.FlopCounterMode around the first compute() block, with the same
formulas and the same record of matmuls and convolutions (their shapes, for the measured
ceiling) as workloads.flops.count, which counts a workload mgpu-bench builds; here the job's own
forward, backward and optimizer step run under it (the optimizer's element-wise ops have no
formula: MFU convention counts model FLOPs only). Every formula runs guarded: one that fails on
an odd argument counts 0 and is said, never raised into the training.

Profile: torch.profiler over a few whole steps (CUDA activity on GPUs), started at a step's
start and stopped at a later step's end; the kernels' intervals from its trace are split by the
model probe's analyse.kernel_split (compute, NCCL, NCCL with nothing beside it, idle).
"""

from __future__ import annotations

import contextlib
import warnings


class StepCounter:
    """workloads.flops.Counter, guarded, entered in one compute() block and left at its end."""

    def __init__(self) -> None:
        from mgpu_bench.workloads.flops import Counter

        self.counter = Counter(guarded=True)

    def __enter__(self):
        self.counter.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.counter.__exit__(*exc)

    def result(self, samples: int, device: str):
        """The count as workloads.FlopCount (FLOPs of this rank's step of `samples` samples), or
        None with nothing counted; and a note on failed formulas (or None)."""
        failed = self.counter.failed
        note = f"{len(failed)} FLOP formula(s) failed and counted 0 ({'; '.join(failed)})" if failed else None
        if self.counter.total <= 0:
            return None, note
        return self.counter.result(samples, device, "counted by FlopCounterMode on the job's first step"), note


class ProfileWindow:
    """torch.profiler started now (CUDA activity on a GPU, CPU activity on CPU processes)."""

    def __init__(self, cuda: bool) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.cuda = cuda
        self.prof = profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self.prof.start()

    def stop(self, steps: int) -> dict:
        """Stops it (the profiler waits for the device) and returns the model probe's profile
        record: {"steps", **analyse.kernel_split(kernels)}; no kernels on CPU processes."""
        from mgpu_bench.probes.model.analyse import kernel_split
        from mgpu_bench.probes.model.measure import profiled_kernels

        with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here
            warnings.simplefilter("ignore", UserWarning)
            self.prof.stop()
        kernels = profiled_kernels(self.prof) if self.cuda else []
        return {"steps": steps, **kernel_split(kernels)}

    def abandon(self) -> None:
        with warnings.catch_warnings(), contextlib.suppress(Exception):  # it is dropped either way
            warnings.simplefilter("ignore", UserWarning)
            self.prof.stop()
