"""The monitor's result: each rank's record at finish(), and on rank 0 the model probe's own run
built from them (the per-rank dicts its worker returns: phases, profile, peak memory, matmul
ceiling; figures.analyse for the stable window, throughput and MFU; its findings and verdict),
a `model` document of workload "job:NAME", printed, stored through the runner's storing path
and written where asked.

Phases per rank and timed step: step (the wall), data (outside compute(): the data wait),
compute; forward, backward and optimizer are not told apart inside the job's compute() and are
left out. The document's `job` section holds what only the monitor measures: the per-rank
figures, the straggler, gross and effective throughput, the window summaries, the FLOP count's
and the ceiling's sources, the misuse seen.
"""

from __future__ import annotations

import socket
import statistics
import sys
from typing import Any

WINDOWS_KEPT = 1000  # window summaries in the document (the most recent)


def record(mon) -> dict:
    """This rank's record (JSON): its kept steps per step, its windows, the facts the model
    probe's worker returns, measured here at finish() (peak memory, the matmul ceiling)."""
    from . import clock

    rec: dict[str, Any] = {"rank": mon.rank, "world": mon.world, "host": socket.gethostname(),
                           "device": str(mon.device) if mon.device is not None else None, "gpu_name": None,
                           "torch": None, "steps_seen": mon.steps, "cols": clock.joined(mon._kept),
                           "windows": mon.windows[-WINDOWS_KEPT:], "first_step_s": mon._first_step_s,
                           "flop_count": None, "flop_note": mon._flop_note, "profile": mon.profile_record,
                           "notes": list(dict.fromkeys(mon._notes + mon.misuse_notes())),
                           "peak_allocated": None, "peak_reserved": None, "total_memory": None,
                           "matmul_ceiling": None, "totals": dict(mon.totals), "stall_events": list(mon._stall_events),
                           "stall_sums": mon.stall_sums, "noise": None}
    if mon._reference is not None:
        try:
            rec["reference"] = mon._reference.figures()
        except Exception as exc:  # noqa: BLE001 - the reference steps are lost, the run is not
            rec["notes"].append(f"the reference steps could not be read ({type(exc).__name__})")
    noise = mon._sync.noise if mon._sync is not None else None
    if noise is not None and noise.error:
        rec["notes"].append(f"noise_scale=True: its gradient norms failed ({noise.error}): the noise scale not "
                            "estimated (the training went on)")
    elif noise is not None:
        try:
            nbytes = max((s.nbytes for pool in (mon._pool, mon._other) for s in (pool.sync or [])), default=0)
            nbytes = nbytes or getattr(mon._sync, "nbytes", 0)  # GradMarks: the bytes its norms covered
            rec["noise"] = noise.figures(nbytes, mon.device)
        except Exception as exc:  # noqa: BLE001 - the noise scale is lost, the run is not
            rec["notes"].append(f"the noise scale's figures could not be read ({type(exc).__name__})")
    fault = getattr(mon._sync, "fault", None)
    if fault:
        rec["notes"].append(f"the gradient marks hit a fault of their own ({fault}): " + (
            "the reference steps stopped (the training went on)" if fault.startswith("after_backward: ") else
            "steps from it on have no arrival or exposed-communication figures (the training went on)"))
    if mon.device is None:
        return rec
    import torch

    rec["torch"] = torch.__version__
    if mon.flop_count is not None:
        rec["flop_count"] = {k: v for k, v in mon.flop_count.to_dict().items() if k != "dense_ops"}
        rec["flop_count"]["dense_ops"] = len(mon.flop_count.dense_ops)
    if mon.device.type == "cuda":
        rec["gpu_name"] = torch.cuda.get_device_name(mon.device)
        rec["peak_allocated"] = torch.cuda.max_memory_allocated(mon.device)
        rec["peak_reserved"] = torch.cuda.max_memory_reserved(mon.device)
        rec["total_memory"] = torch.cuda.get_device_properties(mon.device).total_memory
        if mon.ceiling and mon.flop_count is not None and mon.flop_count.dense_ops and rec["cols"].get("index"):
            try:
                from mgpu_bench.workloads import flops

                rec["matmul_ceiling"] = flops.ceiling(mon.flop_count.dense_ops, mon.device)
            except Exception as exc:  # noqa: BLE001 - out of memory beside the job's own tensors, say
                rec["notes"].append(f"the matmul ceiling could not be timed ({type(exc).__name__})")
    return rec


def job_key(name: str) -> str:
    """The history name of a job: "job:NAME" as a metric-safe key (schema.NAME)."""
    from mgpu_bench.workloads import safe_key

    return safe_key(f"job:{name}")


def _parallel(model) -> str:
    """ddp or fsdp where the model says so (DistributedDataParallel, FSDP1 or FSDP2), else job:
    the job's own, not known to the monitor."""
    if model is None:
        return "job"
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    names = {c.__name__ for c in type(model).__mro__}
    if "DistributedDataParallel" in names:
        return "ddp"
    if names & {"FullyShardedDataParallel", "FSDPModule"}:
        return "fsdp"
    return "job"


def _aligned(records: list[dict]) -> tuple[list[int], list[dict]]:
    """The timed steps every present rank kept (their indices, ascending), and per rank its
    columns cut to those steps."""
    common = None
    for r in records:
        idx = set(r["cols"].get("index") or [])
        common = idx if common is None else common & idx
    steps = sorted(common or ())
    out = []
    for r in records:
        pos = {i: k for k, i in enumerate(r["cols"].get("index") or [])}
        keep = [pos[i] for i in steps]
        out.append({key: [values[k] for k in keep] for key, values in r["cols"].items()})
    return steps, out


def _references(present: list[dict], steps: list[int], cols: list[dict]):
    """The reference steps (reference.py) out of the aligned steps (their all-reduce ran unhidden:
    not the job's steps), and per rank {"steps", "wall_s", "comm_s"} of those every rank timed."""
    flagged = {i for c in cols for i, x in zip(c.get("index") or [], c.get("reference") or []) if x}
    if not flagged:
        return steps, cols, {}
    refs = {}
    for r, c in zip(present, cols):
        got = r.get("reference") or {}
        comm = dict(zip(got.get("steps") or [], got.get("comm_s") or []))
        walls = dict(zip(c.get("index") or [], c.get("wall_s") or []))
        both = [i for i in sorted(flagged) if i in comm and i in walls]
        refs[r["rank"]] = {"steps": both, "wall_s": [walls[i] for i in both], "comm_s": [comm[i] for i in both],
                           "count": got.get("count", len(both)), "left_out": got.get("left_out", 0)}
    keep_steps = [i for i in steps if i not in flagged]
    out = []
    for c in cols:
        pos = [k for k, i in enumerate(c.get("index") or []) if i not in flagged]
        out.append({key: [values[k] for k in pos] for key, values in c.items() if key != "reference"})
    return keep_steps, out, refs


def _median_int(values) -> int:
    return round(statistics.median(values)) if values else 0


def conclude(mon, records: list[dict | None], alone: bool = False) -> dict:
    """Rank 0 (or a rank `alone`): the model document of the job, printed, stored and written
    as `mon` asks (alone: none of that, the rank's own figures)."""
    from mgpu_bench.results.document import Document, status

    present = [r for r in records if r is not None]
    missing = [i for i, r in enumerate(records) if r is None]
    steps, cols = _aligned(present) if present else ([], [])
    run, job = build(mon, present, missing, steps, cols)
    run.job = job  # the straggler among the findings, wherever the run is drawn again
    from mgpu_bench.machine.env import fingerprint
    from mgpu_bench.probes.model.document import document

    try:
        environment = fingerprint()
    except Exception:  # noqa: BLE001 - a device that faulted at the end: the run is kept without it
        environment = {}
    doc = Document.of(document(run, environment, list(sys.argv)), run)
    doc["job"] = job
    if mon._early is not None and run.stats:
        doc["status"] = status("interrupted", f"ended early: {mon._early}; the {len(job['windows'])} window(s) "
                                              "measured before are kept")
    if not run.stats:
        doc["status"] = status("failed", run.stop_message)
        if not alone and mon.rank == 0:
            mon._misuse("no-step", f"finish(): {run.stop_message}; nothing stored", stacklevel=5)
    if alone or mon.rank != 0:
        return doc
    _report(mon, doc, run, job)
    return doc


def build(mon, present: list[dict], missing: list[int], steps: list[int], cols: list[dict]):
    """(the model probe's ModelRun of the job, the document's job section)."""
    from mgpu_bench.machine import hardware
    from mgpu_bench.probes.model.config import ModelConfig
    from mgpu_bench.probes.model.figures import ModelRun, analyse

    r0 = present[0] if present else {}
    steps, cols, references = _references(present, steps, cols)
    key = job_key(mon.name)
    world = max(mon.world, len(present) + len(missing))
    samples = [s for c in cols for s in c.get("samples", [])]
    tokens = [t for c in cols for t in c.get("tokens", [])]
    batch = _median_int(samples)
    tps = None
    if tokens and all(t is not None for t in tokens) and sum(samples):
        tps = mon.tokens_per_sample or max(1, round(sum(tokens) / sum(samples)))
    cuda = mon.device is not None and mon.device.type == "cuda"
    profiled = bool(r0.get("profile"))
    cfg = ModelConfig(model=key, seq_len=tps, batch_size=max(1, batch), grad_accum=1, steps=len(steps),
                      warmup_steps=mon.warmup, parallel=_parallel(mon.model), data="loader", num_workers=0,
                      preprocess_ms=0.0, data_dir=None, checkpointing=False, exposed_comm=False, profile=profiled,
                      device="cuda" if cuda else "cpu", seed=0, progress=False, compile=False)
    peak = None
    if mon.peak_tflops is not None:
        peak = hardware.Figure(mon.peak_tflops * 1e12, "FLOP/s", hardware.USER_OVERRIDE)
    elif r0.get("gpu_name"):
        peak = hardware.peak_flops(r0["gpu_name"], mon.dtype)
    notes = list(dict.fromkeys(n for r in present for n in r.get("notes") or []))
    flops_step, flop_source = None, None
    counted = r0.get("flop_count")
    if mon.flops_per_step is not None:
        flops_step, flop_source = mon.flops_per_step, "given (flops_per_step)"
    elif counted:
        flops_step = counted["flops"] / counted["batch_size"] * max(1, batch)
        flop_source = f"counted by FlopCounterMode on the job's first step ({counted['batch_size']} samples)"
    elif mon.count_flops:
        notes.append("no FLOPs counted: no step entered compute() before the timed steps, or the step has no matmul, "
                     "convolution or attention; give flops_per_step for MFU")
    if r0.get("flop_note"):
        notes.append(r0["flop_note"])
    per_sample = flops_step / batch if flops_step and batch else None
    ranks = []
    for r, c in zip(present, cols):
        rank = {"rank": r["rank"], "world": world, "device": r["device"], "host": r["host"], "error": None,
                "gpu_name": r["gpu_name"], "torch": r["torch"],
                "phases": {"step": c["wall_s"], "data": c["data_s"], "compute": c["compute_s"]},
                "steps_index": list(steps), "profile": r.get("profile"), "peak_allocated": r["peak_allocated"],
                "peak_reserved": r["peak_reserved"], "total_memory": r["total_memory"],
                "wall_s": sum(c["wall_s"]), "matmul_ceiling": r.get("matmul_ceiling")}
        if r.get("totals") and r["totals"].get("steps"):
            rank["totals"] = r["totals"]
            rank["stall_events"] = r.get("stall_events") or []
            rank["stall_sums"] = r.get("stall_sums")
        if c.get("queue_s"):
            rank["queue"] = c["queue_s"]
        if references.get(r["rank"]):
            rank["reference"] = references[r["rank"]]
        if not ranks and r.get("windows"):  # the windows' step ranges, for the ledger per window
            rank["windows"] = [{"first": w["first"], "last": w["last"]} for w in r["windows"]]
        if r.get("noise"):
            rank["noise"] = r["noise"]
        if c.get("arrival_s") and any(x is not None for x in c["arrival_s"]):
            rank["sync"] = {"arrival": c["arrival_s"], "exposed": c["sync_exposed_s"], "busy": c["sync_busy_s"],
                            "bytes": c["sync_bytes"]}
        ranks.append(rank)
    run = ModelRun(cfg, [world], ["loader"], r0.get("gpu_name"), peak, notes=notes,
                   workload=_workload(mon, key, tps, counted, flops_step, batch))
    if steps:
        run.stats.append(analyse(cfg, world, ranks, peak.value if peak is not None else None, per_sample, tps))
    else:
        run.stopped = "failed"
        seen = r0.get("steps_seen", 0)
        run.stop_message = (f"no step measured: {seen} step(s) seen, warm-up {mon.warmup}"
                            + (f", profiled {mon.profile_steps}" if mon._prof_start >= 0 else "")
                            + (" (each rank kept different steps)" if len(present) > 1 and any(
                                c.get("index") for c in (r["cols"] for r in present)) else "")
                            + ": run more steps, or lower warmup=")
    if peak is None:
        run.notes.append("no MFU: " + ("this GPU has no " + mon.dtype + " peak in the hardware database; give "
                                       "peak_tflops=" if cuda else "CPU processes have no peak figure; give peak_tflops="))
    if missing:
        run.notes.append(f"rank(s) {', '.join(map(str, missing))} sent no record within {mon.gather_timeout_s:g} s: "
                         "the figures are the other ranks'")
    job = _job(mon, run, present, cols, flops_step, flop_source)
    st = run.stats[0] if run.stats else None
    if st is not None and st.straggler is not None:
        job["straggler"] = st.straggler
    if mon.noise_scale and mon._sync is not None:  # (without the hook the monitor said why at the first step)
        found = st.noise if st is not None else None
        if found is not None:
            job["noise_scale"] = found
        elif not any("its gradient norms failed" in n or "the noise scale's figures could not be read" in n
                     for r in present for n in r.get("notes") or []):  # (a rank's own note says why)
            run.notes.append("noise_scale=True: no gradient all-reduce was seen in compute() on every rank (a DDP "
                             "model of 2+ ranks whose parameters have gradients): no noise scale")
    return run, job


def _workload(mon, key: str, tps, counted, flops_step, batch) -> dict:
    """The document's workload section (as Workload.facts() writes it) for the job."""
    params = None
    if mon.model is not None:
        params = sum(p.numel() for p in {id(p): p for p in mon.model.parameters()}.values())
    out = {"key": key, "text": key, "kind": "job", "tokens_per_sample": tps, "seq_len": tps, "image_size": None,
           **({"params": params} if params is not None else {})}
    if counted and flops_step and batch and not mon.flops_per_step:  # as counted (given FLOPs: the job section)
        out["flops"] = {"per_sample": counted["flops"] / counted["batch_size"], "batch_size": counted["batch_size"],
                        "device": counted["device"], "note": counted.get("note"), "dense_ops": counted.get("dense_ops")}
    return out


def _job(mon, run, present: list[dict], cols: list[dict], flops_step, flop_source) -> dict:
    """What only the monitor measures, for the document's `job` section."""
    st = run.stats[0] if run.stats else None
    d = st.derived if st is not None else {}
    a, b = (st.window[0], st.window[1]) if st is not None else (0, 0)
    ranks = []
    for r, c in zip(present, cols):
        w = c["wall_s"][a:b]
        row = {"rank": r["rank"], "host": r["host"], "device": r["device"], "steps_seen": r["steps_seen"]}
        if w:
            t = r.get("totals") or {}
            row.update(step_s=statistics.median(w), data_s=statistics.median(c["data_s"][a:b]),
                       compute_s=statistics.median(c["compute_s"][a:b]),
                       samples_per_s=t["samples"] / t["elapsed_s"] if t.get("elapsed_s") else None)
        row["peak_allocated"] = r["peak_allocated"]
        ranks.append(row)
    job: dict[str, Any] = {"name": mon.name, "key": job_key(mon.name), "ranks": ranks, "straggler": None,
                           "windows": present[0]["windows"] if present else [],
                           "flops_per_step": flops_step, "flops_source": flop_source,
                           "first_step_s": present[0]["first_step_s"] if present else None,
                           "profile_steps": [mon._prof_start, mon._prof_end - 1] if mon._prof_start >= 0 else None,
                           "optimizer": type(mon.optimizer).__name__ if mon.optimizer is not None else None,
                           "ceiling": None}
    if d:
        job["gross_samples_per_s"] = d["samples_per_s"]
        job["effective_samples_per_s"] = d.get("effective_samples_per_s")
        if d.get("matmul_ceiling"):
            job["ceiling"] = {"flops_per_s": d["matmul_ceiling"], "of_ceiling": d.get("of_ceiling"),
                              "source": "the step's own matmul and convolution shapes (counted on its first step), "
                                        "each timed alone in bf16 on this GPU at finish()"}
        elif d.get("flops_per_s_per_gpu") and run.gpu_name:
            job["ceiling"] = _stored_gemm(mon, run.gpu_name, present[0]["host"], d["flops_per_s_per_gpu"])
    return job


def _stored_gemm(mon, gpu_name: str, host: str, rate: float) -> dict | None:
    """The best bf16 (or `dtype`) GEMM of this GPU model on this host in the history: the
    ceiling when the step's own shapes were not timed."""
    import os

    from mgpu_bench.history import History
    from mgpu_bench.history.store import default_path

    path = mon.db or default_path()
    if not os.path.exists(path):
        return None
    try:
        with History.open(path) as h:
            for info in h.list(200, kind="gemm"):
                if info.host != host:
                    continue
                best = [m for m in h.metrics(info.run_id) if m.name.endswith(f".{mon.dtype}.tflops")
                        and m.labels.get("gpu_name") == gpu_name]
                if best:
                    top = max(best, key=lambda m: m.value)
                    return {"flops_per_s": top.value, "of_ceiling": rate / top.value,
                            "source": f"the best {mon.dtype} GEMM of stored gemm run {info.run_id} ({top.labels.get('shape')}"
                                      f" on {gpu_name}, {host})"}
    except Exception:  # noqa: BLE001 - an unreadable history gives no ceiling, not a failed finish
        return None
    return None


def _report(mon, doc, run, job) -> None:
    """Rank 0: the history row, the Prometheus textfile, the JSON document and the report folder
    first; then findings, notes, the model table, the job's own lines and the verdict on stdout."""
    from mgpu_bench.core.paths import write_json
    from mgpu_bench.output.console import err_console, out_console
    from mgpu_bench.results.probe import get
    from mgpu_bench.run import keep

    probe = get("model")
    out, err = out_console(), err_console()
    if probe.measured(doc):  # stored and written first: a closed or full stdout never costs the job's figures
        history, run_id = None, None
        store = keep.Store(mon.db, False, mon.prometheus)
        try:
            if mon.store:
                history, run_id, _ = keep.save(probe, None, doc, store, out, err)
            if mon.prometheus:
                keep.textfile(mon.prometheus, doc, run_id, err)
            failed = keep.write_outputs([(mon.json, lambda p: write_json(p, doc), "--json"),
                                           (mon.report, lambda p: probe.report(doc, p, history), "--report")], err)
            if mon.store and run_id is None:  # the history could not take it: a file for `history add`
                keep.kept_for_later(doc, "model", mon.json, "--json" in failed, store, err)
        finally:
            if history is not None:
                history.close()
    if not mon.print:
        return
    from mgpu_bench.probes.model.analyse import findings, verdicts
    from mgpu_bench.probes.model.render import render_terminal

    try:
        for f in findings(run):  # the straggler among them, once
            out.print(f"finding: {f.text}", highlight=False, soft_wrap=True,
                      style=None if f.severity == "ok" else "bold yellow")
        for note in dict.fromkeys(run.notes):
            err.print(f"note: {note}", highlight=False)
        if run.stats and run.stats[0].derived:
            render_terminal(run, out)
            for line in job_lines(job, run):
                out.print(f"  {line}", highlight=False, soft_wrap=True)
        found = verdicts(run)
        out.print(f"verdict: {found[-1].line}" if found else f"verdict: none ({run.stop_message})", highlight=False,
                  soft_wrap=True)
    except OSError:  # the job's stdout closed or full (a broken pipe among them): its figures are stored and written
        pass


def job_lines(job: dict, run) -> list[str]:
    """The monitor's own lines under the model table: gross against effective throughput, the
    ceiling's source, the per-rank figures."""
    lines: list[str] = []
    st = run.stats[0]
    if job.get("effective_samples_per_s"):
        gross, eff = job["gross_samples_per_s"], job["effective_samples_per_s"]
        lines.append(f"gross {gross:,.1f} samples/s (samples / the wall clock over every timed step), effective "
                     f"{eff:,.1f} samples/s (samples / the time inside compute()): the time outside compute() costs "
                     f"{100 * max(0.0, 1 - gross / eff):.1f}%")
    if job.get("flops_source") and "given" in job["flops_source"]:  # a count is said by the model table's lines
        lines.append(f"FLOPs per step and rank: {job['flops_per_step'] / 1e9:,.2f} GFLOP, {job['flops_source']}")
    c = job.get("ceiling")
    if c:
        lines.append(f"MFU against the measured ceiling: {100 * c['of_ceiling']:.0f}% of {c['flops_per_s'] / 1e12:.0f} "
                     f"TFLOP/s, {c['source']}")
    for r in job["ranks"] if len(job["ranks"]) > 1 else ():
        if r.get("step_s") is not None:
            lag = (job.get("straggler") or {}).get("per_rank_lag_s") or []
            idx = job["ranks"].index(r)
            lines.append(f"rank {r['rank']} ({r['device']} on {r['host']}): "
                         + (f"{r['samples_per_s']:,.1f} samples/s by the wall clock, " if r.get("samples_per_s") else "")
                         + f"steady-state step {1e3 * r['step_s']:.1f} ms, outside compute {1e3 * r['data_s']:.1f} ms, "
                         f"compute {1e3 * r['compute_s']:.1f} ms"
                         + (f", lag {1e3 * lag[idx]:.1f} ms" if idx < len(lag) else ""))
    d = st.derived
    if d.get("reference_steps"):
        lines.append(f"exposed communication against {d['reference_steps']} reference steps (gradient sync off in the "
                     f"backward, the all-reduce run after it and timed alone: {1e3 * d['reference_step_s']:.1f} ms a step "
                     f"without it against {1e3 * d['step_s']:.1f} ms); they cost {100 * d['reference_cost_share']:.2f}% "
                     "of the time")
    if job.get("first_step_s") is not None:
        lines.append(f"first step {job['first_step_s']:.2f} s (not timed"
                     + ("; its FLOPs counted" if (job.get("flops_source") or "").startswith("counted") else "") + ")")
    if job.get("profile_steps") and st.derived.get("gpu_idle_share") is None:
        lines.append(f"profiled steps {job['profile_steps'][0]}-{job['profile_steps'][1]} (not timed): no CUDA kernels "
                     "to split on CPU processes")
    return lines
