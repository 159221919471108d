"""What a check says: problems (the node should not run jobs), warnings, and the verdict the
scheduler acts on: ok, problem, or unknown (the check itself could not tell; never a reason to
drain).

Each figure is judged two ways:
- against its floor, where the GPU model is in mgpu_bench/data/hardware.json: a fixed fraction of
  the datasheet figure (FLOORS, each with the measurements that set it). A healthy GPU sits well
  above; a floor catches what no healthy GPU does whatever its history.
- against this node's reference, where there is one (reference.py): its baseline (`mgpu-bench
  baseline set RUN` on a stored check of this node), else the median of its last passing checks.
  Slow is below the reference by more than max(REFERENCE_FLOOR, 3 x noise), noise being how much
  the figure moves on this node when healthy: from the robust spread (1.4826 x MAD / median) of
  the reference's samples, over sqrt(n) (figure_noise), and for recent checks the spread between
  them. The run's own spread is not used: a
  slowed process's bursts are cut by its stalls, and that spread is a symptom, not noise.
Health facts, other processes on the GPUs, wrong results and GPU work that failed or never
returned are problems of their own.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from mgpu_bench.results.probe import OK, PROBLEM, WARNING, Finding

# kind -> (fraction, what of the datasheet it multiplies, why that fraction)
FLOORS = {
    "gemm": (0.50, "the dense bf16 peak",
             ("healthy GPUs reach 69-77% of it on this 8192^3 GEMM (H200: 680-758 TFLOP/s of 989, "
             "benchmarks/RESULTS.md); half the peak is below any healthy GPU's clock and power variation and "
             "above a GPU shared with another job's GEMM (381 TFLOP/s on an H200)")),
    "copy": (0.60, "the datasheet memory bandwidth",
             ("healthy copies reach 88-90% of it, read plus written (H200: 4.24-4.33 TB/s of 4.8); 60% leaves room "
             "for a short run (3.83 TB/s after allocator churn) and catches a GPU shared with another job (1.93 TB/s)")),
    "allreduce": (0.40, "the ring's slowest hop (theory.py)",
                  ("NCCL's rings reach about 80% of it at 1 GiB and 60-70% at 64-256 MiB (2x H200: 267 GB/s at 64 MiB, "
                  "328 at 1 GiB of 450, shared/ANCHORS.md); 40% still catches a ring that fell back to PCIe or lost "
                  "half its NVLinks")),
}
# Below the node's own reference by more than this (or 3 x noise) is slow: a GPU's short GEMM or copy
# repeats within a few percent (thermal state, clocks); CPU processes on a shared host within ~20%.
REFERENCE_FLOOR = {"gpu": 0.10, "cpu": 0.25}
TOO_NOISY = 0.5  # a threshold this wide judges nothing: the figure is said to be too noisy instead
NPD_MAX = 80  # node-problem-detector keeps the first 80 bytes of a plugin's output (max_output_length)
METRIC = {"gemm": "tflops", "copy": "copy_bandwidth", "allreduce": "allreduce_busbw"}
WHAT = {"gemm": "GEMM", "copy": "HBM copy", "allreduce": "allreduce busbw"}
SHORT = {"gemm": "GEMM", "copy": "copy", "allreduce": "allreduce"}
MEASURING = ("gemm", "hbm", "allreduce", "sdc", "ranks")  # the parts whose figures say the node runs jobs at speed


def metric_name(figure: Mapping) -> str:
    """The history's name of a figure: check.gpu0.tflops, check.rank1.copy_bandwidth,
    check.allreduce_busbw."""
    if figure["device"] == "node":
        return f"check.{METRIC[figure['kind']]}"
    return f"check.{figure['device']}.{METRIC[figure['kind']]}"


def fmt(kind: str, value: float | None) -> str:
    if value is None:
        return "-"
    if kind == "gemm":
        return f"{value / 1e12:.1f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:.2f} GFLOP/s"
    return f"{value / 1e12:.2f} TB/s" if value >= 1e12 else f"{value / 1e9:.1f} GB/s" if value >= 1e9 \
        else f"{value / 1e6:.0f} MB/s"


def short_fmt(kind: str, value: float) -> str:
    """A figure in the fewest characters, for the 80-byte line: 412T (FLOP/s), 3.1TB/s, 140GB/s."""
    if kind == "gemm":
        return f"{value / 1e12:.0f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:.1f} GFLOP/s"
    return fmt(kind, value)


def noise(samples: Sequence[float]) -> float | None:
    """1.4826 x MAD / median of at least 5 samples (the robust relative spread), else None."""
    xs = [float(x) for x in samples if x and x > 0]
    if len(xs) < 5:
        return None
    med = statistics.median(xs)
    return 1.4826 * statistics.median(abs(x - med) for x in xs) / med if med > 0 else None


def figure_noise(samples: Sequence[float]) -> float | None:
    """How much a figure made of `samples` (their median, or a CPU process's fastest quartile)
    moves: the samples' robust spread over sqrt(n), x 1.2533 for a median (its standard error
    against the mean's); None under 5 samples."""
    spread = noise(samples)
    n = len([x for x in samples if x and x > 0])
    return None if spread is None else 1.2533 * spread / n**0.5


# -- floors ----------------------------------------------------------------------------------------


def floors(devices: Sequence[Mapping], figures: Sequence[Mapping]) -> list[dict]:
    """The floor of each kind of figure per GPU model measured: {kind, model, value, unit,
    fraction, of, reference (the datasheet or theory value), source, why}. A model not in the
    hardware database gets none (said in the notes)."""
    from mgpu_bench.machine import hardware

    out: list[dict] = []
    seen = set()
    models = {d["name"]: d.get("model") for d in devices}
    for f in figures:
        kind = f["kind"]
        fraction, of, why = FLOORS[kind]
        if kind == "allreduce":
            theory = (f.get("detail") or {}).get("theory")
            key = (kind, "node")
            if theory and key not in seen:
                seen.add(key)
                out.append({"kind": kind, "model": "node", "value": fraction * theory, "unit": "B/s",
                            "fraction": fraction, "of": of, "reference": theory,
                            "source": (f.get("detail") or {}).get("path") or "theory.py", "why": why})
            continue
        model = models.get(f["device"])
        if not model or model == "cpu" or (kind, model) in seen:
            continue
        seen.add((kind, model))
        gpu = hardware.find_gpu(model)
        ref = None
        if gpu is not None:
            ref = gpu.peak.get("bf16") if kind == "gemm" else gpu.memory_bandwidth
        if ref is None or ref.value is None:
            continue
        out.append({"kind": kind, "model": model, "value": fraction * ref.value, "unit": ref.unit, "fraction": fraction,
                    "of": of, "reference": ref.value, "source": ref.source, "why": why})
    return out


def floor_lines(fl: Sequence[Mapping]) -> list[str]:
    """How each floor was derived, one line each, as the output prints them."""
    out = []
    for f in fl:
        where = "the node" if f["model"] == "node" else f["model"]
        out.append(f"floor: {WHAT[f['kind']]} on {where} >= {fmt(f['kind'], f['value'])}: {100 * f['fraction']:.0f}% "
                   f"of {f['of']} {fmt(f['kind'], f['reference'])} ({f['source']}): {f['why']}")
    return out


# -- the verdict -----------------------------------------------------------------------------------


def _finding(severity: str, text: str, short: str, device: str, part: str) -> dict:
    return {"severity": severity, "text": text, "short": short, "device": device, "part": part}


def _label(device: str) -> str:
    return device.replace("gpu", "GPU ").replace("rank", "rank ") if device != "node" else "node"


def verdict_of(parts: Sequence[Mapping], devices: Sequence[Mapping], reference: Mapping | None, budget_s: float,
          need_s: float) -> dict:
    """The verdict of a check: {state, findings (problems first), floors, reason (the first
    problem, one line, for Slurm), npd (at most 80 bytes, for node-problem-detector), fix (what to
    do when the state is unknown), judged (the parts that measured something)}."""
    figures = [f for p in parts for f in p.get("figures") or []]
    fl = floors(devices, figures)
    out: list[dict] = []
    by_part = {p["part"]: p for p in parts}
    cpu = bool(devices) and all(d.get("model") == "cpu" for d in devices)
    out += _health(by_part.get("health"))
    out += _processes(by_part.get("processes"))
    for p in parts:
        for device, error in (p.get("errors") or {}).items():
            out.append(_finding(PROBLEM, f"{_label(device)}: the {p['part']} failed: {error}",
                                f"{_label(device)} {p['part']} failed: {error}", device, p["part"]))
        if p.get("status") == "hung":
            out.append(_finding(PROBLEM, f"{p['part']}: {p['why']} (after {p['seconds']:.1f} s): its GPU work hangs",
                                f"{p['part']} hung: {p['why']}", "node", p["part"]))
    models = {d["name"]: d.get("model") for d in devices}
    out += _figures(figures, fl, reference, REFERENCE_FLOOR["cpu" if cpu else "gpu"], models)
    out += _sdc(by_part.get("sdc"))
    judged = [p["part"] for p in parts if p.get("status") in ("measured", "failed", "hung")
              and (p.get("figures") or p.get("facts") or p.get("errors") or p.get("status") == "hung")]
    errors = [p for p in parts if p.get("status") == "error"]
    problems = [f for f in out if f["severity"] == PROBLEM]
    fix = None
    if problems:
        state = PROBLEM
    elif errors:  # the check's own failure first: a longer budget would not mend it
        state = "unknown"
        fix = f"the check could not run its {errors[0]['part']} part ({errors[0]['why']}): the node was not judged"
    elif not set(judged) & set(MEASURING):
        state = "unknown"
        suggest = max(budget_s, need_s) * 1.5
        fix = (f"give --budget {suggest:.0f}s or more: nothing was measured within --budget {budget_s:g}s (this "
               f"node's check needs about {need_s:.0f} s; its health facts alone do not say it runs jobs at speed)")
    else:
        state = OK
    out.sort(key=lambda f: (f["severity"] != PROBLEM, f["severity"] != WARNING))
    return {"state": state, "findings": out, "floors": fl, "reason": problems[0]["text"] if problems else None,
            "npd": npd_line(state, problems, figures, devices, fix), "fix": fix, "judged": judged}


def _health(part: Mapping | None) -> list[dict]:
    out: list[dict] = []
    if not part or part.get("status") != "measured":
        return out
    for device, got in (part.get("facts") or {}).items():
        if device in ("versions", "host"):
            continue
        for h in got.get("findings") or []:
            sev = h.get("severity", PROBLEM)
            out.append(_finding(sev, f"{_label(device)}: {h['text']}", f"{_label(device)} {h['text']}", device,
                                "health"))
    v = (part.get("facts") or {}).get("versions") or {}
    drv, rt = v.get("cuda_driver"), v.get("cuda_runtime")
    if drv and rt and _version(drv) < _version(rt):
        out.append(_finding(PROBLEM, f"the driver supports CUDA {drv}, older than the CUDA runtime {rt} the tool "
                                     "runs on: update the driver", f"driver CUDA {drv} < runtime {rt}", "node", "health"))
    return out


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(text).split("."))
    except ValueError:
        return (0,)


def _processes(part: Mapping | None) -> list[dict]:
    out: list[dict] = []
    if not part or part.get("status") != "measured":
        return out
    for p in (part.get("facts") or {}).get("foreign") or []:
        held = f", {p['used_bytes'] / 2**30:.1f} GiB" if p.get("used_bytes") else ""
        who = f"pid {p['pid']} ({p.get('name') or 'name not visible'}{held})"
        dev = p["device"]
        if p.get("busy") is False:
            out.append(_finding(WARNING, f"{_label(dev)} holds memory of {who}, which ran no kernels when the check "
                                         "started: it lowers what fits", f"{_label(dev)} memory held by pid {p['pid']}",
                                dev, "processes"))
        else:
            out.append(_finding(PROBLEM, f"{_label(dev)} is shared with {who}: another job runs on the node's GPU",
                                f"{_label(dev)} shared with pid {p['pid']} {p.get('name') or ''}".strip(), dev,
                                "processes"))
    return out


def _figures(figures: Sequence[Mapping], fl: Sequence[Mapping], reference: Mapping | None, rel_floor: float,
             models: Mapping[str, str | None]) -> list[dict]:
    out: list[dict] = []
    floor_of = {(f["kind"], f["model"]): f for f in fl}
    refs = (reference or {}).get("metrics") or {}
    which = (reference or {}).get("label") or "the reference"
    versus = "vs baseline" if (reference or {}).get("kind") == "baseline" else \
        f"vs last {len((reference or {}).get('runs') or [])}"  # the 80-byte line says which
    for f in figures:
        kind, dev, value = f["kind"], f["device"], f["value"]
        detail = f.get("detail") or {}
        label = _label(dev)
        if kind == "gemm" and detail.get("max_error") is not None and not detail["max_error"] <= detail["tolerance"]:
            out.append(_finding(PROBLEM, f"{label}: wrong GEMM results (relative error {detail['max_error']:.2g}, "
                                         f"tolerance {detail['tolerance']:g})", f"{label} GEMM wrong results", dev, kind))
        if kind == "allreduce" and detail.get("wrong"):
            out.append(_finding(PROBLEM, f"allreduce: {detail['wrong']} wrong element(s): the data did not arrive intact",
                                f"allreduce {detail['wrong']} wrong elements", dev, kind))
        cause = _throttle(detail.get("telemetry"))
        floor = floor_of.get((kind, "node" if dev == "node" else models.get(dev)))
        name = metric_name(f)
        if floor and value < floor["value"]:
            out.append(_finding(PROBLEM, f"{label}: {WHAT[kind]} {fmt(kind, value)}, below its floor "
                                         f"{fmt(kind, floor['value'])} ({100 * floor['fraction']:.0f}% of "
                                         f"{fmt(kind, floor['reference'])}){cause}",
                                f"{label} {SHORT[kind]} {short_fmt(kind, value)} < floor "
                                f"{short_fmt(kind, floor['value'])}", dev, kind))
            continue
        ref = refs.get(name)
        if not ref:
            continue
        # how much the figure moves on this node when it is healthy (the reference's own noise): a slow
        # run's own spread is a symptom (bursts cut by stalls), never a reason to widen the threshold
        spread = ref.get("noise") or 0.0
        threshold = max(rel_floor, 3 * spread)
        if threshold >= TOO_NOISY:
            out.append(_finding(WARNING, f"{label}: {WHAT[kind]} too noisy to judge against {which} (spread "
                                         f"{100 * spread:.0f}%)", f"{label} {SHORT[kind]} too noisy", dev, kind))
            continue
        if value < ref["value"] * (1 - threshold):
            drop = 1 - value / ref["value"]
            out.append(_finding(PROBLEM, f"{label}: {WHAT[kind]} {fmt(kind, value)}, {100 * drop:.0f}% below {which} "
                                         f"{fmt(kind, ref['value'])} (threshold {100 * threshold:.0f}%){cause}",
                                f"{label} {SHORT[kind]} {short_fmt(kind, value)}, -{100 * drop:.0f}% {versus}",
                                dev, kind))
    return out


def _throttle(tele: Mapping | None) -> str:
    """The clock-event reasons seen while the GEMM ran that slow a healthy GPU (thermal, hardware
    slowdown, power brake): the likely cause, in words."""
    from mgpu_bench.machine.telemetry import POWER_CAP

    reasons = [r for r in (tele or {}).get("limiting") or [] if r != POWER_CAP]
    return f"; {', '.join(reasons)} seen while it ran" if reasons else ""


def _sdc(part: Mapping | None) -> list[dict]:
    out: list[dict] = []
    if not part or part.get("status") not in ("measured", "failed"):
        return out
    facts = {k: v for k, v in (part.get("facts") or {}).items() if isinstance(v, Mapping) and "hash" in v}
    for dev, f in facts.items():
        label = _label(dev)
        if f.get("differs"):
            out.append(_finding(PROBLEM, f"{label}: unstable: the same GEMM gave a different result within "
                                         f"{f['gemms']} repetitions (silent data corruption)",
                                f"{label} sdc: unstable GEMM results", dev, "sdc"))
        if f.get("hbm_mismatches"):
            out.append(_finding(PROBLEM, f"{label}: {f['hbm_mismatches']} wrong 8-byte word(s) in "
                                         f"{f['hbm_bytes'] / 2**30:.1f} GiB of HBM written and read back",
                                f"{label} sdc: {f['hbm_mismatches']} bad HBM words", dev, "sdc"))
    groups: dict[tuple, list[str]] = {}
    for dev, f in facts.items():
        groups.setdefault(tuple(f.get("peers") or [dev]), []).append(dev)
    for members in groups.values():
        hashes = {d: facts[d]["hash"] for d in members}
        counts: dict[str, int] = {}
        for h in hashes.values():
            counts[h] = counts.get(h, 0) + 1
        if len(counts) < 2:
            continue
        common, most = max(counts.items(), key=lambda kv: kv[1])
        for d, h in hashes.items():
            if h != common or most * 2 <= len(hashes):
                out.append(_finding(PROBLEM, f"{_label(d)}: its GEMM result differs from its peers' of the same model "
                                             f"(hash {h}, {most} of {len(hashes)} agree on {common})",
                                    f"{_label(d)} sdc: result differs from peers", d, "sdc"))
    return out


def npd_line(state: str, problems: Sequence[Mapping], figures: Sequence[Mapping], devices: Sequence[Mapping],
             fix: str | None) -> str:
    """node-problem-detector's condition message: one line, at most NPD_MAX bytes, naming the GPU
    and the figure."""
    if state == PROBLEM:
        first = problems[0]["short"]
        more = f" (+{len(problems) - 1})" if len(problems) > 1 else ""
        text = first + more
    elif state == OK:
        gemm = [f for f in figures if f["kind"] == "gemm"]
        low = min(gemm, key=lambda f: f["value"]) if gemm else None
        what = f", GEMM min {short_fmt('gemm', low['value'])} on {_label(low['device'])}" if low else ""
        kind = "GPU" if any(d.get("model") != "cpu" for d in devices) else "CPU rank"
        text = f"ok: {len(devices)} {kind}(s){what}"
    else:
        text = f"unknown: {fix or 'not judged'}"
    return _fit(text, NPD_MAX)


def _fit(text: str, limit: int) -> str:
    """One line of printable ASCII, at most `limit` bytes: white space runs as one space, control
    characters (ESC, OSC 8's) as their escapes, anything else outside ASCII as '?'."""
    from mgpu_bench.output.console import safe_text

    raw = safe_text(" ".join(str(text).split())).encode("ascii", "replace")
    return (raw if len(raw) <= limit else raw[:limit - 3] + b"...").decode("ascii")


# -- the roles the protocol finds ------------------------------------------------------------------


def findings(doc: Mapping) -> list[Finding]:
    """What the command prints on top: the verdict's problems and warnings (another process on
    a GPU is printed by the runner itself, from the run's occupancy record), then the state."""
    v = doc.get("verdict") or {}
    out = [Finding(f["severity"], f["text"]) for f in v.get("findings") or [] if f.get("part") != "processes"]
    if v.get("state") == OK:
        out.append(Finding(OK, f"{doc.get('node')}: ok: {', '.join(v.get('judged') or [])} judged"))
    return out


def failure(doc: Mapping) -> str | None:
    v = doc.get("verdict") or {}
    if v.get("state") == PROBLEM:
        return f"{doc.get('node')}: {v.get('reason')}"
    return None


def key_figure(doc: Mapping) -> tuple[str, str]:
    v = doc.get("verdict") or {}
    gemm = [f for p in doc.get("parts") or [] for f in p.get("figures") or [] if f["kind"] == "gemm"]
    low = min(gemm, key=lambda f: f["value"]) if gemm else None
    figure = f"{v.get('state', '-')}" + (f", GEMM min {fmt('gemm', low['value'])}" if low else "")
    ref = (doc.get("reference") or {}).get("label") or "floors"
    return figure, ref
