#include "device.hpp"

#include <cuda_runtime_api.h>
#include <cublasLt.h>
#include <nccl.h>

#include <cstdio>

#include "errors.hpp"

namespace mgpu {

int device_count() {
  int n = 0;
  MGPU_CUDA_CHECK(cudaGetDeviceCount(&n));
  return n;
}

DeviceInfo device_info(int index) {
  cudaDeviceProp prop{};
  MGPU_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  DeviceInfo info;
  info.index = index;
  info.name = prop.name;
  char uuid[64];
  const unsigned char* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::snprintf(uuid, sizeof(uuid),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  info.uuid = uuid;
  char bus[32];
  MGPU_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), index));
  info.pci_bus_id = bus;
  info.total_memory = prop.totalGlobalMem;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  return info;
}

std::pair<size_t, size_t> mem_get_info(int index) {
  int previous = 0;
  MGPU_CUDA_CHECK(cudaGetDevice(&previous));
  MGPU_CUDA_CHECK(cudaSetDevice(index));
  size_t free_bytes = 0, total = 0;
  const cudaError_t st = cudaMemGetInfo(&free_bytes, &total);
  MGPU_CUDA_WARN(cudaSetDevice(previous));
  MGPU_CUDA_CHECK(st);
  return {free_bytes, total};
}

int driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) return 0;
  return v;
}

int runtime_version() {
  int v = 0;
  MGPU_CUDA_CHECK(cudaRuntimeGetVersion(&v));
  return v;
}

int nccl_version() {
  int v = 0;
  MGPU_NCCL_CHECK(nullptr, ncclGetVersion(&v));
  return v;
}

size_t cublaslt_version() { return cublasLtGetVersion(); }

}  // namespace mgpu
