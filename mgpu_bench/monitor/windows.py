"""StepMonitor's work away from the hot path: at its first step and at each window's edge. A mixin
of StepMonitor (as ending.py's Ending is); monitor.py holds the state it reads and writes.

- The first step (_setup): the device the step runs on (the user has placed the model by now),
  the two pools of marks (clock.py), the ranks and the job's store (ranks.py), the gradient
  all-reduce's marks or hook on a DDP model (_attach_sync: training/gradsync.py, the reference
  steps of reference.py), the profiled window's steps.
- A window's edge (_edge): the pool before the full one is read back (its steps ended a window
  ago: no wait), summarised (clock.summary), its long steps tallied (probes/model/stalls.py), and
  the window put into the job's store for rank 0, which says a line per window with progress on
  (_say).

This is the costly part of the monitor, done once per window of steps, never inside one.
"""

from __future__ import annotations

import os
import sys

from . import clock


class Windows:
    """StepMonitor's first-step set-up and window edges."""

    def _setup(self) -> None:
        """At the first step: the device (the user has placed the model by now), the ranks, the
        pools and the profiled window."""
        import torch

        dev = self._device_arg
        if dev is None and self.model is not None:
            dev = next((p.device for p in self.model.parameters()), None)
        if dev is None:
            dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        dev = torch.device(dev)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        cuda = dev.type == "cuda"
        from mgpu_bench.probes.model import stalls  # noqa: F401 - imported now, not at the first window edge inside a step
        self._pool = clock.CudaPool(self.window, dev) if cuda else clock.HostPool(self.window)
        self._other = clock.CudaPool(self.window, dev) if cuda else clock.HostPool(self.window)
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            if self.world > 1:
                from .ranks import Exchange, default_store

                store = default_store()
                if store is None:
                    self._notes.append("the job's store could not be reached: each rank's figures stay its own")
                else:
                    run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
                    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
                    self._exchange = Exchange(store, f"mgpu_bench/monitor/{run}/{restart}/{self.name}/{self._instance}",
                                              self.rank, self.world)
        elif self.rank != 0:
            self._notes.append(f"rank {self.rank} of a launcher's job without a process group "
                               "(torch.distributed.init_process_group before the first step gathers the ranks)")
        self._attach_sync(cuda)
        self._hook_exit()
        wanted = self.profile if self.profile is not None else cuda
        if wanted:
            self._prof_start = self.warmup if self.profile_at is None else self.profile_at
            self._prof_end = self._prof_start + self.profile_steps

    def _attach_sync(self, cuda: bool) -> None:
        """When each rank reaches the gradient all-reduce and the communication the backward could
        not hide: by default three marks a step from hooks on the model's own tensors (GradMarks:
        DDP's all-reduce stays its C++ path, and noise_scale=True adds the norms' hooks in the
        steps that take them); with comm_hook=True the all-reduce runs through the communication
        hook with marks (GradSync: its bandwidth too, and there the noise scale's norms)."""
        wanted = self.comm_hook or self.noise_scale
        if (self.comm_hook is False and not self.noise_scale) or self.world < 2:
            if wanted and self.world < 2:
                self._notes.append(f"{'noise_scale' if self.noise_scale else 'comm_hook'}=True: one rank, no "
                                   "gradient all-reduce (the noise scale needs two batch sizes: 2+ DDP ranks)")
            return
        from mgpu_bench.training.gradsync import GradMarks, GradSync

        ddp, why = GradSync.usable(self.model) if self.model is not None else (None, "no model= given")
        if ddp is None:
            if wanted:
                what = "the noise scale not estimated" if self.noise_scale else "not timed"
                self._notes.append(f"{'noise_scale' if self.noise_scale else 'comm_hook'}=True: {what}: {why} "
                                   "(give model=, the DDP model)")
            return
        if self.comm_hook:
            sync = GradSync(cuda, noise=self.noise_scale)
            sync.attach(ddp)
        else:
            sync = GradMarks(cuda, noise=self.noise_scale)
            if not sync.attach(ddp):
                if self.noise_scale:
                    self._notes.append("noise_scale=True: the noise scale not estimated: the model has no parameter "
                                       "with gradients, or this torch lacks post-accumulate-grad hooks")
                return
        self._sync = sync
        for pool in (self._pool, self._other):
            pool.sync_read = sync.read
        if isinstance(sync, GradMarks) and self.reference_every:
            from . import reference

            self._reference = reference.attach(sync, ddp, self.model, cuda, self.reference_every, self._notes)

    def _edge(self) -> None:
        """The pool is full: the one before it is read (its steps ended a window ago), and the
        two change places."""
        cur, other = self._pool, self._other
        if self._sync is not None and self._sync.noise is not None:
            self._sync.noise.rotate()  # the window just filled: its norms' sums start for the host
        if self._unread:
            cols = other.read(cur)
            other.n = 0
            self._add_window(cols)
        self._pool, self._other, self._unread = other, cur, True

    def _add_window(self, cols: dict) -> None:
        tps = self.tokens_per_sample
        cols["tokens"] = [t if t is not None else (tps * s if tps else None)
                          for t, s in zip(cols["tokens"], cols["samples"])]
        s = clock.summary(cols, len(self.windows))
        t = self.totals
        t["steps"] += s["steps"]
        t["samples"] += s["samples"]
        t["tokens"] = None if t["tokens"] is None or s["tokens"] is None else t["tokens"] + s["tokens"]
        t["elapsed_s"] += s["seconds"]
        t["compute_s"] = None if t["compute_s"] is None or s["compute_seconds"] is None else \
            t["compute_s"] + s["compute_seconds"]
        from mgpu_bench.probes.model.stalls import KEPT_EVENTS, tally

        room = KEPT_EVENTS - len(self._stall_events)
        if room > 0:
            self._stall_events.extend(s["stalls"][:room])
        self.stall_sums = tally(self.stall_sums, s["stalls"])
        if self.device.type == "cuda":
            import torch

            s["peak_allocated"] = torch.cuda.max_memory_allocated(self.device)
        self.windows.append(s)
        self._kept.append(cols)
        if self._exchange is None:
            if self.progress and self.rank == 0:
                self._say(s, None)
            return
        try:
            self._exchange.put_window(s)
            if self.rank == 0:
                got = self._exchange.windows()
                for r, w in enumerate(got or []):
                    self._others.setdefault(r, {})[w["window"]] = w
                if self.progress:
                    self._say(s, got)
        except Exception as exc:  # noqa: BLE001 - the store went away (a rank's exit): figures stay per rank
            self._notes.append(f"gathering at window edges stopped ({type(exc).__name__}): a rank's store went away")
            self._exchange = None

    def _say(self, s: dict, ranks: list[dict] | None) -> None:
        """Rank 0's line for a window (stderr)."""
        rate = s["samples"] / s["seconds"] if s["seconds"] > 0 else 0.0
        text = (f"mgpu-bench monitor {self.name}: steps {s['first']}-{s['last']}: {1e3 * s['step_s']:.1f} ms/step, "
                f"{rate * self.world:,.0f} samples/s")
        if s["data_s"] is not None:
            text += f", data wait {100 * s['data_s'] / s['step_s']:.1f}%"
        if ranks and len(ranks) > 1:  # each rank's latest window (ranks.py's lag, on the window medians)
            from .ranks import lags

            lag = [x[0] for x in lags([[r["step_s"]] for r in ranks], [[r["data_s"] or 0.0] for r in ranks])]
            slow = max(range(len(ranks)), key=lambda r: lag[r])
            text += f"; slowest rank {slow}, {1e3 * lag[slow]:.1f} ms behind (its window {ranks[slow]['window']})"
        print(text, file=sys.stderr, flush=True)
