"""The fleet pass on the ranks a cluster launcher started (torchrun, srun, mpirun): one process per
GPU (or per CPU process), every rank measuring at once, rank 0 gathering everything through the
process group (no shared file system).

Phases, each bounded by --timeout (the process group's timeout and every wait on the store):
  roster   the ranks that arrive within --timeout form the group; nodes missing are "no answer"
  node     per rank: GEMM (torch.matmul, bf16 on GPUs, fp32 on CPU), device copy bandwidth, the
           GPU's health facts (health.py) and who else is on it; per node: an allreduce among its
           ranks
  links    schedule.pairing_rounds: per round, every pair of nodes at once, per rail (local rank
           r with local rank r) a sendrecv, and the pair's allreduce over both nodes' ranks
  world    an allreduce over every rank
  isolate  when the world is slow and no node or rail explains it: halves of the world measured at
           once, the slow one split again (schedule.isolate)
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from mgpu_bench.core.errors import CommTimeoutError, InputError, defer_sigterm
from mgpu_bench.results.torch_timing import allreduce as _allreduce
from mgpu_bench.results.torch_timing import copy_seconds as _copy_seconds
from mgpu_bench.results.torch_timing import gemm_seconds as _gemm_seconds
from mgpu_bench.results.torch_timing import timed, typical

from . import schedule


@dataclass(frozen=True)
class FleetConfig:
    size: int  # bytes per sendrecv and allreduce
    iters: int  # timed iterations of each collective (the same on every rank of it)
    warmup: int
    rounds: int  # link-pass rounds; 0: schedule.default_rounds
    seed: int
    timeout_s: float
    gemm_n: int  # N of the N^3 matmul
    copy_bytes: int
    phases: tuple[str, ...]
    device: str  # "cuda" or "cpu"
    prometheus: str | None = None  # written by each node for itself
    exclude_file: str | None = None
    expect: tuple[str, ...] = ()  # nodes that should answer (--expect)
    concurrency: int = 0  # pairs measured at once in a round (0: all)
    drain: bool = False  # rank 0 drains the nodes to drain in Slurm (--drain)


@dataclass
class FleetRun:
    config: FleetConfig
    nodes: list[dict] = field(default_factory=list)
    pairings: list[dict] = field(default_factory=list)
    intra: list[dict] = field(default_factory=list)
    world: dict | None = None
    isolation: dict | None = None
    schedule: list = field(default_factory=list)
    phase_seconds: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    stopped: str | None = None
    stop_message: str | None = None
    wall_seconds: float = 0.0
    verdicts: dict | None = None
    rank: int = 0


def node_name(host: str, node_rank: int, duplicate: bool) -> str:
    """The node's name: SLURMD_NODENAME's or the host's, with the launcher's node rank where
    several launcher nodes share one host (emulation, containers)."""
    return f"{host}#{node_rank}" if duplicate else host


def _host() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


# -- forming the group ---------------------------------------------------------------------------


def form(le, backend: str, timeout_s: float, device):
    """The ranks that arrive within timeout_s form the process group, renumbered in order of
    their launcher rank; rank 0 decides the roster and the others read it from the store.
    -> (store, roster: the launcher ranks in the group, this rank's place)."""
    from datetime import timedelta

    import torch.distributed as dist

    from mgpu_bench.core import ranks

    store = ranks.open_store(le, timeout_s)
    prefix = ranks.key_prefix() + "/fleet"
    store.set(f"{prefix}/arrived/{le.rank}", _host())
    if le.rank == 0:
        deadline = time.monotonic() + timeout_s
        while True:
            arrived = [r for r in range(le.world_size) if store.check([f"{prefix}/arrived/{r}"])]
            if len(arrived) == le.world_size or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        store.set(f"{prefix}/roster", ",".join(map(str, arrived)))
    store.wait([f"{prefix}/roster"], timedelta(seconds=2 * timeout_s + 10))
    roster = [int(x) for x in bytes(store.get(f"{prefix}/roster")).decode().split(",")]
    if le.rank not in roster:
        raise CommTimeoutError(f"rank {le.rank} arrived after the roster was closed ({timeout_s:g} s, --timeout): "
                               "the pass went on without it")
    place = roster.index(le.rank)
    dist.init_process_group(backend, store=dist.PrefixStore(f"{prefix}/pg", store), rank=place,
                            world_size=len(roster), timeout=timedelta(seconds=timeout_s), device_id=device)
    return store, roster, place


# -- timing --------------------------------------------------------------------------------------


# -- the phases ----------------------------------------------------------------------------------


def node_pass(cfg: FleetConfig, device, bus_id: str, sync: Callable[[], None] = lambda: None) -> dict:
    """This rank's own figures: GEMM and copy bandwidth on its device, its GPU's health; sync()
    between the parts keeps every rank on the same part at once."""
    import torch

    from mgpu_bench.machine import health, occupancy

    on_gpu = device.type == "cuda"
    n = cfg.gemm_n
    gemm = _gemm_seconds(n, device)
    sync()
    copy, moved = _copy_seconds(cfg.copy_bytes, device)
    # A GPU's figure is its median burst. A CPU rank's is its fastest quartile's: the host's other
    # load only ever slows some bursts of a process (a slowed rank is slow in all of them).
    out = {"flops_per_s": 2.0 * n**3 / typical(gemm, on_gpu), "flops_samples": [2.0 * n**3 / s for s in gemm],
           "copy_bytes_per_s": moved / typical(copy, on_gpu), "copy_samples": [moved / s for s in copy],
           "health": []}
    if on_gpu:
        out["name"] = torch.cuda.get_device_name(device)
        out["health"] = health.findings(health.facts(bus_id))
        shared = occupancy.foreign({}, occupancy.snapshot({device.index: bus_id}))  # ours may be unseen: strict
        out["health"] += [{"text": t, "severity": "warning"} for t in occupancy.findings_text(shared)]
    return out


def _sendrecv(size: int, device, peer: int, iters: int, warmup: int) -> dict:
    """busbw of a bidirectional exchange of `size` bytes with `peer` (each way), from the mean time
    per exchange."""
    import torch
    import torch.distributed as dist

    send = torch.ones(size // 4, device=device, dtype=torch.float32)
    recv = torch.empty_like(send)

    def once():
        for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]):
            req.wait()

    seconds = timed(once, device, iters, warmup)
    return {"seconds": seconds, "busbw": size / statistics.fmean(seconds)}


def _subgroups(rank_sets: list[list[int]], timeout_s: float):
    """This rank's group among disjoint rank sets (every rank must call this with the same sets);
    None for a rank in none."""
    from datetime import timedelta

    import torch.distributed as dist

    mine = None
    for ranks in rank_sets:
        g = dist.new_group(ranks, timeout=timedelta(seconds=timeout_s))
        if dist.get_rank() in ranks:
            mine = g
    return mine


def gather(obj, dst: int = 0) -> list | None:
    """Every rank's object on rank `dst` (None elsewhere)."""
    import torch.distributed as dist

    out = [None] * dist.get_world_size() if dist.get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out


def broadcast(obj, src: int = 0):
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


# -- the pass ------------------------------------------------------------------------------------


class Watchdog:
    """Watches this rank's main thread: a peer that died while this rank was connecting to it can
    hold gloo or NCCL with no timeout. Past `notice_s` without progress it tells the store it is
    alive but blocked (from its own store connection, `open_store`), so that rank 0's roll call
    does not call it gone; past `limit_s` it ends the process: a rank never outlives its pass.
    beat(phase) marks progress; stop() ends the watch."""

    def __init__(self, limit_s: float, rank: int, notice_s: float | None = None, open_store=None):
        self.limit_s, self.rank, self.phase = limit_s, rank, "roster"
        self.notice_s, self.open_store, self.store, self.noted = notice_s, open_store, None, False
        self.last = time.monotonic()
        self.done = threading.Event()
        threading.Thread(target=self._watch, daemon=True, name="fleet-watchdog").start()

    def beat(self, phase: str) -> None:
        self.phase, self.last = phase, time.monotonic()

    def stop(self) -> None:
        self.done.set()

    def _note(self, where: str | None) -> None:
        from mgpu_bench.core import ranks

        with contextlib.suppress(Exception):
            if self.store is None:
                self.store = self.open_store()
            ranks.blocked_note(self.store, self.rank, where)
            self.noted = where is not None

    def _watch(self) -> None:
        while not self.done.wait(min(1.0, self.limit_s / 10)):
            stuck = time.monotonic() - self.last
            if self.open_store and self.notice_s is not None and (stuck > self.notice_s) != self.noted:
                self._note(f"held {stuck:.0f} s in the {self.phase} phase, waiting on a peer" if stuck > self.notice_s
                           else None)
            if stuck > self.limit_s:
                sys.stderr.write(f"mgpu-bench: rank {self.rank} made no progress for {stuck:.0f} s in the {self.phase} "
                                 "phase (a peer gone mid-connection?): leaving; rank 0 names the nodes that did not "
                                 "answer\n")
                sys.stderr.flush()
                os._exit(1)


def run_fleet(cfg: FleetConfig, le, say: Callable[[str], None] | None = None,
              decide: Callable[[FleetRun], dict] | None = None) -> FleetRun:
    """The whole pass on this rank; rank 0's FleetRun holds every node's figures. Faults (a node
    that dies, a phase past --timeout, Ctrl-C) end the pass with what was gathered kept on rank 0
    and the lost nodes named. `decide(run)` (rank 0) judges the pass so far: the isolation phase
    and each node's Prometheus text follow it."""
    import torch
    import torch.distributed as dist

    from mgpu_bench.core import launch, ranks

    say = say or (lambda _t: None)
    run = FleetRun(cfg)
    t_start = time.monotonic()
    on_gpu = cfg.device == "cuda"
    if on_gpu:
        torch.cuda.set_device(le.local_rank)
    else:  # a CPU process stands for one GPU: one thread each, so that ranks sharing cores share them evenly
        torch.set_num_threads(1)
    device = torch.device("cuda", le.local_rank) if on_gpu else torch.device("cpu")
    launch.export_env(le)
    try:
        store, roster, place = form(le, "nccl" if on_gpu else "gloo", cfg.timeout_s, device if on_gpu else None)
    except CommTimeoutError as exc:  # no store, or the roster closed without this rank: nothing to gather
        run.rank, run.stopped, run.stop_message = le.rank, "failed", f"stopped before the roster formed: {exc}"
        run.wall_seconds = time.monotonic() - t_start
        return run
    run.rank = place
    me = replace(le, rank=place, world_size=len(roster))
    members: list | None = None
    phase = "roster"
    # every wait of a step is bounded by timeout_s, then up to min(timeout_s, 60) + 5 s of roll call
    dog = Watchdog(2 * cfg.timeout_s + 30, place, cfg.timeout_s / 2, lambda: _store_client(le, cfg.timeout_s))
    try:
        bus = ""
        if on_gpu:
            from mgpu_bench import _native

            bus = str(_native.device_info(le.local_rank)["pci_bus_id"])
        info = (le.rank, _host(), le.node_rank, le.local_rank, str(device), bus)
        everyone = [None] * len(roster)
        dist.all_gather_object(everyone, info)
        members = [ranks.Member(i, e[1], e[2], e[3], e[4], e[5]) for i, e in enumerate(everyone)]
        nodes = _nodes(members, le, roster)
        run.nodes = nodes
        node_of = {r: n["index"] for n in nodes for r in n["ranks"]}
        by_node_local = {(n["index"], local): r for n in nodes for local, r in zip(n["locals"], n["ranks"], strict=True)}
        if place == 0:
            say(f"{len(nodes)} node(s), {len(roster)} rank(s)"
                + (f"; {le.world_size - len(roster)} rank(s) never arrived" if len(roster) < le.world_size else ""))

        if "node" in cfg.phases:
            phase = "node"
            dog.beat(phase)
            t0 = time.monotonic()
            if on_gpu:
                if place == 0:
                    say("node pass: GEMM, copy bandwidth, health on every GPU at once")
                dist.barrier()  # every GPU at once: the same load on shared power, cooling and hosts
                mine = node_pass(cfg, device, bus, dist.barrier)
            else:  # CPU ranks share cores: together they would measure the scheduler, so one at a time
                if place == 0:
                    say("node pass: GEMM and copy bandwidth, one CPU rank at a time")
                mine = {}
                for turn in range(len(roster)):
                    dist.barrier()
                    if turn == place:
                        mine = node_pass(cfg, device, bus)
                dist.barrier()
            got = gather((place, le.local_rank, mine))
            node_sets = [n["ranks"] for n in nodes if len(n["ranks"]) > 1]
            intra = None
            if node_sets:
                group = _subgroups(node_sets, cfg.timeout_s)
                if group is not None:
                    intra = _allreduce(cfg.size, device, group, cfg.iters, cfg.warmup)
            got_intra = gather((place, intra))
            if place == 0:
                for r, local, figs in got:
                    node = nodes[node_of[r]]
                    node["gpus"].append({"local": local, "rank": r, **figs})
                    node["model"] = figs.get("name") or node["model"]
                for n in nodes:
                    times = [x[1] for x in got_intra if x[1] is not None and x[0] in n["ranks"]]
                    if times:
                        slowest = min(times, key=lambda x: x["busbw"])
                        run.intra.append({"node": n["index"], **slowest})
            run.phase_seconds["node"] = time.monotonic() - t0

        if "links" in cfg.phases and len([n for n in nodes if n["answered"]]) > 1:
            phase = "links"
            dog.beat(phase)
            t0 = time.monotonic()
            present = len([n for n in nodes if n["answered"]])  # the measured nodes come first
            rounds = schedule.pairing_rounds(present, cfg.rounds or schedule.default_rounds(present), cfg.seed)
            run.schedule = [[list(p) for p in r] for r in rounds]
            for k, pairs in enumerate(rounds):
                dog.beat(phase)
                if place == 0:
                    say(f"links round {k + 1}/{len(rounds)}: {len(pairs)} pair(s), {cfg.concurrency or len(pairs)} "
                        "at once")
                mine_node = node_of[place]
                group = _subgroups([nodes[a]["ranks"] + nodes[b]["ranks"] for a, b in pairs], cfg.timeout_s)
                sr = ar = None
                chunk = cfg.concurrency or len(pairs)
                for start in range(0, len(pairs), chunk):  # at most `chunk` pairs at once
                    batch = pairs[start:start + chunk]
                    dist.barrier()
                    partner = next((b if a == mine_node else a for a, b in batch if mine_node in (a, b)), None)
                    if partner is None:
                        continue
                    peer = by_node_local.get((partner, le.local_rank))
                    if peer is not None:
                        sr = _sendrecv(cfg.size, device, peer, cfg.iters, cfg.warmup)
                    ar = _allreduce(cfg.size, device, group, cfg.iters, cfg.warmup)
                dist.barrier()
                got = gather((place, le.local_rank, sr, ar))
                if place == 0:
                    run.pairings += _pairings(k, pairs, got, node_of)
                    say(f"links round {k + 1}/{len(rounds)} done")
            run.phase_seconds["links"] = time.monotonic() - t0

        if "world" in cfg.phases:
            phase = "world"
            dog.beat(phase)
            t0 = time.monotonic()
            if place == 0:
                say("world allreduce")
            w = _allreduce(cfg.size, device, None, cfg.iters, cfg.warmup)
            got = gather(w)
            if place == 0:
                slowest = min(got, key=lambda x: x["busbw"])
                run.world = {"busbw": slowest["busbw"], "samples": [cfg.size * 2 * (len(roster) - 1) / len(roster) / s
                                                                    for s in slowest["seconds"]],
                             "wrong": sum(x["wrong"] for x in got), "ranks": len(roster)}
            run.phase_seconds["world"] = time.monotonic() - t0
            phase = "isolate"
            dog.beat(phase)
            _isolate(cfg, run, nodes, device, place, decide, say, lambda: dog.beat("isolate"))
        defer_sigterm()  # measured: a stop signal now waits while the verdicts go out and the group goes
    except InputError:
        raise
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - any fault: keep what was gathered, name who left
        dog.beat(phase)
        # rank 0 waits long enough for a rank held in its own collective to time out and answer
        wait = min(cfg.timeout_s, 60.0) + 5.0 if place == 0 else min(5.0, cfg.timeout_s)
        told = ranks.account(exc, store, me, members, wait)
        run.stopped = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        run.stop_message = f"stopped in the {phase} phase: {told}"
        if place == 0:
            lost = _silent(store, me)
            for n in run.nodes:
                if set(n["ranks"]) & lost:
                    n["answered"] = False
                    n["lost"] = f"lost in the {phase} phase"
    finally:
        run.wall_seconds = time.monotonic() - t_start
    dog.beat("outputs")
    if run.stopped is None and decide is not None:
        _per_node_outputs(cfg, run, place, le, decide)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    dog.stop()
    return run


def _nodes(members, le, roster: list[int]) -> list[dict]:
    """The nodes in launcher node-rank order, each with its ranks (group ranks) and local ranks;
    the launcher's nodes that sent no rank are listed as no answer."""
    by_node: dict[int, list] = {}
    for m in members:
        by_node.setdefault(m.node, []).append(m)
    hosts: dict[str, set[int]] = {}
    for m in members:
        hosts.setdefault(m.host, set()).add(m.node)
    nodes = []
    for node_rank in range(max(le.nnodes, max(by_node) + 1)):
        ms = sorted(by_node.get(node_rank, []), key=lambda m: m.local_rank)
        known = le.node_names[node_rank] if node_rank < len(le.node_names) else None
        host = ms[0].host if ms else (known or "?")
        dup = ms and len(hosts.get(host, ())) > 1
        nodes.append({"index": len(nodes), "node": node_name(host, node_rank, bool(dup)) if ms else (known or f"node {node_rank}"),
                      "host": host, "node_rank": node_rank, "ranks": [m.rank for m in ms],
                      "locals": [m.local_rank for m in ms], "model": "cpu" if ms and ms[0].device == "cpu" else None,
                      "gpus": [], "answered": bool(ms), "lost": None if ms else "never arrived"})
    # the measured nodes first, so that pairings index only nodes that have ranks
    present = [n for n in nodes if n["answered"]]
    absent = [n for n in nodes if not n["answered"]]
    for i, n in enumerate(present + absent):
        n["index"] = i
    return present + absent


def _pairings(k: int, pairs, got, node_of) -> list[dict]:
    out = []
    for a, b in pairs:
        rails, ar = {}, []
        for r, local, sr, allr in got:
            if node_of.get(r) in (a, b):
                if sr is not None:
                    cur = rails.get(str(local))
                    if cur is None or sr["busbw"] < cur["busbw"]:  # the slower end of the rail
                        rails[str(local)] = sr
                if allr is not None:
                    ar.append(allr)
        allreduce = min(ar, key=lambda x: x["busbw"]) if ar else None
        out.append({"round": k, "a": a, "b": b, "rails": rails, "allreduce": allreduce})
    return out


def _isolate(cfg: FleetConfig, run: FleetRun, nodes: list[dict], device, place: int, decide, say,
             beat: Callable[[], None] = lambda: None) -> None:
    """Rank 0 decides whether to isolate and which groups each level measures; every rank follows
    its broadcasts (an empty list ends it)."""
    from mgpu_bench.probes.fleet import analyse

    def measure(groups: list[list[int]]) -> list[float]:
        beat()
        broadcast(groups)
        return _measure_groups(cfg, groups, nodes, device, place)

    if place == 0:
        verdicts = decide(run) if decide else {"suspects": [], "world": {}}
        explained = [s for s in verdicts["suspects"] if s["what"] in ("node", "rail", "gpu")]
        cpu = device.type != "cuda"
        slow, _w, _ref = analyse.world_slow(run.world, run.pairings, cpu)
        if slow and not explained and len(nodes) > 2:
            say("isolation: the world allreduce is slow and no node explains it")
            med, noise = analyse.spread([p["allreduce"]["busbw"] for p in run.pairings if p.get("allreduce")])
            run.isolation = schedule.isolate([n["index"] for n in nodes if n["answered"]], measure, med,
                                             lambda f, r: analyse.is_slow("world", f, r, noise, 1, cpu))
        broadcast([])
        return
    while True:
        beat()
        groups = broadcast(None)
        if not groups:
            return
        _measure_groups(cfg, groups, nodes, device, place)


def _measure_groups(cfg: FleetConfig, groups: list[list[int]], nodes: list[dict], device, place: int) -> list[float]:
    """An allreduce in every group of nodes at once; on rank 0 the slowest rank's busbw per group."""
    rank_sets = [[r for i in g for r in nodes[i]["ranks"]] for g in groups]
    mine = _subgroups(rank_sets, cfg.timeout_s)
    res = _allreduce(cfg.size, device, mine, cfg.iters, cfg.warmup) if mine is not None else None
    got = gather((place, res))
    if place != 0:
        return []
    out = []
    for ranks in rank_sets:
        figs = [x[1] for x in got if x[0] in ranks and x[1] is not None]
        out.append(min(f["busbw"] for f in figs) if figs else 0.0)
    return out


def _store_client(le, timeout_s: float):
    """A second connection to the job's store (never its server), for another thread."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore(le.master_addr, le.master_port, None, False, timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def _silent(store, le) -> set[int]:
    """The group ranks that did not answer the roll call (ranks.roll_call's keys)."""
    from mgpu_bench.core import ranks

    prefix = ranks.key_prefix()
    out = set()
    for r in range(le.world_size):
        with contextlib.suppress(Exception):
            if r != le.rank and not any(store.check([f"{prefix}/{k}/{r}"]) for k in ("present", "left", "blocked")):
                out.add(r)
    return out


def _per_node_outputs(cfg: FleetConfig, run: FleetRun, place: int, le, decide) -> None:
    """Rank 0's verdicts to every rank; each node's first rank writes its node's Prometheus text."""
    from mgpu_bench.probes.fleet.headline import node_metrics

    per_node = None
    if place == 0:
        run.verdicts = decide(run)
        per_node = {n["index"]: node_metrics(n, run) for n in run.nodes}
    per_node = broadcast(per_node)
    if cfg.prometheus and le.local_rank == 0:
        from mgpu_bench.output.prometheus import write_textfile

        index = _my_node_index(per_node, place)
        if index is not None:
            try:
                write_textfile(cfg.prometheus, per_node[index]["metrics"], None, {"host": per_node[index]["node"]})
            except OSError as exc:
                run.notes.append(f"could not write {cfg.prometheus} on {per_node[index]['node']}: {exc}")


def _my_node_index(per_node: dict, place: int) -> int | None:
    return next((i for i, v in per_node.items() if place in v["ranks"]), None)
