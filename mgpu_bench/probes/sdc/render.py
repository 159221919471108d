"""sdc on the terminal and in CSV: one row per GPU (base units), two renderers."""

from __future__ import annotations

import csv
import io
import statistics

from .analyse import summary, verdicts
from .result import SdcRun, shape_text

CSV_FIELDS = ("gpu", "gpu_name", "verdict", "issues", "repetitions", "gemms", "gemm_hash", "gemm_flops_per_s",
              "hbm_bytes", "hbm_bytes_per_s", "hbm_wrong_words", "collectives", "collective_wrong_elements",
              "wrong_checks", "checks")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def rows(run: SdcRun) -> list[dict]:
    """One row per GPU: its verdict, what it checked and how fast (FLOP/s, bytes/s: medians over
    repetitions of the work's GPU time)."""
    v = verdicts(run)
    flops = run.config.gemm_flops
    out = []
    for d in run.devices:
        g = d["index"]
        gemm, hbm, coll = (run.checks_of(g, w) for w in ("gemm", "hbm", "collective"))
        out.append({
            "gpu": g, "gpu_name": d.get("name") or "", "verdict": v[g]["verdict"], "issues": ";".join(v[g]["issues"]),
            "repetitions": len(gemm), "gemms": sum(c.count for c in gemm), "gemm_hash": run.references.get(g),
            "gemm_flops_per_s": _median([c.count * flops / c.seconds for c in gemm if c.seconds > 0]),
            "hbm_bytes": run.hbm_bytes.get(g), "hbm_bytes_per_s": _median([2 * c.bytes / c.seconds for c in hbm
                                                                         if c.seconds > 0]),
            "hbm_wrong_words": sum(c.wrong for c in hbm), "collectives": len(coll),
            "collective_wrong_elements": sum(c.wrong for c in coll),
            "wrong_checks": sum(1 for c in run.checks_of(g) if c.wrong), "checks": len(run.checks_of(g)),
        })
    return out


def render_csv(run: SdcRun) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in rows(run):
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def _num(v: float | None, scale: float, fmt: str) -> str:
    return "-" if v is None else format(v / scale, fmt)


def render_terminal(run: SdcRun, console) -> None:
    """The GPU table (100 columns), the pinned algorithm, the summary line."""
    from rich.table import Table

    from mgpu_bench.output.tables import print_table

    cfg = run.config
    t = Table(title=f"Silent data corruption: {cfg.dtype} GEMM {shape_text(cfg.shape)}, HBM pattern, exact allreduce",
              title_justify="left", pad_edge=False, box=None, header_style="bold")
    for name, just in (("GPU", "right"), ("verdict", "left"), ("GEMMs", "right"), ("GEMM hash", "left"),
                       ("TFLOP/s", "right"), ("HBM\nGiB", "right"), ("HBM\nGB/s", "right"), ("HBM wrong\nwords", "right"),
                       ("allreduce\nwrong", "right")):
        t.add_column(name, justify=just, overflow="fold")  # type: ignore[arg-type]
    for r in rows(run):
        t.add_row(str(r["gpu"]), r["verdict"], str(r["gemms"]), r["gemm_hash"] or "-",
                  _num(r["gemm_flops_per_s"], 1e12, ".1f"), _num(r["hbm_bytes"], 2**30, ".1f"),
                  _num(r["hbm_bytes_per_s"], 1e9, ".0f"), str(r["hbm_wrong_words"]),
                  str(r["collective_wrong_elements"]) if r["collectives"] else "-")
    print_table(console, t)
    if run.algo:
        a = run.algo
        console.print(f"  pinned cuBLASLt algorithm (chosen on GPU {a.get('chosen_on')}, used by every GPU): "
                      f"{algo_text(a)}", highlight=False, soft_wrap=True)
    if run.checks:
        console.print(f"sdc: {summary(run)}; {run.check_seconds:.1f} s of checks, {run.wall_seconds:.1f} s wall",
                      highlight=False, soft_wrap=True)


def algo_text(a: dict) -> str:
    text = (f"algo {a.get('algo_id')} tile {a.get('tile')} stages {a.get('stages')} splitK {a.get('split_k')} "
            f"reduction {a.get('reduction')} swizzle {a.get('swizzle')} custom {a.get('custom')}")
    if a.get("cluster"):
        text += f" cluster {a.get('cluster')}"
    return text + f", workspace {int(a.get('workspace') or 0)} B"
