"""One rank of a launcher's job (torchrun, srun, mpirun) sweeping collectives, whatever the backend.

Every rank runs the same requests; for each, the world communicator is measured, then on more
than one node the intra-node and inter-node communicators (ranks.scopes). After each
measurement the ranks exchange their raw seconds (an all-gather on the job's control group), so
every rank knows at once whether any rank failed and all stop together; rank 0 combines the
ranks of each communicator into the raw dict a single-process session returns (per-rank burst
means and samples; measurement.CommMeasurement takes the slowest rank per iteration) and hands it
on. The backends differ only in `measure`: the native CommSession, or torch.distributed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mgpu_bench import _native
from mgpu_bench.core.errors import CommTimeoutError, InputError, MgpuError, portable
from mgpu_bench.core.ranks import Group, Member
from mgpu_bench.results.measurement import CommMeasurement, CommRequest

from .analyse import explain_above_theory, stragglers
from .plan import CommConfig, CommRun, ProgressFn, native_args, spec_of, stop

SCOPES = ("world", "intra-node", "inter-node")

# measure(request, group or None for the world, this rank's place in it, its size) -> this
# rank's {"counts", "iters", "batch", "burst", "samples", "wrong", "estimate"}.
MeasureFn = Callable[[CommRequest, Group | None, int, int], dict]
# emit(request index, scope, group or None, raw dict for CommMeasurement.from_raw)
EmitFn = Callable[[int, str, Group | None, dict], None]


class RankFailure(MgpuError):
    """Another rank's measurement failed; carries that rank's own exception."""

    def __init__(self, rank: int, error: BaseException) -> None:
        super().__init__(f"rank {rank}: {error}")
        self.rank, self.error = rank, error


def sweep(requests: Sequence[CommRequest], me: Member, members: Sequence[Member], groups: Sequence[Group],
          measure: MeasureFn, all_gather: Callable[[object], list], emit: EmitFn) -> None:
    """Runs every request on every scope in order. A failure on any rank raises on every rank:
    the failing rank's own exception there, RankFailure (naming it) on the others; Ctrl-C is
    not caught."""
    mine = {g.scope: g for g in groups if me.rank in g.ranks}
    scopes = ["world"] + [s for s in SCOPES[1:] if any(g.scope == s for g in groups)]
    for index, req in enumerate(requests):
        for scope in scopes:
            group = None if scope == "world" else mine.get(scope)
            result: tuple = ("idle", None)
            if scope == "world" or group is not None:
                place, size = (me.rank, len(members)) if group is None else (group.ranks.index(me.rank),
                                                                            len(group.ranks))
                try:
                    result = ("ok", measure(req, group, place, size))
                except (KeyboardInterrupt, SystemExit):
                    raise
                except Exception as exc:  # noqa: BLE001 - shared with the other ranks, then raised
                    result = ("error", portable(exc))
                    own = exc
            gathered = all_gather(result)
            failed = [(r, res[1]) for r, res in enumerate(gathered) if res[0] == "error"]
            if failed:
                if result[0] == "error":
                    raise own
                raise RankFailure(*failed[0])
            if me.rank != 0:
                continue
            if scope == "world":
                emit(index, scope, None, combine([g[1] for g in gathered]))
            else:
                for g in (g for g in groups if g.scope == scope):
                    emit(index, scope, g, combine([gathered[r][1] for r in g.ranks]))


def combine(per_rank: list[dict]) -> dict:
    """The ranks of one communicator (in its rank order) as one raw dict."""
    first = per_rank[0]
    n = min(len(r["samples"]) for r in per_rank)  # equal: iters and batch are agreed in a communicator
    return {
        "counts": dict(first["counts"]),
        "iters": int(first["iters"]),
        "batch": int(first["batch"]),
        "burst_seconds": [float(r["burst"]) for r in per_rank],
        "samples": np.asarray([list(r["samples"])[:n] for r in per_rank], dtype=float).reshape(len(per_rank), n),
        "wrong": [int(r["wrong"]) for r in per_rank],
        "warmup_seconds_per_iter": float(first["estimate"]),
    }


# -- the straggler report ------------------------------------------------------------------------


def run_joined(run: CommRun, cfg: CommConfig, le, gpus: list[int], progress: ProgressFn | None) -> None:
    """This process as one rank of a job torchrun / srun / mpirun started (one GPU each, the
    local rank's). The ranks meet at the launcher's store, check that they run the same sweep
    and learn where each runs; the native backend takes its NCCL unique ids from that store,
    the torch backend forms its process group there. Every rank measures, rank 0 keeps the
    combined results (joined.sweep). A fault on any rank stops every rank with the measurements
    so far kept on rank 0."""
    import torch
    import torch.distributed as dist

    from mgpu_bench.core import launch, ranks

    launch.export_env(le)
    native = run.backend == "native"
    gpu = gpus[0] if gpus else None
    if gpu is not None:
        torch.cuda.set_device(gpu)
    pg_backend = "nccl" if run.backend == "torch-nccl" else "gloo"  # native: gloo carries control only
    device = torch.device("cuda", gpu) if gpu is not None else torch.device("cpu")
    req = run.requests[0]
    sessions: dict[str, object] = {}
    try:
        store = ranks.init_group(le, pg_backend, cfg.timeout_s, device if pg_backend == "nccl" else None)
    except CommTimeoutError as exc:
        stop(run, exc, req)
        return
    members: list[ranks.Member] | None = None
    try:
        all_gather = ranks.all_gatherer(le.world_size)
        ranks.agree(repr((run.backend, run.requests, cfg.timing)), all_gather)
        bus = "" if gpu is None else str(_native.device_info(gpu)["pci_bus_id"])
        me = ranks.Member(le.rank, le.host, le.node_rank, le.local_rank, "cpu" if gpu is None else f"cuda:{gpu}",
                           bus)
        members = all_gather(me)
        if le.launcher == "mpi":  # no node index exported: number the nodes by host
            members = ranks.nodes_by_host(members)
            me = members[le.rank]
        groups = ranks.scopes(members)
        run.nnodes = len({m.node for m in members})
        multinode = run.nnodes > 1
        run.devices = [f"{m.host}:{m.device}" if multinode else m.device for m in members]
        if le.rank == 0 and gpu is not None:
            _joined_theory(run, members, groups)
        if native:
            measure = _native_measure(cfg, store, me, members, gpu, sessions)
        else:
            measure = _torch_measure(cfg, members, groups, device)
        def emit(index: int, scope: str, group, raw: dict) -> None:
            r = run.requests[index]
            devices = run.devices if group is None else [run.devices[x] for x in group.ranks]
            spec = spec_of(r, raw["counts"], run.backend, devices, cfg.timing.graph)
            if group is not None:
                from dataclasses import replace

                spec = replace(spec, scope=scope, group=group.label)
            run.measurements.append(CommMeasurement.from_raw(spec, raw, cfg.timing.check))
            if progress and scope == "world" and index + 1 < len(run.requests):
                progress(index + 1, len(run.requests), run.requests[index + 1])

        if progress:
            progress(0, len(run.requests), run.requests[0])

        def measure_tracked(r: CommRequest, group, place: int, size: int) -> dict:
            nonlocal req
            req = r
            return measure(r, group, place, size)

        sweep(run.requests, me, members, groups, measure_tracked, all_gather, emit)
        if le.rank == 0:
            run.findings += stragglers(run.measurements, [m.host for m in members])
            run.findings += explain_above_theory(run)
            if native:
                run.notes.append("under a launcher NCCL's transports are not read from its log")
    except InputError:
        raise
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - any fault: keep what was measured, say why
        told = ranks.account(exc, store, le, members, min(5.0, cfg.timeout_s), told=(RankFailure,))
        kept = None
        if le.rank != 0:  # the measurements live on rank 0 alone
            rank0_gone = isinstance(told, ranks.RankLost) and str(told).startswith("rank 0 ")
            kept = ("rank 0, which held the measurements, is gone: none were written" if rank0_gone
                    else "rank 0 keeps the measurements")
        stop(run, told, req, kept)
    finally:
        for key in list(sessions):
            del sessions[key]  # communicators destroyed (or left aborted) here
        import contextlib

        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _joined_theory(run: CommRun, members, groups) -> None:
    """Theory per scope from this node's topology (every node is assumed to look like it)."""
    from mgpu_bench.machine import theory, topo

    # by PCI bus id, which NVML knows whatever each process's CUDA_VISIBLE_DEVICES hides
    local = [(m.local_rank, m.bus_id) for m in members if m.node == members[0].node]
    run.topology = topo.collect()
    if groups:
        run.scope_theory = theory.hierarchy_theory(run.topology, local)
        run.theory = run.scope_theory["world"]
    else:
        run.theory = theory.ring_theory(run.topology, local)


def _native_measure(cfg: CommConfig, store, me, members, gpu: int, sessions: dict):
    """measure() for joined.sweep on the native core: one CommSession per communicator this
    rank belongs to, created on first use; its NCCL unique id comes from the communicator's
    lowest rank through the launcher's store."""
    from mgpu_bench.core import ranks

    prefix = ranks.key_prefix()

    def session(group, place: int, size: int):
        key = "world" if group is None else f"{group.scope}/{group.label}"
        if key not in sessions:
            store_key = f"{prefix}/nccl-id/{key}"
            if place == 0:
                store.set(store_key, _native.nccl_unique_id())
            uid = store.get(store_key)  # waits up to the store's timeout (--timeout)
            sessions[key] = _native.CommSession([gpu], size, place, bytes(uid), cfg.timeout_s)
        return sessions[key]

    def measure(req: CommRequest, group, place: int, size: int) -> dict:
        raw = session(group, place, size).measure(native_args(req, cfg.timing))
        return {"counts": raw["counts"], "iters": raw["iters"], "batch": raw["batch"],
                "burst": raw["burst_seconds"][0], "samples": list(raw["samples"][0]), "wrong": raw["wrong"][0],
                "estimate": raw["warmup_seconds_per_iter"]}

    return measure


def _torch_measure(cfg: CommConfig, members, groups, device):
    """measure() for joined.sweep on torch.distributed: the scopes' groups are formed once, by
    every rank in the same order, as torch requires."""
    from datetime import timedelta

    import torch.distributed as dist

    from .torch_backend import _plan
    from .torch_rank import _measure

    # new_group does not inherit the world's timeout (torch gives gloo 30 min): --timeout here too
    pgs = {g.label + g.scope: dist.new_group(list(g.ranks), timeout=timedelta(seconds=cfg.timeout_s))
           for g in groups}
    kind = "cuda" if device.type == "cuda" else "cpu"

    def measure(req: CommRequest, group, place: int, size: int) -> dict:
        plan = _plan(req, size, kind)
        pg = None if group is None else pgs[group.label + group.scope]
        m = _measure(plan, place, size, device, cfg.timing, pg, None if group is None else group.ranks)
        return {"counts": plan["counts"], "iters": m["iters"], "batch": m["batch"], "burst": m["burst"],
                "samples": m["samples"], "wrong": m["wrong"], "estimate": m["estimate"]}

    return measure
