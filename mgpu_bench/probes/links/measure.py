"""`mgpu-bench links`: GPU-to-GPU and host-to-GPU copy bandwidth and latency, per pair, with
the outlier named.

Every ordered pair (src, dst) is measured with the copy engines (cudaMemcpyPeerAsync) and with
SMs (a kernel on dst reading src's memory over the peer mapping), one direction and both at
once; plus the latency of a dependent 4-byte read from the peer's memory, and pinned host to
device / device to host copies per GPU. Each figure is the median of `iters` copies.
Localisation compares each pair with the node's own median (robust z-score: deviation over
1.4826 x the median absolute deviation), so one slow link stands out whatever the hardware.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from mgpu_bench import _native
from mgpu_bench.errors import InputError

ENGINES = ("ce", "sm")
# A pair is an outlier when it is this many robust standard deviations below the median and
# at least OUTLIER_DROP below it in relative terms (so that a very tight node with a MAD of
# ~0 does not flag 1% differences).
OUTLIER_Z = 3.0
OUTLIER_DROP = 0.10


@dataclass(frozen=True)
class LinkSpec:
    kind: str  # "copy", "latency" (dst reads src's memory) or "host"
    src: int  # GPU index
    dst: int | None  # GPU index; None for host copies
    engine: str | None = None  # "ce" or "sm" for copies
    bidirectional: bool = False
    direction: str | None = None  # "h2d" or "d2h" for host copies
    bytes: int = 0


@dataclass(frozen=True)
class LinkMeasurement:
    spec: LinkSpec
    seconds: tuple[float, ...]  # per copy, or per dependent load for latency

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def bandwidth(self) -> float:
        """bytes/s per direction: bytes / median copy time (a bidirectional copy moves `bytes`
        each way in that time)."""
        return self.spec.bytes / self.median_s

    @property
    def total_bandwidth(self) -> float:
        """bytes/s over both directions for a bidirectional copy, else the bandwidth."""
        return self.bandwidth * (2 if self.spec.bidirectional else 1)

    def to_dict(self) -> dict:
        return {"kind": "link", "spec": asdict(self.spec), "seconds": list(self.seconds)}


@dataclass
class LinksRun:
    gpus: list[int]
    measurements: list[LinkMeasurement] = field(default_factory=list)
    peer_access: dict[tuple[int, int], bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    per_pair_seconds: float = 0.0  # wall time of one ordered pair's measurements (median)
    host_seconds: float = 0.0  # wall time of all host copies

    def estimate_seconds(self, ngpus: int) -> float:
        """Wall time of the same run on `ngpus` GPUs: ordered pairs x the measured time of one
        pair, plus host copies per GPU (pairs are measured one at a time)."""
        per_gpu_host = self.host_seconds / len(self.gpus) if self.gpus else 0.0
        return ngpus * (ngpus - 1) * self.per_pair_seconds + ngpus * per_gpu_host

    def copies(self, engine: str, bidirectional: bool) -> dict[tuple[int, int], LinkMeasurement]:
        return {(m.spec.src, m.spec.dst): m for m in self.measurements
                if m.spec.kind == "copy" and m.spec.engine == engine and m.spec.bidirectional == bidirectional}

    def latencies(self) -> dict[tuple[int, int], LinkMeasurement]:
        return {(m.spec.src, m.spec.dst): m for m in self.measurements if m.spec.kind == "latency"}

    def host(self, direction: str) -> dict[int, LinkMeasurement]:
        return {m.spec.src: m for m in self.measurements if m.spec.kind == "host" and m.spec.direction == direction}


ProgressFn = Callable[[int, int, str], None]


def run_links(gpus: list[int], *, size: int = 256 << 20, iters: int = 10, warmup: int = 3,
              engines: tuple[str, ...] = ENGINES, latency: bool = True, host: bool = True,
              progress: ProgressFn | None = None) -> LinksRun:
    """Measures every ordered pair of `gpus`. A pair without peer access gets copy-engine
    figures only (the driver stages them through host memory) and a note."""
    if len(gpus) < 2 and not host:
        raise InputError("links needs 2 GPUs or more (or host copies)")
    if size < 16 or iters < 1 or warmup < 0:
        raise InputError("--size must be >= 16 bytes, --iters >= 1, --warmup >= 0")
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        raise InputError(f"unknown engine '{bad[0]}': choose from {', '.join(ENGINES)}")
    run = LinksRun(gpus=list(gpus))
    pairs = [(a, b) for a in gpus for b in gpus if a != b]
    steps = len(pairs) + (len(gpus) if host else 0)
    t0 = time.perf_counter()
    pair_walls = []
    for i, (a, b) in enumerate(pairs):
        if progress:
            progress(i, steps, f"GPU {a} -> GPU {b}")
        tp = time.perf_counter()
        peer = bool(_native.can_access_peer(a, b))
        run.peer_access[(a, b)] = peer
        if not peer:
            run.notes.append(f"GPU {a} -> GPU {b}: no peer access; copies go through host memory, SM copies skipped")
        for engine in engines:
            if engine == "sm" and not peer:
                continue
            for bidir in (False, True):
                r = _native.links_copy(a, b, size, engine, bidir, warmup, iters)
                spec = LinkSpec("copy", a, b, engine, bidir, None, size // 16 * 16)
                run.measurements.append(LinkMeasurement(spec, tuple(r["seconds"])))
        if latency and peer:
            # GPU b reads GPU a's memory: the latency of the a -> b direction of the link.
            t = _native.links_read_latency(b, a, 64 << 20, 5000, 5)
            run.measurements.append(LinkMeasurement(LinkSpec("latency", a, b), tuple(t)))
        pair_walls.append(time.perf_counter() - tp)
    th = time.perf_counter()
    if host:
        for j, g in enumerate(gpus):
            if progress:
                progress(len(pairs) + j, steps, f"host <-> GPU {g}")
            for direction in ("h2d", "d2h"):
                t = _native.links_host_copy(g, size, direction == "h2d", warmup, iters)
                run.measurements.append(LinkMeasurement(LinkSpec("host", g, None, direction=direction, bytes=size), tuple(t)))
    run.host_seconds = time.perf_counter() - th
    run.wall_seconds = time.perf_counter() - t0
    run.per_pair_seconds = statistics.median(pair_walls) if pair_walls else 0.0
    return run


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


def findings(run: LinksRun, hops: dict | None = None, topo_findings: list[dict] | None = None) -> list[str]:
    """One line per finding: copies far below the link theory (given per-pair hops), slow
    pairs against the node's median (the GPU named when it is in most of them, with what the
    topology says about it), missing peer access."""
    out = [n for n in run.notes]
    topo_findings = topo_findings or []
    for (a, b), m in sorted(run.copies("ce", False).items()):
        h = (hops or {}).get((a, b))
        bw = getattr(h, "bandwidth", None)
        if bw and m.bandwidth < LOW_SHARE_OF_THEORY * bw:
            out.append(f"GPU {a} -> GPU {b}: {m.bandwidth / 1e9:.1f} GB/s, {100 * m.bandwidth / bw:.0f}% of "
                       f"{h.detail} ({bw / 1e9:.0f} GB/s per direction); copies reach about 87% on a healthy link")
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
            out.append(f"GPU {worst} is in {n} of {len(slow)} slow pairs{why}")
        for s in slow:
            out.append(f"GPU {s['src']} -> GPU {s['dst']} ({s['engine']}, "
                       f"{'both directions' if s['bidirectional'] else 'one direction'}): "
                       f"{s['bandwidth'] / 1e9:.1f} GB/s vs node median {s['node_median'] / 1e9:.1f} GB/s")
    return out


def document(run: LinksRun, hops: dict | None = None) -> dict:
    return {
        "kind": "links",
        "theory": [{"src": a, "dst": b, "bandwidth": h.bandwidth, "detail": h.detail}
                   for (a, b), h in sorted((hops or {}).items())],
        "gpus": run.gpus,
        "peer_access": [{"src": a, "dst": b, "ok": ok} for (a, b), ok in run.peer_access.items()],
        "notes": run.notes,
        "wall_seconds": run.wall_seconds,
        "per_pair_seconds": run.per_pair_seconds,
        "host_seconds": run.host_seconds,
        "estimated_seconds_8_gpus": run.estimate_seconds(8),
        "outliers": outliers(run),
        "measurements": [m.to_dict() for m in run.measurements],
    }


def render(run: LinksRun, console, hops: dict | None = None) -> None:
    """Matrices (rows: source GPU, columns: destination) of GB/s per direction, latency in us,
    and the host copies."""
    from rich.table import Table

    g = run.gpus

    def matrix(title: str, cells: dict[tuple[int, int], str]) -> None:
        console.print(title, highlight=False, soft_wrap=True)  # a table's title would wrap to its width
        t = Table(box=None, pad_edge=False)
        t.add_column("src \\ dst")
        for b in g:
            t.add_column(f"GPU {b}", justify="right")
        for a in g:
            t.add_row(f"GPU {a}", *[("-" if a == b else cells.get((a, b), "n/a")) for b in g])
        console.print(t)
        console.print()

    for engine, label in (("ce", "copy engine"), ("sm", "SM kernel")):
        for bidir in (False, True):
            copies = run.copies(engine, bidir)
            if copies:
                what = "both directions at once, GB/s per direction" if bidir else "one direction, GB/s"
                matrix(f"{label} copies, {what}", {k: f"{m.bandwidth / 1e9:.1f}" for k, m in copies.items()})
    ce = run.copies("ce", False)
    if ce and hops and any(getattr(h, "bandwidth", None) for h in hops.values()):
        cells = {k: (f"{100 * m.bandwidth / hops[k].bandwidth:.0f}%" if getattr(hops.get(k), "bandwidth", None)
                     else "n/a") for k, m in ce.items()}
        details = sorted({h.detail for h in hops.values()})
        matrix(f"copy engine, one direction, % of the link's per-direction theory ({'; '.join(details)})", cells)
    lat = run.latencies()
    if lat:
        matrix("dependent 4-byte read of the source's memory by the destination, us",
               {k: f"{m.median_s * 1e6:.2f}" for k, m in lat.items()})
    h2d, d2h = run.host("h2d"), run.host("d2h")
    if h2d:
        console.print("pinned host memory <-> GPU, GB/s", highlight=False, soft_wrap=True)
        t = Table(box=None, pad_edge=False)
        t.add_column("GPU")
        t.add_column("host -> GPU", justify="right")
        t.add_column("GPU -> host", justify="right")
        for x in g:
            t.add_row(f"GPU {x}", f"{h2d[x].bandwidth / 1e9:.1f}" if x in h2d else "n/a",
                      f"{d2h[x].bandwidth / 1e9:.1f}" if x in d2h else "n/a")
        console.print(t)
        console.print()


def gpus_or_error(spec: str | None) -> list[int]:
    from mgpu_bench.probes.comm.measure import require_gpus

    return require_gpus("links", spec)[0]


def heatmap_png(run: LinksRun, engine: str, bidirectional: bool) -> bytes | None:
    """A GPU x GPU heatmap (rows source, columns destination) of GB/s per direction."""
    copies = run.copies(engine, bidirectional)
    if not copies:
        return None
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    g = run.gpus
    grid = np.full((len(g), len(g)), np.nan)
    for (a, b), m in copies.items():
        grid[g.index(a), g.index(b)] = m.bandwidth / 1e9
    fig, ax = plt.subplots(figsize=(1.2 + 0.7 * len(g), 1.0 + 0.6 * len(g)), dpi=110)
    try:
        im = ax.imshow(grid, cmap="viridis")
        ax.set_xticks(range(len(g)), [f"GPU {x}" for x in g], rotation=45)
        ax.set_yticks(range(len(g)), [f"GPU {x}" for x in g])
        ax.set_xlabel("destination")
        ax.set_ylabel("source")
        mid = (np.nanmin(grid) + np.nanmax(grid)) / 2
        for i in range(len(g)):
            for j in range(len(g)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=7,
                            color="k" if grid[i, j] > mid else "w")
        what = "both directions at once" if bidirectional else "one direction"
        ax.set_title(f"{'copy engine' if engine == 'ce' else 'SM kernel'}, {what}, GB/s", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


def write_report(run: LinksRun, out_dir) -> list:
    """links_<engine>_<uni|bi>.png heatmaps into out_dir (created if its parent exists)."""
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(exist_ok=True)
    written = []
    for engine in ENGINES:
        for bidir in (False, True):
            png = heatmap_png(run, engine, bidir)
            if png:
                p = out / f"links_{engine}_{'bi' if bidir else 'uni'}.png"
                p.write_bytes(png)
                written.append(p)
    return written


def run_from_document(doc: dict) -> tuple[LinksRun, dict]:
    """(links.LinksRun, per-pair theory hops {(src, dst): theory.Hop}) rebuilt from the document
    the links command wrote."""
    from mgpu_bench.theory import Hop

    run = LinksRun(
        gpus=list(doc.get("gpus") or []),
        notes=list(doc.get("notes") or []),
        wall_seconds=doc.get("wall_seconds") or 0.0,
        per_pair_seconds=doc.get("per_pair_seconds") or 0.0,
        host_seconds=doc.get("host_seconds") or 0.0,
    )
    run.measurements = [
        LinkMeasurement(LinkSpec(**m["spec"]), tuple(m["seconds"]))
        for m in doc.get("measurements") or []
        if m.get("kind") == "link"
    ]
    run.peer_access = {
        (p["src"], p["dst"]): bool(p["ok"]) for p in doc.get("peer_access") or []
    }
    hops = {
        (t["src"], t["dst"]): Hop(
            t["src"],
            t["dst"],
            "nvlink" if "NVLink" in str(t.get("detail")) else "pcie",
            t.get("bandwidth"),
            str(t.get("detail")),
        )
        for t in doc.get("theory") or []
    }
    return run, hops
