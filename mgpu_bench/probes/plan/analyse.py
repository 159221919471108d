"""What a plan says on top: the fit, the answer (days for --gpus, GPUs for --days) and what is
missing with the command that measures it. The run is the plan document itself (plain data)."""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_bench.probe import OK, PROBLEM, WARNING, Finding

from . import text


def _fit_lines(doc: Mapping) -> list[Finding]:
    fit, w = doc.get("fit") or {}, doc.get("workload") or {}
    out = []
    key, batch, device = w.get("key"), doc.get("batch"), (doc.get("device") or {}).get("name")
    for parallel in ("ddp", "fsdp"):
        f = fit.get(parallel) or {}
        if f.get("allocated") is None:
            continue
        where = "per GPU" if parallel == "ddp" else f"per GPU over {f.get('gpus')} GPUs"
        parts = f"model states {text.value(f['states'], 'B')}, activations {text.value(f['activations'], 'B')}" + (
            f", other {text.value(f['other'], 'B')}" if f.get("other") else "")
        need = f"{text.value(f['reserved'], 'B')} {where} ({parts})"
        largest = fit.get(f"largest_batch_{parallel}")
        if f.get("fits") is None:
            out.append(Finding(WARNING, f"fit ({parallel.upper()}): {key} at batch {batch} needs {need}; the device "
                                        "memory is not known"))
            continue
        fewest = fit.get(f"fewest_gpus_{parallel}")
        held = (f"the fewest GPUs that hold it: {fewest}" if fewest else
                "no GPU count holds it at this batch" if parallel == "fsdp" else "DDP cannot hold it (every GPU "
                "keeps the whole model)")
        severity = OK if f["fits"] else (PROBLEM if parallel == doc["config"]["parallel"] else WARNING)
        out.append(Finding(severity, f"fit ({parallel.upper()}): {key} at batch {batch} needs {need} of "
                                     f"{text.value(f['capacity'], 'B')} on a {device}: {held}; the largest batch "
                                     f"per GPU: {largest if largest is not None else '-'}"))
    return out


def _answer_line(doc: Mapping) -> Finding | None:
    a, budget = doc.get("answer"), doc.get("budget") or {}
    if not a:
        return None
    amount = f"{text.count(budget.get('value') or 0)} {budget.get('unit')}"
    gpn = (doc.get("device") or {}).get("gpus_per_node") or 1
    if a.get("question") == "gpus":
        if a.get("days") is None:
            return Finding(WARNING, a.get("text") or f"{a.get('gpus')} GPUs: no estimate")
        how = f"measured ({a['measured']})" if a.get("measured") else "projected"
        return Finding(OK, f"{a['gpus']} GPUs ({_nodes(a['gpus'], gpn)}): {text.days(a['days'])} for {amount} (range "
                           f"{text.days(a['days_low'])} - {text.days(a['days_high'])}), {how}")
    if a.get("gpus") is None:
        return Finding(WARNING, a.get("text") or f"{text.days(a['days'])} for {amount}: no GPU count the stored "
                                                 "figures project reaches it (see what is missing)")
    lo, hi = a.get("gpus_low"), a.get("gpus_high")
    rng = f"range {lo} - {hi if hi is not None else 'beyond what the figures project'}"
    return Finding(OK, f"{text.days(a['days'])} for {amount}: {a['gpus']} GPUs ({_nodes(a['gpus'], gpn)}; {rng})")


def _nodes(n: int, gpn: int) -> str:
    k = -(-n // gpn)
    return f"{k} node{'s' if k != 1 else ''} of {gpn}"


def findings(doc: Mapping) -> list[Finding]:
    out = _fit_lines(doc)
    answer = _answer_line(doc)
    if answer is not None:
        out.append(answer)
    for m in doc.get("missing") or []:
        how = f"run `{m['command']}`" if m.get("command") else (m.get("why") or "not measurable from here")
        out.append(Finding(WARNING, f"missing: {m['what']}: {how}"))
    for e in doc.get("measured_now") or []:
        if e.get("status") != "ok":
            out.append(Finding(WARNING, f"--measure: `{e['command']}` {e['status']}: {e.get('error')}"))
    return out


def key_figure(doc: Mapping) -> tuple[str, str]:
    a = doc.get("answer") or {}
    if a.get("days") is not None and a.get("gpus"):
        return f"{a['gpus']} GPUs, {text.days(a['days'])}", "projected from the history"
    return "-", "-"
