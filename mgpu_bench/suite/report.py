"""`mgpu-bench suite`: the verdicts, a Markdown summary for a ticket and one self-contained HTML
page over the three rounds (single-GPU baseline, multi-GPU scaling, limit throughput).

The suite document holds every probe's own result document as its command wrote it (kind
gemm, memory, model, comm or links); each is rebuilt into its module's run object here and drawn
and judged by that module's own plots, tables and findings (gemm.findings, memory.findings,
model_bench.findings and verdict, links.findings, the comm run's stored findings). The suite adds
what only the whole run can say: failed, skipped or stopped probes, busbw against the link
theory, why scaling fell short, the headline verdict of the training step (compute-,
communication-, input- or memory-bound), and an order: problems first.

As in the other reports, nothing on the page is loaded from anywhere: the PNGs are data: URIs,
styles are inline, and every string from outside (host and GPU names, environment values, error
texts, command lines, findings) is escaped, in the HTML with html.escape and in Markdown with
html_page.md plus backslashes before the characters that make links, code or HTML.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import math
import re
import shlex
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_bench.output import html_page
from mgpu_bench.output.plotting import plain as _plain
from mgpu_bench.output.plotting import png as _png
from mgpu_bench.output.plotting import pyplot as _pyplot

PROBLEM, WARNING, OK = "problem", "warning", "ok"
SEVERITIES = (PROBLEM, WARNING, OK)  # the order findings are listed in
ROUND_TITLES = {1: "single-GPU baseline", 2: "multi-GPU scaling", 3: "limit throughput"}
# busbw against the ring theory of the path (theory.py), at the largest size of the sweep. A
# healthy NVLink node gives 47-82% (2x H200 at 64 MiB-1 GiB, benchmarks/RESULTS.md); NCCL over
# SHM where NVLink allowed P2P gave 6%. Under COMM_LOW a path is wrong; under COMM_WEAK at a
# size where busbw has settled (>= COMM_SETTLED bytes) it deserves a look.
COMM_LOW = 0.25
COMM_WEAK = 0.50
COMM_SETTLED = 256 << 20
# Scaling efficiency T_N / (N x T_1): at least SCALING_GOOD is healthy (DDP 1 -> 2 H200: 93.9%,
# RESULTS.md), under SCALING_POOR a problem; above SCALING_ABOVE the baseline itself is suspect.
SCALING_GOOD = 0.90
SCALING_POOR = 0.75
SCALING_ABOVE = 1.05
# A bound share of the step (exposed communication, input pipeline) over twice the healthy
# limit of model_bench (10%) makes the headline verdict a problem rather than a warning.
BOUND_PROBLEM = 2.0


@dataclass(frozen=True)
class Finding:
    """One verdict line: severity (problem, warning or ok) and the text with the figure, the
    expected figure and the likely cause; round and probe name where it came from one probe."""

    severity: str
    text: str
    round: int | None = None
    probe: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------------------------ loading


def sub_kind(doc: Mapping | None) -> str | None:
    """The kind of a probe's result document: its own "kind" (gemm, memory, model), else comm
    (measurements + backend, as `mgpu-bench report` tells it) or links (peer access + measurements,
    as the links command writes it, without a kind); None for anything else."""
    if not isinstance(doc, Mapping):
        return None
    kind = doc.get("kind")
    if kind in ("gemm", "memory", "model", "comm", "links"):
        return kind
    if "measurements" in doc and "backend" in doc:
        return "comm"
    if "measurements" in doc and "peer_access" in doc:
        return "links"
    return None








def _load(kind: str, doc: Mapping):
    """The run object of a probe's document, by the module that wrote it."""
    from mgpu_bench.probes.comm import report as comm_report
    from mgpu_bench.probes.gemm import report as gemm_report
    from mgpu_bench.probes.links import measure as links
    from mgpu_bench.probes.memory import report as memory_report
    from mgpu_bench.probes.model import report as model_report

    loaders = {"gemm": gemm_report.run_from_document, "memory": memory_report.run_from_document,
               "model": model_report.run_from_document, "comm": comm_report.run_from_document,
               "links": links.run_from_document}
    return loaders[kind](dict(doc))


@dataclass
class _Probe:
    index: int
    round: int
    name: str
    title: str
    status: str
    error: str | None
    seconds: float | None
    command: list
    doc: Mapping | None
    kind: str | None
    run: Any = None
    load_error: str | None = None
    telemetry: Mapping | None = (
        None  # NVML sampled by the suite beside the probe (round 3)
    )

    @property
    def where(self) -> str:
        return f"round {self.round} {self.name}"

    @property
    def slug(self) -> str:
        return f"{self.index + 1:02d}_{re.sub(r'[^A-Za-z0-9_-]+', '-', self.name)[:40]}"


def _probes(doc: Mapping) -> list[_Probe]:
    """The suite's probes with their runs rebuilt; a document that cannot be read keeps its
    error in load_error (a finding), never stops the report."""
    out = []
    for i, p in enumerate(doc.get("probes") or []):
        if not isinstance(p, Mapping):
            continue
        sub = p.get("document")
        try:
            rnd = int(p.get("round") or 0)
        except (TypeError, ValueError):
            rnd = 0
        seconds = p.get("seconds")
        pr = _Probe(
            i,
            rnd,
            str(p.get("name") or f"probe {i + 1}"),
            str(p.get("title") or p.get("name") or ""),
            str(p.get("status") or "unknown"),
            None if p.get("error") is None else str(p.get("error")),
            seconds if isinstance(seconds, (int, float)) else None,
            [str(a) for a in p.get("command") or []],
            sub if isinstance(sub, Mapping) else None,
            sub_kind(sub),
            telemetry=p.get("telemetry")
            if isinstance(p.get("telemetry"), Mapping)
            else None,
        )
        if pr.kind is not None:
            try:
                pr.run = _load(pr.kind, sub)
            except Exception as exc:  # noqa: BLE001 - a malformed document is reported, not raised
                pr.load_error = f"{type(exc).__name__}: {exc}"
        out.append(pr)
    return out


# ------------------------------------------------------------------------------------ findings


def _model_where(run, n: int) -> str:
    return f"{n} GPU(s)" if run.config.device == "cuda" else f"{n} process(es)"


def _model_verdicts(run) -> list[tuple[int, str, str]]:
    """(GPU count, where, model_bench.verdict) for each count, as model_bench.findings words it."""
    from mgpu_bench.probes.model import measure as model_bench

    out = []
    for n in run.gpu_counts:
        eff, gross = run.get(n, "synthetic"), run.get(n, "loader")
        main = eff or gross
        if main is not None:
            out.append(
                (
                    n,
                    _model_where(run, n),
                    model_bench.verdict(main, gross if eff is not None else None),
                )
            )
    return out


def _verdict_severity(run, n: int, text: str) -> str:
    from mgpu_bench.probes.model import measure as model_bench

    if text.startswith("compute-bound"):
        return OK
    if text.startswith(("no verdict", "memory-bound: the batch does not fit")):
        return PROBLEM
    eff, gross = run.get(n, "synthetic"), run.get(n, "loader")
    main = eff or gross
    d = main.derived if main is not None else {}
    share, limit = None, None
    if text.startswith("communication-bound"):
        share, limit = d.get("exposed_comm_share"), model_bench.EXPOSED_COMM_LIMIT
    elif text.startswith("input-bound"):
        loss = model_bench.input_loss(eff, gross) if eff is not None else None
        share, limit = (
            max(loss or 0.0, d.get("data_share") or 0.0),
            model_bench.INPUT_LIMIT,
        )
    return (
        PROBLEM
        if share is not None and limit and share > BOUND_PROBLEM * limit
        else WARNING
    )


def verdict(doc: Mapping) -> Finding | None:
    """The headline: the model probes' verdict at their largest GPU count (model_bench.verdict).
    The first one, in round order, that names a bound other than compute wins (a box whose
    input pipeline starves one GPU is input-bound, whatever its scaling run says); else the
    compute-bound one of the largest count; else the first "no verdict". None without a model
    probe."""
    return _verdict(_probes(doc))


def _verdict(probes: list[_Probe]) -> Finding | None:
    found = []
    for p in probes:
        if p.kind == "model" and p.run is not None and p.run.gpu_counts:
            verdicts = _model_verdicts(p.run)
            if verdicts:
                n, where, text = verdicts[-1]
                found.append((p, n, where, text))
    if not found:
        return None
    found.sort(key=lambda f: f[0].round)  # stable: run order within a round
    bound = [f for f in found if not f[3].startswith(("compute-bound", "no verdict"))]
    compute = [f for f in found if f[3].startswith("compute-bound")]
    if bound:
        p, n, where, text = bound[0]
    elif compute:
        p, n, where, text = max(compute, key=lambda f: f[1])
    else:  # every model probe failed: the first one says why
        p, n, where, text = found[0]
    return Finding(
        _verdict_severity(p.run, n, text),
        f"verdict: {text} ({where}, {p.where})",
        p.round,
        p.name,
    )


def _gemm_findings(run) -> list[tuple[str, str]]:
    from mgpu_bench.probes.gemm import measure as gemm

    out = []
    for line in gemm.findings(run):
        bad = (
            "wrong results" in line
            or "algorithms cuBLASLt proposed ran" in line
            or "below the node's median" in line
        )
        out.append((PROBLEM if bad else WARNING, line))
    groups: dict = {}
    for r in run.results:
        if r.phase != "search" and r.tflops:
            groups.setdefault((r.dtype, r.shape), []).append(r)
    for (dtype, shape), rs in groups.items():
        slow = gemm.outliers(
            {r.gpu: r.tflops for r in rs}, {r.gpu: r.noise for r in rs}
        )
        if len(rs) < 2 or slow or any(r.wrong for r in rs):
            continue
        med = statistics.median(r.tflops for r in rs)
        peaks = sorted({r.peak.value for r in rs if r.peak and r.peak.value})
        of = (
            f" ({100 * med * 1e12 / peaks[0]:.0f}% of the {peaks[0] / 1e12:g} TFLOP/s dense peak)"
            if len(peaks) == 1
            else ""
        )
        out.append(
            (
                OK,
                (
                    f"{dtype} {shape}: the {len(rs)} GPUs are within max(2%, 3x noise) "
                    f"of their median {med:.1f} TFLOP/s{of}"
                ),
            )
        )
    return out


def _memory_findings(run) -> list[tuple[str, str]]:
    from mgpu_bench.probes.memory import measure as memory

    out = []
    for line in memory.findings(run):
        if ("HBM" in line and "datasheet" in line) or (
            line.startswith("max batch") and "failed" in line
        ):
            sev = PROBLEM
        elif (
            line.startswith("no allocator fragmented")
            or ("unusable as one block" in line and "cannot" not in line)
            or "negligible" in line
        ):
            sev = OK
        else:
            sev = WARNING
        out.append((sev, line))
    copies = {}
    for h in run.hbm:
        if h.kind in ("copy_ce", "copy_sm") and h.pct_peak is not None:
            copies[h.gpu] = max(copies.get(h.gpu, 0.0), h.bandwidth)
    peaks = sorted({h.peak for h in run.hbm if h.peak})
    if (
        copies
        and len(peaks) == 1
        and all(bw >= memory.HBM_FLOOR * peaks[0] for bw in copies.values())
    ):
        lo, hi = min(copies.values()), max(copies.values())
        where = (
            f"GPU {next(iter(copies))}: {lo / 1e12:.2f} TB/s, {100 * lo / peaks[0]:.0f}%"
            if len(copies) == 1
            else f"{len(copies)} GPUs: {lo / 1e12:.2f}-{hi / 1e12:.2f} TB/s, {100 * lo / peaks[0]:.0f}% or more"
        )
        out.append(
            (
                OK,
                (
                    f"HBM copy on {where} of the {peaks[0] / 1e12:.2f} TB/s datasheet "
                    f"figure (healthy >= {100 * memory.HBM_FLOOR:.0f}%)"
                ),
            )
        )
    for (model, seq), by in _max_batches(run).items():
        parts = [
            f"{by[c]} per GPU {'with' if c else 'without'} activation checkpointing"
            for c in (False, True)
            if c in by
        ]
        out.append((OK, f"largest batch of {model} at seq {seq}: {', '.join(parts)}"))
    return out


def _max_batches(run) -> dict[tuple, dict[bool, Any]]:
    """(model, seq len) -> {checkpointing: largest batch} of the searches that did not fail."""
    out: dict[tuple, dict[bool, Any]] = {}
    for m in run.max_batch:
        if not m.get("error"):
            out.setdefault((m.get("model"), m.get("seq_len")), {})[
                bool(m.get("checkpointing"))
            ] = m.get("max_batch")
    return out


def _model_findings(run, skip: str | None) -> list[tuple[str, str]]:
    """model_bench.findings with severities; the line equal to `skip` (the headline's) is left
    out, and so is the input-pipeline loss a verdict already states."""
    from mgpu_bench.probes.model import measure as model_bench

    verdicts = {where: (n, text) for n, where, text in _model_verdicts(run)}
    scaling = run.scaling()
    out = []
    for line in model_bench.findings(run):
        if line == skip:
            continue
        where, _, rest = line.partition(": ")
        if where in verdicts and rest == verdicts[where][1]:
            out.append((_verdict_severity(run, verdicts[where][0], rest), line))
            continue
        m = re.match(r"scaling 1 -> (\d+): ", line)
        if m and int(m.group(1)) in scaling:
            out.append(
                _scaling_finding(run, int(m.group(1)), scaling[int(m.group(1))], line)
            )
            continue
        m = re.search(r"input-pipeline loss ([\d.]+)%", line)
        if m:
            high = float(m.group(1)) > 100 * model_bench.INPUT_LIMIT
            if (
                high
                and where in verdicts
                and verdicts[where][1].startswith("input-bound: the input pipeline")
            ):
                continue  # the verdict line carries the same figure
            out.append((WARNING if high else OK, line))
            continue
        if re.match(r"\d+ (GPU\(s\)|process\(es\)), \w+ data: ", line):
            out.append((PROBLEM, line))  # a configuration that failed
            continue
        out.append((WARNING, line))
    return out


def _scaling_finding(run, n: int, eff: float, line: str) -> tuple[str, str]:
    from mgpu_bench.probes.model import measure as model_bench

    if eff > SCALING_ABOVE:
        return WARNING, (
            f"{line}: above 100%, so the 1-{'GPU' if run.config.device == 'cuda' else 'process'} "
            "baseline ran slower than its share (noise, or a throttled or shared first GPU): run again"
        )
    if eff >= SCALING_GOOD:
        return OK, line
    sev = WARNING if eff >= SCALING_POOR else PROBLEM
    s = run.effective(n)
    exposed = s.derived.get("exposed_comm_share") if s is not None else None
    if exposed is not None and exposed > model_bench.EXPOSED_COMM_LIMIT:
        cause = "communication-bound: the gradient all-reduce is not hidden behind the backward pass"
    elif exposed is not None:
        unit = "GPUs" if run.config.device == "cuda" else "processes"
        cause = (
            f"the step itself is {1 / eff:.1f}x longer on {n} {unit} while communication is hidden: the ranks "
            "compete for shared resources (CPU cores, memory bandwidth, PCIe) or one rank is slow"
        )
    else:
        cause = "exposed communication was not measured (--exposed-comm)"
    return sev, f"{line} (healthy >= {100 * SCALING_GOOD:.0f}%): {cause}"


def _comm_findings(run) -> list[tuple[str, str]]:
    from mgpu_bench.probes.comm import render as report
    from mgpu_bench.sizes import format_bytes

    out = []
    transport = [f for f in run.findings if "where NVLink allows P2P" in f]
    out += [(WARNING, f) for f in run.findings]
    t = report.theory_dict(run.theory) or {}
    bw = t.get("bandwidth")
    summary = report.summary(run) if run.measurements else []
    by_op: dict[str, dict] = {}
    for s in summary:
        if s["op"] not in by_op or s["placement"] == "out-of-place":
            by_op[s["op"]] = s
    main = "allreduce" if "allreduce" in by_op else next(iter(by_op), None)
    for op, s in by_op.items():
        if s["wrong"]:
            out.append(
                (
                    PROBLEM,
                    f"{op}: {s['wrong']} wrong element(s): the data did not arrive intact",
                )
            )
        if not bw:
            continue
        share = s["busbw_at_largest"] / bw
        text = (
            f"{op} busbw {_gbs(s['busbw_at_largest'])} GB/s at {format_bytes(s['largest_bytes'])}, "
            f"{100 * share:.0f}% of the {bw / 1e9:.0f} GB/s theory ({t.get('summary')})"
        )
        if share < COMM_LOW or (
            share < COMM_WEAK and s["largest_bytes"] >= COMM_SETTLED
        ):
            cause = (
                f": {transport[0]}"
                if transport
                else ": NCCL's log names no slower transport; check mgpu-bench topo, NCCL_P2P_* / NCCL_IB_* and "
                "NCCL_ALGO / NCCL_PROTO"
            )
            out.append((PROBLEM if share < COMM_LOW else WARNING, text + cause))
        elif op == main:
            out.append(
                (
                    OK,
                    text
                    + (
                        f"; NCCL rings reach about {t['practical'] / 1e9:.0f} GB/s"
                        if t.get("practical")
                        else ""
                    ),
                )
            )
    return out


def _links_findings(run, hops: dict, doc: Mapping) -> list[tuple[str, str]]:
    from mgpu_bench import topo
    from mgpu_bench.probes.links import measure as links

    topo_findings = (
        topo.findings(doc["topology"])
        if isinstance(doc.get("topology"), Mapping)
        else []
    )
    lines = links.findings(run, hops, topo_findings)
    out = []
    for line in lines:
        bad = "on a healthy link" in line or " slow pairs" in line
        out.append((PROBLEM if bad else WARNING, line))
    ce = run.copies("ce", False)
    if ce and not lines:
        med = statistics.median(m.bandwidth for m in ce.values())
        (a, b), slowest = min(ce.items(), key=lambda kv: kv[1].bandwidth)
        theory = [h.bandwidth for h in hops.values() if h.bandwidth]
        of = ""
        if theory:
            ref = statistics.median(theory)
            of = f", {100 * med / ref:.0f}% of the {ref / 1e9:.0f} GB/s link theory (healthy copies reach about 87%)"
        out.append(
            (
                OK,
                (
                    f"GPU-to-GPU copies (copy engine, one direction): median "
                    f"{_gbs(med)} GB/s over {len(ce)} pair(s){of}; slowest GPU {a} -> "
                    f"GPU {b} {_gbs(slowest.bandwidth)} GB/s"
                ),
            )
        )
    return out


def _telemetry_gpus(tel: Mapping | None) -> dict[str, Mapping]:
    """GPU index (as text) -> {static, series, summary} of the suite's own sampling."""
    gpus = (tel or {}).get("gpus") or {}
    if not isinstance(gpus, Mapping):
        return {}
    return {str(k): v for k, v in gpus.items() if isinstance(v, Mapping)}


def _telemetry_findings(tel: Mapping | None) -> list[tuple[str, str]]:
    """A GPU whose SM clock stayed below its peers' while the probe ran, with the cause
    telemetry.explain names; the GPUs whose clocks were lowered (power cap, thermal, ...) at
    their peers' clock, in one line."""
    from mgpu_bench import telemetry

    sums = {
        k: g["summary"]
        for k, g in _telemetry_gpus(tel).items()
        if isinstance(g.get("summary"), Mapping)
    }
    out, capped = [], {}
    for k, summary in sums.items():
        peers = [v for j, v in sums.items() if j != k]
        clocks = [v["sm_hz_median"] for v in peers if v.get("sm_hz_median")]
        clock = summary.get("sm_hz_median")
        if (
            clock and clocks and clock < 0.98 * statistics.median(clocks)
        ):  # explain()'s 2%
            out.append(
                (WARNING, f"GPU {k} while it ran: {telemetry.explain(summary, peers)}")
            )
        elif summary.get("limiting"):
            capped.setdefault(", ".join(summary["limiting"]), []).append(k)
    for reasons, gpus in capped.items():
        out.append(
            (
                WARNING,
                f"GPU {', '.join(gpus)} while it ran: clocks lowered by {reasons}",
            )
        )
    return out


def _status_findings(p: _Probe) -> list[tuple[str, str]]:
    """What the probe's status and document say, worded "round 2 comm failed: <error>"."""
    why = p.error or "no reason given"
    if p.status == "failed":
        return [(PROBLEM, f"{p.where} failed: {why}")]
    if p.status in ("skipped", "interrupted"):
        return [(WARNING, f"{p.where} {p.status}: {why}")]
    out = []
    if p.status != "ok":
        out.append((WARNING, f"{p.where} ended with status '{p.status}': {why}"))
    if p.doc is None:
        out.append((WARNING, f"{p.where}: no result document"))
    elif p.kind is None:
        kinds = "gemm, memory, model, comm, links"
        out.append(
            (WARNING, f"{p.where}: a result document of unknown kind (none of {kinds})")
        )
    elif p.load_error:
        out.append(
            (
                PROBLEM,
                f"{p.where}: its result document could not be read: {p.load_error}",
            )
        )
    return out


def findings(doc: Mapping) -> list[Finding]:
    """Every verdict of the suite, problems first, then warnings, then ok; in each, the headline
    verdict first and then the probes in run order. Each module's own findings are reused and
    given a severity; the suite adds failed, skipped and stopped probes, busbw against theory,
    the cause of short scaling and the healthy figures."""
    return _findings(_probes(doc))


def _findings(probes: list[_Probe]) -> list[Finding]:
    head = _verdict(probes)
    out: list[Finding] = [head] if head else []
    for p in probes:
        out += [
            Finding(sev, text, p.round, p.name) for sev, text in _status_findings(p)
        ]
        if p.kind != "gemm":  # gemm judges the clocks it sampled itself
            out += [
                Finding(sev, f"{p.where}: {text}", p.round, p.name)
                for sev, text in _telemetry_findings(p.telemetry)
            ]
        if p.run is None:
            continue
        # A failed probe's partial document still says what went wrong: it is read too.
        lines = []
        stopped = None if p.kind == "links" else p.run.stopped
        if stopped:
            lines.append(
                (
                    PROBLEM,
                    f"stopped early ({stopped}): {p.run.stop_message or 'no message'}",
                )
            )
        try:
            lines += _probe_findings(p, head)
        except Exception as exc:  # noqa: BLE001 - one odd document must not cost the report
            lines.append(
                (
                    PROBLEM,
                    f"its findings could not be computed: {type(exc).__name__}: {exc}",
                )
            )
        out += [
            Finding(sev, f"{p.where}: {text}", p.round, p.name) for sev, text in lines
        ]
    # sorted() is stable: the order within a severity is kept.
    return sorted(out, key=lambda f: SEVERITIES.index(f.severity))


def _probe_findings(p: _Probe, head: Finding | None) -> list[tuple[str, str]]:
    if p.kind == "gemm":
        return _gemm_findings(p.run)
    if p.kind == "memory":
        return _memory_findings(p.run)
    if p.kind == "model":
        skip = None
        if head is not None and head.round == p.round and head.probe == p.name:
            _n, where, text = _model_verdicts(p.run)[-1]
            skip = f"{where}: {text}"
        return _model_findings(p.run, skip)
    if p.kind == "comm":
        return _comm_findings(p.run)
    if p.kind == "links":
        return _links_findings(*p.run, p.doc)  # type: ignore[misc]
    return []


# ------------------------------------------------------------------------------------ table


def _gbs(bps: float) -> str:
    """bytes/s as GB/s (10^9), one decimal from 10 GB/s up, two below."""
    v = bps / 1e9
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _key_gemm(run) -> tuple[str, str]:
    from mgpu_bench.probes.gemm import measure as gemm

    figs, exps = [], []
    sustained = [r for r in run.results if r.series]
    if sustained:
        for dtype in dict.fromkeys(r.dtype for r in sustained):
            rs = [r for r in sustained if r.dtype == dtype]
            per = {
                r.gpu: statistics.median(
                    r.shape.flops / s / 1e12 for _, s in r.series if s
                )
                for r in rs
            }
            tel = [(r.series_telemetry or {}).get("summary") or {} for r in rs]
            clocks = [t["sm_hz_median"] for t in tel if t.get("sm_hz_median")]
            power = [t["power_w_max"] for t in tel if t.get("power_w_max") is not None]
            temp = [t["temp_c_max"] for t in tel if t.get("temp_c_max") is not None]
            reasons = sorted({x for t in tel for x in t.get("limiting") or []})
            low = min(per, key=per.__getitem__)
            med = statistics.median(per.values())
            text = (
                f"{dtype} sustained {max(r.series[-1][0] for r in rs):.0f} s: median {med:.1f} TFLOP/s over "
                f"{len(per)} GPU(s)"
                + (f" (lowest GPU {low}: {per[low]:.1f})" if len(per) > 1 else "")
            )
            if clocks:
                text += f"; SM clock median {statistics.median(clocks) / 1e6:.0f} MHz"
            if power:
                text += f", power up to {max(power):.0f} W"
            if temp:
                text += f", up to {max(temp):.0f} C"
            if reasons:
                text += f"; {', '.join(reasons)}"
            figs.append(text)
            peaks = sorted({r.peak.value for r in rs if r.peak and r.peak.value})
            if len(peaks) == 1:
                exps.append(
                    f"{peaks[0] / 1e12:g} TFLOP/s dense peak ({100 * med * 1e12 / peaks[0]:.0f}%)"
                )
        return "; ".join(figs), "; ".join(exps) or "-"
    groups: dict = {}
    for r in run.results:
        if r.phase != "search" and r.tflops:
            groups.setdefault((r.dtype, r.shape), []).append(r)
    for (dtype, shape), rs in groups.items():
        per = {r.gpu: r.tflops for r in rs}
        med = statistics.median(per.values())
        low = min(per, key=per.__getitem__)
        figs.append(
            f"{dtype} {shape}: median {med:.1f} TFLOP/s over {len(per)} GPU(s)"
            + (f" (lowest GPU {low}: {per[low]:.1f})" if len(per) > 1 else "")
        )
        peaks = sorted({r.peak.value for r in rs if r.peak and r.peak.value})
        if len(peaks) == 1:
            exps.append(
                f"{peaks[0] / 1e12:g} TFLOP/s dense peak ({100 * med * 1e12 / peaks[0]:.0f}%)"
            )
    if not figs and any(r.best is None for r in run.results):
        figs.append(f"no valid result ({len(gemm.findings(run))} finding(s))")
    return "; ".join(figs) or "-", "; ".join(exps) or "-"


def _key_memory(run) -> tuple[str, str]:
    from mgpu_bench.probes.memory import measure as memory

    figs, exps = [], []
    ce = {h.gpu: h for h in run.hbm if h.kind == "copy_ce"}
    if ce:
        low = min(ce.values(), key=lambda h: h.bandwidth)
        figs.append(
            f"HBM copy {low.bandwidth / 1e12:.2f} TB/s"
            + (f" (lowest of {len(ce)} GPUs: GPU {low.gpu})" if len(ce) > 1 else "")
        )
        if low.peak:
            exps.append(f"{low.peak / 1e12:.2f} TB/s datasheet ({low.pct_peak:.0f}%)")
    known = [r for r in run.churn if r.fragmentation is not None]
    if known:
        worst = max(known, key=lambda r: r.fragmentation or 0.0)
        figs.append(
            f"worst fragmentation {100 * (worst.fragmentation or 0):.1f}% ({worst.allocator}, {worst.pattern})"
        )
        exps.append(f"<= {100 * memory.FRAGMENTED:.0f}% healthy")
    for (model, seq), by in _max_batches(run).items():
        figs.append(
            f"max batch {model} seq {seq}: "
            + ", ".join(
                f"{by[c]}{' with checkpointing' if c else ''}"
                for c in (False, True)
                if c in by
            )
        )
    return "; ".join(figs) or "-", "; ".join(exps) or "-"


def _key_model(run) -> tuple[str, str]:
    from mgpu_bench.probes.model import measure as model_bench

    tps = {
        n: s.derived["tokens_per_s"]
        for n in run.gpu_counts
        if (s := run.effective(n)) is not None and s.derived.get("tokens_per_s")
    }
    if not tps:
        return "-", "-"
    eff = run.scaling()
    if len(tps) >= 2 and 1 in tps:
        n = max(tps)
        fig = (
            f"scaling 1 -> {n}: {100 * eff[n]:.1f}% ({tps[n]:.0f} tokens/s against the ideal "
            f"{n * tps[1]:.0f})"
        )
        s = run.effective(n)
        exposed = s.derived.get("exposed_comm_share") if s else None
        exp = f">= {100 * SCALING_GOOD:.0f}%" + (
            f"; exposed communication {100 * exposed:.1f}% (healthy < "
            f"{100 * model_bench.EXPOSED_COMM_LIMIT:.0f}%)"
            if exposed is not None
            else ""
        )
        return fig, exp
    n = max(tps)
    s = run.effective(n)
    fig = f"{_model_where(run, n)}: {tps[n]:.0f} tokens/s, step {1e3 * s.derived['step_s']:.1f} ms"
    gross = run.get(n, "loader")
    if s.data != "loader" and gross is not None and gross.derived.get("tokens_per_s"):
        fig += f" ({gross.derived['tokens_per_s']:.0f} tokens/s with the DataLoader)"
    mfu = s.derived.get("mfu")
    peak = run.peak
    if mfu is not None and peak is not None and peak.value:
        exp = f"MFU {100 * mfu:.1f}% of {peak.value / 1e12:g} TFLOP/s"
    else:
        exp = "no peak figure: no MFU"
    return fig, exp


def _key_comm(run) -> tuple[str, str]:
    from mgpu_bench.probes.comm import render as report
    from mgpu_bench.sizes import format_bytes

    summary = report.summary(run) if run.measurements else []
    if not summary:
        return "-", "-"
    ops = [s["op"] for s in summary]
    op = "allreduce" if "allreduce" in ops else ops[0]
    s = next(
        (s for s in summary if s["op"] == op and s["placement"] == "out-of-place"),
        next(s for s in summary if s["op"] == op),
    )
    fig = f"{op} {format_bytes(s['largest_bytes'])} busbw {_gbs(s['busbw_at_largest'])} GB/s"
    t = report.theory_dict(run.theory) or {}
    if t.get("bandwidth"):
        return (
            fig,
            f"{100 * s['busbw_at_largest'] / t['bandwidth']:.0f}% of {t['bandwidth'] / 1e9:.0f} GB/s theory",
        )
    return fig, f"no link theory ({run.backend} ranks)"


def _key_links(run, hops: dict) -> tuple[str, str]:
    ce = run.copies("ce", False)
    if not ce:
        h2d = run.host("h2d")
        if h2d:
            return (
                f"host -> GPU median {_gbs(statistics.median(m.bandwidth for m in h2d.values()))} GB/s",
                "-",
            )
        return "-", "-"
    med = statistics.median(m.bandwidth for m in ce.values())
    (a, b), slowest = min(ce.items(), key=lambda kv: kv[1].bandwidth)
    fig = f"copy engine median {_gbs(med)} GB/s over {len(ce)} pair(s) (slowest {a} -> {b}: {_gbs(slowest.bandwidth)})"
    theory = [h.bandwidth for h in hops.values() if h.bandwidth]
    if not theory:
        return fig, "-"
    ref = statistics.median(theory)
    return fig, f"{100 * med / ref:.0f}% of {ref / 1e9:.0f} GB/s per direction"


def _key(p: _Probe) -> tuple[str, str]:
    if p.run is None:
        return "-", "-"
    try:
        if p.kind == "links":
            return _key_links(*p.run)
        return {
            "gemm": _key_gemm,
            "memory": _key_memory,
            "model": _key_model,
            "comm": _key_comm,
        }[p.kind](p.run)
    except Exception as exc:  # noqa: BLE001 - the table says what it could not read
        return f"unreadable: {type(exc).__name__}", "-"


def headline_rows(doc: Mapping) -> list[dict]:
    """The summary table, built once for Markdown and HTML: per probe its round, name, title,
    status, wall seconds, key figure (with unit) and the figure it is judged against."""
    return _rows(_probes(doc))


def _rows(probes: list[_Probe]) -> list[dict]:
    rows = []
    for p in probes:
        fig, exp = _key(p)
        rows.append(
            {
                "round": p.round,
                "probe": p.name,
                "title": p.title,
                "status": p.status,
                "seconds": p.seconds,
                "figure": fig,
                "expected": exp,
                "error": p.error,
                "command": p.command,
            }
        )
    return rows


_TABLE_HEADERS = (
    "round",
    "probe",
    "status",
    "wall s",
    "key figure",
    "expected / theory",
)


def _table_cells(row: dict) -> list[str]:
    secs = "-" if row["seconds"] is None else f"{row['seconds']:.1f}"
    return [
        str(row["round"]),
        row["probe"],
        row["status"],
        secs,
        row["figure"],
        row["expected"],
    ]


# ------------------------------------------------------------------------------------ markdown


def _md(text: object) -> str:
    """Outside text for Markdown (html_page.md)."""
    return html_page.md(text)


def _gpu_summary(environment: Mapping) -> str:
    names = Counter(
        str(g.get("name"))
        for g in environment.get("gpus") or []
        if isinstance(g, Mapping) and "name" in g
    )
    return ", ".join(f"{n}x {name}" for name, n in names.items()) or "no GPU"


def machine_line(environment: Mapping) -> str:
    """host; GPU names x count; driver; CUDA; NCCL; torch (plain text, not escaped)."""
    e = environment
    nccl = e.get("nccl") or e.get("torch_nccl")
    return (
        f"host {e.get('host')}; {_gpu_summary(e)}; driver {e.get('nvidia_driver') or '-'}; "
        f"CUDA {e.get('cuda_driver') or '-'} (runtime {e.get('cuda_runtime') or '-'}); NCCL {nccl or '-'}; "
        f"torch {e.get('torch') or '-'}"
    )


def _run_line(doc: Mapping) -> str:
    rounds = ", ".join(str(r) for r in doc.get("rounds") or [])
    dur = doc.get("duration_s")
    return (
        f"created {doc.get('created')}, mgpu-bench {doc.get('tool_version')}, rounds {rounds or '-'}"
        + (f", round 3 duration {dur:g} s" if isinstance(dur, (int, float)) else "")
        + (", quick" if doc.get("quick") else "")
    )


def _command(argv: Sequence) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv) if argv else "-"


def markdown(doc: Mapping) -> str:
    """The ticket-sized summary: the machine, the verdicts (problems first), one table of the
    probes' key figures against their theory, failed probes with their error."""
    env = doc.get("environment") or {}
    probes = _probes(doc)
    fs = _findings(probes)
    counts = Counter(f.severity for f in fs)
    lines = [
        f"# mgpu-bench suite: {_md(env.get('host'))}",
        "",
        f"- machine: {_md(machine_line(env))}",
        f"- run: {_md(_run_line(doc))}",
        "",
        f"## Verdicts ({counts[PROBLEM]} problem(s), {counts[WARNING]} warning(s), {counts[OK]} ok)",
        "",
    ]
    lines += [
        f"- **{f.severity.upper()}** {_md(f.text)}"
        if f.severity != OK
        else f"- ok: {_md(f.text)}"
        for f in fs
    ]
    rows = _rows(probes)
    lines += [
        "",
        "## Probes",
        "",
        *html_page.md_table(
            _TABLE_HEADERS,
            [_table_cells(r) for r in rows],  # md_table escapes each cell
        ),
    ]
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines += ["", "## Failed or incomplete probes", ""]
        lines += [
            f"- round {r['round']} {_md(r['probe'])} {_md(r['status'])}: {_md(r['error'] or 'no reason given')} "
            f"(command: {_md(_command(r['command']))})"
            for r in failed
        ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ plots


def plot_temperature(run, dtype: str) -> bytes | None:
    """GPU temperature (C) over the sustained runs of `dtype`, from the telemetry sampled beside
    them (gemm_report.plot_sustained draws TFLOP/s, SM clock and power); None without any."""
    rs = [
        r
        for r in run.results
        if r.dtype == dtype and r.series and (r.series_telemetry or {}).get("temp_c")
    ]
    if not rs:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.0, 2.6), dpi=110)
    for i, r in enumerate(rs):
        t = r.series_telemetry
        pts = [
            (x, v)
            for x, v in zip(t.get("t") or [], t.get("temp_c") or [])
            if v is not None
        ]
        if pts:
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                "-",
                color=f"C{i % 10}",
                linewidth=1,
                label=f"GPU {r.gpu}",
            )
    ax.set_xlabel("time since the sustained run started (s)")
    ax.set_ylabel("temperature (C)")
    ax.set_title(_plain(f"{dtype} sustained GEMM: GPU temperature"), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return _png(plt, fig)


def plot_telemetry(tel: Mapping, title: str) -> bytes | None:
    """SM clock (MHz), power (W) and temperature (C) over the probe's run per GPU, from the
    NVML samples the suite took beside it, with the max SM clock and the power limit dotted; a
    panel without data is left out; None without any."""
    gpus = _telemetry_gpus(tel)
    panels = [
        (key, label, unit, limit)
        for key, label, unit, limit in (
            ("sm_hz", "SM clock (MHz)", 1e6, "sm_max_hz"),
            ("power_w", "power (W)", 1.0, "power_limit_w"),
            ("temp_c", "temperature (C)", 1.0, None),
        )
        if any(
            v is not None
            for g in gpus.values()
            for v in (g.get("series") or {}).get(key) or []
        )
    ]
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(
        len(panels),
        1,
        sharex=True,
        squeeze=False,
        dpi=110,
        figsize=(9.0, 0.9 + 2.0 * len(panels)),
    )
    for (key, label, unit, limit_key), ax in zip(panels, axes[:, 0]):
        limits = set()
        for i, (k, g) in enumerate(gpus.items()):
            series = g.get("series") or {}
            pts = [
                (t, v / unit)
                for t, v in zip(series.get("t") or [], series.get(key) or [])
                if v is not None
            ]
            if pts:
                ax.plot(
                    [x for x, _ in pts],
                    [y for _, y in pts],
                    "-",
                    color=f"C{i % 10}",
                    linewidth=1,
                    label=f"GPU {_plain(k)}",
                )
            lim = (
                (g.get("static") or g.get("summary") or {}).get(limit_key)
                if limit_key
                else None
            )
            if isinstance(lim, (int, float)) and lim:
                limits.add(lim / unit)
        what = "max SM clock" if limit_key == "sm_max_hz" else "power limit"
        for lim in sorted(limits):
            ax.axhline(
                lim,
                color="black",
                linewidth=1,
                linestyle=":",
                label=f"{what} {lim:.0f}",
            )
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(
            loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False
        )
    axes[-1, 0].set_xlabel("time since the probe started (s)")
    axes[0, 0].set_title(_plain(title), fontsize=10)
    return _png(plt, fig)


def plot_history(trend: Mapping[str, Sequence[tuple[str, float, str]]]) -> bytes | None:
    """One panel per metric: its value over the runs' creation times, the newest point marked.
    `trend`: metric name -> [(created ISO time, value, unit)]; None when no point can be read."""
    import datetime as _dt

    series = []
    for name, points in trend.items():
        pts = []
        for p in points or []:
            try:
                when = _dt.datetime.fromisoformat(str(p[0]))
                value = float(p[1])
            except (TypeError, ValueError, IndexError):
                continue
            if not math.isnan(value):
                pts.append((when, value, str(p[2]) if len(p) > 2 else ""))
        if pts:
            series.append(
                (
                    name,
                    sorted(
                        pts,
                        key=lambda x: (
                            x[0].timestamp() if x[0].tzinfo else x[0].toordinal()
                        ),
                    ),
                )
            )
    if not series:
        return None
    plt = _pyplot()
    cols = 1 if len(series) == 1 else 2
    rows = (len(series) + cols - 1) // cols
    fig, axes = plt.subplots(
        rows, cols, squeeze=False, figsize=(5.2 * cols, 2.6 * rows), dpi=100
    )
    for ax, (name, pts) in zip(axes.flat, series):
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, "-o", markersize=3, linewidth=1, color="tab:blue")
        ax.plot(xs[-1:], ys[-1:], "o", markersize=6, color="tab:red", label="this run")
        ax.set_title(_plain(name), fontsize=9)
        ax.set_ylabel(_plain(pts[-1][2]), fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.tick_params(axis="x", labelsize=7, rotation=30)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return _png(plt, fig)


def _probe_images(p: _Probe) -> dict[str, bytes]:
    """The module's own PNGs of one probe, keyed without the probe's prefix."""
    from mgpu_bench.probes.comm import report as comm_report
    from mgpu_bench.probes.gemm import report as gemm_report
    from mgpu_bench.probes.links import measure as links
    from mgpu_bench.probes.memory import report as memory_report
    from mgpu_bench.probes.model import report as model_report

    run = p.run
    if p.kind == "gemm":
        out = dict(gemm_report.images(run))
        if _telemetry_gpus(p.telemetry):
            return out  # the suite's telemetry plot has the temperature
        for dtype in dict.fromkeys(r.dtype for r in run.results if r.series):
            png = plot_temperature(run, dtype)
            if png:
                out[f"temperature_{dtype}"] = png
        return out
    if p.kind == "memory":
        return memory_report.images(run)
    if p.kind == "model":
        return model_report.images(run)
    if p.kind == "comm":
        return {
            f"busbw_{op}": comm_report.plot_op(run, op)
            for op in dict.fromkeys(m.spec.op for m in run.measurements)
        }
    if p.kind == "links":
        out = {}
        for engine in ("ce", "sm"):
            for bidir in (False, True):
                png = links.heatmap_png(run[0], engine, bidir)
                if png:
                    out[f"links_{engine}_{'bi' if bidir else 'uni'}"] = png
        return out
    return {}


def images(doc: Mapping, history_trend: Mapping | None = None) -> dict[str, bytes]:
    """Every PNG of the page keyed by file stem: <NN>_<probe>_<plot> per probe in run order (the
    modules' own plots), and history when a trend is given. A probe whose plots fail is left
    without them (its section says so)."""
    return _images(_probes(doc), history_trend)


def _images(probes: list[_Probe], history_trend: Mapping | None) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for p in probes:
        pngs: dict[str, bytes] = {}
        # A plot that fails on an odd document leaves its section without it, the rest drawn.
        with contextlib.suppress(Exception):
            if p.run is not None:
                pngs.update(_probe_images(p))
        with contextlib.suppress(Exception):
            title = f"{p.where}: clocks, power and temperature sampled by the suite"
            png = plot_telemetry(p.telemetry, title) if p.telemetry else None
            if png:
                pngs["telemetry"] = png
        out.update({f"{p.slug}_{k}": v for k, v in pngs.items()})
    if history_trend:
        png = plot_history(history_trend)
        if png:
            out["history"] = png
    return out


# ------------------------------------------------------------------------------------ page

_STYLE = html_page.STYLE + (
    "h2{border-bottom:2px solid #444;padding-bottom:2px;margin-top:1.6em}h3{margin-bottom:.3em}"
    ".machine{font-size:1.05em}.sub{color:#555}ul.findings{list-style:none;padding:0}"
    "ul.findings li{margin:4px 0;padding:4px 8px}.problem{background:#fdecea;border-left:6px solid #c62828}"
    ".warning{background:#fff8e1;border-left:6px solid #f9a825}.ok{background:#edf7ed;border-left:6px solid #2e7d32}"
    ".tag{font-weight:bold;font-family:monospace;display:inline-block;min-width:6.5em}"
    ".verdict{font-size:1.15em;padding:8px 10px;margin:8px 0}.grid{display:flex;flex-wrap:wrap;gap:12px}"
    ".probes th{text-align:left}.grid p{margin:0}.st-ok{color:#2e7d32}.st-bad{color:#c62828}.err{color:#b00;font-family:monospace;white-space:pre-wrap}td{vertical-align:top}"
)


def _ul(items: Sequence[str], cls: str = "") -> str:
    e = html.escape
    if not items:
        return ""
    return (
        f"<ul{f' class={cls}' if cls else ''}>"
        + "".join(f"<li>{e(str(i))}</li>" for i in items)
        + "</ul>"
    )


def _imgs(
    imgs: Mapping[str, bytes],
    p: _Probe,
    keys: Sequence[str] | None = None,
    grid: bool = False,
) -> str:
    prefix = f"{p.slug}_"
    mine = [k for k in imgs if k.startswith(prefix)]
    if keys is not None:
        mine = [prefix + k for k in keys if prefix + k in imgs]
    body = "".join(html_page.image(k[len(prefix) :], imgs[k]) for k in mine)
    return f"<div class=grid>{body}</div>" if grid and body else body


def _section_gemm(p: _Probe, imgs) -> str:
    from mgpu_bench.probes.gemm import measure as gemm
    from mgpu_bench.probes.gemm import report as gemm_report

    run = p.run
    parts = [
        _imgs(
            imgs,
            p,
            [
                k
                for k in (
                    f"{kind}_{d}"
                    for d in dict.fromkeys(r.dtype for r in run.results)
                    for kind in ("gemm", "sustained", "temperature", "search")
                )
            ],
        )
    ]
    rows = gemm.rows(run)
    if rows:
        parts.append(
            html_page.table(
                [t for t, _, _ in gemm_report.COLUMNS],
                [[cell(r) for _, _, cell in gemm_report.COLUMNS] for r in rows],
                left=[
                    i
                    for i, (_, right, _) in enumerate(gemm_report.COLUMNS)
                    if not right
                ],
            )
        )
    sustained = [r for r in run.results if r.series]
    if sustained:
        srows = []
        for r in sustained:
            t = (r.series_telemetry or {}).get("summary") or {}
            tps = [r.shape.flops / s / 1e12 for _, s in r.series if s]

            def f(key, scale=1.0, fmt=".0f", t=t):
                v = t.get(key)
                return "-" if v is None else format(v * scale, fmt)

            srows.append(
                [
                    r.gpu,
                    r.dtype,
                    str(r.shape),
                    f"{r.series[-1][0]:.0f}",
                    f"{statistics.median(tps):.1f}",
                    f"{min(tps):.1f}",
                    f("sm_hz_median", 1e-6),
                    f("sm_hz_min", 1e-6),
                    f("power_w_mean"),
                    f("power_w_max"),
                    f("power_limit_w"),
                    f("temp_c_max"),
                    ", ".join(t.get("limiting") or []) or "-",
                ]
            )
        parts.append(
            "<p><b>sustained runs</b>: clocks, power, temperature and throttle reasons sampled beside them</p>"
        )
        parts.append(
            html_page.table(
                [
                    "GPU",
                    "dtype",
                    "M x N x K",
                    "s",
                    "TFLOP/s median",
                    "TFLOP/s min",
                    "SM MHz median",
                    "SM MHz min",
                    "W mean",
                    "W max",
                    "W limit",
                    "C max",
                    "throttle reasons",
                ],
                srows,
                left=(1, 2, 12),
            )
        )
    parts.append(_ul(gemm.summary_lines(run), "mono"))
    return "".join(parts)


def _section_memory(p: _Probe, imgs) -> str:
    from mgpu_bench.probes.memory import report as memory_report

    run = p.run
    parts = [_imgs(imgs, p, grid=True)]
    for headers, rows, left in (
        memory_report.churn_rows(run) + ((1, 2),),
        memory_report.hbm_rows(run) + ((1,),),
    ):
        if rows:
            parts.append(html_page.table(headers, rows, left=left))
    if run.max_batch:
        parts.append(
            html_page.table(
                [
                    "model",
                    "seq len",
                    "activation checkpointing",
                    "largest batch per GPU",
                    "first OOM batch",
                    "trials",
                    "s",
                    "error",
                ],
                [
                    [
                        m.get("model"),
                        m.get("seq_len"),
                        "on" if m.get("checkpointing") else "off",
                        "-" if m.get("max_batch") is None else m.get("max_batch"),
                        "-"
                        if m.get("first_oom_batch") is None
                        else m.get("first_oom_batch"),
                        len(m.get("trials") or []),
                        f"{m.get('seconds') or 0:.1f}",
                        m.get("error") or "-",
                    ]
                    for m in run.max_batch
                ],
                left=(0, 2, 7),
            )
        )
    return "".join(parts)


def _section_model(p: _Probe, imgs) -> str:
    from mgpu_bench.probes.model import report as model_report

    run = p.run
    parts = [
        html_page.table(
            ["setting", "value"], model_report._config_rows(run), left=(0, 1)
        )
    ]
    headers, rows = model_report._rows(run)
    if rows:
        parts.append(html_page.table(headers, rows, left=(1, 13)))
    headers, rows = model_report._scaling_rows(run)
    if rows:
        parts.append(html_page.table(headers, rows, left=(1,)))
    parts.append(_imgs(imgs, p, ["phases", "steps", "scaling"], grid=True))
    return "".join(parts)


def _section_comm(p: _Probe, imgs) -> str:
    from mgpu_bench.probes.comm import render as report
    from mgpu_bench.sizes import format_bytes

    run = p.run
    e = html.escape
    t = report.theory_dict(run.theory) or {}
    parts = [
        f"<p>{run.nranks} ranks, backend {e(run.backend)}; theory: "
        + f"{e(t.get('summary') or 'none (no GPU topology)')}</p>"
    ]
    if run.transports:
        words = "; ".join(
            f"{pair} " + ", ".join(f"{k} x{v}" for k, v in c.items())
            for pair, c in run.transports.items()
        )
        parts.append(f"<p>NCCL transports (ranks, channels): {e(words)}</p>")
    parts.append(_imgs(imgs, p, grid=True))
    rows = []
    for s in report.summary(run) if run.measurements else []:
        pct = (
            f"{100 * s['busbw_at_largest'] / t['bandwidth']:.0f}"
            if t.get("bandwidth")
            else "-"
        )
        mean = "-" if s["mean_busbw_large"] is None else _gbs(s["mean_busbw_large"])
        rows.append(
            [
                s["op"],
                s["placement"],
                format_bytes(s["largest_bytes"]),
                _gbs(s["busbw_at_largest"]),
                mean,
                pct,
                s["wrong"],
            ]
        )
    if rows:
        parts.append(
            html_page.table(
                [
                    "op",
                    "placement",
                    "largest size",
                    "busbw GB/s",
                    "mean busbw >= 64 MiB GB/s",
                    "% of theory",
                    "wrong",
                ],
                rows,
                left=(0, 1),
            )
        )
    return "".join(parts)


def _section_links(p: _Probe, imgs) -> str:
    run, hops = p.run
    parts = []
    details = sorted({h.detail for h in hops.values()})
    if details:
        bws = sorted({h.bandwidth for h in hops.values() if h.bandwidth})
        parts.append(
            f"<p>link theory: {html.escape('; '.join(details))}"
            + (f", {bws[0] / 1e9:.0f} GB/s per direction" if len(bws) == 1 else "")
            + "</p>"
        )
    parts.append(_imgs(imgs, p, grid=True))
    lat = run.latencies()
    if lat:
        us = sorted(m.median_s * 1e6 for m in lat.values())
        parts.append(
            f"<p>dependent 4-byte read of a peer's memory: median {statistics.median(us):.2f} us "
            f"(range {us[0]:.2f}-{us[-1]:.2f}) over {len(us)} pairs</p>"
        )
    h2d, d2h = run.host("h2d"), run.host("d2h")
    if h2d or d2h:
        parts.append(
            html_page.table(
                ["GPU", "host -> GPU GB/s", "GPU -> host GB/s"],
                [
                    [
                        g,
                        _gbs(h2d[g].bandwidth) if g in h2d else "-",
                        _gbs(d2h[g].bandwidth) if g in d2h else "-",
                    ]
                    for g in run.gpus
                ],
            )
        )
    return "".join(parts)


_SECTIONS = {
    "gemm": _section_gemm,
    "memory": _section_memory,
    "model": _section_model,
    "comm": _section_comm,
    "links": _section_links,
}


def _probe_html(p: _Probe, row: dict, imgs) -> str:
    e = html.escape
    secs = "" if p.seconds is None else f", {p.seconds:.1f} s"
    head = (
        f"<h3>{e(p.title or p.name)} <span class=sub>({e(p.name)}: "
        f"<span class={'st-ok' if p.status == 'ok' else 'st-bad'}>{e(p.status)}</span>{e(secs)})</span></h3>"
        f"<p class=sub>command: <span class=mono>{e(_command(p.command))}</span></p>"
    )
    if p.error:
        head += f"<p class=err>{e(p.error)}</p>"
    if row["figure"] != "-":
        head += (
            f"<p><b>{e(row['figure'])}</b>"
            + (f" (expected: {e(row['expected'])})" if row["expected"] != "-" else "")
            + "</p>"
        )
    tel = _telemetry_html(p, imgs)
    if p.run is None:
        unreadable = (
            f"<p class=err>result document not readable: {e(p.load_error)}</p>"
            if p.load_error
            else ""
        )
        return head + unreadable + tel
    try:
        body = _SECTIONS[p.kind](p, imgs)  # type: ignore[index]
    except Exception as exc:  # noqa: BLE001 - the rest of the page still renders
        body = f"<p class=err>this section could not be drawn: {e(type(exc).__name__)}: {e(str(exc))}</p>"
    notes = list(dict.fromkeys((p.run[0] if p.kind == "links" else p.run).notes or []))
    return head + body + tel + (f"<p class=sub>notes:</p>{_ul(notes)}" if notes else "")


def _telemetry_html(p: _Probe, imgs) -> str:
    """The suite's own NVML samples beside the probe: the plot and one row per GPU."""
    if not p.telemetry:
        return ""
    e = html.escape
    every = p.telemetry.get("interval_s")
    every_text = f" every {every:g} s" if isinstance(every, (int, float)) else ""
    parts = [
        f"<p><b>telemetry sampled by the suite</b>{every_text}: clocks, power, temperature "
        + "and clock-event (throttle) reasons while the probe ran</p>"
    ]
    if p.telemetry.get("error"):
        parts.append(f"<p class=err>no telemetry: {e(str(p.telemetry['error']))}</p>")
    parts.append(_imgs(imgs, p, ["telemetry"]))
    rows = []
    for k, g in _telemetry_gpus(p.telemetry).items():
        t = g.get("summary") or {}

        def f(key, scale=1.0, t=t):
            v = t.get(key)
            return f"{v * scale:.0f}" if isinstance(v, (int, float)) else "-"

        rows.append(
            [
                k,
                t.get("samples", "-"),
                f("sm_hz_median", 1e-6),
                f("sm_hz_min", 1e-6),
                f("sm_max_hz", 1e-6),
                f("power_w_mean"),
                f("power_w_max"),
                f("power_limit_w"),
                f("temp_c_max"),
                ", ".join(t.get("reasons") or []) or "-",
            ]
        )
    if rows:
        headers = [
            "GPU",
            "samples",
            "SM MHz median",
            "SM MHz min",
            "SM MHz max clock",
            "W mean",
            "W max",
            "W limit",
            "C max",
            "clock-event reasons seen",
        ]
        parts.append(html_page.table(headers, rows, left=(9,)))
    return "".join(parts)


def _environment_html(env: Mapping) -> str:
    e = html.escape
    keys = (*html_page.ENV_KEYS, "platform", "python")
    rows = [[k, env.get(k)] for k in keys if k in env]
    parts = [html_page.table(["key", "value"], rows, left=(0, 1))]
    gpus = [g for g in env.get("gpus") or [] if isinstance(g, Mapping)]
    if gpus:
        parts.append(
            html_page.table(
                [
                    "index",
                    "name",
                    "memory GiB",
                    "compute capability",
                    "SMs",
                    "PCI bus id",
                    "UUID",
                ],
                [
                    [
                        g.get("index"),
                        g.get("name"),
                        "-"
                        if g.get("total_memory") is None
                        else f"{g['total_memory'] / 2**30:.1f}",
                        g.get("compute_capability", "-"),
                        g.get("multiprocessors", "-"),
                        g.get("pci_bus_id", "-"),
                        g.get("uuid", g.get("error", "-")),
                    ]
                    for g in gpus
                ],
                left=(1, 5, 6),
            )
        )
    variables = env.get("env") or {}
    if variables:
        parts.append(
            html_page.table(
                ["variable", "value"],
                [[k, v] for k, v in variables.items()],
                left=(0, 1),
            )
        )
    libs = env.get("libraries") or {}
    if isinstance(libs, Mapping) and libs:
        parts.append(
            html_page.table(
                ["library", "file loaded"],
                [[k, v] for k, v in libs.items()],
                left=(0, 1),
            )
        )
    return "".join(parts) or f"<p>{e('no environment recorded')}</p>"


def page(
    doc: Mapping,
    history_trend: Mapping | None = None,
    *,
    pngs: Mapping[str, bytes] | None = None,
) -> str:
    """The HTML page: the verdicts on top (problems first, marked), the probes' table, a section
    per round with each probe's own plots and tables, failed probes with their error, the
    history trend (when given: metric name -> [(created ISO time, value, unit)]) and the
    environment. `pngs`: what images() returned, so that write_report draws once."""
    e = html.escape
    probes = _probes(doc)
    imgs = _images(probes, history_trend) if pngs is None else pngs
    env = doc.get("environment") or {}
    fs = _findings(probes)
    counts = Counter(f.severity for f in fs)
    body = [
        f"<h1>mgpu-bench suite: {e(str(env.get('host')))}</h1>",
        f"<p class=machine>{e(machine_line(env))}</p>",
        f"<p class=sub>{e(_run_line(doc))}; command: "
        + f"<span class=mono>{e(_command(doc.get('command') or []))}</span></p>",
    ]
    head = _verdict(probes)
    if head is not None:
        body.append(f"<div class='verdict {head.severity}'><b>{e(head.text)}</b></div>")
    body.append(
        f"<h2>verdicts: {counts[PROBLEM]} problem(s), {counts[WARNING]} warning(s), {counts[OK]} ok</h2>"
    )
    body.append(
        "<ul class=findings>"
        + "".join(  # the headline stands above, not again here
            f"<li class={f.severity}><span class=tag>{f.severity.upper()}</span>{e(f.text)}</li>"
            for f in fs
            if f != head
        )
        + "</ul>"
    )
    rows = _rows(probes)
    body.append(
        "<h2>probes</h2><div class=probes>"
        + html_page.table(
            _TABLE_HEADERS, [_table_cells(r) for r in rows], left=(1, 2, 4, 5)
        )
        + "</div>"
    )
    for rnd in sorted({p.round for p in probes}):
        body.append(f"<h2>round {rnd}: {e(ROUND_TITLES.get(rnd, 'other probes'))}</h2>")
        body += [
            _probe_html(p, row, imgs) for p, row in zip(probes, rows) if p.round == rnd
        ]
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        body.append(
            "<h2>failed or incomplete probes</h2>"
            + html_page.table(
                ["round", "probe", "status", "error", "command"],
                [
                    [
                        r["round"],
                        r["probe"],
                        r["status"],
                        r["error"] or "no reason given",
                        _command(r["command"]),
                    ]
                    for r in failed
                ],
                left=(1, 2, 3, 4),
            )
        )
    if "history" in imgs:
        body.append("<h2>history</h2>" + html_page.image("history", imgs["history"]))
    body.append("<h2>environment</h2>" + _environment_html(env))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>mgpu-bench suite</title>"
        f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>"
    )


def write_report(
    doc: Mapping, out_dir: str | Path, history_trend: Mapping | None = None
) -> list[Path]:
    """Writes every PNG (<NN>_<probe>_<plot>.png, history.png), report.html (the images
    embedded: the file works alone) and summary.md into out_dir (created; its parent must exist,
    FileNotFoundError otherwise); returns the paths, in that order."""
    imgs = images(doc, history_trend)
    return html_page.write_bundle(
        out_dir, imgs, page(doc, history_trend, pngs=imgs), markdown(doc)
    )
