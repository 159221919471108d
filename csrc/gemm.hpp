// The GEMM compute probe (`mgpu-bench gemm`): cuBLASLt matmuls on one GPU, every candidate
// algorithm of cuBLASLt's heuristic timed with CUDA events, results checked on a sample against
// an fp64 reference. Raw seconds only; TFLOP/s, peaks and verdicts are computed in Python.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mgpu {

struct GemmShape {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
};

// One algorithm the heuristic proposed, with its identity (cuBLASLt's algo config attributes,
// enough to name and reproduce it) and its timings.
struct GemmCandidate {
  int index = 0;  // rank in the heuristic's list (0 = its first choice)
  int algo_id = 0;
  int tile = 0;
  int stages = 0;
  int split_k = 1;
  int reduction = 0;
  int swizzle = 0;
  int custom = 0;
  int cluster = 0;  // CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID (Hopper and later)
  size_t workspace = 0;
  float waves = 0.0f;
  std::vector<double> seconds;  // per GEMM, one entry per timed burst
  int iters_per_sample = 0;     // GEMMs in each burst
  double max_error = -1.0;      // largest normalised error on the checked sample; -1: unchecked
  std::string error;            // set when the algorithm failed to run
};

struct GemmMeasureArgs {
  GemmShape shape;
  int candidates = 8;      // how many of the heuristic's algorithms to time
  int samples = 5;         // timed bursts per candidate
  double sample_s = 0.02;  // target length of one burst
  int warmup = 3;          // untimed GEMMs per candidate first
  bool check = true;
};

struct GemmMeasurement {
  std::vector<GemmCandidate> candidates;
  int buffer_sets = 0;        // (A, B, D) sets rotated between GEMMs, against the L2 cache
  int checked_elements = 0;   // per candidate
};

// Bursts of a sustained run: (host monotonic seconds at the burst's end, seconds per GEMM).
using SustainSeries = std::vector<std::pair<double, double>>;

class GemmProbe {
 public:
  // Allocates arenas for A, B and D large enough for max_shape (and several sets of smaller
  // shapes) and fills A and B with random values: init 0 uniform in [-1, 1), 1 standard normal,
  // 2 uniform in [0, 1); fp8 stores 8x those values and multiplies by scales of 1/8.
  // dtype: fp64, fp32, tf32, fp16, bf16, fp8 (e4m3 inputs, bf16 output). layout: two letters,
  // cuBLAS's op(A) op(B) in column-major terms ("NN" is what torch.matmul runs on row-major
  // tensors; fp8 needs "TN"). Throws OutOfMemoryError when the arenas do not fit.
  GemmProbe(int device, const std::string& dtype, const std::string& layout, GemmShape max_shape,
            size_t workspace_bytes, uint64_t seed, bool fp8_fast_accum, int init = 0);
  ~GemmProbe();
  GemmProbe(const GemmProbe&) = delete;
  GemmProbe& operator=(const GemmProbe&) = delete;

  GemmMeasurement measure(const GemmMeasureArgs& args);
  // Runs candidate `index` of the heuristic's list for this shape (the list is deterministic)
  // for duration_s in bursts of about interval_s.
  SustainSeries sustain(GemmShape shape, int index, double duration_s, double interval_s);
  // Asks a running measure()/sustain() to return at its next burst boundary (any thread).
  void stop() { m_stop.store(true); }
  bool stopped() const { return m_stop.load(); }
  size_t arena_bytes() const;
  int device() const { return m_device; }

 private:
  struct Impl;
  std::unique_ptr<Impl> m_impl;
  int m_device;
  std::atomic<bool> m_stop{false};
};

}  // namespace mgpu
