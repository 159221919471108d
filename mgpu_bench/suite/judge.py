"""The suite's verdicts over its probes, read through the probe protocol only.

The suite document holds every probe's own result document as its command wrote it. Each is
given to the probe of its kind (probe.py's registry), which reads it back and judges it with its
own findings (probe.findings) and the verdicts the suite adds (probe.judge). The suite adds what
only the whole run can say: failed, skipped or stopped probes, the clocks it sampled itself while
a probe ran, the headline verdict of the training step (the probes' Verdicts: compute-,
communication-, input- or memory-bound), and an order: problems first.
"""

from __future__ import annotations

import contextlib
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from mgpu_bench.results import probe as registry
from mgpu_bench.results.document import Document, document_kind
from mgpu_bench.results.probe import PROBLEM, SEVERITIES, WARNING, Finding, Probe

ROUND_TITLES = {1: "single-GPU baseline", 2: "multi-GPU scaling", 3: "limit throughput"}


@dataclass
class Entry:
    """One probe of the suite with its document and the probe that reads it."""

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
    probe: Probe | None = None  # None: no document, or a kind no probe reads
    load_error: str | None = None
    telemetry: Mapping | None = None  # NVML sampled by the suite beside the probe (round 3)

    @property
    def where(self) -> str:
        return f"round {self.round} {self.name}"

    @property
    def slug(self) -> str:
        return f"{self.index + 1:02d}_{re.sub(r'[^A-Za-z0-9_-]+', '-', self.name)[:40]}"

    @property
    def readable(self) -> bool:
        return self.probe is not None and self.load_error is None


def sub_kind(doc: Mapping | None) -> str | None:
    """The kind of a probe's document when a probe of the registry reads it, else None."""
    kind = document_kind(doc) if isinstance(doc, Mapping) else None
    return kind if kind in registry.REGISTRY and kind != "suite" else None


def entries(doc: Mapping) -> list[Entry]:
    """The suite's probes, each document read back once by its probe; a document that cannot be
    read keeps its error in load_error (a finding) and never stops the report."""
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
        tel = p.get("telemetry")
        e = Entry(i, rnd, str(p.get("name") or f"probe {i + 1}"), str(p.get("title") or p.get("name") or ""),
                  str(p.get("status") or "unknown"), None if p.get("error") is None else str(p.get("error")),
                  seconds if isinstance(seconds, (int, float)) else None, [str(a) for a in p.get("command") or []],
                  sub if isinstance(sub, Mapping) else None, sub_kind(sub),
                  telemetry=tel if isinstance(tel, Mapping) else None)
        if e.kind is not None:
            e.probe = registry.get(e.kind)
            try:  # read once; the probe's methods reuse the run
                e.doc = Document.of(e.doc, e.probe.from_document(e.doc))
            except Exception as exc:  # noqa: BLE001 - a malformed document is reported, not raised
                e.load_error = f"{type(exc).__name__}: {exc}"
        out.append(e)
    return out


# ------------------------------------------------------------------------------------ verdict


def verdict(doc: Mapping) -> Finding | None:
    """The headline: the training-step verdict of the probes that give one, at their largest
    GPU count. The first one, in round order, that names a bound other than compute wins (a box
    whose input pipeline starves one GPU is input-bound, whatever its scaling run says); else the
    compute-bound one of the largest count; else the first "no verdict". None without one."""
    return _headline(entries(doc))[0]


def _headline(found: list[Entry]) -> tuple[Finding | None, str | None]:
    """(the headline Finding, the probe's own line that says the same)."""
    verdicts = []
    for e in found:
        if e.readable:
            with contextlib.suppress(Exception):  # an odd document gives nothing, the rest still renders
                v = e.probe.verdict(e.doc)
                if v is not None:
                    verdicts.append((e, v))
    if not verdicts:
        return None, None
    verdicts.sort(key=lambda ev: ev[0].round)  # stable: run order within a round
    bound = [ev for ev in verdicts if ev[1].bound not in ("compute", "none")]
    compute = [ev for ev in verdicts if ev[1].bound == "compute"]
    if bound:
        e, v = bound[0]
    elif compute:
        e, v = max(compute, key=lambda ev: ev[1].scale)
    else:  # every one failed: the first says why
        e, v = verdicts[0]
    return Finding(v.severity, f"verdict: {v.text} ({v.where}, {e.where})", e.round, e.name), v.line


# ------------------------------------------------------------------------------------ findings


def findings(doc: Mapping) -> list[Finding]:
    """Every verdict of the suite, problems first, then warnings, then ok; in each, the headline
    first and then the probes in run order."""
    return judge(entries(doc))


def judge(found: list[Entry]) -> list[Finding]:
    head, head_line = _headline(found)
    out: list[Finding] = [head] if head else []
    for e in found:
        out += [Finding(sev, text, e.round, e.name) for sev, text in _status(e)]
        if e.probe is None or not e.probe.own_telemetry:
            out += [Finding(sev, f"{e.where}: {text}", e.round, e.name) for sev, text in telemetry_findings(e.telemetry)]
        if not e.readable:
            continue
        # A failed probe's partial document still says what went wrong: it is read too.
        lines: list[Finding] = []
        st = e.doc.get("status") if isinstance(e.doc.get("status"), Mapping) else {}
        if st.get("stopped"):
            lines.append(Finding(PROBLEM, f"stopped early ({st['stopped']}): {st.get('message') or 'no message'}"))
        try:
            own = e.probe.findings(e.doc) + e.probe.judge(e.doc)
            skip = head_line if head is not None and (head.round, head.probe) == (e.round, e.name) else None
            lines += [f for f in own if f.text != skip]
        except Exception as exc:  # noqa: BLE001 - one odd document must not cost the report
            lines.append(Finding(PROBLEM, f"its findings could not be computed: {type(exc).__name__}: {exc}"))
        out += [Finding(f.severity, f"{e.where}: {f.text}", e.round, e.name) for f in lines]
    return sorted(out, key=lambda f: SEVERITIES.index(f.severity))  # stable: the order within a severity is kept


def _status(e: Entry) -> list[tuple[str, str]]:
    """What the probe's status and document say, worded "round 2 comm failed: <error>"."""
    why = e.error or "no reason given"
    if e.status == "failed":
        return [(PROBLEM, f"{e.where} failed: {why}")]
    if e.status in ("skipped", "interrupted"):
        return [(WARNING, f"{e.where} {e.status}: {why}")]
    out = []
    if e.status != "ok":
        out.append((WARNING, f"{e.where} ended with status '{e.status}': {why}"))
    if e.doc is None:
        out.append((WARNING, f"{e.where}: no result document"))
    elif e.kind is None:
        kinds = ", ".join(k for k in registry.REGISTRY if k != "suite")
        out.append((WARNING, f"{e.where}: a result document of unknown kind (none of {kinds})"))
    elif e.load_error:
        out.append((PROBLEM, f"{e.where}: its result document could not be read: {e.load_error}"))
    return out


def telemetry_gpus(tel: Mapping | None) -> dict[str, Mapping]:
    """GPU index (as text) -> {static, series, summary} of the suite's own sampling."""
    gpus = (tel or {}).get("gpus") or {}
    if not isinstance(gpus, Mapping):
        return {}
    return {str(k): v for k, v in gpus.items() if isinstance(v, Mapping)}


def telemetry_findings(tel: Mapping | None) -> list[tuple[str, str]]:
    """A GPU whose SM clock stayed below its peers' while the probe ran, with the cause
    telemetry.explain names; the GPUs at their peers' clock with a concern all the same
    (telemetry.concerns: a power limit below the default, thermal or hardware slowdown), in one
    line per concern. The power cap at the default limit is normal under load: not a finding."""
    from mgpu_bench.machine import telemetry

    sums = {k: g["summary"] for k, g in telemetry_gpus(tel).items() if isinstance(g.get("summary"), Mapping)}
    out, capped = [], {}
    for k, summary in sums.items():
        peers = [v for j, v in sums.items() if j != k]
        clocks = [v["sm_hz_median"] for v in peers if v.get("sm_hz_median")]
        clock = summary.get("sm_hz_median")
        if clock and clocks and clock < 0.98 * statistics.median(clocks):  # explain()'s 2%
            out.append((WARNING, f"GPU {k} while it ran: {telemetry.explain(summary, peers)}"))
        else:
            for concern in telemetry.concerns(summary):
                capped.setdefault(concern, []).append(k)
    for concern, gpus in capped.items():
        out.append((WARNING, f"GPU {', '.join(gpus)} while it ran: {concern}"))
    return out


# ------------------------------------------------------------------------------------ table


def headline_rows(doc: Mapping) -> list[dict]:
    """The summary table, built once for Markdown and HTML: per probe its round, name, title,
    status, wall seconds, key figure (with unit) and the figure it is judged against."""
    return rows(entries(doc))


def rows(found: list[Entry]) -> list[dict]:
    out = []
    for e in found:
        fig, exp = key_figure(e)
        out.append({"round": e.round, "probe": e.name, "title": e.title, "status": e.status, "seconds": e.seconds,
                    "figure": fig, "expected": exp, "error": e.error, "command": e.command})
    return out


def key_figure(e: Entry) -> tuple[str, str]:
    if not e.readable:
        return "-", "-"
    try:
        return e.probe.key_figure(e.doc)
    except Exception as exc:  # noqa: BLE001 - the table says what it could not read
        return f"unreadable: {type(exc).__name__}", "-"


def notes(e: Entry) -> list[str]:
    if not e.readable:
        return []
    with contextlib.suppress(Exception):  # an odd document gives nothing, the rest still renders
        return list(dict.fromkeys(e.probe.notes(e.doc)))
    return []

