#include "cublaslt.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <stdexcept>

#include "errors.hpp"

namespace mgpu {

void raise_library_error(const std::string& library) {
  if (library == "cuda") {
    // An out-of-range device: cudaErrorInvalidDevice on a GPU machine, "no NVIDIA driver found"
    // on a machine without a driver.
    MGPU_CUDA_CHECK(cudaSetDevice(1 << 20));
  } else if (library == "nccl") {
    MGPU_NCCL_CHECK(nullptr, ncclCommCount(nullptr, nullptr));
  } else if (library == "cublas") {
    MGPU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(nullptr, CUDA_R_32F, 0, 0, 0));
  }
  throw std::invalid_argument("unknown library '" + library + "' (cuda, nccl or cublas)");
}

}  // namespace mgpu
