from __future__ import annotations

import subprocess
import sys

import pytest

from mgpu_bench.core.errors import InputError
from mgpu_bench.probes.memory import torch_memory
from mgpu_bench.probes.memory.torch_memory import (
    SETTINGS,
    draw_seq_lens,
    max_batch,
    parse_seq_lens,
    parse_settings,
    run_setting,
    verdict,
)

GIB = 2**30


def test_parse_settings_names_and_raw_confs():
    assert parse_settings("default") == {"default": None}
    assert parse_settings("all") == SETTINGS
    assert parse_settings("Default, expandable") == {"default": None,
                                                     "expandable": "expandable_segments:True"}
    # consecutive raw options are one conf; ';' separates two raw confs
    got = parse_settings("default,expandable_segments:True,max_split_size_mb:256")
    assert got == {"default": None, "expandable_segments:True,max_split_size_mb:256":
                   "expandable_segments:True,max_split_size_mb:256"}
    got = parse_settings("max_split_size_mb:128;roundup_power2_divisions:[256:1,>:4]")
    assert list(got.values()) == ["max_split_size_mb:128", "roundup_power2_divisions:[256:1,>:4]"]
    # a raw conf equal to a named one takes the name
    assert parse_settings("backend:cudaMallocAsync") == {"async": "backend:cudaMallocAsync"}


@pytest.mark.parametrize("text", ["", "  ", "fast", "expandable_segments:", ":True",
                                  "Max-Split:1", "roundup_power2_divisions:[256:1", "a:b]"])
def test_parse_settings_rejects_garbage(text):
    with pytest.raises(InputError) as info:
        parse_settings(text)
    assert "\n" not in str(info.value)


def test_seq_lens():
    assert parse_seq_lens("2048") == [2048]
    assert parse_seq_lens("256-2048") == list(range(256, 2049, 128))
    assert parse_seq_lens("256-512:64") == [256, 320, 384, 448, 512]
    assert parse_seq_lens("512,1024") == [512, 1024]
    for bad in ("", "x", "2048-256", "0", "256-2048:0", "1-2-3"):
        with pytest.raises(InputError):
            parse_seq_lens(bad)
    a = draw_seq_lens([256, 512, 1024], 50, seed=3)
    assert a == draw_seq_lens([256, 512, 1024], 50, seed=3) and set(a) == {256, 512, 1024}
    assert a != draw_seq_lens([256, 512, 1024], 50, seed=4)


def _result(frag_gib, largest_gib=None, free_gib=None, **extra):
    r = {"reserved_unallocated_at_peak_bytes": int(frag_gib * GIB), "caught_ooms": 0}
    if largest_gib is not None:
        r.update(largest_free_block_bytes=int(largest_gib * GIB),
                 free_in_segments_bytes=int(free_gib * GIB))
    r.update(extra)
    return r


def test_verdict_names_the_best_setting():
    results = {
        "default": _result(3.1, 0.5, 4.2),
        "expandable": _result(0.3, 8.4, 8.6, conf="expandable_segments:True"),
        "split512": _result(2.0, 0.5, 3.0, conf="max_split_size_mb:512"),
        "async": _result(1.0, conf="backend:cudaMallocAsync"),
    }
    line = verdict(results)
    assert line == ("default: 3.1 GiB reserved but unallocated at peak, largest free block 0.5 of "
                    "4.2 GiB free in the cache; expandable_segments:True recovers 2.8 GiB "
                    "(largest block 8.4 of 8.6 GiB free)")


def test_verdict_is_honest_when_nothing_helps():
    results = {"default": _result(3.0, 0.5, 4.0),
               "split512": _result(2.9, 0.5, 4.0, conf="max_split_size_mb:512"),
               "async": {"error": "CUDA error: out of memory", "conf": "backend:cudaMallocAsync"}}
    line = verdict(results)
    assert "no setting recovers a meaningful part" in line and "max_split_size_mb:512" in line
    assert "async failed: CUDA error: out of memory" in line and "\n" not in line
    assert "negligible" in verdict({"default": _result(0.05, 0.01, 0.05),
                                    "expandable": _result(0.0, conf="expandable_segments:True")})
    assert "no default" in verdict({"default": {"error": "boom"}})
    assert "no other setting" in verdict({"default": _result(2.0)})


def _child(*args):
    return subprocess.run([sys.executable, "-m", "mgpu_bench.probes.memory.torch_memory", *args],
                          check=False, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [
    [],
    ["bogus"],
    ["workload", "--model", "tiny"],
    ["workload", "--model", "tiny", "--batch", "x", "--seq-lens", "64", "--json", "o"],
    ["workload", "--model", "nope", "--batch", "2", "--seq-lens", "64", "--json", "o"],
    ["workload", "--model", "tiny", "--batch", "2", "--seq-lens", "9-1", "--json", "o"],
    ["maxbatch", "--model", "tiny", "--seq-len", "4096", "--json", "o"],
    ["maxbatch", "--model", "tiny", "--seq-len", "64", "--device", "cpu", "--json", "o"],
])
def test_child_rejects_bad_args_in_one_line(args):
    proc = _child(*args)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "error:" in proc.stderr


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_has_cuda(), reason="checks the message on a machine without CUDA")
def test_workload_without_cuda_says_so(tmp_path):
    proc = _child("workload", "--model", "tiny", "--batch", "2", "--seq-lens", "64-128",
                  "--steps", "2", "--json", str(tmp_path / "o.json"))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "error: this workload needs a CUDA GPU (torch.cuda.is_available() is False)")
    assert not (tmp_path / "o.json").exists()

    r = run_setting("expandable", "tiny", 2, "64-128", steps=2, seed=0, device_index=0,
                    timeout_s=120)
    assert "needs a CUDA GPU" in r["error"] and r["returncode"] == 1
    assert r["setting"] == "expandable" and r["conf"] == "expandable_segments:True"
    r = max_batch("tiny", 64, setting="default", timeout_s=120)
    assert "needs a CUDA GPU" in r["error"] and r["conf"] is None


def test_parent_reports_timeouts_and_bad_settings():
    r = run_setting("default", "tiny", 2, "64", steps=1, timeout_s=0.01)
    assert r["error"].startswith("timed out") and r["setting"] == "default"
    with pytest.raises(InputError):
        run_setting("fast", "tiny", 2, "64", steps=1)
    with pytest.raises(InputError, match="give one"):
        run_setting("default,expandable", "tiny", 2, "64", steps=1)


def test_child_env_sets_or_removes_the_conf(monkeypatch):
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    env = torch_memory._child_env(None)
    assert "PYTORCH_ALLOC_CONF" not in env and "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["CUDA_VISIBLE_DEVICES"] == "3,1"
    env = torch_memory._child_env("expandable_segments:True")
    assert env["PYTORCH_ALLOC_CONF"] == env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


# --- on a GPU ------------------------------------------------------------------------------------

_WORKLOAD_KEYS = {
    "peak_allocated_bytes", "peak_reserved_bytes", "reserved_unallocated_at_peak_bytes",
    "end_reserved_unallocated_bytes", "inactive_split_peak_bytes", "inactive_split_current_bytes",
    "num_alloc_retries", "num_ooms", "caught_ooms", "largest_free_block_bytes",
    "free_in_segments_bytes", "step_allocated_bytes", "step_reserved_bytes", "step_seq_lens",
    "allocator_backend", "total_memory_bytes", "seconds",
}


@pytest.mark.gpu
@pytest.mark.parametrize("setting", ["default", "expandable", "async"])
def test_gpu_run_setting(setting):
    r = run_setting(setting, "125m", 4, "128-1024", steps=12, seed=0, device_index=0,
                    timeout_s=300)
    assert "error" not in r, r.get("error")
    assert _WORKLOAD_KEYS <= set(r)
    assert len(r["step_reserved_bytes"]) == len(r["step_seq_lens"]) == 12
    assert r["step_seq_lens"] == draw_seq_lens(parse_seq_lens("128-1024"), 12, 0)
    assert r["caught_ooms"] == 0
    assert 0 < r["peak_allocated_bytes"] <= r["peak_reserved_bytes"] < r["total_memory_bytes"]
    # 125M fp32 params + AdamW state alone are ~2 GB
    assert r["end_allocated_bytes"] > 125e6 * 11
    if setting == "async":
        assert r["allocator_backend"] == "cudaMallocAsync"
        assert r["inactive_split_peak_bytes"] is None and r["largest_free_block_bytes"] is None
    else:
        assert r["allocator_backend"] == "native"
        assert r["num_ooms"] == 0 and r["inactive_split_peak_bytes"] >= 0
        assert 0 <= r["largest_free_block_bytes"] <= r["free_in_segments_bytes"]
        assert r["free_in_segments_bytes"] <= r["end_reserved_bytes"]
    if setting == "expandable":
        assert r["alloc_conf"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


@pytest.mark.gpu
def test_gpu_verdict_from_real_runs():
    results = {s: run_setting(s, "tiny", 8, "64-256", steps=10, timeout_s=300)
               for s in ("default", "expandable")}
    line = verdict(results)
    assert line.startswith("default:") and "failed" not in line


@pytest.mark.gpu
def test_gpu_max_batch():
    r = max_batch("125m", 512, checkpointing=False, setting="default", device_index=0,
                  timeout_s=300, limit=64)
    assert "error" not in r, r.get("error")
    assert r["max_batch"] == 64 and r["first_oom_batch"] is None and r["complete"]
    assert [t["batch"] for t in r["trials"]] == [1, 2, 4, 8, 16, 32, 64]
    assert all(t["ok"] and t["seconds"] > 0 for t in r["trials"])
    peaks = [t["peak_allocated_bytes"] for t in r["trials"]]
    assert peaks == sorted(peaks) and r["peak_allocated_bytes"] == peaks[-1]


@pytest.mark.gpu
@pytest.mark.slow  # a 240 s budget alone: -m gpu stays under 5 minutes on one H200; `-m slow` runs it
def test_gpu_max_batch_finds_the_oom_edge():
    r = max_batch("125m", 512, checkpointing=True, setting="expandable", timeout_s=600,
                  time_budget_s=240)
    assert "error" not in r, r.get("error")
    assert r["max_batch"] >= 64  # 125M at 512 tokens with checkpointing: hundreds on an H200
    if r["complete"]:
        assert r["first_oom_batch"] == r["max_batch"] + 1
        assert any(not t["ok"] for t in r["trials"])
    assert r["peak_allocated_bytes"] <= r["total_memory_bytes"]
