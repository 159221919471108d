"""The package's shape: layers that point one way, no import cycles (lazy imports included), probes
that reach each other only through the registry, modules of a readable size, and a history and
output path that import no probe backend."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from mgpu_bench.results import probe as registry

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs" / "hooks"))
import layout  # docs/hooks/layout.py: the one reader of the import graph, the docs' picture's too

PKG = layout.PKG
FIXTURES = Path(__file__).parent / "fixtures"
ORDER = layout.ORDER  # the layers from the bottom up (see layout.py)
_modules, _graph = layout.modules, layout.graph


def test_the_graph_is_read_from_the_real_tree():
    g = _graph()
    assert "mgpu_bench.run.runner" in g["mgpu_bench.cli"]
    assert "mgpu_bench.probes.comm.plan" in g["mgpu_bench.probes.comm.measure"]
    assert len(g) > 50


def test_no_import_cycles():
    cycle = layout.find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def _layer(module: str) -> str:
    """A module's folder; "root" for the package's __init__ and the CLI, "native" for the compiled
    module and its loader (layout.place)."""
    return layout.place(module)


def test_layers_point_one_way():
    """Each layer imports only itself and those below it; a probe imports no other probe and no
    history; history and output import no probe (the registry, results/probe.py, reads them)."""
    g = _graph()
    folders = {_layer(n) for n in g}
    assert folders - set(layout.PLACES) == set(), "a folder with no place in layout.ORDER"
    bad = layout.against_order(g)  # up the order: the root (the CLI) above every folder, the native module below
    for n, targets in g.items():
        layer = _layer(n)
        for t in targets:
            tl = _layer(t)
            if layer == "probes" and (tl == "history" or (tl == "probes" and t.split(".")[2] != n.split(".")[2])):
                bad.append((n, t))  # one probe reaches another only through the registry
            if layer in ("training", "workloads") and tl in ("training", "workloads") and tl != layer:
                bad.append((n, t))  # side by side, neither above the other
    assert bad == []


def test_the_package_root_holds_its_entry_points_and_every_folder_says_what_it_holds():
    """The root: the package's __init__, the CLI and the native loader (and the build's own facts);
    every other module in a folder whose __init__ says, first, what it holds and what it may import."""
    root = sorted(p.name for p in PKG.glob("*.py") if p.name != "_build_config.py")
    assert root == ["__init__.py", "_libs.py", "cli.py"], root
    for folder in sorted(p for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        assert len(doc.split()) >= 8 and "placeholder" not in doc, folder.name
        if folder.name in ORDER and folder.name not in ("probes", "suite", "monitor", "history", "workloads"):
            assert "import" in doc.split("\n\n")[0].lower(), (folder.name, doc)  # what it may import, said up front
        listed = {line.split()[0] for line in doc.splitlines() if line.startswith("    ") and line.split()[0].endswith(".py")}
        own = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
        assert not listed or listed <= own, (folder.name, listed - own)  # no file named that is not there


def test_the_old_module_names_still_import_with_a_warning_naming_the_new_place():
    """Scripts written against the flat layout (mgpu_bench.topo, from mgpu_bench import models) keep
    working: the same module object, a DeprecationWarning saying where it lives now."""
    code = """
import warnings, json
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as w:
    import mgpu_bench.topo as old
    from mgpu_bench import models, hardware
import mgpu_bench.machine.topo as new, mgpu_bench.workloads.gpt as gpt, mgpu_bench.machine.hardware as hw
print(json.dumps({"same": old is new and models is gpt and hardware is hw, "said": [str(x.message) for x in w]}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["same"], got
    assert "mgpu_bench.topo is now mgpu_bench.machine.topo" in got["said"], got
    assert "mgpu_bench.models is now mgpu_bench.workloads.gpt" in got["said"], got


def test_modules_stay_readable():
    sizes = {n: len(p.read_text().splitlines()) for n, p in _modules().items()}
    assert sizes["mgpu_bench.cli"] < 300
    assert max(sizes.values()) <= 700, max(sizes.items(), key=lambda kv: kv[1])


def test_every_registered_probe_is_one_folder_and_keeps_the_protocol():
    for name in registry.names():
        p = registry.get(name)
        assert p.name == name and p.help and p.summary
        module = registry.REGISTRY[name]
        assert module.startswith(("mgpu_bench.probes.", "mgpu_bench.suite"))
        assert p.payload and set(p.outputs) <= {"json", "csv", "report"}
        assert p.progress in ("bar", "status", "lines")


def test_history_and_output_import_no_probe_backend():
    """In a fresh interpreter: read every fixture document's headline metrics through the
    registry, store them in a history and write Prometheus text; no torch, no probe backend."""
    code = f"""
import json, sys, tempfile, pathlib
from mgpu_bench.history import History
from mgpu_bench.output.prometheus import render
from mgpu_bench.results.probe import headline
suite = json.loads(pathlib.Path({str(FIXTURES / "suite" / "suite.json")!r}).read_text())
docs = [suite] + [p["document"] for p in suite["probes"] if p["document"]]
metrics = [m for d in docs for m in headline(d)]
with History.open(pathlib.Path(tempfile.mkdtemp()) / "h.sqlite3") as h:
    ids = [h.save(d) for d in docs]
render(metrics, ids[0], suite["environment"])
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")
               or any(m.endswith(x) for x in (".measure", ".plan", ".joined", ".torch_backend", ".torch_rank", ".torch_memory")))
print(json.dumps({{"metrics": len(metrics), "runs": len(ids), "heavy": heavy}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["runs"] == 1 + sum(1 for _ in json.loads((FIXTURES / "suite" / "suite.json").read_text())["probes"]
                                  if _["document"])
    assert got["metrics"] > 20 and got["heavy"] == []
