// Errors that carry their context across the Python boundary.
//
// One exception type per library. Each keeps the library's numeric code and a message made of
// file:line, the failing call as text, the library's error name and description (and for NCCL
// the communicator's last-error text). module.cpp maps them onto mgpu_bench.CudaError /
// NcclError / CublasError, all subclasses of mgpu_bench.MgpuError.
#pragma once

#include <cuda_runtime_api.h>
#include <cublasLt.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

namespace mgpu {

class Error : public std::runtime_error {
 public:
  Error(const std::string& msg, int code) : std::runtime_error(msg), m_code(code) {}
  int code() const noexcept { return m_code; }

 private:
  int m_code;
};

class CudaError : public Error {
 public:
  using Error::Error;
};
class NcclError : public Error {
 public:
  using Error::Error;
};
class CublasError : public Error {
 public:
  using Error::Error;
};
// A collective did not finish within the session's timeout; the communicators were aborted.
class TimeoutError : public Error {
 public:
  using Error::Error;
};
// Not enough device memory for the buffers of one measurement; the session is still usable.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void throw_cuda(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl(ncclResult_t res, ncclComm_t comm, const char* call, const char* file,
                             int line);
[[noreturn]] void throw_cublas(cublasStatus_t st, const char* call, const char* file, int line);
// Non-throwing variants for destructors and clean-up paths: they print to stderr.
void warn_cuda(cudaError_t err, const char* call, const char* file, int line) noexcept;
void warn_nccl(ncclResult_t res, const char* call, const char* file, int line) noexcept;

}  // namespace mgpu

#define MGPU_CUDA_CHECK(call)                                             \
  do {                                                                    \
    cudaError_t mgpu_err_ = (call);                                       \
    if (mgpu_err_ != cudaSuccess) {                                       \
      ::mgpu::throw_cuda(mgpu_err_, #call, __FILE__, __LINE__);           \
    }                                                                     \
  } while (0)

// `comm` may be nullptr when the call has no communicator yet.
#define MGPU_NCCL_CHECK(comm, call)                                       \
  do {                                                                    \
    ncclResult_t mgpu_res_ = (call);                                      \
    if (mgpu_res_ != ncclSuccess && mgpu_res_ != ncclInProgress) {        \
      ::mgpu::throw_nccl(mgpu_res_, (comm), #call, __FILE__, __LINE__);   \
    }                                                                     \
  } while (0)

#define MGPU_CUBLAS_CHECK(call)                                           \
  do {                                                                    \
    cublasStatus_t mgpu_st_ = (call);                                     \
    if (mgpu_st_ != CUBLAS_STATUS_SUCCESS) {                              \
      ::mgpu::throw_cublas(mgpu_st_, #call, __FILE__, __LINE__);          \
    }                                                                     \
  } while (0)

#define MGPU_CUDA_WARN(call) ::mgpu::warn_cuda((call), #call, __FILE__, __LINE__)
#define MGPU_NCCL_WARN(call) ::mgpu::warn_nccl((call), #call, __FILE__, __LINE__)
