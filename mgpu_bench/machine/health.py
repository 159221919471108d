"""A GPU's health facts through NVML, as findings: what a fleet pass checks on every GPU before it
measures anything.

Each fact is read where NVML supports it and left out where it does not (a query the GPU refuses
is not a fault): uncorrected ECC errors since boot, retired pages pending or remapped rows failed
(the memory needs a reset or the board a replacement), the PCIe link below its maximum generation
or width, NVLinks down, a power limit below the default, clock-event reasons that are faults
(thermal, hardware slowdown, power brake), another process on the GPU. Severity "problem" drains
the node in a fleet pass; "warning" is said.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

_ECC_UNCORRECTED, _ECC_VOLATILE = 1, 0  # nvmlMemoryErrorType_t, nvmlEccCounterType_t


def _call(nv, name: str, *args):
    value, err = nv.try_call(name, *args)
    return None if err is not None else value


def facts(bus_id: str, nvml=None) -> dict:
    """The raw facts of the GPU at `bus_id` ({"error": why} when NVML cannot be read)."""
    from .telemetry import handle_by_bus_id
    from .topo import _open

    nv, status = _open(nvml)
    if nv is None:
        return {"error": status.get("error") or "NVML unavailable"}
    try:
        h, why = handle_by_bus_id(nv, bus_id)
        if h is None:
            return {"error": f"no NVML handle for {bus_id}: {why}"}
        out: dict = {"driver": status.get("driver")}
        out["ecc_uncorrected"] = _call(nv, "nvmlDeviceGetTotalEccErrors", h, _ECC_UNCORRECTED, _ECC_VOLATILE)
        out["retired_pending"] = _call(nv, "nvmlDeviceGetRetiredPagesPendingStatus", h)
        rows = _call(nv, "nvmlDeviceGetRemappedRows", h)  # (corrected, uncorrected, pending, failure)
        if isinstance(rows, (tuple, list)) and len(rows) == 4:
            out["remapped"] = {"corrected": rows[0], "uncorrected": rows[1], "pending": bool(rows[2]),
                               "failure": bool(rows[3])}
        for key, name in (("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                          ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                          ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
                          ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
            out[key] = _call(nv, name, h)
        links = []
        for i in range(18):
            state = _call(nv, "nvmlDeviceGetNvLinkState", h, i)
            if state is None:
                break
            links.append(int(state))
        out["nvlinks"] = links
        mw = _call(nv, "nvmlDeviceGetEnforcedPowerLimit", h)
        dmw = _call(nv, "nvmlDeviceGetPowerManagementDefaultLimit", h)
        out["power_limit_w"] = mw / 1000 if mw else None
        out["power_default_w"] = dmw / 1000 if dmw else None
        out["name"] = _text(_call(nv, "nvmlDeviceGetName", h))
        return out
    finally:
        with contextlib.suppress(Exception):  # shutting down: nothing left to report to
            nv.mod.nvmlShutdown()


def _text(v) -> str | None:
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def findings(f: Mapping) -> list[dict]:
    """Facts -> [{"text", "severity"}]: problems for what needs a reset or a replacement, or runs
    slower than the hardware can; warnings for settings and what may pass."""
    out = []
    if f.get("error"):
        return [{"text": f"no health facts: {f['error']}", "severity": "warning"}]
    if f.get("ecc_uncorrected"):
        out.append({"text": f"{f['ecc_uncorrected']} uncorrected ECC error(s) since the driver loaded",
                    "severity": "problem"})
    if f.get("retired_pending"):
        out.append({"text": "retired pages pending: reset the GPU to retire them", "severity": "problem"})
    rows = f.get("remapped") or {}
    if rows.get("failure"):
        out.append({"text": "row remapping failed: the GPU's memory needs a replacement", "severity": "problem"})
    elif rows.get("pending"):
        out.append({"text": "remapped rows pending: reset the GPU to apply them", "severity": "problem"})
    if f.get("pcie_gen") and f.get("pcie_gen_max") and f["pcie_gen"] < f["pcie_gen_max"]:
        out.append({"text": f"PCIe Gen{f['pcie_gen']} against its maximum Gen{f['pcie_gen_max']} (a link that "
                            "trained down, or idle power saving: check under load)", "severity": "warning"})
    if f.get("pcie_width") and f.get("pcie_width_max") and f["pcie_width"] < f["pcie_width_max"]:
        out.append({"text": f"PCIe x{f['pcie_width']} against its maximum x{f['pcie_width_max']}: a link with "
                            "lanes down", "severity": "problem"})
    links = f.get("nvlinks") or []
    down = [i for i, s in enumerate(links) if not s]
    if links and down and len(down) < len(links):
        out.append({"text": f"NVLink {', '.join(map(str, down))} down ({len(links) - len(down)} of {len(links)} "
                            "active)", "severity": "problem"})
    limit, default = f.get("power_limit_w"), f.get("power_default_w")
    if limit and default and limit < 0.99 * default:
        out.append({"text": f"power limit {limit:.0f} W, below the default {default:.0f} W", "severity": "warning"})
    return out
