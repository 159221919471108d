"""What a training run means: the verdict, the largest loss first (the step ledger's causes: a late
rank, long steps, the input pipeline, exposed communication, an idle GPU), else memory-,
compute-bound or an unexplained gap, with the figure; the findings per GPU count (the wall clock
against the steady-state step, the straggler, the noise scale), scaling efficiency against the
healthy figure with its likely cause, and the key figure. The figures it judges (throughput,
the stable window, MFU, shares) are figures.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mgpu_bench.results.probe import OK, PROBLEM, WARNING, Finding, Verdict

from . import stalls as stall_rule
from .figures import (
    STABLE_TOLERANCE,
    ModelRun,  # used here; tests import it from here too
    StepStats,
    analyse,  # noqa: F401 - re-exported: tests import it from here
    steady_gap,
    throughput,
    unit,
)
from .kernels import ATTENTION_WORDS, MATMUL_WORDS, NCCL_WORDS, kernel_split  # noqa: F401 - their home before

EXPOSED_COMM_LIMIT = 0.10  # healthy is under 10% of the step
INPUT_LIMIT = 0.10
# The wall clock's rate and the steady-state rate (batch / median step) more than 5% apart: the
# median hides time the run spent (the tolerance the stable window allows its steps).
STEADY_GAP = 0.05
# Long steps (stalls.py) costing more than 10% of the time bound the step, as the other losses'
# healthy limits (exposed communication, the input pipeline, an idle GPU) do.
STALL_LIMIT = 0.10
# The GPU idle (no kernel running) for more than this share of the step: the host cannot keep
# it fed (Python and kernel-launch overhead, synchronisations). A healthy eager 350m step on one
# H200 leaves it idle a few percent at most.
IDLE_LIMIT = 0.10
# Without a profile, a step whose model FLOP rate reaches this share of what the GPU's matmuls
# reach alone on the model's shapes is called compute-bound; below it the gap is unexplained.
NEAR_CEILING = 0.70


_COMM_METHOD = {"no_sync": "the same steps with and without gradient sync, no_sync()",
                "reference": "reference steps: gradient sync off, the all-reduce run after the backward and timed "
                             "alone",
                "hook": "timed in DDP's communication hook: the last gradient bucket ready to the last all-reduce "
                        "done",
                "marks": "the last gradient to the backward's end, DDP's wait for its all-reduce, from hooks on the "
                         "model's tensors"}


def _comm_text(stats: StepStats, share: float, method: str | None) -> str:
    """The communication loss in words: its share, how it was measured, the bandwidth it ran at."""
    d = stats.derived
    if method == "profile":
        return (f"communication-bound: NCCL kernels run with nothing else beside them {100 * share:.1f}% of the step "
                f"(healthy is under {100 * EXPOSED_COMM_LIMIT:.0f}%)")
    of = "of the step"
    step_share = d.get("exposed_comm_share")
    if stats.ledger and stats.ledger.get("method") == method:  # the ledger's share, of every timed step's time
        of = "of the time"
        if step_share is not None and abs(step_share - share) >= 0.01:
            of += f" ({100 * step_share:.1f}% of the steady-state step)"
    line = (f"communication-bound: exposed communication is {100 * share:.1f}% {of} (healthy is under "
            f"{100 * EXPOSED_COMM_LIMIT:.0f}%; {_COMM_METHOD.get(method or '', 'measured')})")
    if d.get("sync_busbw"):
        busy = d["sync_busy_s"] / d["step_s"]
        line += (f": the gradient all-reduce of {d['sync_bytes'] / 1e6:,.1f} MB per step ran "
                 f"{1e3 * d['sync_busy_s']:.1f} ms ({100 * busy:.0f}% of the step, the part "
                 f"hidden behind the backward included) at {d['sync_busbw'] / 1e9:,.2f} GB/s bus bandwidth (set it "
                 "beside `mgpu-bench comm` on the same ranks)")
        if share > busy + 0.02:  # the two figures measure different things: say which
            line += (f"; the step loses more ({100 * share:.1f}%) than the all-reduce itself runs ({100 * busy:.0f}%): "
                     "it slows the compute beside it" + (" (gloo runs on the CPU cores the step computes on)"
                                                         if stats.ranks and not stats.ranks[0].get("gpu_name") else
                                                         " (NCCL's kernels take SMs and memory bandwidth)"))
    return line


def _ledger_of(stats: StepStats, gross: StepStats | None) -> StepStats:
    """The configuration whose ledger the verdict reads: the real DataLoader's where it ran beside
    synthetic data (the job as it trains), else the one measured."""
    return gross if gross is not None and gross.ledger else stats


def losses(stats: StepStats, gross: StepStats | None = None) -> list[tuple[float, str, str]]:
    """The step's losses over their healthy limits, largest first: (share of the time, bound,
    the verdict's words), from the step ledger (ledger.py: a late rank, long steps, the input
    pipeline, exposed communication, the GPU idle inside compute, each second counted once under
    the cause that came first). Documents from before the ledger: their own figures (_old_losses)."""
    src = _ledger_of(stats, gross)
    led = src.ledger
    if not led:
        return _old_losses(stats, gross)
    from . import ledger

    found = {c: x for x, c in ledger.losses(led)}
    both = input_loss(stats, gross)  # --data both: the DataLoader's cost against synthetic data, slowdowns included
    if both is not None and both > max(INPUT_LIMIT, found.get("input", 0.0)):
        found["input"] = both
    out = [(share, _BOUND_OF[cause], _loss_text(stats, src, cause, share, against=cause == "input" and share == both))
           for cause, share in found.items()]
    return sorted(out, key=lambda x: -x[0])


_BOUND_OF = {"straggler": "straggler", "stalls": "stall", "input": "input", "communication": "communication",
             "host": "host"}


def _loss_text(stats: StepStats, src: StepStats, cause: str, share: float, against: bool = False) -> str:
    """A ledger cause over its limit in the verdict's words, with its number and what to do."""
    from . import ledger

    d = src.derived
    limit = f"healthy is under {100 * ledger.LIMITS[cause]:.0f}%"
    if cause == "straggler":
        s = src.straggler or {}
        if s.get("named"):
            from .straggler import cause_text

            return f"straggler-bound: waiting for another rank costs {100 * share:.1f}% of the time ({limit}): " + \
                cause_text(s)
        return (f"rank imbalance: waiting for another rank costs {100 * share:.1f}% of the time ({limit}), and no one "
                "rank is late more than the others: the ranks take turns (noise: shared cores or memory bandwidth, "
                "an uneven host)")
    if cause == "stalls":
        said = stall_rule.text(src.stalls) if src.stalls else None
        return f"stall-bound: long steps cost {100 * share:.1f}% of the time ({limit})" + (f": {said}" if said else "")
    if cause == "input":
        how = ("the real DataLoader's throughput against synthetic data on the device" if against else
               "time outside compute() every rank waited")
        return (f"input-bound: the input pipeline costs {100 * share:.1f}% of the time ({how}; {limit}): raise "
                "--num-workers, or make per-sample preprocessing cheaper")
    if cause == "communication":
        return _comm_text(src, share, src.ledger.get("method"))
    return (f"host-bound: the GPU idles {100 * share:.1f}% of the time inside compute() with the batch in hand "
            f"({limit}): the host does not keep it fed (Python, kernel launches, synchronisations); "
            f"{_rate_text(stats.derived or d)}")


def _old_losses(stats: StepStats, gross: StepStats | None = None) -> list[tuple[float, str, str]]:
    """losses() of a document from before the step ledger: each figure over its limit on its own."""
    d = stats.derived
    out: list[tuple[float, str, str]] = []
    exposed = d.get("exposed_comm_share")
    in_profile = d.get("comm_exposed_kernel_share")
    if exposed is not None and exposed > EXPOSED_COMM_LIMIT:
        out.append((exposed, "communication", _comm_text(stats, exposed, stats.comm_method)))
    elif in_profile is not None and in_profile > EXPOSED_COMM_LIMIT:
        out.append((in_profile, "communication", _comm_text(stats, in_profile, "profile")))
    loss = input_loss(stats, gross)
    if loss is not None and loss > INPUT_LIMIT:
        text = (f"input-bound: the input pipeline costs {100 * loss:.1f}% of the step (raise --num-workers, or make "
                "per-sample preprocessing cheaper)")
        out.append((loss, "input", text))
    elif d.get("data_share", 0) > INPUT_LIMIT:
        text = f"input-bound: waiting for data is {100 * d['data_share']:.1f}% of the step (raise --num-workers)"
        out.append((d["data_share"], "input", text))
    share = d.get("stall_share")
    if share is not None and share > STALL_LIMIT and stats.stalls:
        text = (f"stall-bound: long steps cost {100 * share:.1f}% of the time (healthy is under "
                f"{100 * STALL_LIMIT:.0f}%): {stall_rule.text(stats.stalls)}")
        out.append((share, "stall", text))
    idle = d.get("gpu_idle_share")
    if idle is not None and idle > IDLE_LIMIT:
        text = (f"launch-bound: the GPU idles {100 * idle:.1f}% of the step (healthy is under {100 * IDLE_LIMIT:.0f}%): "
                f"the host does not keep it fed (Python, kernel launches, synchronisations); {_rate_text(d)}")
        out.append((idle, "launch", text))
    return sorted(out, key=lambda x: -x[0])


_SHORT = {"communication": "exposed communication", "input": "the input pipeline", "stall": "long steps",
          "launch": "an idle GPU", "host": "an idle GPU inside compute", "straggler": "waiting for another rank"}


def verdict(stats: StepStats, gross: StepStats | None = None) -> str:
    """What bounds the step, with the deciding figure: the largest of its losses over their
    healthy limits (losses(): communication, input, stalls, launch), the others named after it;
    else memory (it does not fit, or nearly), compute (the GPU busy the whole step, with how the
    time splits and the matmul rate against what this GPU reaches on the same shapes), or an
    unexplained gap below that ceiling. Never compute-bound by default on a GPU: without a
    profile, only near the measured matmul ceiling."""
    d = stats.derived
    if stats.error and "out of memory" in stats.error:
        return "memory-bound: the batch does not fit (out of memory); lower --batch-size or use checkpointing"
    if not d:
        return f"no verdict: {stats.error or 'no steps measured'}"
    exposed = d.get("exposed_comm_share")
    in_profile = d.get("comm_exposed_kernel_share")
    found = losses(stats, gross)
    if found:
        text = found[0][2]
        if len(found) > 1:
            text += "; also " + ", ".join(f"{_SHORT[b]} {100 * x:.1f}%" for x, b, _ in found[1:])
        return text
    mem = d.get("peak_reserved")
    if mem and d.get("total_memory") and mem > 0.95 * d["total_memory"]:
        return f"memory-bound: {100 * mem / d['total_memory']:.0f}% of device memory reserved at peak"
    rate = _rate_text(d)
    idle = d.get("gpu_idle_share")
    if idle is not None:
        return (f"compute-bound: the GPU is busy {100 * (1 - idle):.0f}% of the step: matmuls "
                f"{100 * d['matmul_share']:.0f}%, attention {100 * d['attention_share']:.0f}%, other kernels "
                f"{100 * d['other_kernel_share']:.0f}% (elementwise, norms, optimizer: memory-bound), NCCL alone "
                f"{100 * (in_profile or 0.0):.0f}%; {rate}")
    of = d.get("of_ceiling")
    if of is not None and of < NEAR_CEILING:
        return (f"unexplained gap of {100 * (1 - of):.0f}% below what this GPU's matmuls reach on the model's "
                f"shapes; {rate}; profile it (--profile) to see where the step goes")
    if of is None and d.get("mfu") is None:
        return "compute-bound (CPU processes: no profile or matmul ceiling to hold it against)" + (
            f", exposed communication {100 * exposed:.1f}%" if exposed is not None else "")
    return "compute-bound: " + rate + (f", exposed communication {100 * exposed:.1f}%" if exposed is not None else "")


def _rate_text(d: dict) -> str:
    """MFU against the datasheet and the model's rate against the measured matmul ceiling."""
    parts = []
    if d.get("mfu") is not None:
        parts.append(f"MFU {100 * d['mfu']:.1f}%")
    if d.get("of_ceiling") is not None:
        parts.append(f"{100 * d['of_ceiling']:.0f}% of the {d['matmul_ceiling'] / 1e12:.0f} TFLOP/s this GPU's "
                     "matmuls reach on the model's shapes")
    return ", ".join(parts) or "no peak figure for MFU"


def input_loss(effective: StepStats, gross: StepStats | None) -> float | None:
    """1 - gross throughput (real DataLoader) / effective throughput (synthetic data on the device)."""
    if gross is None or not gross.derived or not effective.derived:
        return None
    return max(0.0, 1.0 - throughput(gross.derived) / throughput(effective.derived))


# Scaling efficiency T_N / (N x T_1): at least SCALING_GOOD is healthy (DDP 1 -> 2 H200: 93.9%,
# RESULTS.md), under SCALING_POOR a problem; above SCALING_ABOVE the baseline itself is suspect.
SCALING_GOOD = 0.90
SCALING_POOR = 0.75
SCALING_ABOVE = 1.05
# A bound share of the step (exposed communication, input pipeline) over twice its healthy
# limit (10%) makes the verdict a problem rather than a warning.
BOUND_PROBLEM = 2.0
BOUNDS = {"shared GPU": "shared", "compute-bound": "compute", "communication-bound": "communication", "input-bound": "input",
          "memory-bound": "memory", "launch-bound": "launch", "host-bound": "host", "stall-bound": "stall",
          "straggler-bound": "straggler", "rank imbalance": "straggler", "unexplained gap": "unexplained",
          "contention": "contention", "no verdict": "none"}


def where(run: ModelRun, n: int) -> str:
    return f"{n} GPU(s)" if run.config.device == "cuda" else f"{n} process(es)"


def verdicts(run: ModelRun, shared: Sequence = ()) -> list[Verdict]:
    """The verdict (verdict()) of each GPU count, ascending, with its severity; on GPUs another
    process also used (occupancy.GpuProcess in `shared`), that is the verdict."""
    from mgpu_bench.machine.occupancy import cause

    out = []
    for n in run.gpu_counts:
        eff, gross = run.get(n, "synthetic"), run.get(n, "loader")
        main = eff or gross
        if main is None:
            continue
        text = in_words_of(run, verdict(main, gross if eff is not None else None))
        causes = list(dict.fromkeys(c for p in shared if (c := cause(p.gpu, list(shared)))))
        if causes and run.config.device == "cuda":
            text = (f"shared GPU: {'; '.join(causes)}: the step's figures are not this GPU's alone "
                    f"({_rate_text(main.derived) if main.derived else 'no steps measured'})")
            out.append(Verdict("shared", PROBLEM, text, where(run, n), n, f"{where(run, n)}: {text}"))
            continue
        contention = _contention(run, n, text)
        if contention is not None:
            eff_n = run.scaling()[n]
            out.append(Verdict("contention", WARNING if eff_n >= SCALING_POOR else PROBLEM, contention, where(run, n),
                               n, f"{where(run, n)}: {contention}"))
            continue
        bound = next((b for prefix, b in BOUNDS.items() if text.startswith(prefix)), "none")
        out.append(Verdict(bound, _severity(run, n, text), text, where(run, n), n, f"{where(run, n)}: {text}"))
    return out


def _severity(run: ModelRun, n: int, text: str) -> str:
    """compute-bound is ok; no verdict or a batch that does not fit is a problem; a bound share
    over BOUND_PROBLEM times its healthy limit is a problem, under it a warning."""
    if text.startswith("compute-bound"):
        return OK
    if text.startswith("unexplained gap"):
        return WARNING
    if text.startswith(("no verdict", "memory-bound: the batch does not fit")):
        return PROBLEM
    eff, gross = run.get(n, "synthetic"), run.get(n, "loader")
    main = eff or gross
    d = main.derived if main is not None else {}
    share, limit = None, None
    if main is not None and _ledger_of(main, gross if eff is not None else None).ledger:
        from . import ledger

        found = losses(main, gross if eff is not None else None)
        if found:
            cause = next(c for c, b in _BOUND_OF.items() if b == found[0][1])
            share, limit = found[0][0], ledger.LIMITS[cause]
        return PROBLEM if share is not None and limit and share > BOUND_PROBLEM * limit else WARNING
    if text.startswith("communication-bound"):
        share = max(d.get("exposed_comm_share") or 0.0, d.get("comm_exposed_kernel_share") or 0.0)
        limit = EXPOSED_COMM_LIMIT
    elif text.startswith("input-bound"):
        loss = input_loss(eff, gross) if eff is not None else None
        share, limit = max(loss or 0.0, d.get("data_share") or 0.0), INPUT_LIMIT
    elif text.startswith("launch-bound"):
        share, limit = d.get("gpu_idle_share"), IDLE_LIMIT
    elif text.startswith("stall-bound"):
        share, limit = d.get("stall_share"), STALL_LIMIT
    return PROBLEM if share is not None and limit and share > BOUND_PROBLEM * limit else WARNING


def findings(run: ModelRun, shared: Sequence = ()) -> list[Finding]:
    """Per GPU count: failed configurations (problems), the verdict, the input-pipeline loss
    where the verdict does not already state it, a run with no stable window; then scaling
    efficiency against the healthy figure, with its likely cause when short."""
    lines: list[Finding] = []
    said = {v.scale: v for v in verdicts(run, shared)}
    for n in run.gpu_counts:
        eff, gross = run.get(n, "synthetic"), run.get(n, "loader")
        main = eff or gross
        if main is None:
            continue
        at = where(run, n)
        for st in (eff, gross):
            if st is not None and st.error:
                lines.append(Finding(PROBLEM, f"{at}, {st.data} data: {st.error}"))
        v = said[n]
        lines.append(Finding(v.severity, v.line))
        src = _ledger_of(main, gross if eff is not None else None)
        if src.ledger and src.ledger.get("steps"):
            from .ledger import line as ledger_line

            lines.append(Finding(OK, f"{at}{', ' + src.data + ' data' if eff is not None and gross is not None else ''}"
                                     f": {ledger_line(src.ledger)}"))
        loss = input_loss(eff, gross) if eff is not None else None
        if loss is not None and not (loss > INPUT_LIMIT and v.text.startswith("input-bound: the input pipeline")):
            lines.append(Finding(WARNING if loss > INPUT_LIMIT else OK,
                                 f"{at}: input-pipeline loss {100 * loss:.1f}% (loader "
                                 f"{throughput(gross.derived):.0f} against synthetic "
                                 f"{throughput(eff.derived):.0f} {unit(eff.derived)})"))
        if main.derived and not main.window[2]:
            lines.append(Finding(WARNING, in_words_of(run, f"{at}: no stable window (step times kept moving by more "
                                                      f"than {100 * STABLE_TOLERANCE:.0f}%): the steady-state step "
                                                      "is the median of every step after warm-up; add --steps")))
        lines += _truth(run, main, at, v)
    for n, e in run.scaling().items():
        if n > 1:
            lines.append(_scaling(run, n, e))
    noise = noise_text(run)
    if noise:
        lines.append(Finding(OK, noise))
    return lines


def noise_text(run: ModelRun) -> str | None:
    """The gradient noise scale's finding (the in-job monitor's noise_scale=True, or model's
    --noise-scale: its synthetic data's) of the largest count that has one, with its cost."""
    from mgpu_bench.training import noise_scale

    found = [s for s in run.stats if s.noise]
    ns = max(found, key=lambda s: s.world).noise if found else run.job.get("noise_scale")
    source = "" if run.workload.get("kind") == "job" else " of the synthetic data (random inputs, not your data's)"
    line = noise_scale.words(ns, source)
    if not line:
        return None
    if ns.get("b_simple") and ns.get("cost_s_per_step") is not None:
        share = ns.get("cost_share")
        line += (f"; its cost {1e3 * ns['cost_s_per_step']:.2f} ms per step"
                 + (f" ({100 * share:.2f}% of the step)" if share is not None else ""))
    return line


def _truth(run: ModelRun, st: StepStats, at: str, v: Verdict) -> list[Finding]:
    """What the wall clock says beside the steady-state step: their gap over STEADY_GAP, the
    long steps (unless the verdict names them), the straggler."""
    out: list[Finding] = []
    d = st.derived
    if not d:
        return out
    gap = steady_gap(d)
    if gap is not None and gap > STEADY_GAP:
        u = "tokens/s" if d.get("tokens_per_s") else "samples/s"
        wall = throughput(d)
        steady = d.get("steady_tokens_per_s") if d.get("tokens_per_s") else d.get("steady_samples_per_s")
        named = v.text.startswith("stall-bound")
        said = stall_rule.cost_text(st.stalls) if st.stalls and st.stalls.get("count") and not named else None
        why = ("the long steps of the verdict" if named else said if said else
               "no single long step explains it: the steps wander (see the step-time plot of --report)")
        out.append(Finding(WARNING, f"{at}: the wall clock's throughput, {wall:,.0f} {u} ({d['measured_steps']} steps "
                                    f"in {d['elapsed_s']:.2f} s), is {100 * gap:.1f}% below the steady-state rate "
                                    f"{steady:,.0f} {u} (batch / the median step, {1e3 * d['step_s']:.1f} ms): {why}"))
    elif st.stalls and st.stalls.get("count") and not v.text.startswith("stall-bound"):
        out.append(Finding(OK, f"{at}: {stall_rule.cost_text(st.stalls)}"))
    s = st.straggler
    if s is None and run.job.get("straggler_text"):  # a job document from before the straggler moved here
        out.append(Finding(WARNING, run.job["straggler_text"]))
    if s is not None:
        who = next((r for r in st.ranks if r.get("rank") == s["rank"]), {})
        place = (f" ({who['device']}" + (f" on {who['host']}" if who.get("host") else "") + ")") if who.get("device") else ""
        from .straggler import straggler_text

        out.append(Finding(WARNING if s["named"] else OK, straggler_text(s, place)))
    return out


# Exposed communication from steps without gradient sync that would make those steps scale by more
# than this against one rank (efficiency / (1 - exposed)): the A/B measured the ranks competing for
# the same cores, not communication, and is not set beside the scaling it contradicts.
CONTRADICTION = 1.25


def reconcile(run: ModelRun) -> None:
    """Drops an exposed-communication figure that contradicts the scaling measured beside it (the
    steps without gradient sync would scale by more than CONTRADICTION) and says so in the notes;
    the figure is kept as exposed_comm_dropped."""
    for n, e in run.scaling().items():
        s = run.effective(n)
        d = s.derived if s is not None else {}
        x = d.get("exposed_comm_share")
        if n < 2 or x is None or x >= 1 or e / (1.0 - x) <= CONTRADICTION:
            continue
        d["exposed_comm_dropped"], d["exposed_comm_share"] = x, None
        d.pop("no_sync_step_s", None)
        s.comm_method = None
        run.notes.append(f"{where(run, n)}: exposed communication left out: the steps without gradient sync ran "
                         f"{e / (1.0 - x):.1f}x as fast per {'GPU' if run.config.device == 'cuda' else 'process'} as one "
                         f"alone beside a scaling efficiency of {100 * e:.1f}%, which cannot both hold (the ranks compete "
                         "for the same CPU cores, so the steps with and without sync measured that)")


# A job the in-job monitor (mgpu_bench.monitor) measured has no mgpu-bench options: its verdicts
# name what to change in the job instead.
_JOB_WORDS = {
    "raise --num-workers": "give the DataLoader more workers",
    "add --steps": "let the job run more steps before finish()",
    "lower --batch-size": "lower the batch size",
}


def in_words_of(run: ModelRun, text: str) -> str:
    """A verdict or finding as the run's user acts on it: mgpu-bench's options for its own runs,
    the job's own levers for a job the monitor measured."""
    if run.workload.get("kind") != "job":
        return text
    for option, words in _JOB_WORDS.items():
        text = text.replace(option, words)
    return text


def _scaling(run: ModelRun, n: int, eff: float) -> Finding:
    """Scaling efficiency 1 -> n against SCALING_GOOD, and why it fell short: exposed
    communication, or a step that grew while communication stayed hidden. Each threshold stands
    beside its own metric."""
    s = run.effective(n)
    exposed = s.derived.get("exposed_comm_share") if s else None
    line = f"scaling 1 -> {n}: efficiency {100 * eff:.1f}% (T_{n} / ({n} x T_1); healthy >= {100 * SCALING_GOOD:.0f}%)"
    why = (f"; exposed communication {100 * exposed:.1f}% of the step (healthy < {100 * EXPOSED_COMM_LIMIT:.0f}%)"
           if exposed is not None else "")
    unit = "GPU" if run.config.device == "cuda" else "process"
    if eff > SCALING_ABOVE:
        return Finding(WARNING, f"{line}{why}: above 100%, so the 1-{unit} baseline ran slower than its share (noise, "
                                "or a throttled or shared first GPU): run again")
    if eff >= SCALING_GOOD:
        return Finding(OK, line + why)
    return Finding(WARNING if eff >= SCALING_POOR else PROBLEM, f"{line}{why}: {_scaling_cause(run, n, eff, exposed)}")


def _scaling_cause(run: ModelRun, n: int, eff: float, exposed: float | None) -> str:
    units = "GPUs" if run.config.device == "cuda" else "processes"
    if exposed is not None and exposed > EXPOSED_COMM_LIMIT and units == "processes":
        # CPU processes: gloo's all-reduce runs on the cores the step computes on, so an exposed
        # share is the ranks competing for them too, whatever share a run happens to measure
        return (f"the step is {1 / eff:.1f}x longer on {n} {units}: the ranks and their all-reduce (gloo) compete "
                "for the same CPU cores, so communication cannot hide behind compute")
    if exposed is not None and exposed > EXPOSED_COMM_LIMIT:
        return "communication-bound: the gradient all-reduce is not hidden behind the backward pass"
    if exposed is not None:
        return (f"the step itself is {1 / eff:.1f}x longer on {n} {units} while communication is hidden: the ranks "
                "compete for shared resources (CPU cores, memory bandwidth, PCIe) or one rank is slow")
    d = run.effective(n).derived if run.effective(n) is not None else {}
    if d.get("exposed_comm_dropped") is not None:
        return "exposed communication could not be told apart from the ranks competing for the cores (see the notes)"
    return "exposed communication was not measured (--exposed-comm)"


def _contention(run: ModelRun, n: int, text: str) -> str | None:
    """A compute-bound verdict at n > 1 ranks whose scaling fell below SCALING_GOOD with the
    communication hidden: the step grew on its own, so the verdict names that instead (a green
    compute-bound above a scaling problem would contradict it)."""
    eff = run.scaling().get(n)
    s = run.effective(n)
    exposed = s.derived.get("exposed_comm_share") if s else None
    cpu = run.config.device != "cuda"  # an exposed share on CPU processes is contention too (_scaling_cause)
    if n < 2 or eff is None or eff >= SCALING_GOOD or not text.startswith(
            ("compute-bound", "communication-bound") if cpu else "compute-bound"):
        return None
    if exposed is None or (exposed > EXPOSED_COMM_LIMIT and not cpu) or eff > SCALING_ABOVE:
        return None
    return (f"contention: scaling 1 -> {n} is {100 * eff:.1f}% (healthy >= {100 * SCALING_GOOD:.0f}%) with "
            f"exposed communication {100 * exposed:.1f}% (healthy < {100 * EXPOSED_COMM_LIMIT:.0f}%): "
            + _scaling_cause(run, n, eff, exposed))


def key_figure(run: ModelRun) -> tuple[str, str]:
    """Scaling at the largest count against the ideal, else tokens/s (samples/s where the workload
    has no tokens) and MFU of the one count."""
    tps = {n: throughput(s.derived) for n in run.gpu_counts
           if (s := run.effective(n)) is not None and throughput(s.derived)}
    if not tps:
        return "-", "-"
    eff = run.scaling()
    u = unit(run.effective(max(tps)).derived)
    if len(tps) >= 2 and 1 in tps:
        n = max(tps)
        fig = f"scaling 1 -> {n}: {100 * eff[n]:.1f}% ({tps[n]:.0f} {u} against the ideal {n * tps[1]:.0f})"
        s = run.effective(n)
        exposed = s.derived.get("exposed_comm_share") if s else None
        exp = f">= {100 * SCALING_GOOD:.0f}%" + (
            f"; exposed communication {100 * exposed:.1f}% (healthy < {100 * EXPOSED_COMM_LIMIT:.0f}%)"
            if exposed is not None else "")
        return fig, exp
    n = max(tps)
    s = run.effective(n)
    fig = f"{where(run, n)}: {tps[n]:.0f} {u}, step {1e3 * s.derived['step_s']:.1f} ms"
    gross = run.get(n, "loader")
    if s.data != "loader" and gross is not None and throughput(gross.derived):
        fig += f" ({throughput(gross.derived):.0f} {u} with the DataLoader)"
    mfu = s.derived.get("mfu")
    peak = run.peak
    if mfu is not None and peak is not None and peak.value:
        return fig, f"MFU {100 * mfu:.1f}% of {peak.value / 1e12:g} TFLOP/s"
    return fig, "no peak figure: no MFU"


def steps_to_fill(model_doc: Mapping | None, duration_s: float) -> int:
    """Steps that fill `duration_s` at the median step time of a model document's run with the
    most GPUs (at least 20); 0 when there is none."""
    try:
        run = max((r for r in model_doc["runs"] if r.get("derived")), key=lambda r: r.get("world", 1))
        return max(20, int(duration_s / run["derived"]["step_s"]))
    except (TypeError, KeyError, ValueError, ZeroDivisionError):
        return 0
