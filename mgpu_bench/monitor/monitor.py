"""StepMonitor: the user's own training loop timed as `mgpu-bench model` times its own.

    mon = StepMonitor(name="bert-large-pretrain", tokens_per_sample=512)
    for batch in loader:
        with mon.step(samples=batch["input_ids"].shape[0]):   # the whole step
            with mon.compute():                                # after the batch is in hand
                loss = model(**batch).loss; loss.backward(); opt.step(); opt.zero_grad()
    report = mon.finish()

The steps, in order: warm-up steps (`warmup`, not timed; the first one that enters compute() is
counted by FlopCounterMode, never timed), the profiled window (`profile_steps` steps from
`profile_at`, not timed: torch.profiler on, then off for good), then timed steps. Timed steps
are recorded into a pool of `window` slots (clock.py); at each window edge the pool before is
read back (its events are long done: no wait), summarised and put into the job's store for rank
0 (ranks.py). The last `keep_steps` steps are kept per step; finish() reads the rest, gathers
every rank's record on rank 0, which builds the model probe's result (result.py), prints it,
stores it and hands the document to every rank.

A job that ends without finish() keeps its figures: an exception out of the loop (the interpreter
runs the monitor's exit hook), SIGTERM or SIGHUP (a scheduler's time limit, torchrun stopping the
job, a closed terminal: kept, then the default action ends the process as it would have; a handler
of the job's own decides instead; a monitor in a worker thread too; a forked child stores nothing:
ending.py), a rank whose peers are gone. The windows measured so far are read, gathered for at most
EARLY_GATHER_S and stored as a run whose status says it ended early; where the history cannot take
it (locked, full, gone) the document is kept in a file, with the `history add` line that stores it.

Misuse never stops the training: a step inside a step, compute() outside a step or inside
compute(), a step without a valid sample count, a step after finish() are ignored with a
MonitorWarning (once per kind; counted in the document's notes), or raise MonitorError with
strict=True. A step without compute() counts as compute only (its data wait 0) and is said. An
exception inside a step is re-raised untouched; that step is left out, the steps before it are
kept and finish() still reports them. A fault in the monitor itself turns it off with one
warning; the training goes on. finish() never raises for misuse: with no step measured it warns
and returns a document whose status says so (nothing stored). Bad arguments to StepMonitor()
raise MonitorError at once, before any step.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import operator
import time
import warnings
from typing import Any

from mgpu_bench.core.errors import InputError

from . import clock
from .ending import Ending
from .windows import Windows

IDLE, IN_STEP, IN_COMPUTE = 0, 1, 2
# The most samples (or tokens) one step of one rank may carry: beyond it a count is a mistake (an
# id, a byte count), and the document's totals would lose their precision.
MAX_PER_STEP = 1 << 40
# A job ending without finish() waits at most this long for its other ranks' records (they end too).
# (A scheduler's SIGKILL follows its SIGTERM after Slurm's KillWait, 30 s by default, or torch
# elastic's 30 s: the run is stored well inside it.)
EARLY_GATHER_S = 5.0
_INSTANCES = itertools.count()  # monitors made in this process: the same order on every rank names their keys


class MonitorError(InputError):
    """StepMonitor misused: bad arguments to StepMonitor() (always raised, before any step), or
    misuse during the training with strict=True."""


class MonitorWarning(UserWarning):
    """StepMonitor misused during the training (the default): the monitor ignores the call and
    the training goes on; each kind is warned once and counted in the document's notes."""


class _Noop:
    """What a misused step() or compute() returns: a context that does nothing."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


_NOOP = _Noop()


class _Step:
    __slots__ = ("mon",)

    def __init__(self, mon: StepMonitor) -> None:
        self.mon = mon

    def __enter__(self):
        self.mon._step_enter()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.mon._step_exit(exc_type)
        return False  # an exception in the step goes on to the training's own code, untouched


class _Compute:
    __slots__ = ("mon",)

    def __init__(self, mon: StepMonitor) -> None:
        self.mon = mon

    def __enter__(self):
        self.mon._compute_enter()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.mon._compute_exit(exc_type)
        return False


def _positive_int(value: Any, what: str, low: int = 1, high: int = 1 << 40, none: bool = False) -> int | None:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise MonitorError(f"StepMonitor({what}={value!r}): give a whole number from {low}" + (" or None" if none else ""))
    if not low <= value <= high:
        raise MonitorError(f"StepMonitor({what}={value}): give a whole number from {low} to {high}")
    return value


def _positive(value: Any, what: str, unit: str) -> float | None:
    if value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = float("nan")
    if isinstance(value, bool) or not (x > 0 and x < float("inf")):
        raise MonitorError(f"StepMonitor({what}={value!r}): give a positive number of {unit}, or None")
    return x


class StepMonitor(Ending, Windows):
    """Times the steps of a training loop inside the job and reports what `mgpu-bench model`
    reports for its own: samples/s and tokens/s (gross and effective), the data wait, MFU,
    peak memory, exposed communication from a short profiled window, the straggler, the verdict.

    name: the job's name; the history keys it as workload "job:NAME" (characters outside
        [A-Za-z0-9_+-.:] become '-').
    tokens_per_sample: tokens per sample, for tokens/s (None: samples/s only, unless step()
        is given tokens).
    model, optimizer: optional; the model gives the device, the parameter count and the
        parallelism (DDP or FSDP); the optimizer's class is recorded.
    flops_per_step: FLOPs of one rank's step (forward + backward, model FLOPs); None: counted
        by FlopCounterMode on the first step that enters compute() (count_flops=False: none).
    peak_tflops: the dense peak per GPU MFU is held against; None: the hardware database's
        figure for `dtype` on this GPU.
    warmup: steps left out first (compile, allocator, autotuning).
    window: steps per window: the pool read back and the ranks' figures gathered at its edges.
    keep_steps: the most recent steps kept per step for the document (older ones stay in
        the window summaries).
    profile: profile `profile_steps` steps from step `profile_at` (default: the first after
        warm-up) with torch.profiler; None: on GPUs, off on CPU processes.
    ceiling: at finish() on GPUs, time the counted matmuls and convolutions alone (the measured
        ceiling); without a count, the best stored gemm run of this GPU is the reference.
    comm_hook: when each rank reaches the gradient all-reduce (the straggler inside compute) and
        the communication the backward could not hide (mgpu_bench.training.gradsync). None (default): for a
        DDP `model` on 2+ ranks, three marks a step from hooks on its own tensors (GradMarks: DDP's
        all-reduce untouched); True: the all-reduce run through torch's default communication hook
        with marks (GradSync), which also gives its time and bus bandwidth, at a cost (on one H200,
        2.4% of a 350m DDP step with DDP's 25 MB buckets); False: neither (but for the noise
        scale's hooks, with noise_scale=True).
    reference_every: with the default marks (comm_hook None), one timed step in this many is a
        reference step (mgpu_bench.monitor.reference): DDP's sync off in its backward, the
        gradients' all-reduce run after it and timed alone, so that the exposed communication is
        the step's time against the same step without it (as `model` measures it with no_sync()),
        not only the tail the marks see; the training still gets the ranks' mean gradient. 0: off
        (the marks' figure). The reference steps' cost is said.
    noise_scale: estimate the gradient noise scale B_simple from each rank's gradient and the
        all-reduced one (mgpu_bench.training.noise_scale: McCandlish et al. 2018, appendix A), per window,
        and what more GPUs buy against it; its cost is measured and said. The norms: in the steps
        that take them, a post-accumulate-grad hook on every parameter (this rank's gradient,
        before DDP's all-reduce) and one multi-tensor norm after DDP's end of backward; no
        collective of its own, DDP's all-reduce untouched (in the communication hook instead with
        comm_hook=True). Off by default; needs a DDP model on 2+ ranks (said once otherwise, the
        training goes on).
    noise_every: the noise scale's norms are taken in one timed step in this many (its cost
        shrinks with it; the estimate averages over the steps that do, so it stays unbiased).
    store, db, prometheus: keep the run in the history database (the default one unless `db`);
        also write a Prometheus textfile.
    json, report: also write the result document / the model report folder.
    print: print the table, the findings and the verdict on rank 0 (stdout).
    progress: a line per window on rank 0 (stderr).
    device: where the step runs; None: the model's device, else the current CUDA device when
        CUDA is available, else the CPU.
    strict: misuse raises MonitorError instead of warning.
    gather_timeout_s: how long rank 0 waits in finish() for the other ranks' records.
    """

    def __init__(self, name: str, tokens_per_sample: int | None = None, *, model: Any = None, optimizer: Any = None,
                 flops_per_step: float | None = None, count_flops: bool = True, peak_tflops: float | None = None,
                 dtype: str = "bf16", warmup: int = 5, window: int = 50, keep_steps: int = 1000,
                 profile: bool | None = None, profile_at: int | None = None, profile_steps: int = 3,
                 ceiling: bool = True, comm_hook: bool | None = None, reference_every: int = 20,
                 noise_scale: bool = False,
                 noise_every: int = 8, store: bool = True, db: str | None = None, json: str | None = None,
                 report: str | None = None, prometheus: str | None = None, print: bool = True,
                 progress: bool = False, device: Any = None, strict: bool = False,
                 gather_timeout_s: float = 120.0) -> None:
        if not isinstance(name, str) or not name.strip():
            raise MonitorError(f"StepMonitor(name={name!r}): give the job's name, e.g. name=\"bert-large-pretrain\"")
        self.name = name.strip()
        self.tokens_per_sample = _positive_int(tokens_per_sample, "tokens_per_sample", none=True)
        self.flops_per_step = _positive(flops_per_step, "flops_per_step", "FLOPs per rank and step")
        self.peak_tflops = _positive(peak_tflops, "peak_tflops", "TFLOP/s per GPU")
        self.gather_timeout_s = _positive(gather_timeout_s, "gather_timeout_s", "seconds") or 120.0
        self.warmup = _positive_int(warmup, "warmup", 0)
        self.window = _positive_int(window, "window", 1, 1_000_000)
        self.keep_steps = _positive_int(keep_steps, "keep_steps", 1, 10_000_000)
        self.profile_steps = _positive_int(profile_steps, "profile_steps", 1, 100)
        self.profile_at = _positive_int(profile_at, "profile_at", 0, none=True)
        if profile not in (None, True, False):
            raise MonitorError(f"StepMonitor(profile={profile!r}): give True, False or None (on GPUs only)")
        if comm_hook not in (None, True, False):
            raise MonitorError(f"StepMonitor(comm_hook={comm_hook!r}): give True, False or None (a DDP model's "
                               "all-reduce timed in its communication hook where it has none of its own)")
        self.comm_hook = comm_hook
        self.reference_every = _positive_int(reference_every, "reference_every", 0, 1_000_000)
        self._reference: Any = None  # reference.Reference, where its steps can run
        if noise_scale not in (True, False):
            raise MonitorError(f"StepMonitor(noise_scale={noise_scale!r}): give True or False")
        self.noise_scale = noise_scale
        self.noise_every = _positive_int(noise_every, "noise_every", 1, 100_000)
        from mgpu_bench.machine import hardware

        try:
            self.dtype = hardware.peak_dtype(str(dtype))
        except InputError:
            raise MonitorError(f"StepMonitor(dtype={dtype!r}): give one of {', '.join(hardware.PEAK_DTYPES)} (the "
                               "dtype whose dense peak MFU is held against)") from None
        self.model, self.optimizer, self._device_arg = model, optimizer, device
        self.count_flops, self.profile, self.ceiling = bool(count_flops), profile, bool(ceiling)
        self.store, self.db, self.prometheus, self.json, self.report = bool(store), db, prometheus, json, report
        self.print, self.progress, self.strict = bool(print), bool(progress), bool(strict)
        if self._writer():  # an output that cannot be written is found now, not after the training
            from mgpu_bench.core.paths import check_distinct, check_report_dir, check_writable

            try:
                db_path = None
                if self.store:
                    from mgpu_bench.history import default_path

                    db_path = db or default_path()
                check_distinct([("StepMonitor(json=...)", json), ("StepMonitor(prometheus=...)", prometheus),
                                ("--report", report)], db_path, "StepMonitor(db=...)" if db else "the history database")
                check_writable(json, "StepMonitor(json=...)")
                check_writable(prometheus, "StepMonitor(prometheus=...)")
                check_report_dir(report, "StepMonitor(report=...)")
                if self.store:
                    from mgpu_bench.history import History

                    History.open(db).close()
            except InputError as exc:
                raise MonitorError(str(exc)) from None
        self._instance = next(_INSTANCES)
        self._state, self._seen, self._raised, self._entered = IDLE, 0, 0, 0
        self._samples, self._tokens = 0, None
        self._step_ctx, self._compute_ctx = _Step(self), _Compute(self)
        self._pool: Any = None  # made at the first step, on the device the step runs on
        self._other: Any = None
        self._unread = False
        self._slot_open = self._discard = False
        self._off: str | None = None  # why the monitor stopped measuring (its own fault)
        self._kept: collections.deque = collections.deque(maxlen=max(1, -(-self.keep_steps // self.window)))
        self.windows: list[dict] = []  # this rank's window summaries (clock.summary)
        self._others: dict[int, dict[int, dict]] = {}  # rank 0: other ranks' window summaries by window
        self._count_pending = self.count_flops and self.flops_per_step is None
        self._counter: Any = None
        self.flop_count: Any = None  # workloads.FlopCount of the first step, when counted
        self._flop_note: str | None = None
        self._profiling: Any = None
        self.profile_record: dict | None = None
        self._prof_start = self._prof_end = -1
        self._misuse_counts: dict[str, int] = {}
        self._notes: list[str] = []
        self._no_compute = 0  # timed steps that never entered compute()
        self._first_step_s: float | None = None
        self._sync: Any = None  # gradsync.GradSync on the DDP model, once attached
        self._early: str | None = None  # why the job ended without finish(), when it did
        self._ending = False  # finish() (or the job's end) under way
        # every timed step's sums (the windows': steps no longer kept per step count too), and its stalls
        self.totals: dict[str, Any] = {"steps": 0, "samples": 0, "tokens": 0, "elapsed_s": 0.0, "compute_s": 0.0}
        self._stall_events: list[list] = []  # the first stalls.KEPT_EVENTS, [index, excess s, where]
        self.stall_sums: dict | None = None  # stalls.tally of them all
        self._t_first = 0.0
        self._doc: dict | None = None
        self._finished = False
        self.device: Any = None
        self.rank, self.world, self._exchange = self._launcher_rank(), 1, None

    # -- the public face ---------------------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Steps completed so far (warm-up and profiled ones included; steps that raised not)."""
        return self._seen

    def step(self, samples: int, tokens: int | None = None):
        """A context timing one whole step of `samples` samples on this rank (and `tokens`
        tokens, where they vary per step; else tokens_per_sample x samples)."""
        if self._state != IDLE or self._finished:
            return self._misuse("step-after-finish" if self._finished else "nested-step",
                                "step() after finish(): the step is not measured" if self._finished else
                                "step() inside a step: the inner step is ignored (one step per iteration of the "
                                "training loop)")
        if samples.__class__ is not int or not 0 < samples <= MAX_PER_STEP:
            samples = self._samples_of(samples)
            if samples is None:
                return _NOOP
        if tokens is not None and (tokens.__class__ is not int or not 0 <= tokens <= MAX_PER_STEP):
            tokens = self._tokens_of(tokens)
        self._samples, self._tokens = samples, tokens
        return self._step_ctx

    def compute(self):
        """A context around the part of the step after the batch is in hand (forward, backward,
        optimizer step); the rest of the step is the data wait."""
        if self._state != IN_STEP:
            return self._misuse("compute-outside" if self._state == IDLE else "nested-compute",
                                "compute() outside a step: ignored (put it inside `with mon.step(...)`)"
                                if self._state == IDLE else "compute() inside compute(): the inner one is ignored")
        return self._compute_ctx

    def finish(self) -> dict:
        """Ends the monitoring: reads back the last steps, gathers every rank's figures on rank 0,
        which prints the table, the findings and the verdict, stores the run and writes the
        files it was asked for. Returns the result document (a `model` document of workload
        job:NAME) on every rank. Never raises for misuse (see the module's docs); a second call
        returns the same document."""
        return self._end(None)

    def _end(self, early: str | None) -> dict:
        """finish(), or (early: why) the job's end without it: the same document, marked as ended
        early, its gathering bounded by EARLY_GATHER_S."""
        if self._doc is not None or self._ending:
            return self._doc or {}
        self._finished, self._ending = True, True
        self._early = early
        pending = self._defer_term()
        try:
            doc = self._finish()
        except (KeyboardInterrupt, MonitorError):  # MonitorError: misuse with strict=True
            self._ending = False
            self._redeliver(pending)
            raise
        except Exception as exc:  # noqa: BLE001 - the training is done; its end must not be a traceback of ours
            text = f"mgpu-bench monitor: finish() failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); nothing stored"
            warnings.warn(text, MonitorWarning, stacklevel=2)
            doc = {"kind": "model", "status": {"completed": False, "stopped": "failed", "message": text}, "runs": []}
        self._doc = doc
        self._ending = False
        self._redeliver(pending)
        return doc

    def __repr__(self) -> str:
        return f"StepMonitor({self.name!r}, steps={self._seen}, windows={len(self.windows)})"

    # -- misuse ------------------------------------------------------------------------------------

    def _misuse(self, kind: str, text: str, stacklevel: int = 3):
        """Ignored with a MonitorWarning (once per kind, every one counted), or MonitorError
        when strict; `stacklevel` points the warning at the training's own line."""
        if self.strict:
            raise MonitorError(text)
        self._misuse_counts[kind] = self._misuse_counts.get(kind, 0) + 1
        if self._misuse_counts[kind] == 1:
            warnings.warn(f"mgpu-bench monitor: {text}", MonitorWarning, stacklevel=stacklevel)
        return _NOOP

    def _samples_of(self, samples: Any) -> int | None:
        if type(samples).__module__.startswith("torch") and hasattr(samples, "device"):
            self._misuse("samples", "step(samples=<a tensor>): give an int (batch.shape[0]; reading a tensor's value "
                                    "would synchronise the device): the step is not measured", stacklevel=4)
            return None
        try:
            n = operator.index(samples) if not isinstance(samples, bool) else -1
        except TypeError:
            n = -1
        if not 0 < n <= MAX_PER_STEP:
            self._misuse("samples", f"step(samples={samples!r}): give the step's samples on this rank as a positive int "
                                    f"(at most {MAX_PER_STEP:,}): the step is not measured", stacklevel=4)
            return None
        return n

    def _tokens_of(self, tokens: Any) -> int | None:
        try:
            n = operator.index(tokens) if not isinstance(tokens, bool) and not hasattr(tokens, "device") else -1
        except TypeError:
            n = -1
        if not 0 <= n <= MAX_PER_STEP:
            self._misuse("tokens", f"step(tokens={tokens!r}): give the step's tokens as a whole number up to "
                                   f"{MAX_PER_STEP:,} (or leave it out): tokens_per_sample x samples counts instead",
                         stacklevel=4)
            return None
        return n

    def _reference_off(self) -> None:
        if self._reference is not None:
            self._reference.off()

    def _fault(self, exc: BaseException) -> None:
        """The monitor's own fault: it stops measuring, the training goes on."""
        if self._off is None:
            self._off = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            warnings.warn(f"mgpu-bench monitor: stopped measuring after {self._seen} step(s) ({self._off}); the "
                          "steps measured before are kept", MonitorWarning, stacklevel=4)
        self._reference_off()
        self._slot_open = False
        if self._profiling is not None:
            self._profiling.abandon()
            self._profiling = None
        if self._counter is not None:
            counter, self._counter = self._counter, None
            with contextlib.suppress(Exception):  # it is dropped either way
                counter.__exit__(None, None, None)

    # -- the hot path ------------------------------------------------------------------------------

    def _step_enter(self) -> None:
        self._state = IN_STEP
        if self._off is not None:
            return
        try:
            if self._pool is None:
                self._setup()
            i = self._seen
            if i == self._prof_start:
                from .counting import ProfileWindow

                self._profiling = ProfileWindow(self.device.type == "cuda")
            if i == 0:
                self._t_first = time.perf_counter()
            k = self._entered  # steps entered, the ones that raise included: a slot's index
            self._entered = k + 1
            if i >= self.warmup and self._profiling is None:
                pool = self._pool
                n = pool.n
                pool.index[n] = k
                pool.samples[n] = self._samples
                pool.tokens[n] = self._tokens
                pool.computed[n] = False
                pool.reference[n] = False
                pool.mark(clock.START)
                self._slot_open = True
        except Exception as exc:  # noqa: BLE001 - the monitor's fault, not the training's
            self._fault(exc)

    def _compute_enter(self) -> None:
        self._state = IN_COMPUTE
        if self._off is not None:
            return
        try:
            if self._slot_open:
                pool = self._pool
                if not pool.computed[pool.n]:
                    pool.computed[pool.n] = True
                    pool.mark(clock.COMPUTE_START)
                    if self._sync is not None:
                        self._sync.slot = pool.sync_slot()
                        noisy = False
                        if self._sync.noise is not None:
                            noisy = self._sync.noise.active = self._seen % self.noise_every == 0
                            self._sync.arm()
                        ref = self._reference
                        if ref is not None and not noisy and ref.wanted(pool.index[pool.n]):
                            pool.reference[pool.n] = ref.begin(pool.index[pool.n])
            if self._count_pending and self._profiling is None:
                self._count_pending = False
                self._discard = True  # a counted step runs slower: never timed
                from .counting import StepCounter

                counter = StepCounter()
                counter.__enter__()
                self._counter = counter
        except Exception as exc:  # noqa: BLE001
            self._fault(exc)

    def _compute_exit(self, exc_type) -> None:
        self._state = IN_STEP
        if self._off is not None:
            return
        try:
            if self._slot_open:
                self._pool.mark(clock.COMPUTE_END)
            if self._sync is not None:
                if self._reference is not None and self._reference.active:
                    self._reference.end(getattr(self._sync.slot, "backwards", None), exc_type is None)
                if self._sync.noise is not None and self._sync.slot is not None:
                    self._sync.noise.end_step(self._samples)
                    self._sync.disarm()
                self._sync.slot = None
            if self._counter is not None:
                counter, self._counter = self._counter, None
                counter.__exit__(exc_type, None, None)
                if exc_type is None:
                    self.flop_count, self._flop_note = counter.result(self._samples, str(self.device))
                else:
                    self._count_pending = True  # the step raised: the next one is counted
        except Exception as exc:  # noqa: BLE001
            self._fault(exc)

    def _step_exit(self, exc_type) -> None:
        self._state = IDLE
        if self._off is not None:
            if exc_type is None:
                self._seen += 1
            return
        try:
            pool = self._pool
            if self._slot_open:
                self._slot_open = False
                if exc_type is None and not self._discard:
                    pool.mark(clock.END)
                    if not pool.computed[pool.n]:
                        self._no_compute += 1
                        if self._no_compute == 1:
                            self._misuse("no-compute", f"step {self._seen} ran without mon.compute(): its data wait "
                                                       "cannot be told apart and counts as 0 (wrap the forward, "
                                                       "backward and optimizer step in `with mon.compute():`)", stacklevel=4)
                    pool.n += 1
            self._discard = False
            if exc_type is not None:
                self._raised += 1
                if self._profiling is not None:
                    self._profiling.abandon()
                    self._profiling = None
                    self._notes.append("the profiled window ended in an exception: no profile")
                return
            if self._seen == 0:
                self._first_step_s = time.perf_counter() - self._t_first
            self._seen += 1
            if self._profiling is not None and self._seen == self._prof_end:
                window, self._profiling = self._profiling, None
                self.profile_record = window.stop(self.profile_steps)
            if pool.n == pool.size:
                self._edge()
        except MonitorError:
            raise
        except Exception as exc:  # noqa: BLE001
            self._fault(exc)

    # -- finish ------------------------------------------------------------------------------------

    @staticmethod
    def _launcher_rank() -> int:
        from mgpu_bench.core.launch import detect

        try:
            le = detect()
        except InputError:
            return 0
        return 0 if le is None else le.rank

    def _writer(self) -> bool:
        return self._launcher_rank() == 0

    def _finish(self) -> dict:
        from . import result

        if self._state != IDLE and self._early is not None:  # the job ended inside a step: that step is left out
            self._state, self._slot_open = IDLE, False
            if self._counter is not None:
                self._fault(RuntimeError("the job ended inside the counted step"))
        self._reference_off()
        if self._state != IDLE:
            self._misuse("finish-in-step", "finish() inside a step: the open step is left out")
            self._state, self._slot_open = IDLE, False
            if self._counter is not None:
                self._fault(RuntimeError("finish() inside the counted step"))
        if self._profiling is not None:
            self._profiling.abandon()
            self._profiling = None
            self._notes.append(f"finish() came inside the profiled window (steps {self._prof_start}-"
                               f"{self._prof_end - 1}): no profile")
        if self._pool is not None and self._off is None:
            try:
                if self.device.type == "cuda":
                    import torch

                    torch.cuda.synchronize(self.device)
                if self._unread:
                    cols = self._other.read(self._pool)
                    self._other.n = 0
                    self._add_window(cols)
                if self._pool.n:
                    cols = self._pool.read(None)
                    self._pool.n = 0
                    self._add_window(cols)
                self._unread = False
            except Exception as exc:  # noqa: BLE001
                self._fault(exc)
        record = result.record(self)
        if self._exchange is None:
            return result.conclude(self, [record])
        try:
            self._exchange.put_final(record)
        except Exception as exc:  # noqa: BLE001 - the store is gone: this rank reports alone
            self._notes.append(f"the job's store went away ({type(exc).__name__}): this rank's figures alone")
            self._exchange = None
            return result.conclude(self, [record])
        wait = self.gather_timeout_s if self._early is None else min(self.gather_timeout_s, EARLY_GATHER_S)
        if self._early is not None:  # a store whose server went with the job must not hold the end for minutes
            with contextlib.suppress(Exception):
                import datetime

                self._exchange.store.set_timeout(datetime.timedelta(seconds=wait))
        if self.rank == 0:
            records = self._exchange.finals(wait)
            records[0] = record
            doc = result.conclude(self, records)
            with contextlib.suppress(Exception):  # the others fall back to their own record
                self._exchange.put_doc(doc)
            return doc
        doc = self._exchange.doc(2 * wait)
        if doc is None:
            warnings.warn(f"mgpu-bench monitor: rank 0 gave no result document within {2 * self.gather_timeout_s:g} "
                          "s; this rank's own figures are returned", MonitorWarning, stacklevel=3)
            return result.conclude(self, [record], alone=True)
        return doc

    def misuse_notes(self) -> list[str]:
        """The misuse counted, in words, for the document's notes."""
        words = {"nested-step": "step() inside a step (ignored)", "compute-outside": "compute() outside a step (ignored)",
                 "nested-compute": "compute() inside compute() (ignored)", "samples": "step() without a valid samples= "
                 "(not measured)", "tokens": "step() with an invalid tokens= (tokens_per_sample counted instead)",
                 "step-after-finish": "step() after finish() (not measured)", "finish-in-step": "finish() inside a "
                 "step (that step left out)"}
        out = [f"{n} x {words[k]}" for k, n in self._misuse_counts.items() if k in words]
        if self._no_compute:
            out.append(f"{self._no_compute} timed step(s) never entered compute(): their data wait counts as 0")
        if self._raised:
            out.append(f"{self._raised} step(s) raised an exception and are left out")
        if self._off:
            out.append(f"the monitor stopped measuring after a fault of its own ({self._off})")
        return out
