"""What a fleet pass says: which node, GPU, rail or link is bad, with the deciding figure.

Every figure is judged against the fleet's own median among nodes of the same GPU model, never
against a datasheet: slow means below the median by more than max(floor, k x noise), noise being
the robust spread of that figure over the fleet above its median (spread()). Floors: compute and
memory 5% (a GPU within 5% of its peers is healthy), links 15% (networks are noisier); CPU
processes standing in for nodes, 20% and 30% (they share one host's cores). k grows
with the number of figures compared, so that a healthy fleet of any size has no false suspect
with 99% probability: k = the normal quantile of 1 - 0.01 / count, at least 3 (3.2 for 64 figures,
4.6 for 8192).

Links are judged by pairings (schedule.py): a node slow in more than half of its pairings is the
suspect node and explains its partners' slow pairing with it; then a rail (local rank r's NIC)
slow in more than half of its node's pairings, the others fine, is the suspect rail; a slow
pairing that neither explains, both partners fine elsewhere, is the suspect link. Health facts
(ECC, retired or remapped memory, PCIe below its maximum, NVLinks down, a lowered power limit,
another process on the GPU) are findings of their own. Figures so spread that only one below half
the median could be called slow give a warning that the pass cannot judge them, and for the
pairings no node, rail or link is named from them.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

K_NOISE = 3.0
# The world against two nodes: a ring over many nodes adds latency and its own imbalance, so a
# world 30% below what two nodes reach is the least that is called slow.
FLOOR = {"compute": 0.05, "memory": 0.05, "sendrecv": 0.15, "allreduce": 0.15, "world": 0.30}
# CPU processes (gloo) stand in for nodes on one host: they share its cores, caches and loopback,
# so differences within these floors are the host's scheduling, not a part.
FLOOR_CPU = {"compute": 0.20, "memory": 0.20, "sendrecv": 0.30, "allreduce": 0.30, "world": 0.50}
# Past this threshold a figure would have to fall below half the median to be called slow: the
# pass says it cannot judge rather than calling everything fine.
TOO_NOISY = 0.5
UNITS = {"compute": ("TFLOP/s", 1e12), "memory": ("GB/s", 1e9), "sendrecv": ("GB/s", 1e9),
         "allreduce": ("GB/s", 1e9), "world": ("GB/s", 1e9)}


@dataclass(frozen=True)
class Suspect:
    """One bad part. what: node, gpu, rail, link, health, no answer, or (node -1) world, group
    or noise (figures too spread to judge); node: the node index;
    part: the GPU or rail (local rank), or the partner node of a link; text: the verdict with
    the deciding figure; severity: problem or warning; drain: whether its node goes in the list
    of nodes to drain."""

    what: str
    node: int
    part: int | None
    text: str
    severity: str = "problem"
    drain: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def spread(values: Sequence[float]) -> tuple[float, float]:
    """(median, robust relative noise); noise 0 with fewer than 3 values. The noise is 1.4826 x
    the median deviation above the median, over the median: a bad part only ever makes a figure
    lower, so the upper half is noise alone (on symmetric noise this is the usual MAD), while
    the lower half holds the faults whose share would inflate a two-sided MAD."""
    med = statistics.median(values)
    if len(values) < 3 or med <= 0:
        return med, 0.0
    return med, 1.4826 * statistics.median(v - med for v in values if v >= med) / med


def k_for(count: int) -> float:
    """Sigmas beyond which one of `count` healthy figures falls with 1% probability (at least 3)."""
    return max(K_NOISE, statistics.NormalDist().inv_cdf(1 - 0.01 / max(1, count)))


def threshold(kind: str, noise: float, count: int = 1, cpu: bool = False) -> float:
    return max((FLOOR_CPU if cpu else FLOOR)[kind], k_for(count) * noise)


def is_slow(kind: str, value: float, median: float, noise: float, count: int = 1, cpu: bool = False) -> bool:
    return median > 0 and value < median * (1 - threshold(kind, noise, count, cpu))


def too_noisy(what: str, kind: str, noise: float, count: int, cpu: bool, fix: str) -> list[Suspect]:
    """A warning when `noise` leaves nothing short of half the median judged slow."""
    t = threshold(kind, noise, count, cpu)
    if t < TOO_NOISY:
        return []
    reach = (f"only one below {100 * (1 - t):.0f}% of the median could be called slow" if t < 1
             else "none could be called slow")
    return [Suspect("noise", -1, None, f"{what} too noisy to judge: they spread {100 * noise:.0f}% (robust) over the "
                                       f"fleet, so {reach}; {fix}", "warning", False)]


def fmt(kind: str, value: float | None) -> str:
    if value is None:
        return "-"
    unit, scale = UNITS[kind]
    if value < scale:  # CPU processes: GFLOP/s, MB/s
        unit, scale = unit.replace("TFLOP", "GFLOP").replace("GB", "MB"), scale / 1e3
    v = value / scale
    return f"{v:.1f} {unit}" if v >= 10 else f"{v:.2f} {unit}"


def pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.0f}%"


def _by_model(nodes: Sequence[Mapping]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for n in nodes:
        if n.get("answered", True):
            groups.setdefault(str(n.get("model") or "?"), []).append(n["index"])
    return groups


def gpu_outliers(nodes: Sequence[Mapping]) -> tuple[list[Suspect], dict]:
    """Per GPU model, each GPU's compute and memory against the fleet median of that model.
    -> (suspects, {(kind, model): (median, noise)})."""
    out, stats = [], {}
    by_index = {n["index"]: n for n in nodes}
    for model, members in _by_model(nodes).items():
        for kind, key in (("compute", "flops_per_s"), ("memory", "copy_bytes_per_s")):
            values = {(i, g["local"]): g[key] for i in members for g in by_index[i].get("gpus") or []
                      if g.get(key)}
            if len(values) < 2:
                continue
            med, noise = spread(list(values.values()))
            stats[(kind, model)] = (med, noise)
            cpu = model == "cpu"
            for (i, local), v in sorted(values.items()):
                if is_slow(kind, v, med, noise, len(values), cpu):
                    name = by_index[i]["node"]
                    what = "GEMM" if kind == "compute" else "copy"
                    unit = "rank" if model == "cpu" else "GPU"
                    out.append(Suspect("gpu", i, local, f"{name} {unit} {local}: {what} {fmt(kind, v)}, "
                                       f"{100 * (1 - v / med):.0f}% below the fleet median {fmt(kind, med)} "
                                       f"({model}; threshold {100 * threshold(kind, noise, len(values), cpu):.0f}%)"))
            out += too_noisy(f"{'GEMM' if kind == 'compute' else 'Copy'} figures ({model})", kind, noise, len(values),
                             cpu, "rerun when the nodes are idle")
    return out, stats


def link_suspects(nodes: Sequence[Mapping], pairings: Sequence[Mapping]) -> tuple[list[Suspect], dict]:
    """Nodes, rails and links from the pairings (see the module's docstring). A pairing's figure
    is the median of its rails' sendrecv busbw (the pair's allreduce where no rail was timed), over
    the fleet's median. A node is judged by the median of its pairings' figures (one bad partner
    does not move it; a bad node moves all of its own), against the spread of every node's: nodes
    are taken worst first, each explaining its pairings away before the next is judged. A rail by
    its share of its pairings' median rail, the same way. A link by its own pairing's figure, when
    no suspect node or rail explains it.
    -> (suspects, {"sendrecv": (median, noise), "allreduce": (median, noise)})."""
    names = {n["index"]: n["node"] for n in nodes}
    cpu = bool(nodes) and all(n.get("model") == "cpu" for n in nodes)
    stats: dict = {}
    for kind, values in (("sendrecv", [f["busbw"] for pr in pairings for f in (pr.get("rails") or {}).values()
                                       if f.get("busbw")]),
                         ("allreduce", [pr["allreduce"]["busbw"] for pr in pairings
                                        if (pr.get("allreduce") or {}).get("busbw")])):
        if len(values) >= 3:
            stats[kind] = spread(values)
    figure: dict[int, float] = {}  # pairing -> its value
    rails: dict[int, dict[int, float]] = {}
    for p, pr in enumerate(pairings):
        rs = {int(r): f["busbw"] for r, f in (pr.get("rails") or {}).items() if f.get("busbw")}
        if rs:
            rails[p] = rs
            figure[p] = statistics.median(rs.values())
        elif (pr.get("allreduce") or {}).get("busbw"):
            figure[p] = pr["allreduce"]["busbw"]
    out: list[Suspect] = []
    if len(figure) < 3:
        return out, stats
    fleet = statistics.median(figure.values())
    ratio = {p: v / fleet for p, v in figure.items()}
    mine = {n["index"]: [p for p in figure if n["index"] in (pairings[p]["a"], pairings[p]["b"])] for n in nodes}
    _, pair_noise = spread(list(ratio.values()))
    pair_slow = {p for p, r in ratio.items() if is_slow("sendrecv", r, 1.0, pair_noise, len(ratio), cpu)}
    out += too_noisy("Pairings", "sendrecv", pair_noise, len(ratio), cpu,
                     "rerun with more --iters, a larger --size or a lower --concurrency")
    if out:  # too noisy: no node, rail or link is named from them
        return out, stats
    bad: set[int] = set()
    while True:  # nodes, worst first, each explaining its pairings away
        score = {}
        for node, ps in mine.items():
            left = [p for p in ps if not ({pairings[p]["a"], pairings[p]["b"]} - {node}) & bad]
            if node not in bad and len(left) >= 2:
                score[node] = (statistics.median(ratio[p] for p in left), left)
        if len(score) < 3:
            break
        _, fleet_noise = spread([v for v, _ in score.values()])
        # A median of m pairings varies at least as the pairings do, over sqrt(m) (x 1.2533 for a
        # median): a few nodes' scores can agree by chance, the pairings' spread cannot.
        noise_of = {n: max(fleet_noise, 1.2533 * pair_noise / len(left) ** 0.5) for n, (_, left) in score.items()}
        slow = [n for n in score if is_slow("sendrecv", score[n][0], 1.0, noise_of[n], len(score), cpu)]
        if not slow:
            break
        # Of the slow ones, first the node with the largest share of slow pairings, then the lowest
        # median: a healthy node met by several bad ones can have a bad one's median, but not
        # every pairing slow. (Its best pairing would decide the same on clean data; a share is
        # not swayed by one lucky measurement.)
        worst = min(slow, key=lambda n: (-sum(p in pair_slow for p in score[n][1]) / len(score[n][1]),
                                         score[n][0], n))
        value, left = score[worst]
        noise = noise_of[worst]
        bad.add(worst)
        out.append(Suspect("node", worst, None, f"{names[worst]}: its {len(left)} pairings at a median {100 * value:.0f}% "
                                                "of the fleet's pairing (threshold "
                                                f"{100 * (1 - threshold('sendrecv', noise, len(score), cpu)):.0f}%), slow "
                                                "with every partner: the node (its NICs, PCIe or host), not its "
                                                "partners"))
    explained = {p for p in figure if {pairings[p]["a"], pairings[p]["b"]} & bad}
    bad_rails: set[tuple[int, int]] = set()
    rel: dict[tuple[int, int], float] = {}  # (node, rail) -> median share of its pairings' median rail
    for node, ps in mine.items():
        if node in bad:
            continue
        per: dict[int, list[float]] = {}
        for p in ps:
            if p in rails and len(rails[p]) > 1 and p not in explained:
                for r, v in rails[p].items():
                    per.setdefault(r, []).append(v / figure[p])
        for r, vs in per.items():
            if len(vs) >= 2:
                rel[(node, r)] = statistics.median(vs)
    if len(rel) >= 3:
        _, noise = spread(list(rel.values()))
        for (node, r), value in sorted(rel.items(), key=lambda kv: kv[1]):
            if is_slow("sendrecv", value, 1.0, noise, len(rel), cpu):
                bad_rails.add((node, r))
                out.append(Suspect("rail", node, r, f"{names[node]} rail {r} (local rank {r}'s NIC or cable): at "
                                                    f"{100 * value:.0f}% of its pairings' other rails, the other rails "
                                                    "fine"))
    for p in sorted(pair_slow - explained):
        a, b = pairings[p]["a"], pairings[p]["b"]
        if p in rails and any((x, r) in bad_rails for x in (a, b) for r in rails[p]) and statistics.median(
                v for r, v in rails[p].items() if (a, r) not in bad_rails and (b, r) not in bad_rails
        ) / fleet >= 1 - threshold("sendrecv", pair_noise, 1, cpu):
            continue  # its suspect rail explains it
        out.append(Suspect("link", a, b, f"{names[a]} <-> {names[b]} (round {pairings[p]['round'] + 1}): at "
                                         f"{100 * ratio[p]:.0f}% of the fleet's median pairing, slow while both are "
                                         "fine with their other partners: the path between them (switch port, "
                                         "cable, routing)", drain=False))
    return out, stats


def health_suspects(nodes: Sequence[Mapping]) -> list[Suspect]:
    """The health facts each rank read from NVML, as findings: problems drain the node."""
    out = []
    for n in nodes:
        for g in n.get("gpus") or []:
            for h in g.get("health") or []:
                out.append(Suspect("health", n["index"], g["local"], f"{n['node']} GPU {g['local']}: {h['text']}",
                                   h.get("severity", "problem"), h.get("severity", "problem") == "problem"))
    return out


def world_slow(world: Mapping | None, pairings: Sequence[Mapping], cpu: bool = False
               ) -> tuple[bool, float | None, float | None]:
    """The world allreduce against what two nodes reach (the median pair allreduce: a ring over
    nodes is bound by the same per-node links). -> (slow, world busbw, reference)."""
    ref_values = [pr["allreduce"]["busbw"] for pr in pairings if (pr.get("allreduce") or {}).get("busbw")]
    w = (world or {}).get("busbw")
    if not w or len(ref_values) < 1:
        return False, w, None
    med, noise = spread(ref_values)
    return is_slow("world", w, med, noise, 1, cpu), w, med


def judge(doc: Mapping) -> dict:
    """Every suspect of the pass, the drain list and the figures they were judged by."""
    nodes = doc.get("nodes") or []
    pairings = doc.get("pairings") or []
    suspects = [Suspect("no answer", n["index"], None, f"{n['node']}: no answer ({n.get('lost') or 'never arrived'})")
                for n in nodes if not n.get("answered", True)]
    gpus, gstats = gpu_outliers(nodes)
    links, lstats = link_suspects(nodes, pairings)
    suspects += health_suspects(nodes) + gpus + links
    slow, w, ref = world_slow(doc.get("world"), pairings, bool(nodes) and all(n.get("model") == "cpu" for n in nodes))
    iso = doc.get("isolation") or {}
    if slow:
        names = {n["index"]: n["node"] for n in nodes}
        explained = [s for s in suspects if s.what in ("node", "rail", "gpu")]  # an absent node is not in it
        text = f"world allreduce {fmt('world', w)} against {fmt('world', ref)} between two nodes"
        if explained:
            suspects.append(Suspect("world", -1, None, f"{text}: explained by the suspects above", "warning", False))
        for g in iso.get("found") or []:
            suspects.append(Suspect("group", -1, None, f"{text}; isolated to the group "
                                    f"{', '.join(names[i] for i in g)}", drain=False))
        for g in iso.get("between") or []:
            suspects.append(Suspect("group", -1, None, f"{text}; the group {', '.join(names[i] for i in g)} is slow "
                                    "while its halves alone are fine: the path between them", drain=False))
        if not explained and not iso:
            suspects.append(Suspect("world", -1, None, f"{text}: not isolated (no isolation pass)", "warning", False))
    drain = sorted({s.node for s in suspects if s.drain and s.node >= 0})
    return {"suspects": [s.to_dict() for s in suspects], "drain": drain,
            "stats": {"gpu": {f"{k[0]}:{k[1]}": v for k, v in gstats.items()},
                      **{k: v for k, v in lstats.items() if k != "slow"}},
            "world": {"busbw": w, "reference": ref, "slow": slow}}


def node_table(doc: Mapping, verdicts: Mapping) -> list[dict]:
    """One row per node, worst first: its deciding figure against the fleet median, the noise,
    its verdict."""
    suspects = [Suspect(**s) for s in verdicts["suspects"]]
    rows = []
    stats = verdicts["stats"]
    for n in doc.get("nodes") or []:
        mine = [s for s in suspects if s.node == n["index"]]
        worst_ratio, deciding = float("inf"), "-"
        for g in n.get("gpus") or []:
            for kind, key in (("compute", "flops_per_s"), ("memory", "copy_bytes_per_s")):
                med_noise = stats["gpu"].get(f"{kind}:{n.get('model')}")
                if g.get(key) and med_noise and med_noise[0]:
                    ratio = g[key] / med_noise[0]
                    if ratio < worst_ratio:
                        worst_ratio = ratio
                        unit = "rank" if n.get("model") == "cpu" else "GPU"
                        deciding = (f"{unit} {g['local']} {('GEMM' if kind == 'compute' else 'copy')} {fmt(kind, g[key])}"
                                    f" (median {fmt(kind, med_noise[0])}, noise {100 * med_noise[1]:.1f}%)")
        for pr in doc.get("pairings") or []:
            if n["index"] in (pr["a"], pr["b"]):
                for rail, fig in (pr.get("rails") or {}).items():
                    med_noise = stats.get("sendrecv")
                    if fig.get("busbw") and med_noise and med_noise[0]:
                        ratio = fig["busbw"] / med_noise[0]
                        if ratio < worst_ratio:
                            other = pr["b"] if pr["a"] == n["index"] else pr["a"]
                            worst_ratio = ratio
                            deciding = (f"rail {rail} with node {other}: {fmt('sendrecv', fig['busbw'])} (median "
                                        f"{fmt('sendrecv', med_noise[0])}, noise {100 * med_noise[1]:.1f}%)")
        verdict = "; ".join(s.text.split(": ", 1)[-1] for s in mine if s.severity == "problem") or \
            ("no answer" if not n.get("answered", True) else "ok")
        rows.append({"node": n["node"], "index": n["index"], "model": n.get("model"),
                     "ratio": worst_ratio if deciding != "-" else None,
                     "deciding": deciding, "verdict": verdict,
                     "suspect": any(s.severity == "problem" for s in mine)})
    return sorted(rows, key=lambda r: (not r["suspect"], r["ratio"] if r["ratio"] is not None else 0.0, r["index"]))
