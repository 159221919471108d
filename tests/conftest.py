from __future__ import annotations

import pytest


def _gpu_count() -> int:
    from mgpu_bench.comm import visible_gpu_count

    return visible_gpu_count()


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need one NVIDIA GPU, `multi_gpu(n)` tests n; without them they skip with
    the reason (CI has no GPU; run `pytest -m gpu` on a GPU machine)."""
    count = None
    for item in items:
        need = 0
        if item.get_closest_marker("gpu"):
            need = 1
        marker = item.get_closest_marker("multi_gpu")
        if marker:
            need = max(need, int(marker.args[0]))
        if need:
            if count is None:
                count = _gpu_count()
            if count < need:
                item.add_marker(pytest.mark.skip(reason=f"needs {need} NVIDIA GPU(s), {count} visible"))
