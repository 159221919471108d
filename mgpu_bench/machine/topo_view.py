"""What a topology snapshot (topo.collect) says to a person: `findings()` turns it into warnings
a person can act on, each with the figure seen and the figure expected (a downgraded PCIe link,
fewer active NVLinks than the GPU's peers, a GPU pair with neither NVLink nor P2P, a NIC port
that is down); `render()` prints it the way `nvidia-smi topo -m` does, with tables around it.
Both read the snapshot only: no NVML, no /sys.
"""

from __future__ import annotations

from .topo import format_cpulist

# ---------------------------------------------------------------------------------------------
# findings


def _finding(severity: str, subject: str, message: str) -> dict:
    return {"severity": severity, "subject": subject, "message": message}


def _links_text(links: list[int]) -> str:
    return ("link " if len(links) == 1 else "links ") + ", ".join(str(x) for x in links)


def findings(snapshot: dict) -> list[dict]:
    """What deserves a look, warnings first: each {severity, subject, message}, the message one
    line with the figure seen and the figure expected."""
    out: list[dict] = []
    nvml = snapshot.get("nvml", {})
    gpus = snapshot.get("gpus", [])
    if not nvml.get("available"):
        out.append(_finding("warning", "NVML", f"NVML unavailable, no GPU facts collected: {nvml.get('error')}"))
    elif nvml.get("error"):
        out.append(_finding("warning", "NVML", f"NVML query failed, GPU facts incomplete: {nvml['error']}"))

    for g in gpus:
        subject = f"GPU {g['index']}"
        p = g.get("pcie") or {}
        gen, width, max_gen, max_width = p.get("gen"), p.get("width"), p.get("max_gen"), p.get("max_width")
        if None not in (gen, width, max_gen, max_width):
            now, cap = f"PCIe Gen{gen} x{width}", f"Gen{max_gen} x{max_width}"
            if width < max_width:
                # Idle GPUs lower the generation to save power, never the width: a narrow link
                # is a seating, riser or BIOS fault until shown otherwise.
                out.append(_finding("warning", subject,
                                    f"{subject} {now}, capable of {cap}: downgraded link; verify under load"))
            elif gen < max_gen:
                out.append(_finding("info", subject, f"{subject} {now}, capable of {cap}: idle GPUs lower the "
                                    "generation; check under load"))
        gpu_max = p.get("gpu_max_gen")
        if gpu_max is not None and max_gen is not None and gpu_max > max_gen:
            out.append(_finding("info", subject, f"{subject} is PCIe Gen{gpu_max} capable but its slot allows "
                                f"Gen{max_gen}"))

    # NVLinks: a GPU with fewer active links than the best of its peers, or a link that is down.
    active = {g["index"]: sum(1 for ln in g.get("nvlinks", []) if ln.get("active")) for g in gpus}
    expected = max(active.values(), default=0)
    for g in gpus:
        subject = f"GPU {g['index']}"
        links = g.get("nvlinks", [])
        down = [ln["link"] for ln in links if ln.get("active") is False]
        n = active[g["index"]]
        if expected and n < expected:
            tail = f" ({_links_text(down)} of {len(links)} inactive)" if down else ""
            out.append(_finding("warning", subject, f"{subject} has {n} active NVLinks, its peers {expected}{tail}"))
        elif down and expected:
            # As many active links as the best peer: the down ones read as the platform's wiring
            # (links the board does not connect), not as a fault.
            out.append(_finding("info", subject, f"{subject} NVLink {_links_text(down)} present but inactive "
                                f"({n} of {len(links)} active, as many as its best peer)"))
    if not expected and any(ln.get("active") is False for g in gpus for ln in g.get("nvlinks", [])):
        out.append(_finding("info", "NVLink", "NVLinks present but none active (no bridge or NVSwitch "
                            "fabric up?): GPUs talk over PCIe"))

    seen = set()
    for pr in snapshot.get("pairs", []):
        key = (min(pr["src"], pr["dst"]), max(pr["src"], pr["dst"]))
        if key in seen:
            continue
        seen.add(key)
        p2p = pr.get("p2p") or {}
        known = [p2p.get(k) for k in ("read", "write") if p2p.get(k) is not None]
        if pr.get("nvlinks", 0) == 0 and known and "ok" not in known:
            out.append(_finding("warning", f"GPU {key[0]} <-> GPU {key[1]}",
                                f"GPU {key[0]} <-> GPU {key[1]}: no NVLink and no P2P (read {p2p.get('read')}, "
                                f"write {p2p.get('write')}; path {pr.get('pcie_path')}): copies go through "
                                "host memory"))

    for nic in snapshot.get("nics", []):
        if nic.get("state") != "ACTIVE":
            subject = f"{nic['device']} port {nic['port']}"
            out.append(_finding("warning", subject, f"{subject} is {nic.get('state')} "
                                f"(physical {nic.get('phys_state')}), expected ACTIVE"))
    out.sort(key=lambda f: f["severity"] != "warning")  # stable: warnings first, order kept
    return out


# ---------------------------------------------------------------------------------------------
# terminal


def _mhz(hz) -> str:
    return f"{hz / 1e6:.0f}" if hz is not None else "?"


def _pcie_cell(p: dict) -> str:
    """'Gen5 x16' when at its capability, else now/capable per figure: 'Gen5 x8/x16', 'Gen1/5 x16'."""
    gen, width, max_gen, max_width = p.get("gen"), p.get("width"), p.get("max_gen"), p.get("max_width")
    if gen is None or width is None:
        return "n/a"
    g = f"Gen{gen}" if max_gen in (None, gen) else f"Gen{gen}/{max_gen}"
    w = f"x{width}" if max_width in (None, width) else f"x{width}/x{max_width}"
    return f"{g} {w}"


def _nvlink_cells(links: list[dict]) -> tuple[str, str]:
    """('18/18', '4.0, 26.6'): active/all, and the version and per-link GB/s where all agree."""
    if not links:
        return "-", "-"
    act = [ln for ln in links if ln.get("active")]
    versions = {ln["version"] for ln in act if ln.get("version")}
    rates = {ln["rate_Bps"] for ln in act if ln.get("rate_Bps")}
    detail = [versions.pop() if len(versions) == 1 else "?", f"{rates.pop() / 1e9:.1f}" if len(rates) == 1 else "?"]
    return f"{len(act)}/{len(links)}", ", ".join(detail) if act else "-"


def render(snapshot: dict, console, print_table=None) -> None:
    """Findings, the GPU table, the pair matrix (like nvidia-smi topo -m) and the NIC table,
    readable at 100 columns. Tables go through `print_table(console, table)` when given
    (output.tables.print_table: no figure cut; a shared module does not import output)."""
    from rich.table import Table
    from rich.text import Text

    show = print_table or (lambda c, table: c.print(table))
    host, nvml, gpus, nics = snapshot["host"], snapshot["nvml"], snapshot["gpus"], snapshot["nics"]
    head = f"{host.get('hostname')}: {len(gpus)} GPU(s), {host.get('sockets') or '?'} socket(s), " \
           f"{host.get('numa_nodes') or '?'} NUMA node(s), kernel {host.get('kernel')}"
    if nvml.get("available"):
        head += f", driver {nvml.get('driver')}"
    console.print(Text(head))
    found = findings(snapshot)
    for f in found:
        style = "yellow" if f["severity"] == "warning" else "dim"
        console.print(Text.assemble((f["severity"], style), f": {f['message']}"))
    if not found:
        console.print("No findings.")
    console.print()

    if gpus:
        t = Table(title="GPUs", title_justify="left", box=None, pad_edge=False, header_style="bold")
        for title, justify in (("GPU", "right"), ("name", "left"), ("bus id", "left"), ("memory\nGiB", "right"),
                               ("NUMA", "right"), ("power\nW", "right"), ("SM MHz\nnow/max", "right"),
                               ("mem MHz\nnow/max", "right"), ("PCIe now/\ncapable", "left"),
                               ("NVLinks\nup/all", "right"), ("NVLink\nver, GB/s", "left")):
            t.add_column(title, justify=justify, no_wrap=title in ("GPU", "bus id"))
        for g in gpus:
            ck = g["clocks"]
            cells = (
                str(g["index"]), (g["name"] or "?").removeprefix("NVIDIA "), g["pci_bus_id"] or "?",
                f"{g['memory_total_bytes'] / (1 << 30):.0f}" if g["memory_total_bytes"] else "?",
                "-" if g["numa_node"] is None else str(g["numa_node"]),
                f"{g['power_limit_W']:.0f}" if g["power_limit_W"] is not None else "?",
                f"{_mhz(ck['sm_Hz'])}/{_mhz(ck['sm_max_Hz'])}", f"{_mhz(ck['mem_Hz'])}/{_mhz(ck['mem_max_Hz'])}",
                _pcie_cell(g["pcie"]), *_nvlink_cells(g["nvlinks"]),
            )
            # Text cells: no markup or emoji codes read into names and bus ids (':ab:' is an emoji)
            t.add_row(*(Text(c) for c in cells), style="red" if g["errors"] and g["name"] is None else None)
        show(console, t)
        console.print()

        m = Table(title="Paths (as nvidia-smi topo -m)", title_justify="left", box=None, pad_edge=False,
                  header_style="bold")
        m.add_column("")
        for g in gpus:
            m.add_column(f"GPU{g['index']}", justify="center")
        m.add_column("NUMA", justify="right")
        m.add_column("CPU affinity", justify="left")
        cell = {(p["src"], p["dst"]): p["path"] or "?" for p in snapshot["pairs"]}
        for g in gpus:
            i = g["index"]
            m.add_row(f"GPU{i}", *[("X" if i == h["index"] else cell.get((i, h["index"]), "?")) for h in gpus],
                      "-" if g["numa_node"] is None else str(g["numa_node"]), format_cpulist(g["cpu_affinity"]))
        names = list(dict.fromkeys(n["device"] for n in nics))
        for k, name in enumerate(names):
            paths = {p["gpu"]: p["path"] for n in nics if n["device"] == name for p in n["gpu_paths"]}
            numa = next(n["numa_node"] for n in nics if n["device"] == name)
            m.add_row(f"NIC{k}", *[paths.get(g["index"], "?") for g in gpus],
                      "-" if numa is None else str(numa), "")
        show(console, m)
        legend = "NV# = # NVLinks; PIX = one PCIe switch; PXB = several switches; PHB = host bridge; " \
                 "NODE = across host bridges of a NUMA node; SYS = across NUMA nodes"
        console.print(Text(legend, style="dim"))
        if names:
            console.print(Text("  ".join(f"NIC{k}: {name}" for k, name in enumerate(names)), style="dim"))
        console.print()

    if nics:
        t = Table(title="NICs (/sys/class/infiniband)", title_justify="left", box=None, pad_edge=False,
                  header_style="bold")
        for title, justify in (("device", "left"), ("port", "right"), ("state", "left"), ("physical", "left"),
                               ("link layer", "left"), ("rate", "right"), ("bus id", "left"), ("NUMA", "right"),
                               ("nearest GPUs", "left")):
            t.add_column(title, justify=justify)
        for n in nics:
            rate = (f"{n['rate_bps'] / 1e9:g} Gb/s {n['generation'] or ''}".rstrip()
                    if n["rate_bps"] is not None else "?")
            near = n["nearest_gpus"]
            path = next((p["path"] for p in n["gpu_paths"] if near and p["gpu"] == near[0]), "")
            cells = (n["device"], str(n["port"]), n["state"] or "?", n["phys_state"] or "?", n["link_layer"] or "?",
                     rate, n["pci_bus_id"] or "-", "-" if n["numa_node"] is None else str(n["numa_node"]),
                     f"{','.join(str(x) for x in near)} ({path})" if near else "-")
            t.add_row(*(Text(c) for c in cells), style=None if n["state"] == "ACTIVE" else "yellow")
        show(console, t)
