"""What a links run means: the slow pair, and the GPU behind most slow pairs with what the topology
says about it; copies against the link theory; the suite's verdicts.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable

from mgpu_bench.results.probe import OK, PROBLEM, WARNING, Finding
from mgpu_bench.results.sizes import format_gbs

from .result import ENGINES, OUTLIER_DROP, OUTLIER_Z, LinksRun


def robust_z(values: dict, key_value: Callable = lambda m: m) -> dict:
    """(x - median) / (1.4826 * MAD) per key; 0 for all when the MAD is 0."""
    xs = {k: key_value(v) for k, v in values.items()}
    if len(xs) < 3:
        return {k: 0.0 for k in xs}
    med = statistics.median(xs.values())
    mad = statistics.median(abs(x - med) for x in xs.values())
    if mad == 0:
        return {k: 0.0 for k in xs}
    return {k: (x - med) / (1.4826 * mad) for k, x in xs.items()}


def outliers(run: LinksRun) -> list[dict]:
    """Pairs well below the node's median, per engine and direction mode, and the GPU they
    share when one GPU is in most of them."""
    found = []
    for engine in ENGINES:
        for bidir in (False, True):
            copies = run.copies(engine, bidir)
            if len(copies) < 3:
                continue
            z = robust_z(copies, lambda m: m.bandwidth)
            med = statistics.median(m.bandwidth for m in copies.values())
            for (a, b), m in copies.items():
                if z[(a, b)] < -OUTLIER_Z and m.bandwidth < (1 - OUTLIER_DROP) * med:
                    found.append({"src": a, "dst": b, "engine": engine, "bidirectional": bidir,
                                  "bandwidth": m.bandwidth, "node_median": med, "z": z[(a, b)]})
    return found


# A copy-engine copy below this share of the link's per-direction theory is a finding (H200
# pairs reach 87%: benchmarks/RESULTS.md; published H100/H200 pairwise copies about 88%).
LOW_SHARE_OF_THEORY = 0.70


def _causes(gpu: int, topo_findings: list[dict]) -> list[str]:
    """What the topology's findings say about `gpu` (subjects "GPU 5", "GPU 0 <-> GPU 5").
    The topology counts GPUs as NVML does; with CUDA_DEVICE_ORDER=PCI_BUS_ID both agree."""
    pattern = re.compile(rf"\bGPU {gpu}\b")
    return [f["message"] for f in topo_findings if pattern.search(f.get("subject", ""))]


def findings(run: LinksRun, hops: dict | None = None, topo_findings: list[dict] | None = None) -> list[Finding]:
    """Missing peer access (warnings); copies far below the link theory (per-pair hops: the
    run's own unless given) and slow pairs against the node's median, the GPU named when it is in
    most of them with what the topology (the run's snapshot unless given) says about it
    (problems)."""
    out = [Finding(WARNING, n) for n in run.notes]
    hops = run.hops if hops is None else hops
    if topo_findings is None:
        from mgpu_bench.machine import topo_view

        topo_findings = topo_view.findings(run.topology) if run.topology else []
    for (a, b), m in sorted(run.copies("ce", False).items()):
        h = (hops or {}).get((a, b))
        bw = getattr(h, "bandwidth", None)
        if bw and m.bandwidth < LOW_SHARE_OF_THEORY * bw:
            out.append(Finding(PROBLEM, f"GPU {a} -> GPU {b}: {m.bandwidth / 1e9:.1f} GB/s, {100 * m.bandwidth / bw:.0f}% of "
                       f"{h.detail} ({bw / 1e9:.0f} GB/s per direction); copies reach about 87% on a healthy link"))
    slow = outliers(run)
    if slow:
        counts: dict[int, int] = {}
        for s in slow:
            counts[s["src"]] = counts.get(s["src"], 0) + 1
            counts[s["dst"]] = counts.get(s["dst"], 0) + 1
        worst, n = max(counts.items(), key=lambda kv: kv[1])
        if n > 1 and n >= len(slow) * 0.6:
            causes = _causes(worst, topo_findings)
            why = ("; the topology says: " + "; ".join(causes)) if causes else \
                " (check for an NVLink down, fewer active links, a downgraded PCIe link)"
            out.append(Finding(PROBLEM, f"GPU {worst} is in {n} of {len(slow)} slow pairs{why}"))
        for s in slow:
            out.append(Finding(WARNING, f"GPU {s['src']} -> GPU {s['dst']} ({s['engine']}, "
                       f"{'both directions' if s['bidirectional'] else 'one direction'}): "
                       f"{s['bandwidth'] / 1e9:.1f} GB/s vs node median {s['node_median'] / 1e9:.1f} GB/s"))
    return out


def judge(run: LinksRun, hops: dict | None = None, found: list[Finding] | None = None) -> list[Finding]:
    """The suite's ok line when nothing was found (the run's own findings unless given): the
    copy-engine median against the link theory (the run's hops unless given), and the slowest pair."""
    hops = run.hops if hops is None else hops
    found = findings(run, hops) if found is None else found
    ce = run.copies("ce", False)
    if not ce or found:
        return []
    med = statistics.median(m.bandwidth for m in ce.values())
    (a, b), slowest = min(ce.items(), key=lambda kv: kv[1].bandwidth)
    theory = [h.bandwidth for h in hops.values() if h.bandwidth]
    of = ""
    if theory:
        ref = statistics.median(theory)
        of = f", {100 * med / ref:.0f}% of the {ref / 1e9:.0f} GB/s link theory (healthy copies reach about 87%)"
    return [Finding(OK, f"GPU-to-GPU copies (copy engine, one direction): median {format_gbs(med)} GB/s over "
                        f"{len(ce)} pair(s){of}; slowest GPU {a} -> GPU {b} {format_gbs(slowest.bandwidth)} GB/s")]


def key_figure(run: LinksRun, hops: dict | None = None) -> tuple[str, str]:
    """The copy-engine median and the slowest pair against the link theory (the run's hops
    unless given; host copies when no pair was measured)."""
    hops = run.hops if hops is None else hops
    ce = run.copies("ce", False)
    if not ce:
        h2d = run.host("h2d")
        if h2d:
            return f"host -> GPU median {format_gbs(statistics.median(m.bandwidth for m in h2d.values()))} GB/s", "-"
        return "-", "-"
    med = statistics.median(m.bandwidth for m in ce.values())
    (a, b), slowest = min(ce.items(), key=lambda kv: kv[1].bandwidth)
    fig = (f"copy engine median {format_gbs(med)} GB/s over {len(ce)} pair(s) (slowest {a} -> {b}: "
           f"{format_gbs(slowest.bandwidth)})")
    theory = [h.bandwidth for h in hops.values() if h.bandwidth]
    if not theory:
        return fig, "-"
    ref = statistics.median(theory)
    return fig, f"{100 * med / ref:.0f}% of {ref / 1e9:.0f} GB/s per direction"
