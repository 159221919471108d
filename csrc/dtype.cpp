#include "dtype.hpp"

#include <stdexcept>

#include "errors.hpp"

namespace mgpu {
namespace {

// exact_limit: 2^(mantissa bits + 1) for floating types (fp32 2^24, fp16 2^11, bf16 2^8,
// e4m3 2^4, e5m2 2^3); the positive range for integers.
const DTypeInfo kTypes[] = {
    {DType::f32, "fp32", 4, 16777216.0, true},
    {DType::f16, "fp16", 2, 2048.0, true},
    {DType::bf16, "bf16", 2, 256.0, true},
    {DType::f64, "fp64", 8, 9007199254740992.0, true},
    {DType::i32, "int32", 4, 2147483647.0, false},
    {DType::i8, "int8", 1, 127.0, false},
    {DType::f8e4m3, "fp8_e4m3", 1, 16.0, true},
    {DType::f8e5m2, "fp8_e5m2", 1, 8.0, true},
};

}  // namespace

const DTypeInfo& dtype_info(DType t) {
  for (const auto& info : kTypes) {
    if (info.type == t) return info;
  }
  throw std::invalid_argument("unknown dtype");
}

const DTypeInfo& dtype_info(const std::string& name) {
  for (const auto& info : kTypes) {
    if (name == info.name) return info;
  }
  throw std::invalid_argument("unknown dtype '" + name + "'");
}

std::vector<std::string> dtype_names() {
  std::vector<std::string> names;
  for (const auto& info : kTypes) names.emplace_back(info.name);
  return names;
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i8: return ncclInt8;
#if MGPU_HAVE_NCCL_FP8
    case DType::f8e4m3: return ncclFloat8e4m3;
    case DType::f8e5m2: return ncclFloat8e5m2;
#else
    case DType::f8e4m3:
    case DType::f8e5m2:
      throw NcclError("fp8 needs NCCL >= 2.24; this module was built against NCCL " +
                          std::to_string(NCCL_VERSION_CODE),
                      static_cast<int>(ncclInvalidArgument));
#endif
  }
  throw std::invalid_argument("unknown dtype");
}

}  // namespace mgpu
