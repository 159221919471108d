// The element types a measurement can use, and their NCCL names.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <string>
#include <vector>

namespace mgpu {

// fp8 reductions arrived in NCCL 2.24 (sm_90 and newer).
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
#define MGPU_HAVE_NCCL_FP8 1
#else
#define MGPU_HAVE_NCCL_FP8 0
#endif

enum class DType { f32, f16, bf16, f64, i32, i8, f8e4m3, f8e5m2 };

struct DTypeInfo {
  DType type;
  const char* name;    // as the CLI spells it
  size_t size;         // bytes per element
  double exact_limit;  // largest integer N such that every integer in [-N, N] is exact
  bool floating;
};

const DTypeInfo& dtype_info(DType t);
const DTypeInfo& dtype_info(const std::string& name);  // throws std::invalid_argument
std::vector<std::string> dtype_names();
ncclDataType_t nccl_type(DType t);  // throws NcclError when this NCCL lacks the type

}  // namespace mgpu
