"""The Grafana dashboard the package ships (mgpu_bench/data/grafana/mgpu-bench.json) asks only for
metrics the tool writes, shows every headline family of the node-level probes, and says each
figure's unit: checked against the textfile writer (output/prometheus.py) run on the result
documents of tests/fixtures and on a real CPU `mgpu-bench check --prometheus`."""

from __future__ import annotations

import importlib.resources
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_bench.output.prometheus import render
from mgpu_bench.results.probe import headline

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = importlib.resources.files("mgpu_bench").joinpath("data/grafana/mgpu-bench.json")  # package data
FIXTURES = ROOT / "tests" / "fixtures"
# The kinds whose figures describe a node's health over time; plan (a projection) and fleet (its
# textfiles written per node by fleet itself) are not on the dashboard.
ON_THE_DASHBOARD = ("check", "comm", "gemm", "memory", "model", "links", "sdc", "overlap")
# Grafana's unit ids for the suffixes the writer gives (prometheus.UNIT_SUFFIX).
UNITS = {"_bytes_per_second": "Bps", "_flops_per_second": "flops", "_seconds": "s", "_ratio": "percentunit",
         "_bytes": "bytes"}
METRIC = re.compile(r"\bmgpu_bench_[a-z0-9_]+")


def _families(text: str) -> dict[str, set[str]]:
    """family -> the label names of its series, from a textfile."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            out.setdefault(line.split()[2], set())
        elif line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            out.setdefault(name, set()).update(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', rest.rpartition("}")[0]))
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, set[str]]:
    """Every family the writer gives for the fixtures' result documents, and for a real check on
    this machine's CPU processes (its node allreduce, which the one-GPU fixtures cannot have)."""
    out: dict[str, set[str]] = {}
    for path in sorted(FIXTURES.glob("*.json")) + sorted(FIXTURES.glob("*/*.json")):
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("schema") != "mgpu-bench/result":
            continue
        for name, labels in _families(render(headline(doc), "r1", doc.get("environment") or {}, "x.prom")).items():
            out.setdefault(name, set()).update(labels)
    prom = tmp_path_factory.mktemp("check") / "check.prom"
    r = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "check", "--no-store", "--no-progress",
                        "--prometheus", str(prom)], check=False, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert r.returncode in (0, 1), r.stdout + r.stderr  # ok, or a problem on a loaded host: figures either way
    for name, labels in _families(prom.read_text()).items():
        out.setdefault(name, set()).update(labels)
    return out


def _panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out += [p, *p.get("panels", [])]
    return out


def test_the_dashboard_asks_only_for_what_the_tool_writes_and_shows_all_of_it(written):
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    queries = [t["expr"] for p in _panels(dash) for t in p.get("targets", [])]
    queries += [v["definition"] for v in dash["templating"]["list"] if v.get("definition")]
    asked = {m for q in queries for m in METRIC.findall(q)}
    assert asked - set(written) == set(), "the dashboard asks for metrics the tool does not write"
    node_level = {f for f in written if f.split("_")[2] in ON_THE_DASHBOARD} | {"mgpu_bench_info"}
    assert node_level - asked == set(), "families the tool writes that the dashboard does not show"
    assert "mgpu_bench_check_allreduce_bus_bandwidth_bytes_per_second" in asked
    # Every query picks its hosts by the dashboard's host variable, a label every series has.
    assert all('host=~"$host"' in q for q in queries if q.startswith("mgpu_bench_"))
    assert all("host" in labels for labels in written.values())


def test_every_panel_says_the_unit_of_what_it_shows():
    dash = json.loads(DASHBOARD.read_text())
    for p in _panels(dash):
        if p["type"] not in ("timeseries", "stat"):
            continue
        names = {m for t in p["targets"] for m in METRIC.findall(t["expr"])}
        suffixes = {next((s for s in sorted(UNITS, key=len, reverse=True) if n.endswith(s)), None) for n in names}
        assert len(suffixes) == 1, (p["title"], names)
        unit = p["fieldConfig"]["defaults"]["unit"]
        (suffix,) = suffixes
        if p["fieldConfig"]["defaults"].get("mappings"):  # values shown as words (1: ok, 0: problem)
            assert unit == "none", p["title"]
        else:
            assert unit == UNITS.get(suffix, "none"), (p["title"], unit, suffix)
        assert p["description"], p["title"]
