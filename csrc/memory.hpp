// The memory probe (`mgpu-bench memory`): how much device memory a job can really use after
// realistic allocation churn, under which allocator, and whether HBM delivers its bandwidth.
// C++ returns raw numbers (bytes, host seconds per allocator call, event seconds per copy);
// fragmentation ratios, percentiles, bandwidths and verdicts are computed in Python.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mgpu {

// Every size the churn patterns and the largest-block search ask for is a multiple of this:
// the driver's large-page size and cuMemGetAllocationGranularity's minimum on A100/H100/H200,
// so no allocator rounds a request up and the budget counts what is really taken.
constexpr size_t kMemoryGranule = size_t(2) << 20;

// One device-memory allocator, used by one thread on one device (the current device is the
// caller's business: memory_churn sets it). Implementations: "cudaMalloc", "async", "vmm".
class Allocator {
 public:
  virtual ~Allocator() = default;  // frees whatever is still allocated (warnings, no throw)
  virtual const char* name() const = 0;
  // `bytes` of device memory, or nullptr when the device (or the pool) is out of memory, which
  // is not an error here. Any other failure throws CudaError. The call has finished on the
  // device when it returns, so host timing around it is the cost of the call.
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  // Gives memory cached by the allocator but not allocated back to the device, as a caching
  // allocator does on an allocation failure before it retries. False: nothing is cached.
  virtual bool release_cached() { return false; }
  // The pool's reserved (taken from the device) and used (allocated) bytes; false when the
  // allocator has no pool.
  virtual bool pool_stats(uint64_t* /*reserved*/, uint64_t* /*used*/) const { return false; }
};

// Throws std::invalid_argument (listing the choices) for an unknown name.
std::unique_ptr<Allocator> make_allocator(const std::string& name, int device);
std::vector<std::string> memory_allocators();
std::vector<std::string> memory_patterns();

struct MemoryEvent {
  bool is_free = false;  // false: an alloc call
  size_t bytes = 0;      // the size allocated (or freed)
  double seconds = 0.0;  // host wall time of the call (std::chrono::steady_clock)
};

struct ChurnResult {
  std::string allocator;
  std::string pattern;
  size_t free_before = 0;         // cudaMemGetInfo free bytes before the pattern
  size_t total = 0;               // cudaMemGetInfo total bytes
  size_t budget = 0;              // bytes the pattern may hold at once (fraction x free_before)
  size_t free_after_pattern = 0;  // cudaMemGetInfo free bytes with the pattern's blocks held
  size_t held_bytes = 0;          // bytes the pattern still holds (sum of its live blocks)
  int64_t allocations_done = 0;   // successful alloc calls of the pattern
  int64_t allocations_failed = 0; // 0, or 1 when an allocation failed and ended the pattern
  size_t largest_block = 0;       // largest single allocation that succeeded after the pattern
  double search_seconds = 0.0;    // wall time of the largest-block search
  int search_probes = 0;          // allocations the search tried
  // "async" only: the pool's reserved and used bytes right after the pattern. Memory free to
  // the job is then free_after_pattern + (pool_reserved - pool_used).
  std::optional<uint64_t> pool_reserved;
  std::optional<uint64_t> pool_used;
  std::vector<MemoryEvent> events;  // every alloc and free call of the pattern, in order
};

// Runs `pattern` with `allocator` on `device`, holding at most budget_fraction (0, 1] of the
// free memory at the start, then finds the largest block that can still be allocated with the
// same allocator (binary search at kMemoryGranule over [0, free memory]), frees everything and
// returns. Throws std::invalid_argument for unknown names (before any CUDA call) or a bad
// fraction, CudaError for CUDA failures other than running out of memory.
ChurnResult memory_churn(int device, const std::string& allocator, const std::string& pattern,
                         uint64_t seed, double budget_fraction);

// The same run on a simulated first-fit arena of `capacity` bytes (allocator "simulated"): host
// bookkeeping only, no CUDA call, so the patterns and the search can be tested without a GPU.
// free_before/free_after_pattern are the arena's; seconds are those of the bookkeeping.
ChurnResult memory_churn_simulated(const std::string& pattern, uint64_t seed,
                                   double budget_fraction, size_t capacity);

struct BandwidthResult {
  std::vector<double> seconds;  // per repetition, CUDA events
  size_t bytes_read = 0;        // device memory read per repetition
  size_t bytes_written = 0;     // device memory written per repetition
};

// One GPU's memory bandwidth. kind: "copy_ce" (cudaMemcpyAsync device to device, copy
// engines), "copy_sm" (kernel, 16-byte loads and stores), "read" (kernel, 16-byte loads, one
// 4-byte result per block), "write" (kernel, 16-byte stores). `bytes` per buffer is rounded
// down to a multiple of 16. Throws OutOfMemoryError when the buffers do not fit.
BandwidthResult hbm_bandwidth(int device, const std::string& kind, size_t bytes, int warmup,
                              int iters);
std::vector<std::string> hbm_kinds();

}  // namespace mgpu
