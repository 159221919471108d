"""The native module: it builds, imports without a GPU, and its errors cross into Python typed."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

import mgpu_bench
from mgpu_bench import _native
from mgpu_bench.core.errors import CublasError, CudaError, MgpuError, NcclError


def test_module_is_the_compiled_extension():
    assert _native.__file__.endswith(".so")
    assert _native.NCCL_HEADER_VERSION >= 21800
    assert _native.nccl_version() >= 21800
    assert _native.cublaslt_version() > 0
    assert _native.runtime_version() >= 12000
    assert mgpu_bench.__version__ == _native.__version__


@pytest.mark.parametrize(
    "library, cls, words",
    [("nccl", NcclError, "ncclCommCount"), ("cublas", CublasError, "CUBLAS_STATUS_INVALID_VALUE")],
)
def test_library_errors_are_typed_with_context(library, cls, words):
    with pytest.raises(cls) as info:
        _native._raise_library_error(library)
    err = info.value
    assert isinstance(err, MgpuError) and isinstance(err, RuntimeError)
    assert err.code != 0
    assert words in str(err)
    assert "cublaslt.cpp:" in str(err)  # file:line of the failing call
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and back.code == err.code and str(back) == str(err)


def test_cuda_error_is_typed():
    with pytest.raises(CudaError) as info:
        _native._raise_library_error("cuda")
    assert info.value.code != 0
    if _native.driver_version() == 0:
        assert str(info.value).startswith("no NVIDIA driver found")


def test_nccl_last_error_text_is_included():
    with pytest.raises(NcclError, match="comm argument is NULL"):
        _native._raise_library_error("nccl")


def test_no_driver_is_named_not_a_cuda_string():
    if _native.driver_version() != 0:
        pytest.skip("a driver is present")
    with pytest.raises(CudaError, match="^no NVIDIA driver found"):
        _native.device_count()


def test_import_and_help_in_a_fresh_process():
    out = subprocess.run([sys.executable, "-m", "mgpu_bench.cli", "--help"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "comm" in out.stdout
