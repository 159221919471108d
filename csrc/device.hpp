// Device and library facts the Python layer records with every result.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace mgpu {

struct DeviceInfo {
  int index = 0;
  std::string name;
  std::string uuid;        // "GPU-xxxxxxxx-...", as nvidia-smi prints it
  std::string pci_bus_id;  // "0000:18:00.0"
  size_t total_memory = 0;
  int cc_major = 0;
  int cc_minor = 0;
  int multiprocessors = 0;
};

int device_count();  // throws CudaError ("no NVIDIA driver found", ...)
DeviceInfo device_info(int index);
std::pair<size_t, size_t> mem_get_info(int index);  // (free, total) bytes
int driver_version();   // CUDA version the driver supports, e.g. 13000; 0 without a driver
int runtime_version();  // CUDA runtime this module was built with
int nccl_version();     // of the NCCL library loaded at run time
size_t cublaslt_version();

}  // namespace mgpu
