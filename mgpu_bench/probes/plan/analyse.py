"""What a plan says on top: the fit, the answer (days for --gpus, GPUs for --days) where the layout
asked fits, else that it does not and what fits instead (exit code 1), the runs left out of the
evidence and why, and what is missing with the command that measures it. The run is the plan
document itself (plain data)."""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.results.probe import OK, PROBLEM, WARNING, Finding

from . import text
from .layout import SHARD_WORDS, SHARDS, ZERO_STAGES
from .sources.evidence import CPU

MAX_LEFT_OUT = 5  # runs named one per line; the rest counted


def _unknown_memory(device) -> str:
    """Why there is nothing to fit in, as the end of a sentence."""
    if device == CPU:
        return f"{device} have no device memory to fit it in (the host's memory is the limit)"
    return f"the memory of a {device} is not known, so whether it fits is not said"


def _fit_lines(doc: Mapping) -> list[Finding]:
    fit, w = doc.get("fit") or {}, doc.get("workload") or {}
    out = []
    key, batch, device = w.get("key"), doc.get("batch"), (doc.get("device") or {}).get("name")
    asked = (doc.get("layout") or {}).get("name") or (doc.get("config") or {}).get("parallel")
    plain = asked in SHARDS or (doc.get("config") or {}).get("search")
    for parallel in ("ddp", *((asked,) if asked in ZERO_STAGES else ()), "fsdp") if plain else ():
        f = fit.get(parallel) or {}
        if f.get("allocated") is None:
            continue
        words = SHARD_WORDS.get(parallel, parallel)
        where = "per GPU" if parallel == "ddp" else f"per GPU over {f.get('gpus')} GPUs"
        parts = f"model states {text.value(f['states'], 'B')}, activations {text.value(f['activations'], 'B')}" + (
            f", other {text.value(f['other'], 'B')}" if f.get("other") else "")
        need = f"{text.value(f['reserved'], 'B')} {where} ({parts})"
        largest = fit.get(f"largest_batch_{parallel}")
        if f.get("fits") is None:
            out.append(Finding(WARNING, f"fit ({words}): {key} at batch {batch} needs {need}; "
                                        f"{_unknown_memory(device)}"))
            continue
        fewest = fit.get(f"fewest_gpus_{parallel}")
        held = (f"the fewest GPUs that hold it: {fewest}" if fewest else
                "no GPU count holds it at this batch" if parallel != "ddp" else "DDP cannot hold it (every GPU "
                "keeps the whole model)")
        severity = OK if f["fits"] else (PROBLEM if parallel == asked else WARNING)
        out.append(Finding(severity, f"fit ({words}): {key} at batch {batch} needs {need} of "
                                     f"{text.value(f['capacity'], 'B')} on a {device}: {held}; the largest batch "
                                     f"per GPU: {largest if largest is not None else '-'}"))
    f, lay = fit.get("asked") or {}, doc.get("layout") or {}
    if lay and asked not in SHARDS and f.get("allocated") is not None:
        parts = f"model states {text.value(f['states'], 'B')}, activations {text.value(f['activations'], 'B')}"
        head = (f"fit ({lay.get('text')}): {key} at micro-batch {f.get('batch')} on {f.get('gpus')} GPUs needs "
                f"{text.value(f['reserved'], 'B')} per GPU ({parts})")
        if f.get("fits") is None:
            out.append(Finding(WARNING, f"{head}; {_unknown_memory(device)}"))
            return out
        largest = fit.get("largest_batch_asked")
        out.append(Finding(OK if f["fits"] else PROBLEM,
                           f"{head} of {text.value(f['capacity'], 'B')} on a {device}: "
                           f"{'fits' if f['fits'] else 'does not fit'}; the largest micro-batch: "
                           f"{largest if largest is not None else '-'}"))
    return out


def _answer_lines(doc: Mapping) -> list[Finding]:
    a, budget = doc.get("answer"), doc.get("budget") or {}
    if not a:
        return []
    amount = f"{text.count(budget.get('value') or 0)} {budget.get('unit')}"
    gpn = (doc.get("device") or {}).get("gpus_per_node") or 1
    if a.get("fits") is False:
        need = f"{text.value(a.get('memory'), 'B')} per GPU of {text.value(a.get('capacity'), 'B')}" \
            if a.get("memory") is not None else "more than a GPU holds"
        out = [Finding(PROBLEM, f"does not fit as asked: {a.get('text')} (it needs {need}): no days or GPUs are "
                                "answered for it (exit code 1); instead:")]
        out += [Finding(OK if o.get("days") is not None or o.get("fits") else WARNING,
                        "instead: " + _instead(o, gpn, amount, a.get("question") == "gpus"))
                for o in a.get("instead") or []]
        if not a.get("instead"):
            out.append(Finding(WARNING, "instead: nothing the plan considers fits (see the fit lines)"))
        return out
    if a.get("question") == "gpus":
        if a.get("days") is None:
            return [Finding(WARNING, a.get("text") or f"{a.get('gpus')} GPUs: no estimate")]
        how = f"measured ({a['measured']})" if a.get("measured") else "at the given rate (assumed)" if a.get(
            "assumed") else "projected"
        return [Finding(OK, f"{a['gpus']} GPUs ({_nodes(a['gpus'], gpn)}){_with(a)}: {text.days(a['days'])} for "
                            f"{amount} (range {text.days(a['days_low'])} - {text.days(a['days_high'])}), {how}")]
    budget_days = a.get("budget_days")
    if a.get("gpus") is None:
        return [Finding(WARNING, a.get("text") or f"{text.days(budget_days)} for {amount}: no GPU count the stored "
                                                  "figures project reaches it (see what is missing)")]
    lo, hi = a.get("gpus_low"), a.get("gpus_high")
    rng = f"range {lo} - {hi if hi is not None else 'beyond what the figures project'} GPUs"
    took = f"{text.days(a['days'])} (range {text.days(a.get('days_low'))} - {text.days(a.get('days_high'))})" \
        if a.get("days") is not None else "-"
    return [Finding(OK, f"{a['gpus']} GPUs ({_nodes(a['gpus'], gpn)}){_with(a)} finish {amount} in {took}: the fewest "
                        f"GPUs projected within the budget of {text.days(budget_days)} ({rng})")]


def _goodput_lines(doc: Mapping) -> list[Finding]:
    """--noise-scale: the answer's global batch against the noise scale, its statistical
    efficiency, goodput and days to the same progress (estimate/goodput.py), and whether more GPUs buy
    convergence there (noise_scale.NOT_WORTH: doubling them divides the steps by less)."""
    from mgpu_bench.training.noise_scale import NOT_WORTH

    a, ns, budget = doc.get("answer") or {}, doc.get("noise_scale") or {}, doc.get("budget") or {}
    if not ns or a.get("stat_efficiency") is None:
        return []
    unit = "tokens/s" if (doc.get("workload") or {}).get("tokens_per_sample") else "samples/s"
    b, noise, e = a["global_batch"], ns["b_noise"], a["stat_efficiency"]
    err = f" +- {text.samples(ns['stderr'])}" if ns.get("stderr") else ""
    key = (doc.get("workload") or {}).get("key")
    where = ns.get("run") or "given"
    if ns.get("run") and ns.get("same_workload") is False:
        where += f": {'the job ' if ns.get('whose') == 'job' else ''}{ns.get('workload')}'s, not {key}'s"
    rng = (f"range {a['stat_efficiency_low']:.3f} - {a['stat_efficiency_high']:.3f}" if ns.get("stderr") else
           "no uncertainty given")
    line = (f"goodput at {a['gpus']} GPUs: the global batch {b:,} samples is {b / noise:.3g}x the gradient noise "
            f"scale {text.samples(noise)}{err} samples ({where}): statistical efficiency E = {e:.3f} ({rng}) against "
            f"B_0 = {text.samples(ns['b0'])} samples (Pollux: (B_noise + B_0) / (B_noise + B)), goodput "
            f"{text.total_rate(a.get('goodput'))} {unit} of "
            f"{text.total_rate(a['goodput'] / e) if a.get('goodput') else '-'} {unit}")
    if a.get("days_progress") is not None:
        amount = f"{text.count(budget.get('value') or 0)} {budget.get('unit')}"
        asked = f", not the {text.days(a['budget_days'])} asked" if a.get("question") == "days" and \
            a.get("budget_days") and a["days_progress"] > a["budget_days"] else ""
        line += (f"; {text.days(a['days_progress'])} (range {text.days(a.get('days_progress_low'))} - "
                 f"{text.days(a.get('days_progress_high'))}) to the same training progress as {amount} at batch "
                 f"{text.samples(ns['b0'])} (the plain {text.days(a['days_progress'] * e)} / E){asked}")
    gain = a.get("doubling_fewer_steps")
    if gain is not None and gain < NOT_WORTH:
        return [Finding(WARNING, f"{line}: more GPUs buy {unit}, not convergence (doubling them divides the steps to "
                                 f"the same loss by only {gain:.2f}, McCandlish et al. 2018)")]
    return [Finding(OK, line)]


def _with(a: Mapping) -> str:
    lay = a.get("layout") or {}
    return "" if not lay or lay.get("name") in ("ddp", "fsdp") else f" with {lay.get('text')}"  # ZeRO-1/2 said


def _instead(o: Mapping, gpn: int, amount: str, asked_gpus: bool) -> str:
    lay = o.get("layout") or {}
    if o.get("host_bytes") is not None:
        state = ("fits" if o.get("fits") else "does not fit either") if o.get("fits") is not None else "-"
        return (f"{o['what']}: {text.value(o['host_bytes'], 'B')} of fp32 weights and AdamW moments on the hosts "
                f"({text.value(o['host_bytes_per_node'], 'B')} per node of {o['nodes']}), "
                f"{text.value(o.get('gpu_bytes'), 'B')} per GPU on {o['gpus']} GPUs"
                f"{' with recomputation' if o.get('checkpointing') else ''}: {state}; {o.get('why')}")
    where = f"{o['gpus']} GPUs ({_nodes(o['gpus'], gpn)})" + (", the fewest it needs" if asked_gpus and not
                                                                o.get("at_asked") else "")
    days = f"{text.days(o['days'])} for {amount}" if o.get("days") is not None else "no step time (see what is missing)"
    if o.get("days_progress") is not None:
        days += f" ({text.days(o['days_progress'])} to the same progress at E = {o['stat_efficiency']:.3f})"
    return (f"{o['what']}: {lay.get('text')} at micro-batch {o.get('batch')} (global batch {o.get('global_batch')} samples), "
            f"{where}: {days}, {text.value(o.get('memory'), 'B')} per GPU")


def _nodes(n: int, gpn: int) -> str:
    k = -(-n // gpn)
    return f"{k} node{'s' if k != 1 else ''} of {gpn}"


def findings(doc: Mapping) -> list[Finding]:
    out = _fit_lines(doc) + _answer_lines(doc) + _goodput_lines(doc)
    left = doc.get("left_out") or []
    for x in left[:MAX_LEFT_OUT]:
        out.append(Finding(WARNING, f"left out: {x['run']}, {x['why']}"))
    if len(left) > MAX_LEFT_OUT:
        out.append(Finding(WARNING, f"left out: {len(left) - MAX_LEFT_OUT} more runs (the document lists them)"))
    for m in doc.get("missing") or []:
        how = f"run `{m['command']}`" + (f" ({m['why']})" if m.get("why") else "") if m.get("command") else \
            (m.get("why") or "not measurable from here")
        out.append(Finding(WARNING, f"missing: {m['what']}: {how}"))
    for e in doc.get("measured_now") or []:
        if e.get("status") != "ok":
            out.append(Finding(WARNING, f"--measure: `{e['command']}` {e['status']}: {e.get('error')}"))
    return out


NO_ESTIMATE = "no_estimate"  # status.stopped of a plan that answers nothing for want of a figure


def no_estimate(doc: Mapping) -> str | None:
    """Why a plan answers nothing (its status then says so: stored marked incomplete, exit code 1),
    or None where it answers: the question asked (--gpus N: the days; --days D: the GPUs) has no
    figure, or without a question no GPU count is projected, for want of a figure (`missing`) or of
    the device's memory. A layout that does not fit is an answer (failure()); so is a --days budget
    that no GPU count meets though every count was projected."""
    a = doc.get("answer")
    if a is None:
        if doc.get("curve") or not doc.get("missing"):
            return None
        return "no estimate: no GPU count is projected (what is missing is listed above); the plan is marked " \
               "incomplete (exit code 1)"
    if a.get("fits") is False or a.get("unreachable"):
        return None
    if a.get("question") == "gpus" and (a.get("days") is not None or not (doc.get("budget") or {}).get("value")
                                        and doc.get("curve")):
        return None
    if a.get("question") == "days" and a.get("gpus") is not None:
        return None
    why = str(a.get("text") or "a figure is missing").replace(" (see below)", "")
    why = why if why.startswith("no estimate") else f"no estimate: {why}"
    return f"{why} (what is missing is listed above); the plan is marked incomplete (exit code 1)"


def failure(doc: Mapping) -> str | None:
    """The layout asked does not fit: exit code 1, the plan kept with what fits instead."""
    a = doc.get("answer") or {}
    if a.get("fits") is False:
        return f"does not fit as asked: {a.get('text')}; what fits instead is above (exit code 1)"
    return None


def key_figure(doc: Mapping) -> tuple[str, str]:
    a = doc.get("answer") or {}
    if a.get("fits") is False:
        return "does not fit", a.get("text") or "-"
    if a.get("days") is not None and a.get("gpus"):
        return f"{a['gpus']} GPUs, {text.days(a['days'])}", "projected from the history"
    return "-", "-"
