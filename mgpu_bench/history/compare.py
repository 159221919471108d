"""Comparing runs: per metric the change against a noise-aware threshold, and what differs
between the two machines' fingerprints (driver, NCCL, GPUs, topology, NCCL_* / CUDA_* variables).

A change is judged in the only three ways the figures allow: it is beyond the noise (regression
or improvement), within it (inside one spread: the runs agree), or too close to the noise to say
("cannot tell": larger than the quieter run's spread, yet under NOISE_K of the larger one). A
drop larger than either run's spread is never "within noise". Ratios are judged as the log of new / base against the
spread, so that a 10x drop (-90%) and a 10x gain (+900%) are the same distance from no change.
On a host too noisy to compare (noisy_host: busy when a CPU run started, or figures that spread
more than NOISY_SPREAD within the run) every metric's spread is at least the run's own typical
spread: two identical runs drifting apart on such a host are "cannot tell", not regressions.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from mgpu_bench.core.errors import InputError
from mgpu_bench.results.metrics import Metric

from .records import utc_now
from .store import History

# -- comparison -------------------------------------------------------------------------------

# A metric regresses when it is worse by more than max(tolerance, NOISE_K x noise), noise being
# the larger robust spread (1.4826 x MAD / median) of the two runs' samples. 3, as the GEMM
# outlier rule (max(2%, 3x noise)) and links' robust z of 3: under a normal model a sample lies
# beyond 3 sigma with 0.3% chance. The spread is that of single samples, not of their median, on
# purpose: run-to-run drift (clocks, temperature, placement) exceeds what one run's samples show,
# so the threshold is not shrunk by sqrt(n).
NOISE_K = 3.0
MIN_SAMPLES_FOR_NOISE = (
    5  # as measurement.MIN_SAMPLES_FOR_NOISE: fewer give no estimate
)
STATUSES = (
    "regression",
    "improvement",
    "cannot tell",
    "within noise",
    "unchanged",
    "added",
    "missing",
)


def noise(samples: Sequence[float], absolute: bool = False) -> float | None:
    """Robust spread of the samples: 1.4826 x MAD / |median| (relative), or 1.4826 x MAD in the
    samples' own unit when `absolute` (fractions, compared in points). None with fewer than
    MIN_SAMPLES_FOR_NOISE samples, or a zero median for a relative spread."""
    xs = [float(x) for x in samples if math.isfinite(float(x))]
    if len(xs) < MIN_SAMPLES_FOR_NOISE:
        return None
    med = statistics.median(xs)
    mad = 1.4826 * statistics.median(abs(x - med) for x in xs)
    if absolute:
        return mad
    return mad / abs(med) if med else None


@dataclass(frozen=True)
class Change:
    """One metric of two runs.

    change: new - base relative to |base| (fractions: in absolute terms, a share of 1, since a
    relative change of a share near 0 says little); None when the metric is in one run only.
    gain: change signed so that positive is better and negative worse, whatever `better` is.
    noise_base / noise_new: each run's spread in the same terms as `change` (None: fewer than
    5 samples). threshold: max(tolerance, NOISE_K x the larger noise). status: one of STATUSES.
    """

    name: str
    unit: str
    better: str
    base: float | None
    new: float | None
    change: float | None
    gain: float | None
    noise_base: float | None
    noise_new: float | None
    threshold: float | None
    status: str
    floor: float | None = None  # the noisy host's spread that this metric's noise was raised to (None: not raised)

    @property
    def absolute(self) -> bool:
        """The change is in absolute terms (percentage points of a fraction)."""
        return self.unit == "fraction"


def compare(
    base_metrics: Iterable[Metric],
    new_metrics: Iterable[Metric],
    tolerance: float = 0.05,
    floor: float | None = None,
) -> list[Change]:
    """Per metric of the two runs, the change and its status (see Change), in the new run's
    order, then the base's metrics missing from the new run. tolerance: a fraction in (0, 1);
    floor: the least relative spread of a ratio metric (a noisy host's, host_spread). Runs that
    share no metric give only added and missing ones (compare_runs: not comparable)."""
    if not (0 < tolerance < 1):
        raise InputError(
            f"tolerance {tolerance:g} is out of range: give more than 0 and less than 100%"
        )
    base = {m.name: m for m in base_metrics}
    new = {m.name: m for m in new_metrics}
    out = []
    for name, n in new.items():
        b = base.get(name)
        if b is None:
            out.append(
                Change(
                    name,
                    n.unit,
                    n.better,
                    None,
                    n.value,
                    None,
                    None,
                    None,
                    None,
                    None,
                    "added",
                )
            )
            continue
        out.append(_change(b, n, tolerance, floor))
    for name, b in base.items():
        if name not in new:
            out.append(
                Change(
                    name,
                    b.unit,
                    b.better,
                    b.value,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    "missing",
                )
            )
    return out


def _change(b: Metric, n: Metric, tolerance: float, floor: float | None = None) -> Change:
    absolute = n.unit == "fraction"
    diff = n.value - b.value
    if absolute:
        change = diff
    elif b.value:
        change = diff / abs(b.value)
    else:
        change = 0.0 if diff == 0 else math.copysign(math.inf, diff)
    gain = change if n.better == "higher" else -change
    nb, nn = noise(b.samples, absolute), noise(n.samples, absolute)
    known = [x for x in (nb, nn) if x is not None]
    spread = max(known) if known else None
    # "within noise" says the runs agree: the change inside the quieter run's spread too. A run
    # spread by its own trouble (a throttled node's steps, 116% against 16%) does not make a 3x drop
    # agree with a steady baseline: that is "cannot tell".
    agree = min(known) if known else None
    raised = None
    if floor is not None and not absolute and (spread is None or spread < floor):
        spread, raised = floor, floor
    if floor is not None and not absolute and agree is not None and agree < floor:
        agree = floor
    threshold = max(tolerance, NOISE_K * spread) if spread is not None else tolerance
    # the distance from no change: percentage points of a fraction, else |ln(new / base)| (of two
    # values of one sign; a ratio near 1 gives about the relative change)
    if absolute or not (b.value and n.value) or (b.value > 0) != (n.value > 0):
        distance = abs(change)
    else:
        distance = abs(math.log(n.value / b.value))
    if abs(change) <= tolerance:
        status = "unchanged"
    elif distance > threshold:
        status = "regression" if gain < 0 else "improvement"
    elif spread is None or distance <= max(tolerance, agree):
        status = "within noise"
    else:
        status = "cannot tell"
    return Change(
        n.name,
        n.unit,
        n.better,
        b.value,
        n.value,
        change,
        gain,
        nb,
        nn,
        threshold,
        status,
        raised,
    )


# -- fingerprints -----------------------------------------------------------------------------


def topology_hash(fp: Mapping) -> str | None:
    """A short hash of the topology facts a fingerprint holds: each GPU's index and PCI bus id,
    and where a topo snapshot is present ("topology"), each GPU's current PCIe link and active
    NVLinks and each pair's path. None when the fingerprint has none of them."""
    facts: list = []
    for g in fp.get("gpus") or []:
        if isinstance(g, Mapping):
            facts.append(["gpu", g.get("index"), g.get("pci_bus_id")])
    topo = fp.get("topology")
    if isinstance(topo, Mapping):
        for g in topo.get("gpus") or []:
            pcie = g.get("pcie") or {}
            links = sum(1 for lk in g.get("nvlinks") or [] if lk.get("active"))
            facts.append(
                [
                    "link",
                    g.get("index"),
                    g.get("pci_bus_id"),
                    pcie.get("gen"),
                    pcie.get("width"),
                    links,
                ]
            )
        for pr in topo.get("pairs") or []:
            facts.append(["pair", pr.get("src"), pr.get("dst"), pr.get("path")])
    if not facts:
        return None
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]


def _gpu_names(fp: Mapping) -> str | None:
    names = [
        str(g.get("name"))
        for g in fp.get("gpus") or []
        if isinstance(g, Mapping) and g.get("name")
    ]
    if not names:
        return None
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{c}x {n}" for n, c in counts.items())


def _uuids(fp: Mapping) -> tuple | None:
    u = tuple(
        str(g.get("uuid"))
        for g in fp.get("gpus") or []
        if isinstance(g, Mapping) and g.get("uuid")
    )
    return u or None


def fingerprint_diff(fp_a: Mapping, fp_b: Mapping) -> list[str]:
    """What differs between two environment fingerprints among host, GPU models, GPU UUIDs,
    NVIDIA driver, CUDA runtime and driver API, NCCL (and torch's own NCCL), torch, the
    recorded environment variables (NCCL_*, CUDA_*, ...) and the topology hash; one line each,
    e.g. 'driver 550.54.15 vs 580.159.04'. Absent values show as 'unknown' ('unset' for
    variables); a fact absent from both is not a difference."""
    fp_a, fp_b = fp_a or {}, fp_b or {}
    # what a run imported from another tool's log could not tell (its "not_in_log"): unknown, not a difference
    unknown = set(fp_a.get("not_in_log") or []) | set(fp_b.get("not_in_log") or [])
    out = []

    def show(v) -> str:
        return "unknown" if v is None else str(v)

    def show_env(v) -> str:
        return "unset" if v is None else str(v)

    for key, label in (
        ("host", "host"),
        ("nvidia_driver", "driver"),
        ("cuda_runtime", "CUDA runtime"),
        ("cuda_driver", "CUDA driver API"),
        ("nccl", "NCCL"),
        ("torch_nccl", "torch's NCCL"),
        ("torch", "torch"),
    ):
        a, b = fp_a.get(key), fp_b.get(key)
        if a != b and key not in unknown:
            out.append(f"{label} {show(a)} vs {show(b)}")
    a, b = _gpu_names(fp_a), _gpu_names(fp_b)
    if a != b:
        out.append(f"GPUs {show(a)} vs {show(b)}")
    ua, ub = _uuids(fp_a), _uuids(fp_b)
    if ua != ub and not (unknown and not (ua and ub)):  # a log that names no UUIDs differs in none
        changed = sum(1 for x, y in zip(ua or (), ub or ()) if x != y) + abs(
            len(ua or ()) - len(ub or ())
        )
        out.append(
            f"GPU UUIDs differ ({changed} GPU(s)): other physical GPUs, or another order"
        )
    env_a, env_b = fp_a.get("env") or {}, fp_b.get("env") or {}
    for key in [] if "env" in unknown else sorted(
        set(env_a) | set(env_b)
    ):  # the recorded allowlist: NCCL_*, CUDA_*, threads
        if env_a.get(key) != env_b.get(key):
            out.append(
                f"{key}={show_env(env_a.get(key))} vs {show_env(env_b.get(key))}"
            )
    ta, tb = topology_hash(fp_a), topology_hash(fp_b)
    if ta != tb and "topology" not in unknown:
        out.append(
            f"topology {show(ta)} vs {show(tb)} (GPU PCI bus ids or links differ)"
        )
    return out


# -- two stored runs --------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """Two stored runs compared: base and new run ids, fingerprint differences, changes."""

    base: str
    new: str
    tolerance: float
    fingerprint_differences: list[str]
    changes: list[Change]
    # Why the runs cannot be compared (a run on GPUs another process also used): a regression
    # gate fails on these, since nothing can be said either way.
    not_comparable: tuple[str, ...] = ()
    # A host too noisy to compare (noisy_host): said beside the changes, which keep their status.
    warnings: tuple[str, ...] = ()

    @property
    def compared(self) -> int:
        """Metrics both runs have, set side by side."""
        return sum(1 for c in self.changes if c.status not in ("added", "missing"))

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.status == "regression"]

    @property
    def undecided(self) -> list[Change]:
        """Changes too close to the noise to call either way ("cannot tell")."""
        return [c for c in self.changes if c.status == "cannot tell"]

    @property
    def cannot_tell(self) -> bool:
        """No regression, but some change cannot be told from the noise: a gate can say neither
        "passed" nor "failed" (compare's own exit code)."""
        return not self.failed and bool(self.undecided)

    @property
    def failed(self) -> bool:
        """A gate on this comparison fails: a regression, or runs that cannot be compared."""
        return bool(self.regressions or self.not_comparable)

    def to_dict(self) -> dict:
        """The JSON document `compare --json` writes (base units, fractions as fractions)."""
        from dataclasses import asdict

        def clean(v):
            return None if isinstance(v, float) and not math.isfinite(v) else v

        return {
            "schema": "mgpu-bench/compare",
            "schema_version": 1,
            "created": utc_now(),
            "base": self.base,
            "new": self.new,
            "tolerance": self.tolerance,
            "noise_k": NOISE_K,
            "rule": "regression: worse by more than max(tolerance, noise_k x the larger noise), |ln(new/base)| for "
            "ratios (fractions: in points); within noise: within the smaller noise; cannot tell: between; noise = 1.4826 x "
            "MAD / median of a run's samples, none under 5 samples, at least the run's typical spread on a noisy "
            "host",
            "fingerprint_differences": self.fingerprint_differences,
            "not_comparable": list(self.not_comparable),
            "warnings": list(self.warnings),
            "regressions": len(self.regressions),
            "cannot_tell": len(self.undecided),
            "changes": [
                {k: clean(v) for k, v in asdict(c).items()} for c in self.changes
            ],
        }


def compare_runs(
    history: History, base_id: str, new_id: str, tolerance: float = 0.05
) -> Comparison:
    """Compares two stored runs' metrics and fingerprints (see `compare`, `fingerprint_diff`): the
    stored headline metrics, or where the kind says what compares (its `headline.comparable`, e.g.
    comm's latency per size), those, from the stored documents. Runs that share no metric cannot
    be compared: a regression gate fails on them (not_comparable)."""
    base, new = history.get(base_id), history.get(new_id)
    base_metrics, new_metrics = _comparable(history, base), _comparable(history, new)
    noisy = noisy_host(base, base_metrics) + noisy_host(new, new_metrics)
    floor = None
    if noisy:  # drift between runs on such a host exceeds a metric's own samples: its typical spread at least
        floor = max(NOISY_SPREAD, host_spread(base_metrics) or 0.0, host_spread(new_metrics) or 0.0,
                    BUSY_DRIFT * max(busy_load(base), busy_load(new)))
        noisy.append(f"every metric's noise is taken as at least {100 * floor:.0f}% (the noisier run's typical spread, "
                     f"at least {100 * NOISY_SPREAD:.0f}%, or {100 * BUSY_DRIFT:.0f}% per unit of load per CPU on a "
                     "busy host): a change under 3 times that cannot be told from the host's drift")
    changes = compare(base_metrics, new_metrics, tolerance, floor)
    apart = []
    if not any(c.status not in ("added", "missing") for c in changes):
        apart.append((other_workloads(base_metrics, new_metrics) or f"the two runs share no metric ({len(base_metrics)} "
                      f"and {len(new_metrics)} metrics)") + ": compare runs of the same kind and configuration, or set a "
                     "matching baseline")
    return Comparison(
        base.run_id,
        new.run_id,
        tolerance,
        fingerprint_diff(base.fingerprint, new.fingerprint),
        changes,
        tuple(apart + shared_gpus(base) + shared_gpus(new)),
        tuple(noisy)
        + tuple(line + ": their training figures are not compared" for line in
                [other_workloads(base_metrics, new_metrics)] if line and not apart),
    )


def other_workloads(base: Iterable[Metric], new: Iterable[Metric]) -> str | None:
    """The line saying two runs trained different workloads (the `model` label of their model and
    memory metrics: a workload's key, which names its metrics, so none of them is set against the
    other's), or None when they trained the same ones or either trained none."""
    def of(metrics: Iterable[Metric]) -> set[str]:
        return {m.labels["model"] for m in metrics if m.kind in ("model", "memory") and m.labels.get("model")}

    a, b = of(base), of(new)
    if not a or not b or a == b:
        return None
    return f"the runs trained different workloads ({', '.join(sorted(a))} against {', '.join(sorted(b))})"


def _comparable(history: History, run) -> list[Metric]:
    """The run's metrics as compare sets them side by side (compare_runs)."""
    from mgpu_bench.results import probe as registry

    doc = run.document if isinstance(run.document, Mapping) else None
    probe = registry.for_document(doc) if doc is not None else None
    build = probe.role("headline", "comparable") if probe is not None else None
    if build is None:
        return history.metrics(run.run_id)
    return [m for m in build(doc) if math.isfinite(m.value)]


# A host too noisy to compare: its runs drift between runs by more than a run's own samples show.
# Two signs, each said as a warning beside the changes (a load average is no measurement of the
# figures themselves, so it does not overrule their thresholds). Figures that spread more than
# NOISY_SPREAD within the run (the median over its metrics of each one's relative noise): a
# threshold of 3x that hides a 30% drop. Or, for a run on CPU processes, a host already busy when
# it started (1-minute load average above BUSY_LOAD per CPU): the same `model` on a busy 2-core
# host gave 228 and 763 tokens/s in two runs a minute apart.
NOISY_SPREAD = 0.10
BUSY_LOAD = 0.5
# On a busy host a CPU run's figures drift with the load: the same run gave 228 and 763 tokens/s a
# minute apart at a load of 4 per CPU (3.3x). A busy run's noise floor is this much per unit of
# load per CPU (at 4 per CPU: 40%, a threshold of 3.3x in ln terms): a rule of thumb from those runs,
# not a model.
BUSY_DRIFT = 0.10


def busy_load(run) -> float:
    """The 1-minute load per CPU of a CPU-only run at its start; 0 for a GPU run or none recorded."""
    fp = run.fingerprint if isinstance(run.fingerprint, Mapping) else {}
    load = fp.get("host_load") if isinstance(fp.get("host_load"), Mapping) else {}
    try:
        busy, cpus = float(load.get("load_1m")), int(load.get("cpus"))
    except (TypeError, ValueError):
        return 0.0
    return busy / cpus if cpus > 0 and not fp.get("gpus") else 0.0


def noisy_host(run, metrics: Sequence[Metric]) -> list[str]:
    """Lines for a stored run whose host was too noisy for its figures to be compared."""

    out = []
    fp = run.fingerprint if isinstance(run.fingerprint, Mapping) else {}
    load = fp.get("host_load") if isinstance(fp.get("host_load"), Mapping) else {}
    try:
        busy, cpus = float(load.get("load_1m")), int(load.get("cpus"))
    except (TypeError, ValueError):
        busy, cpus = None, 0
    if not fp.get("gpus") and busy is not None and cpus > 0 and busy > BUSY_LOAD * cpus:
        out.append(f"{run.run_id}: the host was busy when it started (load average {busy:.1f} on {cpus} CPU(s)) and "
                   "it ran on CPU processes: its figures drift between runs more than its own samples show; run "
                   "both on an idle host")
    spread = host_spread(metrics)
    if spread is not None and spread > NOISY_SPREAD:
        n = sum(1 for m in metrics if m.unit != "fraction" and noise(m.samples) is not None)
        out.append(f"{run.run_id}: its figures spread {100 * spread:.0f}% within the run (the median of {n} metrics' "
                   f"noise; above {100 * NOISY_SPREAD:.0f}% a small change cannot be told from noise): the host is too "
                   "noisy to compare")
    return out


def host_spread(metrics: Sequence[Metric]) -> float | None:
    """A run's typical relative spread: the median of its ratio metrics' noise (3 at least)."""
    spreads = [s for m in metrics if m.unit != "fraction" and (s := noise(m.samples)) is not None]
    return statistics.median(spreads) if len(spreads) >= 3 else None


def shared_gpus(run) -> list[str]:
    """Lines for a stored run that ran beside another process on its GPUs (occupancy); one that
    only held memory, running nothing, leaves the figures comparable."""
    from mgpu_bench.machine.occupancy import competing, findings_text, from_document

    doc = run.document if isinstance(run.document, Mapping) else {}
    return [f"{run.run_id}: {line}" for line in findings_text(competing(from_document(doc)))]
