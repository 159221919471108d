// Small RAII owners for CUDA objects and timing helpers shared by the probes (links, gemm).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>

#include "errors.hpp"

namespace mgpu {

class ScopedDevice {
 public:
  explicit ScopedDevice(int dev) {
    MGPU_CUDA_CHECK(cudaGetDevice(&m_prev));
    MGPU_CUDA_CHECK(cudaSetDevice(dev));
  }
  // For destructors: never throws; a failure is a warning and the restore is skipped.
  ScopedDevice(int dev, std::nothrow_t) noexcept {
    m_ok = cudaGetDevice(&m_prev) == cudaSuccess;
    MGPU_CUDA_WARN(cudaSetDevice(dev));
  }
  ~ScopedDevice() {
    if (m_ok) MGPU_CUDA_WARN(cudaSetDevice(m_prev));
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int m_prev = 0;
  bool m_ok = true;
};

// Device memory filled with 0x5A bytes (never zeros, which some paths run faster on).
class DeviceBuffer {
 public:
  DeviceBuffer(int dev, size_t bytes) : m_dev(dev) {
    ScopedDevice on(dev);
    MGPU_CUDA_CHECK(cudaMalloc(&m_ptr, std::max<size_t>(bytes, 16)));
    MGPU_CUDA_CHECK(cudaMemset(m_ptr, 0x5A, std::max<size_t>(bytes, 16)));  // never zeros
  }
  ~DeviceBuffer() {
    ScopedDevice on(m_dev, std::nothrow);
    MGPU_CUDA_WARN(cudaFree(m_ptr));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return m_ptr; }

 private:
  int m_dev;
  void* m_ptr = nullptr;
};

class Stream {
 public:
  explicit Stream(int dev) : m_dev(dev) {
    ScopedDevice on(dev);
    MGPU_CUDA_CHECK(cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking));
  }
  ~Stream() {
    ScopedDevice on(m_dev, std::nothrow);
    MGPU_CUDA_WARN(cudaStreamDestroy(m_stream));
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return m_stream; }
  int device() const { return m_dev; }

 private:
  int m_dev;
  cudaStream_t m_stream = nullptr;
};

class Event {
 public:
  Event(int dev, bool timing) : m_dev(dev) {
    ScopedDevice on(dev);
    MGPU_CUDA_CHECK(cudaEventCreateWithFlags(&m_event, timing ? cudaEventDefault
                                                              : cudaEventDisableTiming));
  }
  ~Event() {
    ScopedDevice on(m_dev, std::nothrow);
    MGPU_CUDA_WARN(cudaEventDestroy(m_event));
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return m_event; }

 private:
  int m_dev;
  cudaEvent_t m_event = nullptr;
};

inline double elapsed(const Event& a, const Event& b) {
  float ms = 0.0f;
  MGPU_CUDA_CHECK(cudaEventElapsedTime(&ms, a.get(), b.get()));
  return static_cast<double>(ms) * 1e-3;
}

inline void check_device(int dev) {
  int n = 0;
  MGPU_CUDA_CHECK(cudaGetDeviceCount(&n));
  if (dev < 0 || dev >= n) {
    throw std::invalid_argument("GPU " + std::to_string(dev) + " does not exist (" +
                                std::to_string(n) + " visible)");
  }
}

// A device buffer, or OutOfMemoryError saying which one (`what`), how large and how much was
// free; other CUDA errors pass through.
inline std::unique_ptr<DeviceBuffer> allocate(int dev, size_t bytes, const char* what) {
  try {
    return std::make_unique<DeviceBuffer>(dev, bytes);
  } catch (const CudaError& e) {
    if (e.code() != static_cast<int>(cudaErrorMemoryAllocation)) throw;
    cudaGetLastError();
    size_t free = 0, total = 0;
    {
      ScopedDevice on(dev, std::nothrow);
      cudaMemGetInfo(&free, &total);
    }
    const double gib = double(size_t(1) << 30);
    std::ostringstream os;
    os << "GPU " << dev << ": out of memory allocating " << what << " (" << bytes / gib << " GiB; "
       << free / gib << " GiB free of " << total / gib << ")";
    throw OutOfMemoryError(os.str(), static_cast<int>(cudaErrorMemoryAllocation));
  }
}

}  // namespace mgpu
