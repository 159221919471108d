"""The suite document's declared shape (mgpu_bench.results.schema), checked on every read; run.document()
writes it. Import-light, as every kind's shape.py: the history validates stored documents through
it without loading a backend.

One entry per probe step: its round, name, status, seconds and error as the terminal, the report
and the history read them, the probe's own result document (checked by its own kind's shape) and
the NVML samples the suite took beside it.
"""

from __future__ import annotations

from mgpu_bench.results.document import document_kind
from mgpu_bench.results.probe import check_document, names
from mgpu_bench.results.schema import TELEMETRY_SERIES, TELEMETRY_SUMMARY, Bool, Doc, Int, List, Map, Num, Obj, Str

# NVML's static facts of a GPU as telemetry.Sampler reads them once: its name and bus id, the
# clock and power limits the report sets the samples against (Hz, W); None where NVML refused.
STATIC = Obj({"name": Str(max_len=200, null=True), "pci_bus_id": Str(max_len=100, null=True),
              **{k: Num(null=True) for k in ("sm_max_hz", "power_limit_w", "power_default_w", "power_max_w")}},
             what="a GPU's static facts", null=True)
TELEMETRY = Obj({
    "gpus": Map(Obj({"series": TELEMETRY_SERIES, "summary": TELEMETRY_SUMMARY, "static": STATIC},
                    what="a GPU's samples"), null=True),
    "interval_s": Num(0, null=True), "error": Str(null=True),
}, what="the suite's telemetry", null=True)


def _document_of_its_command(entry) -> tuple[str, str] | None:
    """An entry's document is of the probe it ran: the probe its command names (`mgpu-bench comm
    ...` holds a comm document), or without a command the probe its name starts with (comm,
    model-1gpu): a model document in the comm slot would be judged and drawn as the comm round's."""
    doc, command, name = entry.get("document"), entry.get("command"), entry.get("name")
    if not isinstance(doc, dict):
        return None
    ran = command[1] if isinstance(command, list) and len(command) > 1 and isinstance(command[1], str) else None
    if ran is None and isinstance(name, str):
        ran = next((k for k in names() if name == k or name.startswith(k + "-")), None)
    kind = document_kind(doc)
    if ran is not None and kind != ran:
        return "document", f"is a {kind} document, but this entry ran `mgpu-bench {ran}`: it holds another probe's result"
    return None


ENTRY = Obj({
    "round": Int(0, 99), "name": Str(max_len=200), "title": Str(null=True), "command": List(Str(), null=True),
    "status": Str(("ok", "failed", "skipped", "interrupted")), "error": Str(null=True), "seconds": Num(0),
    "document": Doc(check_document, null=True), "telemetry": TELEMETRY,
}, required=("name", "status"), what="a suite probe entry", rule=_document_of_its_command)
SCHEMA = Obj({
    "quick": Bool(null=True), "rounds": List(Int(1, 3), null=True), "duration_s": Num(0, null=True),
    "status": Obj({"completed": Bool(null=True), "stopped": Str(max_len=200, null=True), "message": Str(null=True),
                   "failed": List(Str(), null=True)}, what="a suite status", null=True),
    "probes": List(ENTRY),
}, required=("probes",), what="a suite result")
