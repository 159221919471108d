#include "comm_data.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>

#include "errors.hpp"

namespace mgpu {
namespace {

__host__ __device__ inline uint64_t hash_index(size_t i, int r) {
  const uint64_t i32 = static_cast<uint64_t>(i) & 0xFFFFFFFFull;
  return (i32 * 1103515245ull + 12345ull + static_cast<uint64_t>(r) * 2246822519ull) &
         0xFFFFFFFFull;
}

__host__ __device__ inline double value(const Pattern& p, int r, size_t i) {
  if (p.k == 0) {
    const int owner = static_cast<int>((hash_index(i, 0) >> 16) % static_cast<uint64_t>(p.nranks));
    return owner == r ? p.scale : 0.0;
  }
  const uint64_t m = 2ull * static_cast<uint64_t>(p.k) + 1ull;
  const int v = static_cast<int>((hash_index(i, r) >> 16) % m) - p.k;
  return static_cast<double>(v) * p.scale;
}

template <typename T>
__device__ inline T from_double(double v) {
  return static_cast<T>(v);
}
template <>
__device__ inline __half from_double<__half>(double v) {
  return __float2half(static_cast<float>(v));
}
template <>
__device__ inline __nv_bfloat16 from_double<__nv_bfloat16>(double v) {
  return __float2bfloat16(static_cast<float>(v));
}
template <>
__device__ inline __nv_fp8_e4m3 from_double<__nv_fp8_e4m3>(double v) {
  return __nv_fp8_e4m3(static_cast<float>(v));
}
template <>
__device__ inline __nv_fp8_e5m2 from_double<__nv_fp8_e5m2>(double v) {
  return __nv_fp8_e5m2(static_cast<float>(v));
}

template <typename T>
__device__ inline double to_double(T x) {
  return static_cast<double>(x);
}
template <>
__device__ inline double to_double<__half>(__half x) {
  return static_cast<double>(__half2float(x));
}
template <>
__device__ inline double to_double<__nv_bfloat16>(__nv_bfloat16 x) {
  return static_cast<double>(__bfloat162float(x));
}
template <>
__device__ inline double to_double<__nv_fp8_e4m3>(__nv_fp8_e4m3 x) {
  return static_cast<double>(static_cast<float>(x));
}
template <>
__device__ inline double to_double<__nv_fp8_e5m2>(__nv_fp8_e5m2 x) {
  return static_cast<double>(static_cast<float>(x));
}

template <typename T>
__global__ void fill_kernel(T* ptr, size_t count, int rank, Pattern p) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    ptr[i] = from_double<T>(value(p, rank, i));
  }
}

__device__ inline double expected(const Expect& e, const Pattern& p, ncclRedOp_t redop,
                                  size_t idx) {
  if (!e.reduce) {
    if (e.chunk > 0) {
      return value(p, static_cast<int>(idx / e.chunk), e.base + idx % e.chunk);
    }
    return value(p, e.from_rank, e.base + idx);
  }
  const size_t src = e.base + idx;
  double acc = value(p, 0, src);
  for (int r = 1; r < p.nranks; ++r) {
    const double v = value(p, r, src);
    if (redop == ncclMax) {
      acc = v > acc ? v : acc;
    } else if (redop == ncclMin) {
      acc = v < acc ? v : acc;
    } else {
      acc += v;
    }
  }
  if (redop == ncclAvg) acc /= p.nranks;
  return acc;
}

template <typename T>
__global__ void check_kernel(const T* out, Expect e, Pattern p, ncclRedOp_t redop, double tol_rel,
                             unsigned long long* wrong) {
  unsigned long long local = 0, first = ~0ull;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < e.count;
       i += stride) {
    const double want = expected(e, p, redop, i);
    const double got = to_double<T>(out[i]);
    const double tol = tol_rel * (fabs(want) > 1.0 ? fabs(want) : 1.0);
    // Written so that NaN (the poison, or a corrupted value) counts as wrong.
    if (!(fabs(got - want) <= tol)) {
      ++local;
      first = first < i ? first : i;
    }
  }
  if (local != 0) {
    atomicAdd(wrong, local);
    atomicMin(wrong + 1, first);  // a minimum: the same index whatever order blocks run in
  }
}

// wrong[2], wrong[3] = the first wrong element (wrong[1]) as read and as expected.
template <typename T>
__global__ void describe_kernel(const T* out, Expect e, Pattern p, ncclRedOp_t redop,
                                unsigned long long* wrong) {
  const unsigned long long i = wrong[1];
  if (i >= e.count) return;
  wrong[2] = static_cast<unsigned long long>(__double_as_longlong(to_double<T>(out[i])));
  wrong[3] = static_cast<unsigned long long>(__double_as_longlong(expected(e, p, redop, i)));
}

unsigned grid_for(size_t count) {
  const size_t blocks = (count + 255) / 256;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(blocks, 4096)));
}

template <typename T>
void fill_typed(void* ptr, size_t count, int rank, const Pattern& p, cudaStream_t s) {
  if (count == 0) return;
  fill_kernel<T><<<grid_for(count), 256, 0, s>>>(static_cast<T*>(ptr), count, rank, p);
  MGPU_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void check_typed(const void* out, const Expect& e, const Pattern& p, ncclRedOp_t redop,
                 double tol_rel, unsigned long long* wrong, cudaStream_t s) {
  if (e.count == 0) return;
  check_kernel<T><<<grid_for(e.count), 256, 0, s>>>(static_cast<const T*>(out), e, p, redop,
                                                     tol_rel, wrong);
  MGPU_CUDA_CHECK(cudaGetLastError());
  describe_kernel<T><<<1, 1, 0, s>>>(static_cast<const T*>(out), e, p, redop, wrong);
  MGPU_CUDA_CHECK(cudaGetLastError());
}

// Relative spacing of the dtype near 1 (2^-mantissa bits).
double ulp(DType t) {
  switch (t) {
    case DType::f32: return std::ldexp(1.0, -23);
    case DType::f16: return std::ldexp(1.0, -10);
    case DType::bf16: return std::ldexp(1.0, -7);
    case DType::f64: return std::ldexp(1.0, -52);
    case DType::f8e4m3: return std::ldexp(1.0, -3);
    case DType::f8e5m2: return std::ldexp(1.0, -2);
    default: return 0.0;
  }
}

#define MGPU_DISPATCH_DTYPE(dtype, FN, ...)                          \
  switch (dtype) {                                                   \
    case DType::f32: FN<float>(__VA_ARGS__); break;                  \
    case DType::f16: FN<__half>(__VA_ARGS__); break;                 \
    case DType::bf16: FN<__nv_bfloat16>(__VA_ARGS__); break;         \
    case DType::f64: FN<double>(__VA_ARGS__); break;                 \
    case DType::i32: FN<int32_t>(__VA_ARGS__); break;                \
    case DType::i8: FN<int8_t>(__VA_ARGS__); break;                  \
    case DType::f8e4m3: FN<__nv_fp8_e4m3>(__VA_ARGS__); break;       \
    case DType::f8e5m2: FN<__nv_fp8_e5m2>(__VA_ARGS__); break;       \
  }

}  // namespace

Pattern make_pattern(DType dtype, bool op_reduces, ncclRedOp_t redop, int nranks) {
  Pattern p;
  p.nranks = nranks;
  const bool summing = op_reduces && (redop == ncclSum || redop == ncclAvg);
  p.scale = (op_reduces && redop == ncclAvg) ? nranks : 1;
  const double limit = dtype_info(dtype).exact_limit;
  const double denom = static_cast<double>(summing ? nranks : 1) * p.scale;
  p.k = static_cast<int>(std::min(8.0, std::floor(limit / denom)));
  return p;
}

void fill_values(void* ptr, DType dtype, size_t count, int rank, const Pattern& p,
                 cudaStream_t stream) {
  MGPU_DISPATCH_DTYPE(dtype, fill_typed, ptr, count, rank, p, stream);
}

void check_values(const void* out, DType dtype, const Expect& e, const Pattern& p,
                  ncclRedOp_t redop, unsigned long long* d_wrong, cudaStream_t stream) {
  const double tol_rel = (redop == ncclAvg) ? 2.0 * ulp(dtype) : 0.0;
  MGPU_DISPATCH_DTYPE(dtype, check_typed, out, e, p, redop, tol_rel, d_wrong, stream);
}

}  // namespace mgpu
