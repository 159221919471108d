#include "gemm.hpp"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "cublaslt_algo.hpp"
#include "cuda_util.hpp"
#include "errors.hpp"

namespace mgpu {
namespace {

constexpr int kCheckSamples = 1024;  // output elements compared with the fp64 reference
constexpr float kFp8Range = 8.0f;     // fp8 inputs are 8x the init's values, scaled by 1/8
constexpr int kScaleStride = 4;       // floats between the A and B scales (16 bytes)

enum class Kind { F64, F32, F16, BF16, F8 };

struct TypeSpec {
  Kind in;
  cudaDataType_t a_type;
  cudaDataType_t d_type;
  cublasComputeType_t compute;
  cudaDataType_t scale_type;
  size_t in_size;
  size_t out_size;
};

TypeSpec type_spec(const std::string& dtype) {
  if (dtype == "fp64") return {Kind::F64, CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F, 8, 8};
  if (dtype == "fp32") return {Kind::F32, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, 4, 4};
  if (dtype == "tf32") {
    return {Kind::F32, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, 4, 4};
  }
  if (dtype == "fp16") return {Kind::F16, CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, 2, 2};
  if (dtype == "bf16") {
    return {Kind::BF16, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, 2, 2};
  }
  if (dtype == "fp8") {
    return {Kind::F8, CUDA_R_8F_E4M3, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, 1, 2};
  }
  throw std::invalid_argument("unknown GEMM dtype '" + dtype +
                              "' (fp64, fp32, tf32, fp16, bf16, fp8)");
}

// ---- device data ---------------------------------------------------------------------------

__device__ inline uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Element i of a random matrix (never an all-zero one): init 0 uniform in [-1, 1), 1 standard
// normal (Box-Muller), 2 uniform in [0, 1). The distribution changes the power a GEMM draws.
__device__ inline float random_value(uint64_t seed, size_t i, int init) {
  const uint64_t r = mix64(seed ^ (static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull));
  const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  if (init == 2) return u;
  if (init == 1) {
    const float u2 = (static_cast<float>(r & 0xFFFFFFu) + 1.0f) * (1.0f / 16777217.0f);  // (0, 1]
    return sqrtf(-2.0f * logf(u2)) * cospif(2.0f * u);
  }
  return 2.0f * u - 1.0f;
}

template <typename T>
__device__ inline T from_float(float v);
template <> __device__ inline double from_float<double>(float v) { return v; }
template <> __device__ inline float from_float<float>(float v) { return v; }
template <> __device__ inline __half from_float<__half>(float v) { return __float2half(v); }
template <> __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <> __device__ inline __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float v) {
  return __nv_fp8_e4m3(v * kFp8Range);
}

template <typename T>
__device__ inline double to_double(T v) { return static_cast<double>(static_cast<float>(v)); }
template <> __device__ inline double to_double<double>(double v) { return v; }

template <typename T>
__global__ void fill_kernel(T* p, size_t n, uint64_t seed, int init) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    p[i] = from_float<T>(random_value(seed, i, init));
  }
}

// One thread per sampled output element (i, j): the fp64 sum over k of A(i,k) B(k,j), and the
// error of D(i,j) relative to max(|reference|, sqrt(sum (A(i,k) B(k,j))^2)). The second term is
// the typical size of such a sum (random signs): relative to it, output rounding stays under the
// output type's half ulp and accumulation error stays small at any K, while a wrong result (zeros,
// another element) scores about 1. Dividing by sum |A B| instead, which grows like K, would let an
// all-zero D pass at K of a few hundred thousand.
template <typename TIn, typename TOut>
__global__ void check_kernel(const TIn* a, const TIn* b, const TOut* d, int64_t m, int64_t n,
                             int64_t k, bool trans_a, bool trans_b, double scale, uint64_t seed,
                             int samples, double* err) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= samples) return;
  const int64_t i = static_cast<int64_t>(mix64(seed + 2 * s) % static_cast<uint64_t>(m));
  const int64_t j = static_cast<int64_t>(mix64(seed + 2 * s + 1) % static_cast<uint64_t>(n));
  const int64_t lda = trans_a ? k : m;
  const int64_t ldb = trans_b ? n : k;
  double sum = 0.0, sumsq = 0.0;
  for (int64_t p = 0; p < k; ++p) {
    const double x = to_double(trans_a ? a[p + i * lda] : a[i + p * lda]);
    const double y = to_double(trans_b ? b[j + p * ldb] : b[p + j * ldb]);
    sum += x * y;
    sumsq += (x * y) * (x * y);
  }
  sum *= scale;
  const double norm = fmax(fabs(sum), sqrt(sumsq) * scale);
  const double got = to_double(d[i + j * m]);
  err[s] = isfinite(got) ? fabs(got - sum) / (norm > 0.0 ? norm : 1.0) : INFINITY;
}

template <typename T>
void fill(T* p, size_t n, uint64_t seed, int init, cudaStream_t st) {
  fill_kernel<T><<<1024, 256, 0, st>>>(p, n, seed, init);
  MGPU_CUDA_CHECK(cudaGetLastError());
}

// ---- cuBLASLt owners -----------------------------------------------------------------------

struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};


size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

}  // namespace

struct GemmProbe::Impl {
  int device;
  std::string dtype;
  TypeSpec spec;
  bool trans_a = false, trans_b = false;
  bool fast_accum = false;
  uint64_t seed;
  size_t arena_a = 0, arena_b = 0, arena_d = 0, workspace_bytes = 0;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<DeviceBuffer> a, b, d, c, workspace, scales, errors;  // c: fp8 only
  cublasLtHandle_t lt = nullptr;

  ~Impl() {
    if (lt) cublasLtDestroy(lt);
  }

  void make_descs(LtDescs& x, GemmShape s) const {
    MGPU_CUBLAS_CHECK(cublasLtMatmulDescCreate(&x.op, spec.compute, spec.scale_type));
    const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    MGPU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    MGPU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (spec.in == Kind::F8) {
      // cuBLASLt wants each scale pointer 16-byte aligned: with B's scale 4 bytes after A's,
      // every fp8 algorithm answered NOT_SUPPORTED on an H200 (cuBLAS 13.1).
      float* sc = static_cast<float*>(scales->get());
      const float* sa = sc;
      const float* sb = sc + kScaleStride;
      MGPU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
      MGPU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
      const int8_t fast = fast_accum ? 1 : 0;
      MGPU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    }
    const uint64_t a_rows = trans_a ? s.k : s.m, a_cols = trans_a ? s.m : s.k;
    const uint64_t b_rows = trans_b ? s.n : s.k, b_cols = trans_b ? s.k : s.n;
    MGPU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.a, spec.a_type, a_rows, a_cols, a_rows));
    MGPU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.b, spec.a_type, b_rows, b_cols, b_rows));
    MGPU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.c, spec.d_type, s.m, s.n, s.m));
    MGPU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.d, spec.d_type, s.m, s.n, s.m));
    MGPU_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&x.pref));
    MGPU_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        x.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes)));
  }

  std::vector<cublasLtMatmulHeuristicResult_t> heuristic(const LtDescs& x, int count) const {
    std::vector<cublasLtMatmulHeuristicResult_t> res(std::max(count, 1));
    int found = 0;
    MGPU_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, x.op, x.a, x.b, x.c, x.d, x.pref,
                                                     static_cast<int>(res.size()), res.data(), &found));
    res.resize(found);
    if (found == 0) {
      throw CublasError("cuBLASLt has no algorithm for this GEMM (dtype " + dtype + ", layout " +
                            (trans_a ? "T" : "N") + (trans_b ? "T" : "N") + ")",
                        static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED));
    }
    return res;
  }

  // (A, B, D) sets that fit the arenas for this shape, rotated between GEMMs so that no GEMM
  // finds its inputs in L2 from the one before.
  int sets(GemmShape s, size_t* step_a, size_t* step_b, size_t* step_d) const {
    *step_a = round_up(static_cast<size_t>(s.m * s.k) * spec.in_size, 256);
    *step_b = round_up(static_cast<size_t>(s.k * s.n) * spec.in_size, 256);
    *step_d = round_up(static_cast<size_t>(s.m * s.n) * spec.out_size, 256);
    const size_t n = std::min({arena_a / *step_a, arena_b / *step_b, arena_d / *step_d, size_t(64)});
    return static_cast<int>(std::max<size_t>(n, 1));
  }

  cublasStatus_t launch(const LtDescs& x, const cublasLtMatmulAlgo_t& algo, int set, size_t step_a,
                        size_t step_b, size_t step_d) const {
    const char* pa = static_cast<const char*>(a->get()) + set * step_a;
    const char* pb = static_cast<const char*>(b->get()) + set * step_b;
    char* pd = static_cast<char*>(d->get()) + set * step_d;
    // fp8 runs out of place, as NVIDIA's fp8 sample does: C (bf16, never read as beta is 0)
    // has its own buffer. The other dtypes write D over C.
    const void* pc = c ? c->get() : pd;
    const double one_d = 1.0, zero_d = 0.0;
    const float one_f = 1.0f, zero_f = 0.0f;
    const void* alpha = spec.scale_type == CUDA_R_64F ? static_cast<const void*>(&one_d) : &one_f;
    const void* beta = spec.scale_type == CUDA_R_64F ? static_cast<const void*>(&zero_d) : &zero_f;
    return cublasLtMatmul(lt, x.op, alpha, pa, x.a, pb, x.b, beta, pc, x.c, pd, x.d, &algo,
                          workspace->get(), workspace_bytes, stream->get());
  }

  // Compares set 0's D (written by the GEMM just launched) with the fp64 reference.
  double check(GemmShape s) {
    double* err = static_cast<double*>(errors->get());
    const int threads = 128, blocks = (kCheckSamples + threads - 1) / threads;
    const uint64_t cseed = seed ^ 0xC0FFEEull;
    const double scale = spec.in == Kind::F8 ? 1.0 / (kFp8Range * kFp8Range) : 1.0;
    cudaStream_t st = stream->get();
    const void* pa = a->get();
    const void* pb = b->get();
    const void* pd = d->get();
    switch (spec.in) {
      case Kind::F64:
        check_kernel<double, double><<<blocks, threads, 0, st>>>(
            static_cast<const double*>(pa), static_cast<const double*>(pb), static_cast<const double*>(pd),
            s.m, s.n, s.k, trans_a, trans_b, scale, cseed, kCheckSamples, err);
        break;
      case Kind::F32:
        check_kernel<float, float><<<blocks, threads, 0, st>>>(
            static_cast<const float*>(pa), static_cast<const float*>(pb), static_cast<const float*>(pd),
            s.m, s.n, s.k, trans_a, trans_b, scale, cseed, kCheckSamples, err);
        break;
      case Kind::F16:
        check_kernel<__half, __half><<<blocks, threads, 0, st>>>(
            static_cast<const __half*>(pa), static_cast<const __half*>(pb), static_cast<const __half*>(pd),
            s.m, s.n, s.k, trans_a, trans_b, scale, cseed, kCheckSamples, err);
        break;
      case Kind::BF16:
        check_kernel<__nv_bfloat16, __nv_bfloat16><<<blocks, threads, 0, st>>>(
            static_cast<const __nv_bfloat16*>(pa), static_cast<const __nv_bfloat16*>(pb),
            static_cast<const __nv_bfloat16*>(pd), s.m, s.n, s.k, trans_a, trans_b, scale, cseed,
            kCheckSamples, err);
        break;
      case Kind::F8:
        check_kernel<__nv_fp8_e4m3, __nv_bfloat16><<<blocks, threads, 0, st>>>(
            static_cast<const __nv_fp8_e4m3*>(pa), static_cast<const __nv_fp8_e4m3*>(pb),
            static_cast<const __nv_bfloat16*>(pd), s.m, s.n, s.k, trans_a, trans_b, scale, cseed,
            kCheckSamples, err);
        break;
    }
    MGPU_CUDA_CHECK(cudaGetLastError());
    std::vector<double> host(kCheckSamples);
    MGPU_CUDA_CHECK(cudaMemcpyAsync(host.data(), err, kCheckSamples * sizeof(double),
                                    cudaMemcpyDeviceToHost, st));
    MGPU_CUDA_CHECK(cudaStreamSynchronize(st));
    double worst = 0.0;
    for (double e : host) worst = std::isnan(e) ? INFINITY : std::max(worst, e);
    return worst;
  }
};

namespace {

void check_shape(GemmShape s) {
  if (s.m <= 0 || s.n <= 0 || s.k <= 0) {
    throw std::invalid_argument("GEMM dimensions must be positive");
  }
}


double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

GemmProbe::GemmProbe(int device, const std::string& dtype, const std::string& layout,
                     GemmShape max_shape, size_t workspace_bytes, uint64_t seed, bool fp8_fast_accum,
                     int init)
    : m_impl(std::make_unique<Impl>()), m_device(device) {
  check_device(device);
  check_shape(max_shape);
  Impl& x = *m_impl;
  x.device = device;
  x.dtype = dtype;
  x.spec = type_spec(dtype);
  if (layout.size() != 2 || (layout[0] != 'N' && layout[0] != 'T') ||
      (layout[1] != 'N' && layout[1] != 'T')) {
    throw std::invalid_argument("layout must be NN, NT, TN or TT, got '" + layout + "'");
  }
  x.trans_a = layout[0] == 'T';
  x.trans_b = layout[1] == 'T';
  x.fast_accum = fp8_fast_accum;
  x.seed = seed;
  x.workspace_bytes = workspace_bytes;
  if (init < 0 || init > 2) {
    throw std::invalid_argument("init must be 0 (uniform), 1 (normal) or 2 (positive)");
  }

  ScopedDevice on(device);
  int l2 = 0;
  MGPU_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  // Each arena holds the largest shape's matrix, and at least 4x L2 so that small shapes get
  // several sets: one GEMM's inputs are evicted before the set comes round again.
  const size_t floor_bytes = round_up(std::max<size_t>(4 * static_cast<size_t>(l2), 1 << 20), 256);
  const auto bytes = [](int64_t r, int64_t c, size_t es) {
    return round_up(static_cast<size_t>(r) * static_cast<size_t>(c) * es, 256);
  };
  x.arena_a = std::max(bytes(max_shape.m, max_shape.k, x.spec.in_size), floor_bytes);
  x.arena_b = std::max(bytes(max_shape.k, max_shape.n, x.spec.in_size), floor_bytes);
  x.arena_d = std::max(bytes(max_shape.m, max_shape.n, x.spec.out_size), floor_bytes);
  x.stream = std::make_unique<Stream>(device);
  x.a = allocate(device, x.arena_a, "matrix A");
  x.b = allocate(device, x.arena_b, "matrix B");
  x.d = allocate(device, x.arena_d, "matrix D");
  if (x.spec.in == Kind::F8) {
    x.c = allocate(device, bytes(max_shape.m, max_shape.n, x.spec.out_size), "matrix C (fp8 runs out of place)");
  }
  x.workspace = allocate(device, std::max<size_t>(workspace_bytes, 256), "the cuBLASLt workspace");
  x.scales = allocate(device, 2 * kScaleStride * sizeof(float), "fp8 scales");
  x.errors = allocate(device, kCheckSamples * sizeof(double), "check results");
  MGPU_CUBLAS_CHECK(cublasLtCreate(&x.lt));

  cudaStream_t st = x.stream->get();
  switch (x.spec.in) {
    case Kind::F64:
      fill(static_cast<double*>(x.a->get()), x.arena_a / 8, seed, init, st);
      fill(static_cast<double*>(x.b->get()), x.arena_b / 8, seed + 1, init, st);
      break;
    case Kind::F32:
      fill(static_cast<float*>(x.a->get()), x.arena_a / 4, seed, init, st);
      fill(static_cast<float*>(x.b->get()), x.arena_b / 4, seed + 1, init, st);
      break;
    case Kind::F16:
      fill(static_cast<__half*>(x.a->get()), x.arena_a / 2, seed, init, st);
      fill(static_cast<__half*>(x.b->get()), x.arena_b / 2, seed + 1, init, st);
      break;
    case Kind::BF16:
      fill(static_cast<__nv_bfloat16*>(x.a->get()), x.arena_a / 2, seed, init, st);
      fill(static_cast<__nv_bfloat16*>(x.b->get()), x.arena_b / 2, seed + 1, init, st);
      break;
    case Kind::F8:
      fill(static_cast<__nv_fp8_e4m3*>(x.a->get()), x.arena_a, seed, init, st);
      fill(static_cast<__nv_fp8_e4m3*>(x.b->get()), x.arena_b, seed + 1, init, st);
      break;
  }
  float sc[2 * kScaleStride];
  std::fill(sc, sc + 2 * kScaleStride, 1.0f / kFp8Range);
  MGPU_CUDA_CHECK(cudaMemcpyAsync(x.scales->get(), sc, sizeof(sc), cudaMemcpyHostToDevice, st));
  MGPU_CUDA_CHECK(cudaStreamSynchronize(st));
}

GemmProbe::~GemmProbe() = default;

size_t GemmProbe::arena_bytes() const {
  return m_impl->arena_a + m_impl->arena_b + m_impl->arena_d + m_impl->workspace_bytes;
}

GemmMeasurement GemmProbe::measure(const GemmMeasureArgs& args) {
  Impl& x = *m_impl;
  const GemmShape s = args.shape;
  check_shape(s);
  if (args.candidates < 1 || args.samples < 1 || args.warmup < 0 || !(args.sample_s > 0)) {
    throw std::invalid_argument("candidates and samples must be >= 1, warmup >= 0, sample_s > 0");
  }
  size_t step_a = 0, step_b = 0, step_d = 0;
  const int nsets = x.sets(s, &step_a, &step_b, &step_d);
  if (step_a > x.arena_a || step_b > x.arena_b || step_d > x.arena_d) {
    throw std::invalid_argument("shape is larger than the probe's max_shape");
  }
  ScopedDevice on(x.device);
  LtDescs descs;
  x.make_descs(descs, s);
  const auto heur = x.heuristic(descs, args.candidates);
  Event start(x.device, true), end(x.device, true);
  cudaStream_t st = x.stream->get();

  GemmMeasurement out;
  out.buffer_sets = nsets;
  out.checked_elements = args.check ? kCheckSamples : 0;
  int set = 0;
  for (size_t ci = 0; ci < heur.size() && !stopped(); ++ci) {
    const cublasLtMatmulAlgo_t& algo = heur[ci].algo;
    GemmCandidate c;
    c.index = static_cast<int>(ci);
    name_algo(algo, c);
    c.workspace = heur[ci].workspaceSize;
    c.waves = heur[ci].wavesCount;

    // Correctness first, on set 0: a wrong algorithm is reported, not timed.
    cublasStatus_t rc = x.launch(descs, algo, 0, step_a, step_b, step_d);
    if (rc != CUBLAS_STATUS_SUCCESS) {
      c.error = std::string("cublasLtMatmul: ") + cublasLtGetStatusName(rc) + ": " +
                cublasLtGetStatusString(rc);
      out.candidates.push_back(std::move(c));
      continue;
    }
    if (args.check) c.max_error = x.check(s);

    for (int w = 0; w < args.warmup; ++w) {
      MGPU_CUBLAS_CHECK(x.launch(descs, algo, set, step_a, step_b, step_d));
      set = (set + 1) % nsets;
    }
    // A 3-GEMM burst estimates the time per GEMM, which sizes the timed bursts.
    MGPU_CUDA_CHECK(cudaEventRecord(start.get(), st));
    for (int it = 0; it < 3; ++it) {
      MGPU_CUBLAS_CHECK(x.launch(descs, algo, set, step_a, step_b, step_d));
      set = (set + 1) % nsets;
    }
    MGPU_CUDA_CHECK(cudaEventRecord(end.get(), st));
    MGPU_CUDA_CHECK(cudaEventSynchronize(end.get()));
    const double est = std::max(elapsed(start, end) / 3.0, 1e-7);
    c.iters_per_sample = static_cast<int>(std::clamp(std::ceil(args.sample_s / est), 1.0, 100000.0));
    for (int k = 0; k < args.samples && !stopped(); ++k) {
      MGPU_CUDA_CHECK(cudaEventRecord(start.get(), st));
      for (int it = 0; it < c.iters_per_sample; ++it) {
        MGPU_CUBLAS_CHECK(x.launch(descs, algo, set, step_a, step_b, step_d));
        set = (set + 1) % nsets;
      }
      MGPU_CUDA_CHECK(cudaEventRecord(end.get(), st));
      MGPU_CUDA_CHECK(cudaEventSynchronize(end.get()));
      c.seconds.push_back(elapsed(start, end) / c.iters_per_sample);
    }
    out.candidates.push_back(std::move(c));
  }
  return out;
}

SustainSeries GemmProbe::sustain(GemmShape s, int index, double duration_s, double interval_s) {
  Impl& x = *m_impl;
  check_shape(s);
  if (index < 0 || !(duration_s > 0) || !(interval_s > 0)) {
    throw std::invalid_argument("index >= 0, duration_s > 0 and interval_s > 0 required");
  }
  size_t step_a = 0, step_b = 0, step_d = 0;
  const int nsets = x.sets(s, &step_a, &step_b, &step_d);
  ScopedDevice on(x.device);
  LtDescs descs;
  x.make_descs(descs, s);
  const auto heur = x.heuristic(descs, index + 1);
  if (index >= static_cast<int>(heur.size())) {
    throw std::invalid_argument("the heuristic proposed only " + std::to_string(heur.size()) +
                                " algorithms for this GEMM");
  }
  const cublasLtMatmulAlgo_t& algo = heur[index].algo;
  Event start(x.device, true), end(x.device, true);
  cudaStream_t st = x.stream->get();
  int set = 0;
  int iters = 1;
  SustainSeries out;
  const double deadline = now_s() + duration_s;
  while (!stopped() && now_s() < deadline) {
    MGPU_CUDA_CHECK(cudaEventRecord(start.get(), st));
    for (int it = 0; it < iters; ++it) {
      MGPU_CUBLAS_CHECK(x.launch(descs, algo, set, step_a, step_b, step_d));
      set = (set + 1) % nsets;
    }
    MGPU_CUDA_CHECK(cudaEventRecord(end.get(), st));
    MGPU_CUDA_CHECK(cudaEventSynchronize(end.get()));
    const double per = elapsed(start, end) / iters;
    if (iters > 1 || interval_s <= per) out.emplace_back(now_s(), per);
    iters = static_cast<int>(std::clamp(std::ceil(interval_s / std::max(per, 1e-7)), 1.0, 1e6));
  }
  return out;
}

}  // namespace mgpu
