// The silent-data-corruption probe (`mgpu-bench sdc`): bitwise-deterministic work on one GPU
// whose results are hashed on the GPU, so that GPUs of one model, repetitions on one GPU and
// nodes can be compared hash against hash.
//
//   GEMM  A (m x k) and B (k x n), bf16 or fp16, column-major, generated on the GPU from a seed
//         by a counter-based generator (element i depends on the seed and i only), D = A B
//         with one pinned cuBLASLt algorithm: no split-K, no reduction scheme, the same
//         serialised cublasLtMatmulAlgo_t on every GPU and repetition.
//   HBM   an address- and seed-dependent pattern written over a buffer, read back and compared
//         on the GPU: mismatching 8-byte words counted, the first one located.
//   hash  sum over 8-byte words i of mix64(w_i ^ mix64(i)) (mod 2^64) per block of a fixed
//         grid, the block sums chained with mix64 in block order by one thread: the same bits
//         whatever order the hardware runs the blocks in.
//
// C++ measures; which GPU disagrees with which, verdicts and findings are computed in Python.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mgpu {

// The pinned algorithm: its serialised bytes (sizeof(cublasLtMatmulAlgo_t)) and the config
// attributes that name it.
struct SdcAlgo {
  std::string blob;
  int algo_id = 0;
  int tile = 0;
  int stages = 0;
  int split_k = 1;
  int reduction = 0;
  int swizzle = 0;
  int custom = 0;
  int cluster = 0;
  size_t workspace = 0;  // bytes the algorithm needs (0: none)
};

struct SdcGemmResult {
  // One per GEMM run, in order; the run stops after the first GEMM whose hash differs from the
  // probe's reference (its output is then still in D: see copy_output).
  std::vector<uint64_t> hashes;
  std::vector<double> seconds;  // per GEMM, CUDA events around the matmul alone
  bool differs = false;         // the last hash differs from the reference
  bool made_reference = false;  // this call's first GEMM became the reference
};

struct SdcHbmResult {
  size_t bytes = 0;          // written, then read back
  uint64_t mismatches = 0;   // 8-byte words that read back other than written
  int64_t first_word = -1;   // index of the first of them; -1: none
  uint64_t first_got = 0;    // what that word read back as
  uint64_t first_want = 0;   // what was written there
  double write_seconds = 0;  // CUDA events around the write kernel
  double read_seconds = 0;   // and around the read-and-compare kernel
};

class SdcProbe {
 public:
  // dtype: "bf16" or "fp16". Allocates A, B, D, a copy of the reference D and the hashing
  // scratch, and generates A and B from `seed`. Throws OutOfMemoryError when they do not fit.
  SdcProbe(int device, const std::string& dtype, int64_t m, int64_t n, int64_t k, uint64_t seed);
  ~SdcProbe();
  SdcProbe(const SdcProbe&) = delete;
  SdcProbe& operator=(const SdcProbe&) = delete;

  // Asks cuBLASLt's heuristic for algorithms with no reduction scheme (preference mask), no
  // workspace first (then 32 MiB if none qualifies), and pins the first one whose split-K
  // count is 1 and reduction scheme none. Throws CublasError when none qualifies.
  SdcAlgo select_algo();
  // Pins another probe's algorithm (select_algo().blob), after cublasLtMatmulAlgoCheck on this
  // GPU. Throws CublasError when this GPU cannot run it.
  SdcAlgo set_algo(const std::string& blob);
  // Runs `count` GEMMs with the pinned algorithm, hashing each output on the GPU. The first GEMM
  // of the probe's life is the reference (its hash, and its output copied aside); every later
  // one is compared with it. Test hook: GEMM number corrupt_gemm of this call (-1: none) has
  // the lowest bit of output element corrupt_element flipped before it is hashed.
  SdcGemmResult gemm(int count, int corrupt_gemm = -1, int64_t corrupt_element = 0);
  uint64_t reference_hash() const;
  bool has_reference() const;
  // D (reference false) or the reference copy, m*n elements of 2 bytes, to host memory.
  void copy_output(bool reference, void* host, size_t bytes) const;
  size_t output_bytes() const;

  // The HBM buffer: allocated once (bytes rounded down to 16), freed with the probe or here.
  void hbm_allocate(size_t bytes);
  void hbm_release();
  size_t hbm_bytes() const;
  // Writes the pattern of `seed` over the buffer, reads it back and compares. Test hook: word
  // corrupt_word (-1: none) has its lowest bit flipped between the write and the read.
  SdcHbmResult hbm_check(uint64_t seed, int64_t corrupt_word = -1);

  void stop() { m_stop.store(true); }
  bool stopped() const { return m_stop.load(); }
  int device() const { return m_device; }

 private:
  struct Impl;
  std::unique_ptr<Impl> m_impl;
  int m_device;
  std::atomic<bool> m_stop{false};
};

// The hash of `bytes` of device memory on `device` (the same function the probe uses); for
// tests that hash a buffer of known contents. Reads whole 8-byte words: bytes is rounded up.
uint64_t sdc_hash_host_data(int device, const std::string& data);

}  // namespace mgpu
