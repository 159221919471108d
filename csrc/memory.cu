#include "memory.hpp"

// Driver API types and PFN_* typedefs only: the functions are looked up at run time through
// the runtime (cudaGetDriverEntryPointByVersion), so the module never links libcuda and still
// imports on a machine without a driver.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "cuda_util.hpp"
#include "errors.hpp"

namespace mgpu {
namespace {

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kGiB = size_t(1) << 30;

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
size_t round_down(size_t x, size_t a) { return x / a * a; }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// ---- driver entry points (vmm) -------------------------------------------------------------

// The driver functions the vmm allocator calls, at their CUDA 12.0 ABI (unchanged since 10.2).
struct DriverApi {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 get_granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
};

template <typename F>
void entry_point(const char* symbol, F* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  MGPU_CUDA_CHECK(cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found));
#else
  MGPU_CUDA_CHECK(cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault, &found));
#endif
  if (found != cudaDriverEntryPointSuccess || p == nullptr) {
    throw CudaError(std::string("the NVIDIA driver has no ") + symbol +
                        " (CUDA 12.0 API): upgrade the driver",
                    static_cast<int>(cudaErrorSymbolNotFound));
  }
  *fn = reinterpret_cast<F>(p);
}

DriverApi load_driver_api() {
  DriverApi d;
  entry_point("cuGetErrorName", &d.get_error_name);
  entry_point("cuGetErrorString", &d.get_error_string);
  entry_point("cuMemGetAllocationGranularity", &d.get_granularity);
  entry_point("cuMemAddressReserve", &d.address_reserve);
  entry_point("cuMemAddressFree", &d.address_free);
  entry_point("cuMemCreate", &d.create);
  entry_point("cuMemRelease", &d.release);
  entry_point("cuMemMap", &d.map);
  entry_point("cuMemUnmap", &d.unmap);
  entry_point("cuMemSetAccess", &d.set_access);
  return d;
}

// Loaded on first use; a failure (no driver) throws and is retried on the next call.
const DriverApi& driver_api() {
  static const DriverApi api = load_driver_api();
  return api;
}

std::string cu_message(const DriverApi& api, CUresult r, const char* call, const char* file,
                       int line) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.get_error_name(r, &name) != CUDA_SUCCESS) name = "CUDA_ERROR_UNKNOWN";
  if (api.get_error_string(r, &text) != CUDA_SUCCESS) text = "unknown driver error";
  std::ostringstream os;
  os << name << ": " << text << " [" << file << ":" << line << ": " << call << "]";
  return os.str();
}

[[noreturn]] void throw_cu(const DriverApi& api, CUresult r, const char* call, const char* file,
                           int line) {
  throw CudaError(cu_message(api, r, call, file, line), static_cast<int>(r));
}

void warn_cu(const DriverApi& api, CUresult r, const char* call, const char* file,
             int line) noexcept {
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_DEINITIALIZED) return;  // at exit: nothing lost
  try {
    std::fprintf(stderr, "mgpu-bench: warning: %s\n", cu_message(api, r, call, file, line).c_str());
  } catch (...) {
  }
}

#define MGPU_CU_CHECK(api, call)                                        \
  do {                                                                  \
    CUresult mgpu_cu_ = (call);                                         \
    if (mgpu_cu_ != CUDA_SUCCESS) {                                     \
      throw_cu((api), mgpu_cu_, #call, __FILE__, __LINE__);             \
    }                                                                   \
  } while (0)
#define MGPU_CU_WARN(api, call) warn_cu((api), (call), #call, __FILE__, __LINE__)

// ---- allocators ----------------------------------------------------------------------------

// The driver's allocator: every call maps (or unmaps) memory, nothing is cached. cudaFree
// synchronises the device.
class CudaMallocAllocator final : public Allocator {
 public:
  explicit CudaMallocAllocator(int dev) : m_dev(dev) {}
  ~CudaMallocAllocator() override {
    ScopedDevice on(m_dev, std::nothrow);
    for (void* p : m_live) MGPU_CUDA_WARN(cudaFree(p));
  }
  const char* name() const override { return "cudaMalloc"; }
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t st = cudaMalloc(&p, bytes);
    if (st == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky; clear it
      return nullptr;
    }
    MGPU_CUDA_CHECK(st);
    m_live.insert(p);
    return p;
  }
  void free(void* p) override {
    MGPU_CUDA_CHECK(cudaFree(p));
    m_live.erase(p);
  }

 private:
  int m_dev;
  std::unordered_set<void*> m_live;
};

// The stream-ordered allocator on a pool of its own whose release threshold is UINT64_MAX:
// freed memory stays reserved by the pool and is reused, as in a caching allocator (PyTorch's
// cudaMallocAsync backend sets the same threshold). Every call synchronises the stream, so the
// host time is the call's and the pool's state is settled when it returns.
class AsyncAllocator final : public Allocator {
 public:
  explicit AsyncAllocator(int dev) : m_dev(dev), m_stream(dev) {
    ScopedDevice on(dev);
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    MGPU_CUDA_CHECK(cudaMemPoolCreate(&m_pool, &props));
    uint64_t keep = UINT64_MAX;
    const cudaError_t st = cudaMemPoolSetAttribute(m_pool, cudaMemPoolAttrReleaseThreshold, &keep);
    if (st != cudaSuccess) {
      MGPU_CUDA_WARN(cudaMemPoolDestroy(m_pool));
      MGPU_CUDA_CHECK(st);
    }
  }
  ~AsyncAllocator() override {
    ScopedDevice on(m_dev, std::nothrow);
    for (void* p : m_live) MGPU_CUDA_WARN(cudaFreeAsync(p, m_stream.get()));
    MGPU_CUDA_WARN(cudaStreamSynchronize(m_stream.get()));
    MGPU_CUDA_WARN(cudaMemPoolTrimTo(m_pool, 0));
    MGPU_CUDA_WARN(cudaMemPoolDestroy(m_pool));
  }
  const char* name() const override { return "async"; }
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t st = cudaMallocFromPoolAsync(&p, bytes, m_pool, m_stream.get());
    if (st == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    MGPU_CUDA_CHECK(st);
    m_live.insert(p);
    MGPU_CUDA_CHECK(cudaStreamSynchronize(m_stream.get()));
    return p;
  }
  void free(void* p) override {
    MGPU_CUDA_CHECK(cudaFreeAsync(p, m_stream.get()));
    m_live.erase(p);
    MGPU_CUDA_CHECK(cudaStreamSynchronize(m_stream.get()));
  }
  // Trims the pool to what is allocated; true when that gave memory back.
  bool release_cached() override {
    uint64_t before = 0, after = 0, used = 0;
    pool_stats(&before, &used);
    MGPU_CUDA_CHECK(cudaStreamSynchronize(m_stream.get()));
    MGPU_CUDA_CHECK(cudaMemPoolTrimTo(m_pool, 0));
    pool_stats(&after, &used);
    return after < before;
  }
  bool pool_stats(uint64_t* reserved, uint64_t* used) const override {
    MGPU_CUDA_CHECK(cudaMemPoolGetAttribute(m_pool, cudaMemPoolAttrReservedMemCurrent, reserved));
    MGPU_CUDA_CHECK(cudaMemPoolGetAttribute(m_pool, cudaMemPoolAttrUsedMemCurrent, used));
    return true;
  }

 private:
  int m_dev;
  Stream m_stream;
  cudaMemPool_t m_pool = nullptr;
  std::unordered_set<void*> m_live;
};

// Virtual memory management, the mechanism of PyTorch's expandable segments: per allocation a
// virtual address range, pinned physical memory of the device (rounded up to the minimum
// granularity), mapped and made read-write for the device. Freeing unmaps and releases both,
// so physical memory never stays stranded in a half-used segment.
class VmmAllocator final : public Allocator {
 public:
  explicit VmmAllocator(int dev) : m_api(driver_api()), m_dev(dev) {
    m_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    m_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    m_prop.location.id = dev;
    MGPU_CU_CHECK(m_api, m_api.get_granularity(&m_granularity, &m_prop,
                                                CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    m_access.location = m_prop.location;
    m_access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  ~VmmAllocator() override {
    ScopedDevice on(m_dev, std::nothrow);
    for (const auto& kv : m_live) {
      MGPU_CU_WARN(m_api, m_api.unmap(kv.first, kv.second.size));
      MGPU_CU_WARN(m_api, m_api.release(kv.second.handle));
      MGPU_CU_WARN(m_api, m_api.address_free(kv.first, kv.second.size));
    }
  }
  const char* name() const override { return "vmm"; }
  void* alloc(size_t bytes) override {
    const size_t size = round_up(std::max<size_t>(bytes, 1), m_granularity);
    CUdeviceptr va = 0;
    CUresult r = m_api.address_reserve(&va, size, 0, 0, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
    MGPU_CU_CHECK(m_api, r);
    CUmemGenericAllocationHandle handle = 0;
    r = m_api.create(&handle, size, &m_prop, 0);
    if (r == CUDA_SUCCESS) {
      r = m_api.map(va, size, 0, handle, 0);
      if (r == CUDA_SUCCESS) {
        r = m_api.set_access(va, size, &m_access, 1);
        if (r == CUDA_SUCCESS) {
          m_live.emplace(va, Mapping{size, handle});
          return reinterpret_cast<void*>(va);
        }
        MGPU_CU_WARN(m_api, m_api.unmap(va, size));
      }
      MGPU_CU_WARN(m_api, m_api.release(handle));
    }
    MGPU_CU_WARN(m_api, m_api.address_free(va, size));
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
    throw_cu(m_api, r, "cuMemCreate/cuMemMap/cuMemSetAccess", __FILE__, __LINE__);
  }
  void free(void* p) override {
    const auto it = m_live.find(reinterpret_cast<CUdeviceptr>(p));
    if (it == m_live.end()) throw std::logic_error("vmm: freeing a pointer it did not allocate");
    const CUdeviceptr va = it->first;
    const Mapping m = it->second;
    m_live.erase(it);
    MGPU_CU_CHECK(m_api, m_api.unmap(va, m.size));
    MGPU_CU_CHECK(m_api, m_api.release(m.handle));
    MGPU_CU_CHECK(m_api, m_api.address_free(va, m.size));
  }

 private:
  struct Mapping {
    size_t size;
    CUmemGenericAllocationHandle handle;
  };
  const DriverApi& m_api;
  int m_dev;
  CUmemAllocationProp m_prop{};
  CUmemAccessDesc m_access{};
  size_t m_granularity = kMemoryGranule;
  std::unordered_map<CUdeviceptr, Mapping> m_live;
};

// A first-fit allocator over a simulated address range of `capacity` bytes: host bookkeeping
// only, no device memory and no CUDA call. Freed ranges coalesce with free neighbours, so it
// behaves like one contiguous segment that is never released (the worst case a caching
// allocator approaches). For tests of the patterns and the search on machines without a GPU.
class SimulatedAllocator final : public Allocator {
 public:
  explicit SimulatedAllocator(size_t capacity) : m_capacity(capacity) {
    if (capacity > 0) m_holes.emplace(0, capacity);
  }
  const char* name() const override { return "simulated"; }
  void* alloc(size_t bytes) override {
    bytes = round_up(std::max<size_t>(bytes, 1), kMemoryGranule);
    for (auto it = m_holes.begin(); it != m_holes.end(); ++it) {
      if (it->second < bytes) continue;
      const size_t offset = it->first, left = it->second - bytes;
      m_holes.erase(it);
      if (left > 0) m_holes.emplace(offset + bytes, left);
      m_live.emplace(offset, bytes);
      m_used += bytes;
      return reinterpret_cast<void*>(kBase + offset);
    }
    return nullptr;
  }
  void free(void* p) override {
    const auto it = m_live.find(reinterpret_cast<uintptr_t>(p) - kBase);
    if (it == m_live.end()) throw std::logic_error("simulated: freeing an unknown pointer");
    size_t offset = it->first, bytes = it->second;
    m_live.erase(it);
    m_used -= bytes;
    auto next = m_holes.lower_bound(offset);
    if (next != m_holes.end() && next->first == offset + bytes) {
      bytes += next->second;
      next = m_holes.erase(next);
    }
    if (next != m_holes.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        bytes += prev->second;
        m_holes.erase(prev);
      }
    }
    m_holes.emplace(offset, bytes);
  }
  size_t free_bytes() const { return m_capacity - m_used; }

 private:
  static constexpr uintptr_t kBase = uintptr_t(1) << 40;  // never a null pointer
  size_t m_capacity;
  size_t m_used = 0;
  std::map<size_t, size_t> m_holes;  // offset -> bytes
  std::map<size_t, size_t> m_live;   // offset -> bytes
};

// Adding an allocator: one class above and one row here.
struct AllocatorDesc {
  const char* name;
  std::unique_ptr<Allocator> (*make)(int dev);
};

template <typename A>
std::unique_ptr<Allocator> make(int dev) {
  return std::make_unique<A>(dev);
}

constexpr AllocatorDesc kAllocators[] = {
    {"cudaMalloc", &make<CudaMallocAllocator>},
    {"async", &make<AsyncAllocator>},
    {"vmm", &make<VmmAllocator>},
};

const AllocatorDesc& find_allocator(const std::string& name) {
  for (const AllocatorDesc& a : kAllocators) {
    if (name == a.name) return a;
  }
  throw std::invalid_argument("unknown allocator '" + name + "' (" + join(memory_allocators()) +
                              ")");
}

// ---- churn ---------------------------------------------------------------------------------

// Runs one pattern's calls through an allocator: keeps the budget, times every call, remembers
// the live blocks, and ends the pattern at the first allocation that fails or would pass the
// budget (every later alloc then returns nullptr without a call).
class Churn {
 public:
  Churn(Allocator& a, size_t budget, uint64_t seed) : m_alloc(a), m_budget(budget), m_rng(seed) {
    events.reserve(4096);
  }
  Churn(const Churn&) = delete;
  Churn& operator=(const Churn&) = delete;

  size_t budget() const { return m_budget; }
  size_t held() const { return m_held; }
  bool fits(size_t bytes) const { return m_held + bytes <= m_budget; }

  void* alloc(size_t bytes) {
    if (m_done) return nullptr;
    if (!fits(bytes)) {
      m_done = true;
      return nullptr;
    }
    const auto t0 = std::chrono::steady_clock::now();
    void* p = m_alloc.alloc(bytes);
    const double s = seconds_since(t0);
    if (p == nullptr) {
      ++allocations_failed;
      m_done = true;
      return nullptr;
    }
    ++allocations_done;
    events.push_back({false, bytes, s});
    m_held += bytes;
    m_live.emplace(p, bytes);
    return p;
  }

  void free(void* p) {
    const auto it = m_live.find(p);
    if (it == m_live.end()) throw std::logic_error("churn: freeing a block it does not hold");
    const size_t bytes = it->second;
    const auto t0 = std::chrono::steady_clock::now();
    m_alloc.free(p);
    events.push_back({true, bytes, seconds_since(t0)});
    m_held -= bytes;
    m_live.erase(it);
  }

  // Frees every block still held; neither timed nor recorded (clean-up after the pattern).
  void release_all() {
    for (const auto& kv : m_live) m_alloc.free(kv.first);
    m_live.clear();
    m_held = 0;
  }

  // Portable draws from the seed: std::mt19937_64's sequence is fixed by the standard, the
  // <random> distributions are not, so these use its raw output.
  uint64_t below(uint64_t n) { return m_rng() % n; }
  double uniform() { return static_cast<double>(m_rng() >> 11) * 0x1.0p-53; }  // [0, 1)
  void shuffle(std::vector<void*>& v) {  // Fisher-Yates
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

  std::vector<MemoryEvent> events;
  int64_t allocations_done = 0;
  int64_t allocations_failed = 0;

 private:
  Allocator& m_alloc;
  size_t m_budget;
  size_t m_held = 0;
  bool m_done = false;
  std::mt19937_64 m_rng;
  std::unordered_map<void*, size_t> m_live;
};

// "interleaved". Imitates a model whose tensors come in two size classes that are allocated in
// turn and die at different times: e.g. the activations of one layer type (kept for backward)
// alternating with larger temporaries of another (MLP intermediates), the temporaries freed
// first. Blocks of 3u and 5u bytes (u = 32 MiB, so 96 MiB and 160 MiB, when the budget holds
// 64 pairs or more; smaller otherwise) alternate until the budget is used; then every 3u block
// is freed, leaving the free memory in holes smaller than the 5u class. The seed is not used.
void interleaved(Churn& c) {
  const size_t u = std::clamp(round_down(c.budget() / 512, kMemoryGranule), kMemoryGranule,
                              32 * kMiB);
  const size_t sizes[2] = {3 * u, 5 * u};
  std::vector<void*> small;
  for (int k = 0; c.fits(sizes[k % 2]); ++k) {
    void* p = c.alloc(sizes[k % 2]);
    if (p == nullptr) return;
    if (k % 2 == 0) small.push_back(p);
  }
  for (void* p : small) c.free(p);
}

// "grow-shrink". Imitates training on variable-length batches (packed or bucketed sequences):
// each step allocates a new set of activation-like blocks whose total follows the step's
// sequence length, while the previous step's set is still alive (the next forward begins before
// the last backward's buffers are gone), then frees the previous set in a shuffled order (the
// order autograd releases them, not the reverse of allocation). Every 4th step one block of
// budget/64 allocated amid the activations is kept until the end (a KV cache page, a grown
// optimizer state, a cached workspace), until the kept blocks reach half the budget.
// Sizes: sequence fraction 1/8 + 7/8 u^2 (u uniform: mostly short batches, a few long ones);
// 4 to 12 blocks per step with weights 1, 1, 2, 3 or 4 (layer kinds) sharing seq x budget/4.
// Peak: kept (<= budget/2) + two sets (<= budget/4 each). The pattern ends between steps with
// the last set freed: only the kept blocks are held, as when the next batch has to fit.
void grow_shrink(Churn& c) {
  constexpr int kSteps = 160;
  constexpr int kKeepEvery = 4;
  constexpr uint64_t kWeights[] = {1, 1, 2, 3, 4};
  const size_t set_cap = c.budget() / 4;
  const size_t keep_size = std::max(kMemoryGranule, round_down(c.budget() / 64, kMemoryGranule));
  size_t kept = 0;
  std::vector<void*> prev, cur;
  for (int step = 0; step < kSteps; ++step) {
    const double u = c.uniform();
    const double seq = 0.125 + 0.875 * u * u;
    const int blocks = 4 + static_cast<int>(c.below(9));
    std::vector<uint64_t> w(blocks);
    uint64_t w_sum = 0;
    for (uint64_t& x : w) w_sum += x = kWeights[c.below(5)];
    const int keep_at =
        (step % kKeepEvery == kKeepEvery - 1 && kept + keep_size <= c.budget() / 2) ? blocks / 2
                                                                                     : -1;
    cur.clear();
    for (int i = 0; i < blocks; ++i) {
      if (i == keep_at) {
        if (c.alloc(keep_size) == nullptr) return;
        kept += keep_size;
      }
      const double share = seq * static_cast<double>(set_cap) * static_cast<double>(w[i]) /
                           static_cast<double>(w_sum);
      const size_t bytes = std::max(kMemoryGranule,
                                    round_down(static_cast<size_t>(share), kMemoryGranule));
      void* p = c.alloc(bytes);
      if (p == nullptr) return;
      cur.push_back(p);
    }
    c.shuffle(prev);
    for (void* p : prev) c.free(p);
    prev.swap(cur);
  }
  c.shuffle(prev);
  for (void* p : prev) c.free(p);
}

// "small-between-large". Imitates large transient buffers (gradient buckets, gathered
// parameters of a sharded model, a big logits tensor, 1 GiB here; budget/32 when smaller)
// allocated while small long-lived tensors (2-8 MiB: norms, biases, metrics, RNG state,
// cached small workspaces) keep being created between them: a large block, then 4 to 16
// small ones, repeated until the budget is used; then the large blocks are freed. The free
// memory lies in large holes separated by pinned small blocks.
void small_between_large(Churn& c) {
  const size_t large = std::max(16 * kMiB, std::min(kGiB, round_down(c.budget() / 32,
                                                                      kMemoryGranule)));
  std::vector<void*> larges;
  while (c.fits(large)) {
    void* p = c.alloc(large);
    if (p == nullptr) return;
    larges.push_back(p);
    const int small = 4 + static_cast<int>(c.below(13));
    for (int i = 0; i < small; ++i) {
      const size_t bytes = kMemoryGranule * (1 + c.below(4));
      if (!c.fits(bytes)) break;
      if (c.alloc(bytes) == nullptr) return;
    }
  }
  for (void* p : larges) c.free(p);
}

// Adding a pattern: one function above (with its comment) and one row here.
struct PatternDesc {
  const char* name;
  void (*run)(Churn&);
};

constexpr PatternDesc kPatterns[] = {
    {"interleaved", &interleaved},
    {"grow-shrink", &grow_shrink},
    {"small-between-large", &small_between_large},
};

const PatternDesc& find_pattern(const std::string& name) {
  for (const PatternDesc& p : kPatterns) {
    if (name == p.name) return p;
  }
  throw std::invalid_argument("unknown memory pattern '" + name + "' (" +
                              join(memory_patterns()) + ")");
}

// One probe of the search: allocate and free at once. On a failure, memory the allocator
// caches is given back and the size tried once more (what a caching allocator does before it
// reports out of memory); after a success the probe's memory is not left cached either, so
// one probe does not change what the next can get.
bool fits_now(Allocator& a, size_t bytes) {
  void* p = a.alloc(bytes);
  if (p == nullptr && a.release_cached()) p = a.alloc(bytes);
  if (p == nullptr) return false;
  a.free(p);
  a.release_cached();
  return true;
}

// Largest allocation in [0, upper] that succeeds. A successful probe of 100+ GiB costs the
// driver a few tenths of a second (mapping and unmapping the pages on an H200), a failing one
// little, so the search is built to need few successes:
// - first, upper less a slack of max(64 MiB, 0.1%): if that fits (the usual case for
//   cudaMalloc and VMM, which map scattered pages into one range), the answer is known to
//   the slack and one probe suffices;
// - otherwise down from the top in doubling steps until a size fits (the largest block of a
//   fragmented allocator is usually near the top), then a binary search between that size and
//   the last that failed, to 0.25% of upper (at least one 2 MiB granule).
size_t largest_block(Allocator& a, size_t upper, int* probes) {
  const size_t top = upper / kMemoryGranule;  // granules
  if (top == 0) return 0;
  const size_t slack = std::max<size_t>((size_t(64) << 20) / kMemoryGranule, top / 1000);
  const size_t resolution = std::max<size_t>(1, top / 400);
  const auto fits = [&](size_t granules) {
    ++*probes;
    return fits_now(a, granules * kMemoryGranule);
  };
  size_t hi = top + 1;  // granules known (or assumed) not to fit
  size_t lo = 0;        // granules known to fit
  for (size_t step = slack; step < top; step *= 2) {
    if (fits(top - step)) {
      lo = top - step;
      break;
    }
    hi = top - step;
  }
  while (hi - lo > resolution) {
    const size_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo * kMemoryGranule;
}

// The pattern, the state after it and the largest-block search on one allocator, then every
// block freed. mem_info gives (free, total) bytes of the memory the allocator draws from.
ChurnResult run_churn(Allocator& a, const PatternDesc& pat, uint64_t seed, double budget_fraction,
                      const std::function<void(size_t*, size_t*)>& mem_info) {
  ChurnResult r;
  r.allocator = a.name();
  r.pattern = pat.name;
  mem_info(&r.free_before, &r.total);
  r.budget = round_down(static_cast<size_t>(budget_fraction * static_cast<double>(r.free_before)),
                        kMemoryGranule);
  Churn churn(a, r.budget, seed);
  pat.run(churn);
  r.allocations_done = churn.allocations_done;
  r.allocations_failed = churn.allocations_failed;
  r.held_bytes = churn.held();
  uint64_t reserved = 0, used = 0;
  if (a.pool_stats(&reserved, &used)) {
    r.pool_reserved = reserved;
    r.pool_used = used;
  }
  mem_info(&r.free_after_pattern, &r.total);
  // Memory the job could still get: free on the device plus, for a pool, what it holds unused.
  const size_t cached = reserved > used ? static_cast<size_t>(reserved - used) : 0;
  const auto t0 = std::chrono::steady_clock::now();
  r.largest_block = largest_block(a, r.free_after_pattern + cached, &r.search_probes);
  r.search_seconds = seconds_since(t0);
  churn.release_all();
  r.events = std::move(churn.events);
  return r;
}

void check_fraction(double budget_fraction) {
  if (!(budget_fraction > 0.0 && budget_fraction <= 1.0)) {
    throw std::invalid_argument("budget_fraction must be in (0, 1]");
  }
}

// ---- HBM bandwidth -------------------------------------------------------------------------

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // independent 16-byte loads in flight per thread

// 16-byte loads, then 16-byte stores, kUnroll per thread and iteration, grid-stride.
__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

// 16-byte loads folded into one XOR per block, written to out[blockIdx.x]: the result depends
// on every load, so none can be dropped; the stores are gridDim.x x 4 bytes.
__global__ void read_kernel(const uint4* __restrict__ src, size_t n, uint32_t* __restrict__ out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t acc = 0;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = src[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  __shared__ uint32_t block_acc;
  if (threadIdx.x == 0) block_acc = 0;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) atomicXor(&block_acc, acc);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = block_acc;
}

// 16-byte stores of index-dependent values (never a constant a memory system could elide).
__global__ void write_kernel(uint4* __restrict__ dst, size_t n, uint32_t salt) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const uint32_t lo = static_cast<uint32_t>(i);
    dst[i] = make_uint4(lo ^ salt, lo, ~lo, salt);
  }
}

// Enough blocks of kThreads to fill every SM: multiprocessors x resident blocks per SM.
template <typename K>
unsigned fill_grid(int dev, K kernel) {
  int sms = 0, per_sm = 0;
  MGPU_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  MGPU_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  return static_cast<unsigned>(sms) * static_cast<unsigned>(std::max(per_sm, 1));
}


}  // namespace

std::vector<std::string> memory_allocators() {
  std::vector<std::string> out;
  for (const AllocatorDesc& a : kAllocators) out.emplace_back(a.name);
  return out;
}

std::vector<std::string> memory_patterns() {
  std::vector<std::string> out;
  for (const PatternDesc& p : kPatterns) out.emplace_back(p.name);
  return out;
}

std::vector<std::string> hbm_kinds() { return {"copy_ce", "copy_sm", "read", "write"}; }

std::unique_ptr<Allocator> make_allocator(const std::string& name, int device) {
  const AllocatorDesc& desc = find_allocator(name);
  check_device(device);
  ScopedDevice on(device);
  return desc.make(device);
}

ChurnResult memory_churn(int device, const std::string& allocator, const std::string& pattern,
                         uint64_t seed, double budget_fraction) {
  const PatternDesc& pat = find_pattern(pattern);
  find_allocator(allocator);
  check_fraction(budget_fraction);
  check_device(device);
  ScopedDevice on(device);
  std::unique_ptr<Allocator> a = make_allocator(allocator, device);
  ChurnResult r = run_churn(*a, pat, seed, budget_fraction, [](size_t* free, size_t* total) {
    MGPU_CUDA_CHECK(cudaMemGetInfo(free, total));
  });
  a.reset();  // "async": the pool is trimmed and destroyed before the next pattern
  return r;
}

ChurnResult memory_churn_simulated(const std::string& pattern, uint64_t seed,
                                   double budget_fraction, size_t capacity) {
  const PatternDesc& pat = find_pattern(pattern);
  check_fraction(budget_fraction);
  SimulatedAllocator a(round_down(capacity, kMemoryGranule));
  return run_churn(a, pat, seed, budget_fraction, [&a, capacity](size_t* free, size_t* total) {
    *free = a.free_bytes();
    *total = capacity;
  });
}

BandwidthResult hbm_bandwidth(int device, const std::string& kind, size_t bytes, int warmup,
                              int iters) {
  const std::vector<std::string> kinds = hbm_kinds();
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
    throw std::invalid_argument("unknown HBM measurement '" + kind + "' (" + join(kinds) + ")");
  }
  if (iters < 1 || warmup < 0) throw std::invalid_argument("need iters >= 1, warmup >= 0");
  const size_t n = bytes / 16;  // uint4 elements
  if (n == 0) throw std::invalid_argument("buffer size below 16 bytes");
  const size_t size = n * 16;
  check_device(device);
  ScopedDevice on(device);

  const bool reads = kind != "write";
  const bool writes = kind != "read";
  std::unique_ptr<DeviceBuffer> src, dst, out;
  if (reads) src = allocate(device, size, "the source buffer");
  if (writes) dst = allocate(device, size, "the destination buffer");
  const unsigned grid = kind == "copy_sm" ? fill_grid(device, copy_kernel)
                        : kind == "read"  ? fill_grid(device, read_kernel)
                        : kind == "write" ? fill_grid(device, write_kernel)
                                          : 0;
  if (kind == "read") out = allocate(device, size_t(grid) * sizeof(uint32_t), "the result buffer");

  BandwidthResult r;
  r.bytes_read = reads ? size : 0;
  r.bytes_written = writes ? size : size_t(grid) * sizeof(uint32_t);

  Stream s(device);
  Event start(device, true), end(device, true);
  const auto* in = reads ? static_cast<const uint4*>(src->get()) : nullptr;
  auto* to = writes ? static_cast<uint4*>(dst->get()) : nullptr;
  for (int it = -warmup; it < iters; ++it) {
    MGPU_CUDA_CHECK(cudaEventRecord(start.get(), s.get()));
    if (kind == "copy_ce") {
      MGPU_CUDA_CHECK(cudaMemcpyAsync(to, in, size, cudaMemcpyDeviceToDevice, s.get()));
    } else if (kind == "copy_sm") {
      copy_kernel<<<grid, kThreads, 0, s.get()>>>(in, to, n);
    } else if (kind == "read") {
      read_kernel<<<grid, kThreads, 0, s.get()>>>(in, n, static_cast<uint32_t*>(out->get()));
    } else {
      write_kernel<<<grid, kThreads, 0, s.get()>>>(to, n, 0x5A5A0000u + static_cast<uint32_t>(it));
    }
    MGPU_CUDA_CHECK(cudaGetLastError());
    MGPU_CUDA_CHECK(cudaEventRecord(end.get(), s.get()));
    MGPU_CUDA_CHECK(cudaEventSynchronize(end.get()));
    if (it >= 0) r.seconds.push_back(elapsed(start, end));
  }
  return r;
}

}  // namespace mgpu
