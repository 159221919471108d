#include "errors.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace mgpu {
namespace {

std::string where(const char* call, const char* file, int line) {
  std::ostringstream os;
  os << file << ":" << line << ": " << call;
  return os.str();
}

}  // namespace

void throw_cuda(cudaError_t err, const char* call, const char* file, int line) {
  std::ostringstream os;
  // Without a driver the static runtime reports "driver version is insufficient"; say what
  // is really missing.
  int driver = 0;
  if ((err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) &&
      cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0) {
    os << "no NVIDIA driver found (libcuda.so.1 could not be loaded)";
  } else if (err == cudaErrorInsufficientDriver) {
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    os << "the NVIDIA driver supports CUDA " << driver / 1000 << "." << (driver % 1000) / 10
       << " but mgpu-bench was built with CUDA " << runtime / 1000 << "." << (runtime % 1000) / 10
       << ": upgrade the driver or rebuild against an older CUDA toolkit";
  } else if (err == cudaErrorNoDevice) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    os << "no NVIDIA GPU visible" << (visible ? " (CUDA_VISIBLE_DEVICES='" : "")
       << (visible ? visible : "") << (visible ? "')" : "");
  } else {
    os << cudaGetErrorName(err) << ": " << cudaGetErrorString(err);
  }
  os << " [" << where(call, file, line) << "]";
  throw CudaError(os.str(), static_cast<int>(err));
}

void throw_nccl(ncclResult_t res, ncclComm_t comm, const char* call, const char* file, int line) {
  std::ostringstream os;
  os << "NCCL error " << static_cast<int>(res) << " (" << ncclGetErrorString(res) << ")";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') {
    os << ": " << last;
  }
  os << " [" << where(call, file, line) << "]";
  throw NcclError(os.str(), static_cast<int>(res));
}

void throw_cublas(cublasStatus_t st, const char* call, const char* file, int line) {
  std::ostringstream os;
  os << cublasLtGetStatusName(st) << ": " << cublasLtGetStatusString(st) << " ["
     << where(call, file, line) << "]";
  throw CublasError(os.str(), static_cast<int>(st));
}

void warn_cuda(cudaError_t err, const char* call, const char* file, int line) noexcept {
  // At interpreter exit the runtime may be unloading before the last owner is freed: nothing
  // is lost then, and nothing is worth a warning.
  if (err != cudaSuccess && err != cudaErrorCudartUnloading) {
    std::fprintf(stderr, "mgpu-bench: warning: %s: %s [%s:%d: %s]\n", cudaGetErrorName(err),
                 cudaGetErrorString(err), file, line, call);
  }
}

void warn_nccl(ncclResult_t res, const char* call, const char* file, int line) noexcept {
  if (res != ncclSuccess && res != ncclInProgress) {
    std::fprintf(stderr, "mgpu-bench: warning: NCCL error %d (%s) [%s:%d: %s]\n",
                 static_cast<int>(res), ncclGetErrorString(res), file, line, call);
  }
}

}  // namespace mgpu
