"""What a memory run means: fragmentation per allocator and pattern, HBM against the datasheet,
the PyTorch allocator settings compared, failed max-batch searches; the suite's verdicts.
"""

from __future__ import annotations

from typing import Any

from mgpu_bench.results.probe import OK, PROBLEM, WARNING, Finding

from .measure import FRAGMENTED, HBM_FLOOR, HBM_LABELS, ChurnResult, MemoryRun


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def findings(run: MemoryRun) -> list[Finding]:
    """Fragmentation above 5% and the allocator that recovers it (warnings), none anywhere
    (ok), smaller differences between allocators (ok), HBM below 80% of the datasheet and failed
    max-batch searches (problems), the PyTorch allocator comparison."""
    lines: list[Finding] = []
    by_pattern: dict[tuple[int, str], list[ChurnResult]] = {}
    for r in run.churn:
        by_pattern.setdefault((r.gpu, r.pattern), []).append(r)
    for (gpu, pattern), rs in by_pattern.items():
        bad = [r for r in rs if (r.fragmentation or 0) > FRAGMENTED]
        for r in bad:
            lines.append(Finding(WARNING, f"GPU {gpu} {pattern} under {r.allocator}: {_gib(r.lost_bytes)} of {_gib(r.free)} free "
                         f"cannot be allocated as one block (fragmentation {100 * (r.fragmentation or 0):.1f}%, "
                         f"largest block {_gib(r.largest)})"))
        clean = [r for r in rs if r.fragmentation is not None and r.fragmentation <= FRAGMENTED]
        if bad and clean:
            best = min(clean, key=lambda r: r.fragmentation or 0.0)
            lines.append(Finding(WARNING, f"GPU {gpu} {pattern}: {best.allocator} recovers it (largest block {_gib(best.largest)} "
                         f"of {_gib(best.free)} free)"))
    allocs = {r.allocator for r in run.churn}
    if run.churn and not any((r.fragmentation or 0) > FRAGMENTED for r in run.churn):
        lines.append(Finding(OK, f"no allocator fragmented under these patterns ({', '.join(sorted(allocs))}): the largest "
                     "block stayed within 5% of free memory in every case"))
    # Smaller differences between allocators are still stated, so a reader sees which one holds
    # memory back: more than one percentage point between the best and the worst.
    for (gpu, pattern), rs in by_pattern.items():
        known = [r for r in rs if r.fragmentation is not None]
        if len(known) < 2:
            continue
        worst = max(known, key=lambda r: r.fragmentation or 0.0)
        best = min(known, key=lambda r: r.fragmentation or 0.0)
        gap = (worst.fragmentation or 0.0) - (best.fragmentation or 0.0)
        if 0.01 < gap and (worst.fragmentation or 0) <= FRAGMENTED:
            lines.append(Finding(OK, f"GPU {gpu} {pattern}: {worst.allocator} leaves {_gib(worst.lost_bytes)} "
                         f"({100 * (worst.fragmentation or 0):.1f}%) of free memory unusable as one block, "
                         f"{best.allocator} {_gib(best.lost_bytes)} ({100 * (best.fragmentation or 0):.1f}%)"))
    for h in run.hbm:
        if h.kind in ("copy_ce", "copy_sm") and h.pct_peak is not None and h.pct_peak < 100 * HBM_FLOOR:
            lines.append(Finding(PROBLEM, f"GPU {h.gpu} HBM {HBM_LABELS[h.kind]}: {h.bandwidth / 1e12:.2f} TB/s, {h.pct_peak:.1f}% of "
                         f"the {h.peak / 1e12:.2f} TB/s datasheet figure (below {100 * HBM_FLOOR:.0f}%)"))
    if run.torch:
        from . import torch_memory

        text = torch_memory.verdict(run.torch)
        lines.append(Finding(OK if "negligible" in text else WARNING, text))
    for mb in run.max_batch:
        if mb.get("error"):
            lines.append(Finding(PROBLEM, f"max batch {mb['model']} (checkpointing {'on' if mb['checkpointing'] else 'off'}): "
                         f"failed: {mb['error']}"))
    return lines


def judge(run: MemoryRun) -> list[Finding]:
    """The suite's ok lines: HBM copies within the healthy share of the datasheet, the largest
    batches found."""
    out = []
    copies: dict[int, float] = {}
    for h in run.hbm:
        if h.kind in ("copy_ce", "copy_sm") and h.pct_peak is not None:
            copies[h.gpu] = max(copies.get(h.gpu, 0.0), h.bandwidth)
    peaks = sorted({h.peak for h in run.hbm if h.peak})
    if copies and len(peaks) == 1 and all(bw >= HBM_FLOOR * peaks[0] for bw in copies.values()):
        lo, hi = min(copies.values()), max(copies.values())
        where = (f"GPU {next(iter(copies))}: {lo / 1e12:.2f} TB/s, {100 * lo / peaks[0]:.0f}%" if len(copies) == 1
                 else f"{len(copies)} GPUs: {lo / 1e12:.2f}-{hi / 1e12:.2f} TB/s, {100 * lo / peaks[0]:.0f}% or more")
        out.append(Finding(OK, f"HBM copy on {where} of the {peaks[0] / 1e12:.2f} TB/s datasheet figure "
                               f"(healthy >= {100 * HBM_FLOOR:.0f}%)"))
    for (model, size), by in max_batches(run).items():
        parts = [f"{by[c]} per GPU {'with' if c else 'without'} activation checkpointing"
                 for c in (False, True) if c in by]
        out.append(Finding(OK, f"largest batch of {model}{' at ' + size if size else ''}: {', '.join(parts)}"))
    return out


def sample_size(m: dict) -> str:
    """A max-batch search's sample in words: "seq 2048", "224 px", or "" (a module's own)."""
    if m.get("image_size"):
        return f"{m['image_size']} px"
    return f"seq {m['seq_len']}" if m.get("seq_len") else ""


def max_batches(run: MemoryRun) -> dict[tuple, dict[bool, Any]]:
    """(model, sample size) -> {checkpointing: largest batch} of the searches that did not fail."""
    out: dict[tuple, dict[bool, Any]] = {}
    for m in run.max_batch:
        if not m.get("error"):
            out.setdefault((m.get("model"), sample_size(m)), {})[
                bool(m.get("checkpointing"))
            ] = m.get("max_batch")
    return out


def key_figure(run: MemoryRun) -> tuple[str, str]:
    """The lowest HBM copy, the worst fragmentation, the largest batches."""
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
        exps.append(f"<= {100 * FRAGMENTED:.0f}% healthy")
    for (model, size), by in max_batches(run).items():
        figs.append(
            f"max batch {model}{' ' + size if size else ''}: "
            + ", ".join(
                f"{by[c]}{' with checkpointing' if c else ''}"
                for c in (False, True)
                if c in by
            )
        )
    return "; ".join(figs) or "-", "; ".join(exps) or "-"
