"""The Prometheus text file: it parses (a small parser of the exposition format written here,
prometheus_client is not a dependency), names and labels are valid, every family is announced
once, label values are escaped, and the file is replaced atomically."""

from __future__ import annotations

import os
import re
import stat
import threading

import pytest
from test_headline import (
    comm_document,
    links_document,
    memory_document,
    model_document,
    suite_document,
)

from mgpu_bench.output.prometheus import (
    escape_value,
    family,
    render,
    sanitize_label,
    sanitize_name,
    write_textfile,
)
from mgpu_bench.results.metrics import Metric
from mgpu_bench.results.probe import headline as metrics_from_document

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
VALUE = r'"((?:[^"\\\n]|\\[\\"n])*)"'
SAMPLE = re.compile(
    rf"^({NAME})(?:\{{((?:{LABEL}={VALUE})(?:,{LABEL}={VALUE})*)?\}})? (\S+)$"
)
PAIR = re.compile(rf"({LABEL})={VALUE}")


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "\\": "\\", '"': '"'}[m.group(1)], v)


def parse(text: str) -> dict[str, dict]:
    """family -> {"help": str, "type": str, "samples": [(labels dict, value)]}; raises
    AssertionError on anything the text format does not allow."""
    assert text.endswith("\n")
    families: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert re.fullmatch(NAME, name) and name not in families, line
            families[name] = {"help": help_text, "type": None, "samples": []}
            current = name
        elif line.startswith("# TYPE "):
            name, _, typ = line[7:].partition(" ")
            assert (
                name == current and families[name]["type"] is None and typ == "gauge"
            ), line
            families[name]["type"] = typ
        else:
            m = SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            name = m.group(1)
            assert name == current and families[name]["type"] == "gauge", (
                f"{name} outside its family block"
            )
            labels = {k: _unescape(v) for k, v in PAIR.findall(m.group(2) or "")}
            assert not any(k.startswith("__") for k in labels)
            value = m.group(m.lastindex)
            assert value in ("NaN", "+Inf", "-Inf") or float(value) == float(value)
            families[name]["samples"].append((labels, float(value)))
    for name, f in families.items():
        keys = [tuple(sorted(lab.items())) for lab, _ in f["samples"]]
        assert len(keys) == len(set(keys)), f"{name}: two series with the same labels"
    return families


ENV = {
    "host": "gpu07",
    "nvidia_driver": "580.159.04",
    "nccl": "2.28.9",
    "cuda_runtime": "13.0",
    "cuda_driver": "13.0",
    "torch": "2.11.0+cu130",
    "mgpu_bench": "0.1.0",
}


def test_every_kind_of_document_exports_and_parses(tmp_path):
    metrics = []
    for doc in (suite_document(), links_document(), model_document()):
        metrics += metrics_from_document(doc)
    metrics += [m for m in metrics_from_document(memory_document())]
    path = tmp_path / "mgpu_bench.prom"
    write_textfile(path, metrics, "r12", ENV)
    fams = parse(path.read_text())
    assert fams["mgpu_bench_info"]["samples"] == [
        (
            {
                "host": "gpu07",
                "textfile": "mgpu_bench.prom",
                "run": "r12",
                "driver": "580.159.04",
                "cuda_runtime": "13.0",
                "cuda_driver": "13.0",
                "nccl": "2.28.9",
                "torch": "2.11.0+cu130",
                "mgpu_bench": "0.1.0",
            },
            1.0,
        )
    ]
    for name in (
        "mgpu_bench_comm_bus_bandwidth_bytes_per_second",
        "mgpu_bench_comm_latency_seconds",
        "mgpu_bench_gemm_flops_per_second",
        "mgpu_bench_gemm_sustained_flops_per_second",
        "mgpu_bench_memory_hbm_bytes_per_second",
        "mgpu_bench_memory_fragmentation_ratio",
        "mgpu_bench_memory_max_batch",
        "mgpu_bench_model_tokens_per_second",
        "mgpu_bench_model_mfu_ratio",
        "mgpu_bench_model_exposed_comm_ratio",
        "mgpu_bench_model_peak_memory_bytes",
        "mgpu_bench_model_scaling_efficiency_ratio",
        "mgpu_bench_links_bandwidth_bytes_per_second",
        "mgpu_bench_links_latency_seconds",
        "mgpu_bench_links_host_bandwidth_bytes_per_second",
    ):
        assert fams[name]["samples"] and fams[name]["help"], name
    total = sum(len(f["samples"]) for n, f in fams.items() if n != "mgpu_bench_info")
    assert total == len(metrics)  # every metric exported once
    busbw = {
        (lab["op"], lab["size"], lab["placement"], lab.get("probe")): v
        for lab, v in fams["mgpu_bench_comm_bus_bandwidth_bytes_per_second"]["samples"]
    }
    ref = next(
        m for m in metrics if m.name == "comm.allreduce.fp32.1GiB.out.2ranks.busbw"
    )
    assert busbw[("allreduce", "1GiB", "out", "comm")] == ref.value
    assert all(lab["host"] == "gpu07" for f in fams.values() for lab, _ in f["samples"])
    # memory is exported twice (in the suite and on its own): the probe label tells them apart
    hbm = fams["mgpu_bench_memory_hbm_bytes_per_second"]["samples"]
    assert {lab.get("probe") for lab, _ in hbm} == {"memory", None}


def test_comm_family_matches_the_documented_example():
    (m,) = [
        m
        for m in metrics_from_document(comm_document())
        if m.name == "comm.allreduce.fp32.1GiB.out.2ranks.busbw"
    ]
    assert family(m)[0] == "mgpu_bench_comm_bus_bandwidth_bytes_per_second"
    line = next(
        x
        for x in render([m], None, ENV).splitlines()
        if x.startswith("mgpu_bench_comm_bus_bandwidth")
    )
    assert 'op="allreduce"' in line and 'size="1GiB"' in line and 'host="gpu07"' in line


def test_label_values_are_escaped_and_names_sanitized():
    odd = 'a "quoted" back\\slash\nnewline'
    m = Metric(
        "weird kind!.x-y.9lives",
        1.5,
        "B",
        "lower",
        (),
        {"odd": odd, "9bad-name": "v", "__reserved": "r", "host": "not this one"},
    )
    text = render([m], 'r"1', {"host": "h\\1"})
    fams = parse(text)
    (name,) = [n for n in fams if n != "mgpu_bench_info"]
    assert (
        re.fullmatch(NAME, name)
        and name.startswith("mgpu_bench_")
        and name.endswith("_bytes")
    )
    ((labels, value),) = fams[name]["samples"]
    assert labels["odd"] == odd and labels["host"] == "h\\1" and value == 1.5
    assert labels["_9bad_name"] == "v" and labels["reserved"] == "r"
    assert fams["mgpu_bench_info"]["samples"][0][0]["run"] == 'r"1'
    assert escape_value(odd) == 'a \\"quoted\\" back\\\\slash\\nnewline'
    assert (
        sanitize_name("1st.metric") == "_1st_metric" and sanitize_label("a.b") == "a_b"
    )


def test_series_the_labels_cannot_tell_apart_get_their_name():
    a = Metric("gemm.gpu0.bf16.tflops", 1e15, "FLOP/s", "higher", (), {"gpu": "0"})
    b = Metric("gemm.gpu0.bf16x.tflops", 2e15, "FLOP/s", "higher", (), {"gpu": "0"})
    fams = parse(render([a, b], "r1", ENV))
    samples = fams["mgpu_bench_gemm_flops_per_second"]["samples"]
    assert {lab["metric"] for lab, _ in samples} == {a.name, b.name}


def test_special_values_use_the_format_spelling():
    ms = [
        Metric("x.a", float("inf"), "s", "lower"),
        Metric("x.b", float("nan"), "s", "lower", (), {"k": "1"}),
    ]
    text = render(ms, None, {})
    assert "+Inf" in text and "NaN" in text
    parse(text)


def test_the_file_is_replaced_atomically_and_readable_by_others(tmp_path):
    path = tmp_path / "mgpu_bench.prom"
    path.write_text("old\n")
    big = [
        Metric(f"comm.op{i}.busbw", float(i), "B/s", "higher", (), {"i": str(i)})
        for i in range(3000)
    ]
    seen: list[str] = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            try:
                seen.append(path.read_text())
            except FileNotFoundError:
                seen.append("MISSING")

    t = threading.Thread(target=reader)
    t.start()
    try:
        for _ in range(20):
            write_textfile(path, big, "r1", ENV)
    finally:
        stop.set()
        t.join()
    final = path.read_text()
    assert all(
        s in ("old\n", final) for s in seen
    )  # never a half-written file, never missing
    parse(final)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["mgpu_bench.prom"]  # no temporary file left


def test_a_missing_folder_raises_and_leaves_nothing(tmp_path):
    with pytest.raises(OSError):
        write_textfile(tmp_path / "nope" / "x.prom", [], None, ENV)
    assert os.listdir(tmp_path) == []


# -- promtool, and series of two files ------------------------------------------------------------------

PROMTOOL_INSTALL = "apt-get install -y prometheus (Debian's package has promtool)"


def _every_probes_documents() -> dict[str, list[dict]]:
    """A document of every registered probe: the GPU runs' fixtures, the fleet and suite fixtures,
    and the documents tests/test_headline.py builds."""
    import json
    from pathlib import Path

    from mgpu_bench.results import probe as registry
    from mgpu_bench.results.document import document_kind

    here = Path(__file__).resolve().parent / "fixtures"
    docs = [json.loads(f.read_text()) for f in sorted((here / "gpu").glob("*.json"))]
    docs += [json.loads((here / "fleet" / "fleet-2-cpu-nodes.json").read_text()),
             json.loads((here / "suite" / "suite.json").read_text()), json.loads((here / "comm_2x_h200.json").read_text())]
    docs += [comm_document(), links_document(), memory_document(), model_document(), suite_document()]
    out: dict[str, list[dict]] = {name: [] for name in registry.names()}
    for d in docs:
        out.setdefault(document_kind(d) or "?", []).append(d)
    return out


def test_every_probes_textfile_passes_promtool(tmp_path):
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(f"promtool is not installed: {PROMTOOL_INSTALL}")
    by_kind = _every_probes_documents()
    missing = [k for k, docs in by_kind.items() if not docs]
    assert not missing, f"no document of {missing} to write a textfile of"
    for kind, docs in by_kind.items():
        for i, doc in enumerate(docs):
            path = tmp_path / f"{kind}{i}.prom"
            write_textfile(path, metrics_from_document(doc), "r12", doc.get("environment") or ENV)
            r = subprocess.run([promtool, "check", "metrics"], stdin=path.open("rb"), capture_output=True, text=True,
                               timeout=60, check=False)
            assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), (kind, r.stdout + r.stderr)
            parse(path.read_text())


def test_family_names_have_one_spelled_out_base_unit_and_no_abbreviation():
    cases = [
        (Metric("model.gpt.ddp.1gpu.real.samples_per_s", 5.0, "samples/s", "higher"), "mgpu_bench_model_samples_per_second"),
        (Metric("check.gpu0.tflops", 7e14, "FLOP/s", "higher"), "mgpu_bench_check_flops_per_second"),
        (Metric("check.allreduce_busbw", 1e11, "B/s", "higher"), "mgpu_bench_check_allreduce_bus_bandwidth_bytes_per_second"),
        (Metric("sdc.gpu0.hbm.checked_bytes", 1e9, "B", "higher"), "mgpu_bench_sdc_checked_bytes"),
        (Metric("check.problems", 0.0, "samples", "lower"), "mgpu_bench_check_problems"),
        (Metric("plan.gpt.ddp.8gpu.step", 0.1, "s", "lower"), "mgpu_bench_plan_step_seconds"),
    ]
    for m, name in cases:
        assert family(m)[0] == name, (m.name, family(m)[0])


def test_two_textfiles_of_two_databases_never_give_the_same_series(tmp_path):
    """node_exporter's textfile collector joins every .prom file of its folder, and drops a series
    that two files both give (the same run id of two databases): every series names its file."""
    m = Metric("check.healthy", 1.0, "fraction", "higher", (), {"node": "n1"})
    a, b = tmp_path / "check.prom", tmp_path / "suite.prom"
    write_textfile(a, [m], "r12", ENV)
    write_textfile(b, [m], "r12", ENV)
    series = []
    for f in (a, b):
        for name, fam in parse(f.read_text()).items():
            series += [(name, tuple(sorted(lab.items()))) for lab, _ in fam["samples"]]
    assert len(series) == len(set(series)) == 4
