// cuBLASLt pieces. The GEMM probe builds on this file.
#pragma once

#include <string>

namespace mgpu {

// Makes a real failing call into `library` ("cuda", "nccl", "cublas") so that tests can check
// the error translation end to end, on machines with or without a GPU.
[[noreturn]] void raise_library_error(const std::string& library);

}  // namespace mgpu
