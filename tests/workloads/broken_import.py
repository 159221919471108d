"""A user module that does not import (for the one-line error of `--model`)."""

from __future__ import annotations

import mgpu_bench_no_such_package  # noqa: F401


def workload(device):
    raise AssertionError("never reached")
