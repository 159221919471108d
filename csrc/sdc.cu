#include "sdc.hpp"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>

#include "cublaslt_algo.hpp"
#include "cuda_util.hpp"
#include "errors.hpp"

namespace mgpu {
namespace {

// The hash's grid is fixed (never sized to the device), so that the block sums, and the order
// they are chained in, are the same on every GPU. mgpu_bench/probes/sdc/analyse.py holds the
// same function in numpy (hash_words) for tests.
constexpr int kHashBlocks = 1024;
constexpr int kThreads = 256;
constexpr size_t kFallbackWorkspace = size_t(32) << 20;  // when no algorithm runs without one
constexpr int kHeuristicResults = 16;

__host__ __device__ inline uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Word i of the HBM pattern for key = mix64(seed): a bijection of i (a multiply by an odd
// constant, then an xor-shift), so no two words of a pass hold the same value (an address fault
// reads back another word's value), consecutive words differ in about half their bits, and every
// word changes with the seed (stale data from the pass before reads back wrong). One multiply
// a word, not mix64's two: the check stays bound by HBM, not by integer throughput.
__device__ inline uint64_t hbm_word(uint64_t key, uint64_t i) {
  const uint64_t x = (i + key) * 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 29);
}

// Sum (mod 2^64) of mix64(w_i ^ mix64(i)) over block b's contiguous share of the words. The
// sum is exact and order-free, so the tree below gives the same bits however threads run.
__global__ void hash_blocks_kernel(const uint64_t* w, size_t nwords, uint64_t* sums) {
  __shared__ uint64_t part[kThreads];
  const size_t chunk = (nwords + kHashBlocks - 1) / kHashBlocks;
  const size_t begin = static_cast<size_t>(blockIdx.x) * chunk;
  const size_t end = begin + chunk < nwords ? begin + chunk : nwords;
  uint64_t s = 0;
  for (size_t i = begin + threadIdx.x; i < end; i += kThreads) s += mix64(w[i] ^ mix64(i));
  part[threadIdx.x] = s;
  __syncthreads();
  for (int step = kThreads / 2; step > 0; step >>= 1) {
    if (static_cast<int>(threadIdx.x) < step) part[threadIdx.x] += part[threadIdx.x + step];
    __syncthreads();
  }
  if (threadIdx.x == 0) sums[blockIdx.x] = part[0];
}

// One thread chains the block sums in block order: h = mix64(nwords), h = mix64(h ^ sum_b).
__global__ void hash_chain_kernel(const uint64_t* sums, size_t nwords, uint64_t* out) {
  uint64_t h = mix64(nwords);
  for (int b = 0; b < kHashBlocks; ++b) h = mix64(h ^ sums[b]);
  *out = h;
}

// Element i of an input matrix: uniform in [-1, 1) from (seed, i) alone, rounded to nearest.
template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
__global__ void fill_kernel(T* p, size_t n, uint64_t seed) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t r = mix64(seed ^ (static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull));
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
    p[i] = from_float<T>(2.0f * u - 1.0f);
  }
}

__global__ void flip16_kernel(uint16_t* p, int64_t i) { p[i] ^= 1u; }
__global__ void flip64_kernel(uint64_t* p, int64_t i) { p[i] ^= 1ull; }

__global__ void hbm_write_kernel(ulonglong2* p, size_t npairs, uint64_t key) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < npairs; j += stride) {
    p[j] = make_ulonglong2(hbm_word(key, 2 * j), hbm_word(key, 2 * j + 1));
  }
}

// out[0] += mismatching words, out[1] = min(out[1], first mismatching word): a sum and a
// minimum, so the result does not depend on the order the blocks run in.
__global__ void hbm_read_kernel(const ulonglong2* p, size_t npairs, uint64_t key,
                                unsigned long long* out) {
  unsigned long long bad = 0, first = ULLONG_MAX;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < npairs; j += stride) {
    const ulonglong2 v = p[j];
    if (v.x != hbm_word(key, 2 * j)) {
      ++bad;
      first = first < 2 * j ? first : 2 * j;
    }
    if (v.y != hbm_word(key, 2 * j + 1)) {
      ++bad;
      first = first < 2 * j + 1 ? first : 2 * j + 1;
    }
  }
  if (bad != 0) {
    atomicAdd(&out[0], bad);
    atomicMin(&out[1], first);
  }
}

// out[2], out[3] = the first mismatching word as read, and as written.
__global__ void hbm_describe_kernel(const uint64_t* w, uint64_t key, unsigned long long* out) {
  if (out[1] == ULLONG_MAX) return;
  out[2] = w[out[1]];
  out[3] = hbm_word(key, out[1]);
}

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }


SdcAlgo describe(const cublasLtMatmulAlgo_t& algo, size_t workspace) {
  SdcAlgo a;
  a.blob.assign(reinterpret_cast<const char*>(&algo), sizeof(algo));
  name_algo(algo, a);
  a.workspace = workspace;
  return a;
}

// No split-K and no reduction scheme: every output element is one dot product, summed in one
// fixed order by one thread block.
bool deterministic(const SdcAlgo& a) {
  return a.split_k <= 1 && a.reduction == CUBLASLT_REDUCTION_SCHEME_NONE;
}

void hash_into(const void* p, size_t bytes, uint64_t* sums, uint64_t* out, cudaStream_t st) {
  const size_t nwords = (bytes + 7) / 8;
  hash_blocks_kernel<<<kHashBlocks, kThreads, 0, st>>>(static_cast<const uint64_t*>(p), nwords,
                                                        sums);
  MGPU_CUDA_CHECK(cudaGetLastError());
  hash_chain_kernel<<<1, 1, 0, st>>>(sums, nwords, out);
  MGPU_CUDA_CHECK(cudaGetLastError());
}

uint64_t read_scalar(const uint64_t* d, cudaStream_t st) {
  uint64_t h = 0;
  MGPU_CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof(h), cudaMemcpyDeviceToHost, st));
  MGPU_CUDA_CHECK(cudaStreamSynchronize(st));
  return h;
}

}  // namespace

struct SdcProbe::Impl {
  int device = 0;
  bool half = false;  // fp16 (else bf16)
  int64_t m = 0, n = 0, k = 0;
  size_t out_bytes = 0;
  int sms = 1;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<DeviceBuffer> a, b, d, ref, sums, scalars, workspace, hbm;
  size_t hbm_bytes = 0;
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool pinned = false;
  size_t workspace_bytes = 0;
  bool has_ref = false;
  uint64_t ref_hash = 0;

  ~Impl() {
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    if (lt) cublasLtDestroy(lt);
  }

  uint64_t* scalar(int i) const { return static_cast<uint64_t*>(scalars->get()) + i; }

  // Pins `al` (workspace: what it needs) and allocates its workspace.
  SdcAlgo pin(const cublasLtMatmulAlgo_t& al, size_t ws) {
    algo = al;
    workspace_bytes = ws;
    workspace = ws ? allocate(device, ws, "the cuBLASLt workspace") : nullptr;
    pinned = true;
    return describe(algo, ws);
  }

  cublasStatus_t matmul(cudaStream_t st) const {
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(lt, op, &one, a->get(), la, b->get(), lb, &zero, d->get(), ld, d->get(),
                          ld, &algo, workspace ? workspace->get() : nullptr, workspace_bytes, st);
  }
};

SdcProbe::SdcProbe(int device, const std::string& dtype, int64_t m, int64_t n, int64_t k,
                   uint64_t seed)
    : m_impl(std::make_unique<Impl>()), m_device(device) {
  check_device(device);
  if (dtype != "bf16" && dtype != "fp16") {
    throw std::invalid_argument("sdc GEMM dtype must be bf16 or fp16, got '" + dtype + "'");
  }
  if (m <= 0 || n <= 0 || k <= 0) throw std::invalid_argument("GEMM dimensions must be positive");
  Impl& x = *m_impl;
  x.device = device;
  x.half = dtype == "fp16";
  x.m = m;
  x.n = n;
  x.k = k;
  x.out_bytes = static_cast<size_t>(m) * static_cast<size_t>(n) * 2;
  ScopedDevice on(device);
  MGPU_CUDA_CHECK(cudaDeviceGetAttribute(&x.sms, cudaDevAttrMultiProcessorCount, device));
  x.stream = std::make_unique<Stream>(device);
  const size_t a_bytes = static_cast<size_t>(m) * static_cast<size_t>(k) * 2;
  const size_t b_bytes = static_cast<size_t>(k) * static_cast<size_t>(n) * 2;
  x.a = allocate(device, round_up(a_bytes, 256), "matrix A");
  x.b = allocate(device, round_up(b_bytes, 256), "matrix B");
  x.d = allocate(device, round_up(x.out_bytes, 256), "matrix D");
  x.ref = allocate(device, round_up(x.out_bytes, 256), "the reference copy of D");
  x.sums = allocate(device, kHashBlocks * sizeof(uint64_t), "hash block sums");
  x.scalars = allocate(device, 8 * sizeof(uint64_t), "check results");
  cudaStream_t st = x.stream->get();
  // Zeros past the last element: the hash reads whole 8-byte words.
  MGPU_CUDA_CHECK(cudaMemsetAsync(x.d->get(), 0, round_up(x.out_bytes, 256), st));
  MGPU_CUDA_CHECK(cudaMemsetAsync(x.ref->get(), 0, round_up(x.out_bytes, 256), st));
  const unsigned grid = static_cast<unsigned>(x.sms) * 8;
  if (x.half) {
    fill_kernel<__half><<<grid, kThreads, 0, st>>>(static_cast<__half*>(x.a->get()), a_bytes / 2,
                                                   mix64(seed));
    fill_kernel<__half><<<grid, kThreads, 0, st>>>(static_cast<__half*>(x.b->get()), b_bytes / 2,
                                                   mix64(seed + 1));
  } else {
    fill_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(
        static_cast<__nv_bfloat16*>(x.a->get()), a_bytes / 2, mix64(seed));
    fill_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(
        static_cast<__nv_bfloat16*>(x.b->get()), b_bytes / 2, mix64(seed + 1));
  }
  MGPU_CUDA_CHECK(cudaGetLastError());

  const cudaDataType_t t = x.half ? CUDA_R_16F : CUDA_R_16BF;
  MGPU_CUBLAS_CHECK(cublasLtCreate(&x.lt));
  MGPU_CUBLAS_CHECK(cublasLtMatmulDescCreate(&x.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t no = CUBLAS_OP_N;
  MGPU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSA, &no, sizeof(no)));
  MGPU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof(no)));
  MGPU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.la, t, m, k, m));
  MGPU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.lb, t, k, n, k));
  MGPU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.ld, t, m, n, m));
  MGPU_CUDA_CHECK(cudaStreamSynchronize(st));
}

SdcProbe::~SdcProbe() = default;

SdcAlgo SdcProbe::select_algo() {
  Impl& x = *m_impl;
  ScopedDevice on(x.device);
  for (size_t ws : {size_t(0), kFallbackWorkspace}) {
    for (bool mask : {true, false}) {
      cublasLtMatmulPreference_t pref = nullptr;
      MGPU_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      std::vector<cublasLtMatmulHeuristicResult_t> res(kHeuristicResults);
      int found = 0;
      cublasStatus_t rc = cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
      if (rc == CUBLAS_STATUS_SUCCESS && mask) {
        const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
        rc = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                  &none, sizeof(none));
      }
      if (rc == CUBLAS_STATUS_SUCCESS) {
        // NOT_SUPPORTED is how the heuristic says it found nothing: try the next preference.
        rc = cublasLtMatmulAlgoGetHeuristic(x.lt, x.op, x.la, x.lb, x.ld, x.ld, pref,
                                            kHeuristicResults, res.data(), &found);
      }
      cublasLtMatmulPreferenceDestroy(pref);
      if (rc != CUBLAS_STATUS_SUCCESS) continue;
      for (int i = 0; i < found; ++i) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        if (deterministic(describe(res[i].algo, res[i].workspaceSize))) {
          return x.pin(res[i].algo, res[i].workspaceSize);
        }
      }
    }
  }
  throw CublasError("cuBLASLt offers no algorithm without split-K and reduction for this " +
                        std::string(x.half ? "fp16" : "bf16") + " GEMM",
                    static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED));
}

SdcAlgo SdcProbe::set_algo(const std::string& blob) {
  Impl& x = *m_impl;
  if (blob.size() != sizeof(cublasLtMatmulAlgo_t)) {
    throw std::invalid_argument("a pinned algorithm is " + std::to_string(sizeof(cublasLtMatmulAlgo_t)) +
                                " bytes, got " + std::to_string(blob.size()));
  }
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, blob.data(), sizeof(algo));
  if (!deterministic(describe(algo, 0))) {
    throw std::invalid_argument("the algorithm given uses split-K or a reduction scheme");
  }
  ScopedDevice on(x.device);
  cublasLtMatmulHeuristicResult_t check{};
  const cublasStatus_t rc = cublasLtMatmulAlgoCheck(x.lt, x.op, x.la, x.lb, x.ld, x.ld, &algo, &check);
  if (rc != CUBLAS_STATUS_SUCCESS) {
    throw CublasError("GPU " + std::to_string(x.device) + " cannot run the pinned cuBLASLt algorithm: " +
                          cublasLtGetStatusName(rc) + ": " + cublasLtGetStatusString(rc),
                      static_cast<int>(rc));
  }
  return x.pin(algo, check.workspaceSize);
}

SdcGemmResult SdcProbe::gemm(int count, int corrupt_gemm, int64_t corrupt_element) {
  Impl& x = *m_impl;
  if (!x.pinned) throw std::invalid_argument("no algorithm pinned: call select_algo or set_algo");
  if (count < 1) throw std::invalid_argument("count must be >= 1");
  if (corrupt_gemm >= 0 && (corrupt_element < 0 || corrupt_element >= x.m * x.n)) {
    throw std::invalid_argument("corrupt_element is not an element of D");
  }
  ScopedDevice on(x.device);
  cudaStream_t st = x.stream->get();
  Event start(x.device, true), end(x.device, true);
  SdcGemmResult out;
  for (int i = 0; i < count && !stopped(); ++i) {
    MGPU_CUDA_CHECK(cudaEventRecord(start.get(), st));
    MGPU_CUBLAS_CHECK(x.matmul(st));
    MGPU_CUDA_CHECK(cudaEventRecord(end.get(), st));
    if (i == corrupt_gemm) {
      flip16_kernel<<<1, 1, 0, st>>>(static_cast<uint16_t*>(x.d->get()), corrupt_element);
      MGPU_CUDA_CHECK(cudaGetLastError());
    }
    hash_into(x.d->get(), x.out_bytes, static_cast<uint64_t*>(x.sums->get()), x.scalar(0), st);
    const uint64_t h = read_scalar(x.scalar(0), st);  // synchronises: the GEMM is done
    out.hashes.push_back(h);
    out.seconds.push_back(elapsed(start, end));
    if (!x.has_ref) {
      MGPU_CUDA_CHECK(cudaMemcpyAsync(x.ref->get(), x.d->get(), x.out_bytes,
                                      cudaMemcpyDeviceToDevice, st));
      MGPU_CUDA_CHECK(cudaStreamSynchronize(st));
      x.ref_hash = h;
      x.has_ref = true;
      out.made_reference = true;
    } else if (h != x.ref_hash) {
      out.differs = true;  // D keeps this output for copy_output
      break;
    }
  }
  return out;
}

uint64_t SdcProbe::reference_hash() const { return m_impl->ref_hash; }
bool SdcProbe::has_reference() const { return m_impl->has_ref; }
size_t SdcProbe::output_bytes() const { return m_impl->out_bytes; }

void SdcProbe::copy_output(bool reference, void* host, size_t bytes) const {
  const Impl& x = *m_impl;
  if (bytes != x.out_bytes) throw std::invalid_argument("copy_output: wrong host buffer size");
  ScopedDevice on(x.device);
  cudaStream_t st = x.stream->get();
  MGPU_CUDA_CHECK(cudaMemcpyAsync(host, (reference ? x.ref : x.d)->get(), bytes,
                                  cudaMemcpyDeviceToHost, st));
  MGPU_CUDA_CHECK(cudaStreamSynchronize(st));
}

void SdcProbe::hbm_allocate(size_t bytes) {
  Impl& x = *m_impl;
  bytes = bytes / 16 * 16;
  if (bytes == 0) throw std::invalid_argument("the HBM buffer must be at least 16 bytes");
  x.hbm.reset();
  x.hbm_bytes = 0;
  x.hbm = allocate(x.device, bytes, "the HBM check buffer");
  x.hbm_bytes = bytes;
}

void SdcProbe::hbm_release() {
  m_impl->hbm.reset();
  m_impl->hbm_bytes = 0;
}

size_t SdcProbe::hbm_bytes() const { return m_impl->hbm_bytes; }

SdcHbmResult SdcProbe::hbm_check(uint64_t seed, int64_t corrupt_word) {
  Impl& x = *m_impl;
  if (!x.hbm) throw std::invalid_argument("no HBM buffer: call hbm_allocate first");
  const size_t words = x.hbm_bytes / 8;
  if (corrupt_word >= static_cast<int64_t>(words)) {
    throw std::invalid_argument("corrupt_word is past the HBM buffer");
  }
  ScopedDevice on(x.device);
  cudaStream_t st = x.stream->get();
  Event w0(x.device, true), w1(x.device, true), r0(x.device, true), r1(x.device, true);
  const uint64_t key = mix64(seed);
  const unsigned grid = static_cast<unsigned>(x.sms) * 8;
  unsigned long long init[4] = {0, ULLONG_MAX, 0, 0};
  unsigned long long* out = reinterpret_cast<unsigned long long*>(x.scalar(4));
  MGPU_CUDA_CHECK(cudaMemcpyAsync(out, init, sizeof(init), cudaMemcpyHostToDevice, st));
  auto* pairs = static_cast<ulonglong2*>(x.hbm->get());
  MGPU_CUDA_CHECK(cudaEventRecord(w0.get(), st));
  hbm_write_kernel<<<grid, kThreads, 0, st>>>(pairs, words / 2, key);
  MGPU_CUDA_CHECK(cudaGetLastError());
  MGPU_CUDA_CHECK(cudaEventRecord(w1.get(), st));
  if (corrupt_word >= 0) {
    flip64_kernel<<<1, 1, 0, st>>>(static_cast<uint64_t*>(x.hbm->get()), corrupt_word);
    MGPU_CUDA_CHECK(cudaGetLastError());
  }
  MGPU_CUDA_CHECK(cudaEventRecord(r0.get(), st));
  hbm_read_kernel<<<grid, kThreads, 0, st>>>(pairs, words / 2, key, out);
  MGPU_CUDA_CHECK(cudaGetLastError());
  MGPU_CUDA_CHECK(cudaEventRecord(r1.get(), st));
  hbm_describe_kernel<<<1, 1, 0, st>>>(static_cast<const uint64_t*>(x.hbm->get()), key, out);
  MGPU_CUDA_CHECK(cudaGetLastError());
  unsigned long long got[4] = {0, 0, 0, 0};
  MGPU_CUDA_CHECK(cudaMemcpyAsync(got, out, sizeof(got), cudaMemcpyDeviceToHost, st));
  MGPU_CUDA_CHECK(cudaStreamSynchronize(st));
  SdcHbmResult r;
  r.bytes = x.hbm_bytes;
  r.mismatches = got[0];
  r.first_word = got[1] == ULLONG_MAX ? -1 : static_cast<int64_t>(got[1]);
  r.first_got = got[2];
  r.first_want = got[3];
  r.write_seconds = elapsed(w0, w1);
  r.read_seconds = elapsed(r0, r1);
  return r;
}

uint64_t sdc_hash_host_data(int device, const std::string& data) {
  check_device(device);
  ScopedDevice on(device);
  const size_t bytes = round_up(std::max<size_t>(data.size(), 1), 8);
  Stream stream(device);
  cudaStream_t st = stream.get();
  auto buf = allocate(device, bytes, "the data to hash");
  auto sums = allocate(device, kHashBlocks * sizeof(uint64_t), "hash block sums");
  auto out = allocate(device, sizeof(uint64_t), "the hash");
  MGPU_CUDA_CHECK(cudaMemsetAsync(buf->get(), 0, bytes, st));
  if (!data.empty()) {
    MGPU_CUDA_CHECK(cudaMemcpyAsync(buf->get(), data.data(), data.size(), cudaMemcpyHostToDevice, st));
  }
  hash_into(buf->get(), data.size(), static_cast<uint64_t*>(sums->get()),
            static_cast<uint64_t*>(out->get()), st);
  return read_scalar(static_cast<uint64_t*>(out->get()), st);
}

}  // namespace mgpu
