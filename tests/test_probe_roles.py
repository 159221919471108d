"""The probe protocol finds a probe's roles by convention: analyse.findings, report.section, ...

A probe's __init__.py declares what the probe is (options, config, run, suite steps) and
overrides a role only where it adds something; it never repeats the delegating methods the
protocol provides (import the probe's own module, call its function with the run).
"""

from __future__ import annotations

import ast
import inspect
import types
from pathlib import Path

import pytest

from mgpu_bench.results import probe as registry
from mgpu_bench.results.probe import Finding, Probe

ROLES = {  # Probe method -> the (module, function) the protocol calls for it
    "from_document": ("document", "run_from_document"), "findings": ("analyse", "findings"),
    "judge": ("analyse", "judge"), "failure": ("analyse", "failure"), "headline": ("headline", "headline"),
    "key_figure": ("analyse", "key_figure"), "render": ("render", "render_terminal"),
    "csv": ("render", "render_csv"), "images": ("report", "images"), "section": ("report", "section"),
    "report": ("report", "write_report"),
}


def _pure_delegates(path: Path) -> list[str]:
    """Methods of the file's classes whose body only imports the probe's conventional function and
    returns its call."""
    tree = ast.parse(path.read_text())
    found = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef) or fn.name not in ROLES:
                continue
            body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            *imports, last = body
            if not imports or not all(isinstance(i, ast.ImportFrom) for i in imports):
                continue
            call = getattr(last, "value", None)
            module, function = ROLES[fn.name]
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == function
                    and any(i.module == module and any(a.name == function for a in i.names) for i in imports)):
                found.append(f"{path.parent.name}.{fn.name}")
    return found


def test_no_probe_repeats_the_delegating_methods():
    files = [Path(registry.get(name).__class__.__module__.replace(".", "/") + ".py") for name in registry.names()]
    root = Path(__file__).resolve().parents[1]
    files = [root / (f.with_suffix("") / "__init__.py" if (root / f.with_suffix("")).is_dir() else f) for f in files]
    assert all(f.exists() for f in files), files
    assert [d for f in files for d in _pure_delegates(f)] == []


def test_the_detector_sees_a_delegating_method(tmp_path):
    src = tmp_path / "p" / "__init__.py"
    src.parent.mkdir()
    src.write_text("class P:\n    def judge(self, doc):\n        from .analyse import judge\n\n"
                   "        return judge(self.load(doc))\n")
    assert _pure_delegates(src) == ["p.judge"]


def _fake_probe(monkeypatch, **functions) -> Probe:
    """A registered probe named "fake" whose analyse/report modules hold `functions`."""
    import sys

    pkg = types.ModuleType("fake_probe_pkg")
    pkg.__path__ = []
    mods = {}
    for qual, fn in functions.items():
        module, name = qual.split("__")
        mods.setdefault(module, types.ModuleType(f"fake_probe_pkg.{module}"))
        setattr(mods[module], name, fn)
    monkeypatch.setitem(sys.modules, "fake_probe_pkg", pkg)
    for module, m in mods.items():
        monkeypatch.setitem(sys.modules, f"fake_probe_pkg.{module}", m)
    monkeypatch.setitem(registry.REGISTRY, "fake", "fake_probe_pkg")

    class Fake(Probe):
        name = "fake"

    return Fake()


def test_a_role_gets_the_run_and_only_the_extras_it_names(monkeypatch):
    seen = {}

    def findings(run, shared):
        seen["findings"] = (run, shared)
        return [Finding("ok", "fine")]

    def write_report(run, out_dir, environment, history=None):
        seen["report"] = (run, out_dir, environment, history)
        return [out_dir]

    def run_from_document(doc):
        return ("run", doc["x"])

    p = _fake_probe(monkeypatch, analyse__findings=findings, report__write_report=write_report,
                    document__run_from_document=run_from_document)
    doc = {"x": 1, "environment": {"host": "h"}}
    assert p.findings(doc) == [Finding("ok", "fine")]
    assert seen["findings"] == (("run", 1), [])
    assert p.report(doc, "out", history="H") == ["out"]
    assert seen["report"] == (("run", 1), "out", {"host": "h"}, "H")


def test_missing_roles_have_the_protocols_answers(monkeypatch):
    p = _fake_probe(monkeypatch)
    doc = {"a": 1}
    assert p.from_document(doc) is doc
    assert p.findings(doc) == [] and p.judge(doc) == [] and p.failure(doc) is None
    assert p.headline(doc) == [] and p.key_figure(doc) == ("-", "-") and p.images(doc) == {}
    assert p.section(doc, {}) == ""
    with pytest.raises(NotImplementedError):
        p.csv(doc)
    with pytest.raises(NotImplementedError):
        p.report(doc, "out")


def test_a_module_that_fails_to_import_is_not_taken_for_a_missing_role(monkeypatch):
    import sys

    p = _fake_probe(monkeypatch)
    monkeypatch.delitem(sys.modules, "fake_probe_pkg.analyse", raising=False)

    def finder(name, *a, **k):
        if name == "fake_probe_pkg.analyse":
            raise ModuleNotFoundError("No module named 'scipy'", name="scipy")
        return real(name, *a, **k)

    import importlib

    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", finder)
    with pytest.raises(ModuleNotFoundError):
        p.findings({})


@pytest.mark.parametrize("name", registry.names())
def test_every_conventional_role_takes_the_run_first(name):
    """Each role function a probe has takes the run (or document) as its first parameter and names
    no extra the protocol cannot give."""
    p = registry.get(name)
    known = {"doc", "environment", "shared", "history", "console", "pngs", "images", "out_dir", "hops",
             "topo_findings", "found", "history_trend", "tuning"}
    for method, (module, function) in ROLES.items():
        fn = p.role(module, function)
        if fn is None or not callable(fn):
            continue
        params = list(inspect.signature(fn).parameters.values())
        assert params, f"{name}: {module}.{function} takes nothing"
        for q in params[1:]:
            required = q.default is inspect.Parameter.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)
            positional = {"render": 1, "section": 1, "report": 1}.get(method, 0)
            if required and params.index(q) > positional:
                assert q.name in known, f"{name}: {module}.{function} needs {q.name}, which the protocol never gives"
