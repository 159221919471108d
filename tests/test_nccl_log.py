from __future__ import annotations

from pathlib import Path

from mgpu_bench.machine import nccl_log

LOG = (Path(__file__).with_name("fixtures") / "nccl_info_2x_h200.log").read_text()


def test_transports_from_a_real_2x_h200_log():
    """NCCL 2.28.3's INFO log of `mgpu-bench comm --ops all` on 2x H200 (NV18)."""
    t = nccl_log.transports(LOG)
    assert set(t) == {(0, 1), (1, 0)}
    assert all(set(c) == {"P2P"} for c in t.values())
    assert sum(sum(c.values()) for c in t.values()) == 112
    assert nccl_log.env_settings(LOG)["NCCL_NVLS_ENABLE"] == "0"
    assert nccl_log.transport_findings(LOG, {(0, 1), (1, 0)}) == []


def test_shared_memory_where_nvlink_exists_is_a_finding():
    log = "\n".join([  # noqa: FLY002 - one line per log line reads better
        "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct",
        "h:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct",
        "h:1:3 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read",
        "h:1:3 [1] NCCL INFO Channel 01 : 1[1] -> 0[0] via NET/Socket/0",  # the older format
    ])
    f0, f1 = nccl_log.transport_findings(log, {(0, 1), (1, 0)})
    assert f0.startswith("rank 0 -> rank 1: NCCL uses SHM on 2 channel(s) where NVLink allows P2P")
    assert f1.startswith("rank 1 -> rank 0: NCCL uses NET on 1 channel(s)")


def test_capture_sets_nccl_debug_only_until_released(monkeypatch):
    import os

    for k in ("NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(nccl_log.Capture, "_used", False)
    c = nccl_log.Capture()
    assert os.environ["NCCL_DEBUG"] == "INFO" and os.environ["NCCL_DEBUG_FILE"] == c.path
    c.release_environment()
    assert "NCCL_DEBUG" not in os.environ and "NCCL_DEBUG_FILE" not in os.environ
    assert nccl_log.Capture().reason.startswith("NCCL was already initialised")
    c.close()
    assert not os.path.exists(c.path)


def test_capture_respects_the_users_nccl_debug(monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.setattr(nccl_log.Capture, "_used", False)
    c = nccl_log.Capture()
    assert c.path is None and "set by the environment" in c.reason


def test_tuning_table_from_the_real_log():
    t = nccl_log.tuning_table(LOG)
    assert t[("AllReduce", "Ring", "Simple")] == (15.2, 360.0)
    assert t[("AllReduce", "Tree", "LL")] == (8.0, 61.1)
    assert t[("AllGather", "Ring", "LL128")] == (15.9, 662.4)
    assert t[("AllReduce", "NVLS", "Simple")] == (0.0, 0.0)  # NCCL_NVLS_ENABLE=0: no NVLS


def test_predicted_algorithm_by_size():
    t = nccl_log.tuning_table(LOG)
    # Latency wins for tiny messages (Ring/LL 7.8 us), bandwidth for large ones (Ring/Simple).
    assert nccl_log.predicted_algorithm(t, "allreduce", 8) == "Ring/LL"
    assert nccl_log.predicted_algorithm(t, "allreduce", 1 << 30) == "Ring/Simple"
    assert nccl_log.predicted_algorithm(t, "alltoall", 1 << 20) is None
    assert not nccl_log.overstating("Ring/Simple")
    assert nccl_log.overstating("NVLS/Simple") and nccl_log.overstating("CollNetDirect/Simple")


def test_p2p_disabled_on_the_real_2x_h200_is_a_finding():
    """NCCL's INFO log of `NCCL_P2P_DISABLE=1 mgpu-bench comm --ops allreduce --sizes 64M` on
    2x H200 (NV18): every channel goes through host shared memory, both directions."""
    log = (Path(__file__).with_name("fixtures") / "nccl_info_2x_h200_p2p_disabled.log").read_text()
    t = nccl_log.transports(log)
    assert set(t) == {(0, 1), (1, 0)} and all(set(c) == {"SHM"} for c in t.values())
    assert nccl_log.env_settings(log).get("NCCL_P2P_DISABLE") == "1"
    lines = nccl_log.transport_findings(log, {(0, 1), (1, 0)})
    assert len(lines) == 2 and all("NCCL uses SHM on 4 channel(s) where NVLink allows P2P" in x for x in lines)
