"""links on the terminal: GPU x GPU matrices of GB/s, % of theory and latency; host copies."""

from __future__ import annotations

from .result import LinksRun


def render_terminal(run: LinksRun, console, hops: dict | None = None) -> None:
    """Matrices (rows: source GPU, columns: destination) of GB/s per direction, % of the link
    theory (the run's hops unless given), latency in us, and the host copies."""
    hops = run.hops if hops is None else hops
    from rich.table import Table

    from mgpu_bench.output.tables import print_table

    g = run.gpus

    def matrix(title: str, cells: dict[tuple[int, int], str]) -> None:
        console.print(title, highlight=False, soft_wrap=True)  # a table's title would wrap to its width
        t = Table(box=None, pad_edge=False)
        t.add_column("src \\ dst")
        for b in g:
            t.add_column(f"GPU {b}", justify="right")
        for a in g:
            t.add_row(f"GPU {a}", *[("-" if a == b else cells.get((a, b), "n/a")) for b in g])
        print_table(console, t)
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
        print_table(console, t)
        console.print()
