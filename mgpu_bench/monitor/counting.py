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
import json
import os
import warnings


class StepCounter:
    """FlopCounterMode entered in one compute() block and left at its end."""

    def __init__(self) -> None:
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        from mgpu_bench.workloads import flops

        base = FlopCounterMode(display=False).flop_registry  # torch's formulas, each taking raw arguments
        self.seen: dict[str, dict] = {}
        self.failed: list[str] = []
        dense = {getattr(torch.ops.aten, n, None): n for n in flops.DENSE_OPS}
        mapping = {packet: self._guarded(formula, dense.get(packet), True) for packet, formula in base.items()}
        for packet, formula in flops._attention_formulas().items():  # shape formulas: FlopCounterMode wraps them
            mapping[packet] = self._guarded(formula, None, False)
        self._spec = flops._spec
        self.mode = FlopCounterMode(display=False, custom_mapping=mapping)

    def _guarded(self, formula, dense_name: str | None, raw: bool):
        def guarded(*args, out_val=None, **kwargs):
            try:
                n = formula(*args, out_val=out_val, **kwargs)
                if dense_name is not None:
                    spec = {"op": dense_name, "args": self._spec(args), "kwargs": self._spec(kwargs)}
                    row = self.seen.setdefault(json.dumps(spec, sort_keys=True), {**spec, "count": 0,
                                                                                  "flops": float(n)})
                    row["count"] += 1
                return n
            except Exception as exc:  # noqa: BLE001 - a formula's fault must not reach the job's step
                if len(self.failed) < 5:
                    self.failed.append(f"{getattr(formula, '__name__', 'formula')}: {type(exc).__name__}")
                return 0

        guarded._get_raw = raw
        return guarded

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)

    def result(self, samples: int, device: str):
        """The count as workloads.FlopCount (FLOPs of this rank's step of `samples` samples), or
        None with nothing counted; and a note on failed formulas (or None)."""
        from mgpu_bench.workloads import FlopCount

        total = float(self.mode.get_total_flops())
        note = f"{len(self.failed)} FLOP formula(s) failed and counted 0 ({'; '.join(self.failed)})" \
            if self.failed else None
        if total <= 0:
            return None, note
        ops = tuple(sorted(self.seen.values(), key=lambda r: -r["flops"] * r["count"]))
        return FlopCount(total, samples, device, ops, "counted by FlopCounterMode on the job's first step"), note


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
        from mgpu_bench import children
        from mgpu_bench.probes.model.analyse import kernel_split

        with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here
            warnings.simplefilter("ignore", UserWarning)
            self.prof.stop()
        kernels = []
        if self.cuda:
            with children.temp_folder("mgpu-monitor-prof-") as tmp:
                path = os.path.join(tmp, "trace.json")
                self.prof.export_chrome_trace(path)
                with open(path) as f:
                    events = json.load(f).get("traceEvents") or []
            kernels = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur") or 0.0), str(e.get("name")))
                       for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
        return {"steps": steps, **kernel_split(kernels)}

    def abandon(self) -> None:
        with warnings.catch_warnings(), contextlib.suppress(Exception):  # it is dropped either way
            warnings.simplefilter("ignore", UserWarning)
            self.prof.stop()
