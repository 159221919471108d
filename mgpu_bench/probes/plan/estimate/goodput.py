"""--noise-scale: the plan's throughput weighed by what each sample of its global batch is worth.

Under data parallelism the global batch grows with the GPUs, and past the gradient noise scale
B_noise a larger batch buys few fewer steps (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training": S = S_min (1 + B_noise / B)). Pollux (Qiao et al., OSDI 2021) gives a batch
B the statistical efficiency

    E = (B_noise + B_0) / (B_noise + B)

against the batch B_0 the job was tuned at (mgpu_bench.training.noise_scale.efficiency): training at B
needs 1 / E times the samples of B_0 for the same progress (the samples to a loss go as
E_min (1 + B / B_noise) in McCandlish et al.'s model, whose ratio at B_0 and B this is; below B_0,
E > 1: fewer samples, more steps). So, beside each plain figure of a GPU count: goodput =
throughput x E, and the days to the same training progress = the plain days / E.

B_noise is a stored run's (the in-job monitor's `StepMonitor(..., noise_scale=True)`, whose
document keeps it with its jackknife error and the job's global batch, B_0 by default), or a
number given with --noise-batch. Its range: E at B_noise +- twice its standard error, as the
plan's other ranges take twice the noise. Plain data in, plain data out: the payload's points,
answer and alternatives get their figures added; nothing here changes a plain figure."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from mgpu_bench.core.errors import InputError
from mgpu_bench.training import noise_scale

from .. import text
from ..config import COUNT_UNITS

MAX_NOISE = 1e15  # samples: a noise scale or batch beyond is a typo, far past any batch a job trains at
_RUN = re.compile(r"^\s*(r\d{1,18}|latest)\s*$", re.IGNORECASE)
_NUMBER = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*([kmbgt]?)\s*(?:samples?)?\s*$",
                     re.IGNORECASE)
JOB, SYNTHETIC = "job", "synthetic"  # whose noise scale a stored run holds: a StepMonitor job's, model's own
POLLUX = "Pollux (Qiao et al., OSDI 2021): E = (B_noise + B_0) / (B_noise + B)"
NOISE_HELP = ("The gradient noise scale of your job: a stored run (r12, latest) of a job monitored with "
              "StepMonitor(..., noise_scale=True), or a number of samples (2000, 1.5K; a bare number is samples, "
              "write r12 for run 12). Each GPU count then gets its global batch's statistical efficiency E = "
              "(B_noise + B_0) / (B_noise + B) (Pollux, Qiao et al. OSDI 2021), the goodput (throughput x E) and "
              "the days to the same training progress (the days / E).")
BATCH_HELP = ("B_0 for --noise-scale: the global batch (samples) the job was tuned at [default: the stored run's "
              "global batch when it measured the noise scale; needed with a number].")


@dataclass(frozen=True)
class NoiseScale:
    """B_noise and B_0 in samples, each with where it came from. `run`: the stored run (None:
    given); `workload`: the key of the workload it was measured on (None: given); `whose`: the
    job's or the model probe's synthetic data's; `per_window`: the run's own estimate per window."""

    b_noise: float
    stderr: float | None
    b0: float
    b0_source: str
    source: str
    run: str | None = None
    workload: str | None = None
    whose: str | None = None
    tokens_per_sample: int | None = None
    steps: int | None = None
    windows: int | None = None
    per_window: list = field(default_factory=list)

    def efficiency(self, batch: float) -> tuple[float, float, float]:
        """E at `batch` samples, and its range over B_noise +- 2 standard errors."""
        e = noise_scale.efficiency(self.b_noise, self.b0, batch)
        if not self.stderr:
            return e, e, e
        ends = [noise_scale.efficiency(max(0.0, self.b_noise + k * self.stderr), self.b0, batch) for k in (-2, 2)]
        return e, min(ends), max(ends)


def _number(given: str, flag: str) -> float | None:
    """A count of samples (2000, 1.5K, 2e6); None where `given` is no number."""
    m = _NUMBER.match(given or "")
    if not m:
        return None
    value = float(m.group(1)) * COUNT_UNITS[m.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{flag} {given.strip()}: a noise scale is a positive number of samples (2000, 1.5K), or a "
                         "stored run (r12, latest)")
    if value > MAX_NOISE:
        raise InputError(f"{flag} {given.strip()}: at most {MAX_NOISE:.0e} samples; check the unit")
    return value


def check(given: str | None, batch: float | None) -> None:
    """--noise-scale and --noise-batch as configure() sees them, before the history is opened."""
    if given is None:
        if batch is not None:
            raise InputError(f"--noise-batch {batch:g} without --noise-scale: give the noise scale it goes with "
                             "(--noise-scale r12, a stored run, or a number of samples)")
        return
    if batch is not None and not (math.isfinite(batch) and 0 < batch <= MAX_NOISE):
        raise InputError(f"--noise-batch {batch:g}: the batch the job was tuned at, in samples: more than 0, at most "
                         f"{MAX_NOISE:.0e}")
    if _RUN.match(given):
        return
    value = _number(given, "--noise-scale")
    if value is None:
        raise InputError(f"--noise-scale {given.strip()!r}: give a stored run (r12, latest: `mgpu-bench history list`) "
                         "or a number of samples (2000, 1.5K)")
    if batch is None:
        run = f" (or r{given.strip()} for the stored run)" if given.strip().isdigit() else ""
        raise InputError(f"--noise-scale {given.strip()} is a number of samples: give --noise-batch B0, the global batch "
                         f"the job was tuned at{run}")


def resolve(given: str | None, batch: float | None, history) -> NoiseScale | None:
    """The noise scale --noise-scale names (check() passed): a number, or a stored run's (History),
    InputError where that run has none."""
    if given is None:
        return None
    if not _RUN.match(given):
        value = _number(given, "--noise-scale")
        return NoiseScale(value, None, float(batch), "--noise-batch",
                          f"--noise-scale {text.samples(value)} samples (given; no uncertainty)")
    rec = history.get(given.strip())  # InputError naming the fix for an unknown run
    doc = rec.document
    found, whose = stored(doc)
    flag = f"--noise-scale {given.strip()}"
    if found is None:
        raise InputError(f"{flag}: {rec.run_id} (a {rec.kind} run) has no gradient noise scale: give the run of a "
                         "job monitored with StepMonitor(..., noise_scale=True) (`mgpu-bench history list`), or a "
                         "number of samples with --noise-batch")
    b = found.get("b_simple")
    if not isinstance(b, (int, float)) or not b > 0:
        raise InputError(f"{flag}: {rec.run_id}'s noise scale could not be estimated (its |G|^2 estimate was not "
                         "positive: too few steps or too noisy a gradient): monitor a longer stretch, or give a number "
                         "with --noise-batch")
    if batch is None and not (isinstance(found.get("b_big"), (int, float)) and found["b_big"] > 0):
        raise InputError(f"{flag}: {rec.run_id} does not say the global batch it measured at: give --noise-batch B0")
    w = doc.get("workload") or {}
    err = found.get("stderr") if isinstance(found.get("stderr"), (int, float)) and found["stderr"] > 0 else None
    steps, windows = found.get("steps"), found.get("windows")
    spread = (f" +- {text.samples(err)} (the jackknife over its windows)" if err else
              " (no uncertainty: under 3 windows)")
    source = (f"{rec.run_id}: {_whose(whose, w.get('key'))}, B_simple over {steps} steps in {windows} window(s){spread} "
              "(McCandlish et al. 2018, appendix A)")
    b0, b0_source = (float(batch), "--noise-batch") if batch is not None else \
        (float(found["b_big"]), f"{rec.run_id}: the global batch it measured the noise scale at")
    # each window's own estimate, in order; None where a window had none (kept: its place in time)
    per = [float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None
           for x in found.get("per_window") or []]
    return NoiseScale(float(b), err, b0, b0_source, source, rec.run_id, w.get("key"), whose,
                      w.get("tokens_per_sample"), steps, windows, per)


def stored(doc: Mapping) -> tuple[dict | None, str | None]:
    """A stored document's noise scale: the in-job monitor's (job.noise_scale), else a model run's
    own (workload.noise_scale: its synthetic data's), and whose it is."""
    job = doc.get("job") if isinstance(doc.get("job"), Mapping) else {}
    if isinstance(job.get("noise_scale"), Mapping):
        return dict(job["noise_scale"]), JOB
    w = doc.get("workload") if isinstance(doc.get("workload"), Mapping) else {}
    if isinstance(w.get("noise_scale"), Mapping):
        return dict(w["noise_scale"]), SYNTHETIC
    return None, None


def _whose(whose: str | None, key) -> str:
    if whose == SYNTHETIC:
        return f"the model run of {key} on its synthetic data (random inputs, not your data's)"
    return f"the StepMonitor job {key}"


def _figures(d: Mapping, samples: float | None, step_s: float | None, tokens: int | None, ns: NoiseScale) -> dict:
    """E, goodput and the days to the same progress for a configuration of `samples` per step."""
    if not samples:
        return {}
    e, lo, hi = ns.efficiency(samples)
    out = {"global_batch": samples, "stat_efficiency": e, "stat_efficiency_low": lo, "stat_efficiency_high": hi,
           "doubling_fewer_steps": noise_scale.fewer_steps(samples, ns.b_noise)}
    if step_s:
        out["goodput"] = samples * (tokens or 1) / step_s * e
    days, d_lo, d_hi = d.get("days"), d.get("days_low"), d.get("days_high")
    if days is not None:
        out["days_progress"] = days / e
        out["days_progress_low"] = (d_lo if d_lo is not None else days) / hi
        out["days_progress_high"] = (d_hi if d_hi is not None else days) / lo if lo > 0 else None
    return out


def apply(payload: dict, ns: NoiseScale | None) -> None:
    """Adds the noise scale's figures to the payload build.plan() made: to every curve and
    measured point, the answer (at its GPU count's point) and what fits instead; its figures
    with their sources, and notes on where it came from."""
    if ns is None:
        return
    w = payload.get("workload") or {}
    tokens = w.get("tokens_per_sample")
    for p in [*(payload.get("curve") or []), *(payload.get("measured_points") or [])]:
        p.update(_figures(p, p.get("samples"), p.get("step_s"), tokens, ns))
    a = payload.get("answer")
    if a and a.get("fits") is not False and a.get("gpus"):
        point = next((p for p in payload.get("curve") or [] if p["gpus"] == a["gpus"]), None)
        if point is not None:  # a's days are its GPU count's projection, the point's (for --days too)
            a.update(_figures(point, point.get("samples"), point.get("step_s"), tokens, ns))
    for o in (a or {}).get("instead") or []:
        if o.get("global_batch"):
            o.update(_figures(o, o["global_batch"], o.get("step_s"), tokens, ns))
    payload["noise_scale"] = {**asdict(ns), "unit": "samples", "formula": POLLUX,
                              "same_workload": ns.workload == w.get("key") if ns.workload else None}
    figures = payload.setdefault("figures", [])
    figures.append({"name": "gradient noise scale B_noise", "value": ns.b_noise, "unit": "samples",
                    "source": ns.source})
    figures.append({"name": "tuned at batch B_0", "value": ns.b0, "unit": "samples", "source": ns.b0_source})
    if a and a.get("stat_efficiency") is not None:
        figures.append({"name": f"statistical efficiency at {a['gpus']} GPUs", "value": a["stat_efficiency"],
                        "unit": "x", "source": f"formula: {POLLUX}, at the global batch {a['global_batch']:,} "
                                               "samples"})
    payload.setdefault("notes", []).extend(_notes(ns, w))


def _notes(ns: NoiseScale, w: Mapping) -> list[str]:
    key = w.get("key")
    out = []
    if ns.run is None:
        out.append(f"--noise-scale: {text.samples(ns.b_noise)} samples, as given, taken as {key}'s at this sample size")
    elif ns.workload != key:
        out.append(f"--noise-scale {ns.run}: the noise scale is that of {_whose(ns.whose, ns.workload)}, measured on "
                   f"its model and data, not on {key}: the efficiency holds as far as {key}'s gradients are as noisy")
    elif ns.whose == SYNTHETIC:
        out.append(f"--noise-scale {ns.run}: the noise scale is {key}'s on the model probe's synthetic data (random "
                   "inputs): your data's may differ; StepMonitor(..., noise_scale=True) measures it in your job")
    if ns.run and ns.tokens_per_sample and w.get("tokens_per_sample") and ns.tokens_per_sample != \
            w.get("tokens_per_sample"):
        out.append(f"--noise-scale {ns.run}: its samples are {ns.tokens_per_sample} tokens, the plan's "
                   f"{w['tokens_per_sample']}: batches are set against it in samples")
    if sum(x is not None for x in ns.per_window) >= 2:  # a trend only where a test finds one (noise_scale.py)
        out.append(f"--noise-scale {ns.run}: {noise_scale.trend_words(ns.per_window, ns.b_noise)}")
    return out
