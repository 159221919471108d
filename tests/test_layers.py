"""The package's shape: layers that point one way, no import cycles (lazy imports included), probes
that reach each other only through the registry, modules of a readable size, and a history and
output path that import no probe backend."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_bench import probe as registry

PKG = Path(__file__).resolve().parent.parent / "mgpu_bench"
FIXTURES = Path(__file__).parent / "fixtures"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every mgpu_bench module `name` imports, at module level or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", None) == "TYPE_CHECKING" for b in block.body for n in ast.walk(b)}
    for node in ast.walk(tree):
        if id(node) in typing_only:  # annotations only: no import at run time
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:  # the longest known prefix: a module, or a package's __init__
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods) | {"mgpu_bench._native"}
    graph = {name: _imports(name, path, known) for name, path in mods.items()}
    # importing a submodule runs its package's __init__ first: not an edge of the code's design
    return {n: {t for t in targets if not n.startswith(t + ".")} for n, targets in graph.items()}


def test_the_graph_is_read_from_the_real_tree():
    g = _graph()
    assert "mgpu_bench.runner" in g["mgpu_bench.cli"]
    assert "mgpu_bench.probes.comm.plan" in g["mgpu_bench.probes.comm.measure"]
    assert len(g) > 50


def test_no_import_cycles():
    g = _graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        path.append(n)
        for t in sorted(g.get(n, ())):
            if state.get(t) == 1:
                cycle = path[path.index(t):] + [t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        path.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n)


SHARED = {"errors", "sizes", "paths", "hardware", "measurement", "ops", "theory", "topo", "telemetry", "env",
          "launch", "models", "workloads", "selection", "metrics", "document", "nccl_log", "nccl_tests", "_libs",
          "children", "schema",
          "per_gpu", "occupancy", "slurm", "torch_timing", "numbers", "startup",
          "_build_config"}  # _build_config: CMake writes it beside the module in an in-place build


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    if parts[1] in SHARED:
        return "shared"
    return parts[1]  # probes, suite, history, output, cli, runner, probe, _native


def test_layers_point_one_way():
    """shared facts import nothing above them; output and history import no probe and no backend;
    a probe imports no other probe, no suite and nothing of the CLI or the runner."""
    bad = []
    for n, targets in _graph().items():
        layer = _layer(n)
        for t in targets:
            tl = _layer(t)
            if layer == "shared" and tl not in ("shared", "_native", "package"):
                bad.append((n, t))
            if layer in ("output", "history") and (tl in ("probes", "suite", "_native", "cli", "runner")):
                bad.append((n, t))
            if layer == "probes":
                if tl in ("suite", "cli", "runner", "history"):
                    bad.append((n, t))
                if tl == "probes" and t.split(".")[2] != n.split(".")[2]:
                    bad.append((n, t))  # one probe reaches another only through the registry
            if layer in ("probe",) and tl not in ("shared", "package"):
                bad.append((n, t))
    assert bad == []


def test_modules_stay_readable():
    sizes = {n: len(p.read_text().splitlines()) for n, p in _modules().items()}
    assert sizes["mgpu_bench.cli"] < 300
    assert max(sizes.values()) <= 800, max(sizes.items(), key=lambda kv: kv[1])


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
from mgpu_bench.probe import headline
suite = json.loads(pathlib.Path({str(FIXTURES / "suite" / "suite.json")!r}).read_text())
docs = [suite] + [p["document"] for p in suite["probes"] if p["document"]]
metrics = [m for d in docs for m in headline(d)]
with History.open(pathlib.Path(tempfile.mkdtemp()) / "h.sqlite3") as h:
    ids = [h.save(d) for d in docs]
render(metrics, ids[0], suite["environment"])
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")
               or any(m.endswith(x) for x in (".measure", ".plan", ".joined", ".torch_backend", ".torch_memory")))
print(json.dumps({{"metrics": len(metrics), "runs": len(ids), "heavy": heavy}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["runs"] == 1 + sum(1 for _ in json.loads((FIXTURES / "suite" / "suite.json").read_text())["probes"]
                                  if _["document"])
    assert got["metrics"] > 20 and got["heavy"] == []
