"""memory on the terminal: the churn, HBM and PyTorch allocator tables, the largest batches."""

from __future__ import annotations

from typing import Any

from .analyse import sample_size
from .measure import HBM_LABELS, MemoryRun


def render_terminal(run: MemoryRun, console) -> None:
    from rich.table import Table

    from mgpu_bench.output.tables import print_table

    if run.churn:
        t = Table(title="Allocation churn: largest block that can really be allocated after each pattern "
                        "(fragmentation = 1 - largest / free)", title_justify="left", pad_edge=False, box=None,
                  header_style="bold")
        for name in ("GPU", "allocator", "pattern", "held\nGiB", "free\nGiB", "largest\nGiB", "fragm.\n%",
                     "alloc p50\nus", "alloc p99\nus", "free p99\nus", "search\ns"):
            t.add_column(name, justify="left" if name in ("allocator", "pattern") else "right")
        for r in run.churn:
            lat = r.latency()
            alloc = list((lat.get("alloc") or {}).values())
            free = list((lat.get("free") or {}).values())
            t.add_row(str(r.gpu), r.allocator, r.pattern, f"{r.raw['held_bytes'] / 2**30:.2f}", f"{r.free / 2**30:.2f}",
                      f"{r.largest / 2**30:.2f}", "-" if r.fragmentation is None else f"{100 * r.fragmentation:.1f}",
                      _us(max((c["p50"] for c in alloc), default=None)), _us(max((c["p99"] for c in alloc), default=None)),
                      _us(max((c["p99"] for c in free), default=None)), f"{r.raw['search_seconds']:.2f}")
        print_table(console, t)
        console.print("  latency columns: the worst size class of the pattern's own calls; per class in --json",
                      highlight=False)
    if run.hbm:
        t = Table(title="HBM bandwidth: (bytes read + bytes written) / median time; TB/s = 10^12 B/s",
                  title_justify="left", pad_edge=False, box=None, header_style="bold")
        for name in ("GPU", "kernel", "read\nGiB", "written\nGiB", "TB/s", "% of\ndatasheet", "datasheet\nTB/s"):
            t.add_column(name, justify="left" if name == "kernel" else "right")
        for h in run.hbm:
            t.add_row(str(h.gpu), HBM_LABELS[h.kind], f"{h.bytes_read / 2**30:.1f}", f"{h.bytes_written / 2**30:.1f}",
                      f"{h.bandwidth / 1e12:.2f}", "-" if h.pct_peak is None else f"{h.pct_peak:.1f}",
                      "-" if h.peak is None else f"{h.peak / 1e12:.2f}")
        print_table(console, t)
    if run.torch:
        t = Table(title="PyTorch caching allocator, one fresh process per setting", title_justify="left",
                  pad_edge=False, box=None, header_style="bold")
        for name in ("setting", "peak alloc\nGiB", "peak reserved\nGiB", "reserved-unalloc\nat peak GiB",
                     "inactive split\npeak GiB", "largest free\nGiB", "free in cache\nGiB", "retries", "OOMs"):
            t.add_column(name, justify="left" if name == "setting" else "right")
        for setting, d in run.torch.items():
            if d.get("error"):
                t.add_row(setting, f"failed: {d['error']}", *[""] * 7)
                continue
            t.add_row(setting, *(_g(d.get(k)) for k in ("peak_allocated_bytes", "peak_reserved_bytes",
                                                           "reserved_unallocated_at_peak_bytes",
                                                           "inactive_split_peak_bytes", "largest_free_block_bytes",
                                                           "free_in_segments_bytes")),
                      _i(d.get("num_alloc_retries")), _i(d.get("num_ooms")))
        print_table(console, t)
    for mb in run.max_batch:
        if mb.get("error"):
            continue
        console.print(f"max batch {mb['model']}{' ' + sample_size(mb) if sample_size(mb) else ''}, activation "
                      "checkpointing "
                      f"{'on' if mb['checkpointing'] else 'off'}: {mb.get('max_batch')} per GPU "
                      f"({len(mb.get('trials') or [])} trials, {mb.get('seconds', 0):.1f} s)", highlight=False)


def _us(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e6:.0f}"


def _g(v: Any) -> str:
    return "-" if v is None else f"{v / 2**30:.2f}"


def _i(v: Any) -> str:
    return "-" if v is None else str(v)
