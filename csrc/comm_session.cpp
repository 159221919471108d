#include "comm_session.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "comm_data.cuh"
#include "errors.hpp"

namespace mgpu {
namespace {

using Clock = std::chrono::steady_clock;

// Thrown by a rank that stops because another rank failed or the session timed out; the
// coordinator reports the first rank's own error instead.
class Aborted : public Error {
 public:
  Aborted() : Error("aborted", 0) {}
};

ncclRedOp_t parse_redop(const std::string& name) {
  if (name == "sum") return ncclSum;
  if (name == "max") return ncclMax;
  if (name == "min") return ncclMin;
  if (name == "avg") return ncclAvg;
  throw std::invalid_argument("unknown reduction '" + name + "' (use sum, max, min or avg)");
}

}  // namespace

// What the coordinator and the worker threads share. Owned jointly (shared_ptr) so that a
// worker left behind stuck in the driver never touches freed memory.
struct SessionShared {
  std::mutex mu;
  std::condition_variable cv;
  int pending = 0;      // workers still running the current task
  bool failed = false;  // a worker failed in a way that stops the others
  std::atomic<bool> abort_requested{false};
};

namespace {

// Out-of-memory is agreed by all ranks (each throws it) and an Aborted rank is a consequence;
// any other error on one rank would leave the others waiting in a collective.
bool stops_others(const std::exception_ptr& err) {
  if (!err) return false;
  try {
    std::rethrow_exception(err);
  } catch (const OutOfMemoryError&) {
    return false;
  } catch (const Aborted&) {
    return false;
  } catch (...) {
    return true;
  }
}

}  // namespace

// One local rank: its thread, stream, communicator and buffers. Everything here is touched
// only by its own thread, except `comm` by CommSession::abort_all_comms once the thread has
// stopped polling (or is stuck inside NCCL, which ncclCommAbort exists to release).
struct Worker {
  size_t index = 0;  // position in the session: its slot in results
  int device = 0;
  int rank = 0;
  int nranks = 0;
  std::shared_ptr<SessionShared> shared;
  const std::atomic<bool>* abort_requested = nullptr;  // &shared->abort_requested

  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::function<void(Worker&)> task;
  bool has_task = false;
  bool busy = false;
  bool quit = false;
  std::exception_ptr error;

  cudaStream_t stream = nullptr;
  ncclComm_t comm = nullptr;
  bool comm_aborted = false;
  void* send = nullptr;
  size_t send_cap = 0;
  void* recv = nullptr;
  size_t recv_cap = 0;
  int64_t* d_agree = nullptr;
  unsigned long long* d_wrong = nullptr;  // [0] wrong count, [1] first wrong, [2..3] its values
  int64_t* h_scalars = nullptr;  // pinned: [0] agreement value, [1..4] d_wrong's copy
  cudaEvent_t sync_event = nullptr;
  std::vector<cudaEvent_t> timing_events;

  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [this] { return has_task || quit; });
      if (quit) return;
      auto fn = std::move(task);
      has_task = false;
      lock.unlock();
      std::exception_ptr err;
      try {
        fn(*this);
      } catch (...) {
        err = std::current_exception();
      }
      const bool fatal = stops_others(err);
      if (fatal) shared->abort_requested = true;  // the other ranks stop polling at once
      lock.lock();
      error = err;
      busy = false;
      {
        std::lock_guard<std::mutex> g(shared->mu);
        --shared->pending;
        shared->failed = shared->failed || fatal;
      }
      shared->cv.notify_all();
    }
  }

  // Waits for `ev`, polling so that an NCCL error, another rank's failure or the session's
  // abort ends the wait instead of a hang.
  void wait(cudaEvent_t ev) {
    for (int polls = 0;; ++polls) {
      const cudaError_t st = cudaEventQuery(ev);
      if (st == cudaSuccess) return;
      if (st != cudaErrorNotReady) MGPU_CUDA_CHECK(st);
      if (abort_requested->load()) throw Aborted();
      ncclResult_t async = ncclSuccess;
      MGPU_NCCL_CHECK(comm, ncclCommGetAsyncError(comm, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        throw_nccl(async, comm, "ncclCommGetAsyncError (asynchronous NCCL failure)", __FILE__,
                   __LINE__);
      }
      if (polls < 2000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  // Completes an NCCL call: an error throws; ncclInProgress (a call still connecting in the
  // background) polls the communicator until it is enqueued, fails, or the session aborts.
  void settle(ncclResult_t res, const char* what) {
    if (res == ncclSuccess) return;
    if (abort_requested->load()) throw Aborted();  // the communicator may be gone already
    if (res != ncclInProgress) throw_nccl(res, comm, what, __FILE__, __LINE__);
    for (int polls = 0;; ++polls) {
      ncclResult_t st = ncclSuccess;
      MGPU_NCCL_CHECK(comm, ncclCommGetAsyncError(comm, &st));
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) throw_nccl(st, comm, what, __FILE__, __LINE__);
      if (abort_requested->load()) throw Aborted();
      if (polls < 2000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }

  void sync() {
    MGPU_CUDA_CHECK(cudaEventRecord(sync_event, stream));
    wait(sync_event);
  }

  // The maximum of `v` over all ranks, through NCCL itself (so it works across processes).
  int64_t agree_max(int64_t v) {
    h_scalars[0] = v;
    MGPU_CUDA_CHECK(cudaMemcpyAsync(d_agree, &h_scalars[0], sizeof(int64_t),
                                    cudaMemcpyHostToDevice, stream));
    settle(ncclAllReduce(d_agree, d_agree, 1, ncclInt64, ncclMax, comm, stream), "ncclAllReduce");
    MGPU_CUDA_CHECK(cudaMemcpyAsync(&h_scalars[0], d_agree, sizeof(int64_t),
                                    cudaMemcpyDeviceToHost, stream));
    sync();
    return h_scalars[0];
  }

  cudaEvent_t timing_event(size_t i) {
    while (timing_events.size() <= i) {
      cudaEvent_t ev = nullptr;
      MGPU_CUDA_CHECK(cudaEventCreate(&ev));
      timing_events.push_back(ev);
    }
    return timing_events[i];
  }

  double elapsed(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0.0f;
    MGPU_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return static_cast<double>(ms) * 1e-3;
  }

  void free_buffers() noexcept {
    if (send) MGPU_CUDA_WARN(cudaFree(send));
    if (recv) MGPU_CUDA_WARN(cudaFree(recv));
    send = recv = nullptr;
    send_cap = recv_cap = 0;
  }

  // Grows the buffers (a zero size frees one); false when the device is out of memory (the
  // error is cleared).
  bool ensure_buffers(size_t send_bytes, size_t recv_bytes) {
    auto grow = [](void** ptr, size_t* cap, size_t want) {
      if (want == 0) {
        if (*ptr) MGPU_CUDA_CHECK(cudaFree(*ptr));
        *ptr = nullptr;
        *cap = 0;
        return true;
      }
      if (want <= *cap && *ptr != nullptr) return true;
      if (*ptr) MGPU_CUDA_CHECK(cudaFree(*ptr));
      *ptr = nullptr;
      *cap = 0;
      const cudaError_t st = cudaMalloc(ptr, std::max<size_t>(want, 256));
      if (st == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        *ptr = nullptr;
        return false;
      }
      MGPU_CUDA_CHECK(st);
      *cap = want;
      return true;
    };
    return grow(&send, &send_cap, send_bytes) && grow(&recv, &recv_cap, recv_bytes);
  }

  void init(const ncclUniqueId& id) {
    MGPU_CUDA_CHECK(cudaSetDevice(device));
    MGPU_CUDA_CHECK(cudaFree(nullptr));  // create the context before NCCL does
    MGPU_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    MGPU_CUDA_CHECK(cudaEventCreateWithFlags(&sync_event, cudaEventDisableTiming));
    MGPU_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_agree), sizeof(int64_t)));
    MGPU_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_wrong), 4 * sizeof(unsigned long long)));
    MGPU_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_scalars), 5 * sizeof(int64_t)));
    // A blocking communicator: measured on 2x H200, a non-blocking one (which would let a
    // stuck initialisation be aborted) put a background hand-off into every launch, 8-byte
    // allreduce 7 us -> 58 us. A rank that never arrives is handled by the session's timeout.
    MGPU_NCCL_CHECK(nullptr, ncclCommInitRank(&comm, nranks, id, rank));
  }

  void destroy() noexcept {
    free_buffers();
    for (cudaEvent_t ev : timing_events) MGPU_CUDA_WARN(cudaEventDestroy(ev));
    timing_events.clear();
    if (sync_event) MGPU_CUDA_WARN(cudaEventDestroy(sync_event));
    if (d_agree) MGPU_CUDA_WARN(cudaFree(d_agree));
    if (d_wrong) MGPU_CUDA_WARN(cudaFree(d_wrong));
    if (h_scalars) MGPU_CUDA_WARN(cudaFreeHost(h_scalars));
    sync_event = nullptr;
    d_agree = nullptr;
    d_wrong = nullptr;
    h_scalars = nullptr;
    if (comm && !comm_aborted) {
      // Finalize (non-blocking: poll it, a few seconds at most), then destroy; abort if the
      // finalize does not complete.
      ncclResult_t st = ncclCommFinalize(comm);
      const auto until = Clock::now() + std::chrono::seconds(5);
      while (st == ncclInProgress && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) break;
      }
      if (st == ncclSuccess) {
        MGPU_NCCL_WARN(ncclCommDestroy(comm));
      } else {
        MGPU_NCCL_WARN(ncclCommAbort(comm));
      }
    }
    comm = nullptr;
    if (stream) MGPU_CUDA_WARN(cudaStreamDestroy(stream));
    stream = nullptr;
  }

  void measure(const MeasureArgs& a, MeasureResult& out, size_t slot);
};

void Worker::measure(const MeasureArgs& a, MeasureResult& out, size_t slot) {
  const OpDesc& op = find_op(a.op);
  const DTypeInfo& ti = dtype_info(a.dtype);
  const ncclRedOp_t redop = parse_redop(a.redop);
  const OpCounts c = op.counts(a.bytes, ti.size, nranks);
  const size_t ts = ti.size;
  // Out-of-place: a send and a receive buffer. In-place: one buffer holding both regions.
  const size_t work_bytes = a.inplace ? std::max(c.send_count, c.recv_count) * ts
                                      : c.recv_count * ts;
  const size_t send_bytes = a.inplace ? 0 : c.send_count * ts;

  if (a.fail_rank == rank) {
    throw CudaError("injected failure on rank " + std::to_string(rank) + " (test hook)",
                    static_cast<int>(cudaErrorUnknown));
  }

  // 1. Buffers, agreed: if any rank is out of memory, every rank stops at this size.
  const bool ok = ensure_buffers(send_bytes, work_bytes);
  if (agree_max(ok ? 0 : 1) != 0) {
    free_buffers();
    std::ostringstream os;
    os << "out of device memory for " << a.op << " at " << c.bytes << " bytes ("
       << (send_bytes + work_bytes) << " bytes of buffers per GPU)"
       << (ok ? " on another rank" : "");
    throw OutOfMemoryError(os.str(), static_cast<int>(cudaErrorMemoryAllocation));
  }

  LaunchArgs la{};
  la.count = c.count;
  la.type = nccl_type(ti.type);
  la.type_size = ts;
  la.redop = redop;
  la.root = a.root;
  la.rank = rank;
  la.nranks = nranks;
  la.comm = comm;
  la.stream = stream;
  char* work = static_cast<char*>(recv);
  if (a.inplace) {
    la.send = work + c.send_inplace_offset * static_cast<size_t>(rank) * ts;
    la.recv = work + c.recv_inplace_offset * static_cast<size_t>(rank) * ts;
  } else {
    la.send = send;
    la.recv = recv;
  }
  auto launch = [&]() {
    if (abort_requested->load()) throw Aborted();
    settle(op.launch(la), op.name);
  };
  const Pattern pattern = make_pattern(ti.type, op.reduces, redop, nranks);
  fill_values(const_cast<void*>(la.send), ti.type, c.send_count, rank, pattern, stream);

  // 2. Warm-up; its later iterations give the per-iteration estimate.
  const int warm = std::max(2, a.warmup_iters);
  cudaEvent_t w0 = timing_event(0), w1 = timing_event(1);
  launch();
  MGPU_CUDA_CHECK(cudaEventRecord(w0, stream));
  for (int i = 1; i < warm; ++i) launch();
  MGPU_CUDA_CHECK(cudaEventRecord(w1, stream));
  sync();
  const double estimate = elapsed(w0, w1) / (warm - 1);

  // 3. Iteration count: fixed, or enough to fill min_time at the slowest rank's estimate.
  const double agreed_estimate =
      static_cast<double>(agree_max(static_cast<int64_t>(estimate * 1e9))) * 1e-9;
  int iters = a.iters;
  if (iters <= 0) {
    const double slowest = agreed_estimate;
    const double want = slowest > 0 ? std::ceil(a.min_time_s / slowest) : a.max_iters;
    iters = static_cast<int>(std::clamp<double>(want, a.min_iters, a.max_iters));
  }

  // Iterations per sample (see MeasureResult::samples), identical on all ranks because it
  // derives from agreed figures only.
  const int want_batch =
      agreed_estimate > 0 ? static_cast<int>(std::ceil(a.sample_target_s / agreed_estimate)) : 1;
  const int batch = std::clamp(want_batch, 1, std::max(1, iters / 20));
  const int nsamples = iters / batch;

  // 4. Burst: iters back to back, events only at the ends.
  // 5. Samples: nsamples steps of `batch` iterations, an event after each step.
  cudaEvent_t start = timing_event(0), end = timing_event(1);
  for (int i = 0; i <= nsamples; ++i) timing_event(static_cast<size_t>(i) + 2);
  auto launch_n = [&](int n) {
    for (int i = 0; i < n; ++i) launch();
  };
  auto sampled = [&](const std::function<void()>& step) {
    MGPU_CUDA_CHECK(cudaEventRecord(timing_events[2], stream));
    for (int s = 0; s < nsamples; ++s) {
      step();
      MGPU_CUDA_CHECK(cudaEventRecord(timing_events[static_cast<size_t>(s) + 3], stream));
    }
    sync();
  };
  double burst = 0.0;
  if (!a.graph) {
    MGPU_CUDA_CHECK(cudaEventRecord(start, stream));
    launch_n(iters);
    MGPU_CUDA_CHECK(cudaEventRecord(end, stream));
    sync();
    burst = elapsed(start, end) / iters;
    sampled([&] { launch_n(batch); });
  } else {
    // The burst is one graph of `iters` calls; the samples replay a graph of `batch` calls
    // with events between replays (event nodes inside a graph were seen to add ~3 us per
    // 8-byte allreduce on H200). Each graph is replayed once untimed first.
    struct Exec {
      cudaGraphExec_t g = nullptr;
      ~Exec() {
        if (g) MGPU_CUDA_WARN(cudaGraphExecDestroy(g));
      }
    };
    auto capture = [&](int n, Exec& out) {
      cudaGraph_t graph = nullptr;
      MGPU_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      try {
        launch_n(n);
      } catch (...) {
        cudaStreamEndCapture(stream, &graph);
        if (graph) cudaGraphDestroy(graph);
        throw;
      }
      MGPU_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      const cudaError_t st = cudaGraphInstantiate(&out.g, graph, 0);
      MGPU_CUDA_WARN(cudaGraphDestroy(graph));
      MGPU_CUDA_CHECK(st);
      MGPU_CUDA_CHECK(cudaGraphLaunch(out.g, stream));  // warm-up replay
    };
    {
      Exec all;
      capture(iters, all);
      MGPU_CUDA_CHECK(cudaEventRecord(start, stream));
      MGPU_CUDA_CHECK(cudaGraphLaunch(all.g, stream));
      MGPU_CUDA_CHECK(cudaEventRecord(end, stream));
      sync();
      burst = elapsed(start, end) / iters;
    }
    Exec step;
    capture(batch, step);
    sampled([&] { MGPU_CUDA_CHECK(cudaGraphLaunch(step.g, stream)); });
  }
  std::vector<double> samples(static_cast<size_t>(nsamples));
  for (int s = 0; s < nsamples; ++s) {
    samples[static_cast<size_t>(s)] = elapsed(timing_events[static_cast<size_t>(s) + 2],
                                              timing_events[static_cast<size_t>(s) + 3]) / batch;
  }

  // 6. Check: poison the output, write known data, run once, count wrong elements on the GPU.
  uint64_t wrong = 0;
  int64_t first_wrong = -1;
  double first_got = 0.0, first_want = 0.0;
  if (a.check) {
    MGPU_CUDA_CHECK(cudaMemsetAsync(recv, 0x7F, work_bytes, stream));
    fill_values(const_cast<void*>(la.send), ti.type, c.send_count, rank, pattern, stream);
    MGPU_CUDA_CHECK(cudaMemsetAsync(d_wrong, 0, 4 * sizeof(unsigned long long), stream));
    MGPU_CUDA_CHECK(cudaMemsetAsync(d_wrong + 1, 0xFF, sizeof(unsigned long long), stream));
    launch();
    if (a.corrupt_rank == rank) MGPU_CUDA_CHECK(cudaMemsetAsync(la.recv, 0x7F, ts, stream));
    const Expect e = op.expect(rank, nranks, a.root, c);
    if (e.defined) check_values(la.recv, ti.type, e, pattern, redop, d_wrong, stream);
    MGPU_CUDA_CHECK(cudaMemcpyAsync(&h_scalars[1], d_wrong, 4 * sizeof(unsigned long long),
                                    cudaMemcpyDeviceToHost, stream));
    sync();
    wrong = static_cast<uint64_t>(h_scalars[1]);
    if (wrong != 0) {
      first_wrong = h_scalars[2];
      std::memcpy(&first_got, &h_scalars[3], sizeof(double));
      std::memcpy(&first_want, &h_scalars[4], sizeof(double));
    }
  }

  // Each worker writes only its own slot; the coordinator reads after all are done.
  if (slot == 0) {
    out.counts = c;
    out.iters = iters;
    out.batch = batch;
  }
  out.burst_seconds[slot] = burst;
  out.samples[slot] = std::move(samples);
  out.wrong[slot] = wrong;
  out.first_wrong[slot] = first_wrong;
  out.first_wrong_got[slot] = first_got;
  out.first_wrong_want[slot] = first_want;
  if (slot == 0) out.warmup_seconds_per_iter = estimate;
}

// ---------------------------------------------------------------------------------------------

std::string nccl_unique_id() {
  ncclUniqueId id;
  MGPU_NCCL_CHECK(nullptr, ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}

CommSession::CommSession(std::vector<int> devices, int nranks, int first_rank,
                         const std::string& unique_id, double timeout_s,
                         std::function<void()> interrupt_check)
    : m_devices(std::move(devices)),
      m_nranks(nranks),
      m_first_rank(first_rank),
      m_timeout_s(timeout_s),
      m_shared(std::make_shared<SessionShared>()),
      m_interrupt_check(std::move(interrupt_check)) {
  if (m_devices.empty()) throw std::invalid_argument("no devices given");
  if (nranks < 1 || first_rank < 0 ||
      first_rank + static_cast<int>(m_devices.size()) > nranks) {
    throw std::invalid_argument("ranks out of range");
  }
  if (!(timeout_s > 0) || timeout_s > 1e6) {
    throw std::invalid_argument("the timeout must be between 0 and 1e6 seconds");
  }
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    throw std::invalid_argument("the NCCL unique id must be " +
                                std::to_string(NCCL_UNIQUE_ID_BYTES) + " bytes");
  }
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  for (size_t i = 0; i < m_devices.size(); ++i) {
    auto w = std::make_unique<Worker>();
    w->index = i;
    w->device = m_devices[i];
    w->rank = first_rank + static_cast<int>(i);
    w->nranks = nranks;
    w->shared = m_shared;
    w->abort_requested = &m_shared->abort_requested;
    Worker* raw = w.get();
    w->thread = std::thread([raw] { raw->loop(); });
    m_workers.push_back(std::move(w));
  }
  try {
    run_on_all([id](Worker& w) { w.init(id); }, "communicator initialisation");
  } catch (...) {
    shutdown();
    throw;
  }
}

CommSession::~CommSession() { shutdown(); }

void CommSession::post(Worker& w, std::function<void(Worker&)> fn) {
  {
    std::lock_guard<std::mutex> g(m_shared->mu);
    ++m_shared->pending;
  }
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.task = std::move(fn);
    w.has_task = true;
    w.busy = true;
    w.error = nullptr;
  }
  w.cv.notify_all();
}

bool CommSession::wait_idle(Clock::duration limit, int allowed) {
  std::unique_lock<std::mutex> lk(m_shared->mu);
  return m_shared->cv.wait_for(lk, limit, [&] { return m_shared->pending <= allowed; });
}

bool CommSession::is_busy(Worker& w) {
  std::lock_guard<std::mutex> lock(w.mu);
  return w.busy;
}

void CommSession::shutdown() noexcept {
  m_interrupt_check = nullptr;
  // Free every idle rank's buffers, events and stream, and its communicator unless aborted;
  // a rank still stuck in the driver is left behind with its Worker (never freed).
  int stuck = 0;
  for (auto& w : m_workers) {
    if (is_busy(*w)) {
      ++stuck;
    } else {
      post(*w, [](Worker& x) { x.destroy(); });
    }
  }
  wait_idle(std::chrono::seconds(10), stuck);
  for (auto& w : m_workers) {
    bool busy;
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->quit = true;
      busy = w->busy;
    }
    w->cv.notify_all();
    if (busy) {
      w->thread.detach();
      (void)w.release();
    } else {
      w->thread.join();
    }
  }
  m_workers.clear();
}

void CommSession::abort_all_comms() {
  for (auto& w : m_workers) {
    if (w->comm && !w->comm_aborted) {
      MGPU_CUDA_WARN(cudaSetDevice(w->device));
      MGPU_NCCL_WARN(ncclCommAbort(w->comm));
      w->comm_aborted = true;
    }
  }
}

void CommSession::abort() {
  if (m_dead) return;
  m_shared->abort_requested = true;
  // Polling ranks stop touching their communicators within microseconds. A rank still busy
  // after the grace period is blocked inside NCCL or CUDA; ncclCommAbort from this thread is
  // what releases it (as PyTorch's watchdog does).
  wait_idle(std::chrono::seconds(2));
  bool releasing = false;  // a busy rank whose communicator exists: the abort releases it
  for (auto& w : m_workers) releasing = releasing || (is_busy(*w) && w->comm != nullptr);
  abort_all_comms();
  m_dead = true;
  if (releasing) wait_idle(std::chrono::seconds(10));
}

void CommSession::run_on_all(const std::function<void(Worker&)>& fn, const std::string& what) {
  if (m_dead) {
    throw NcclError("the communicators were aborted after an earlier failure; start a new session",
                    static_cast<int>(ncclInvalidUsage));
  }
  {
    std::lock_guard<std::mutex> g(m_shared->mu);
    m_shared->failed = false;
  }
  for (auto& w : m_workers) post(*w, fn);

  // Wait until all ranks are done, one fails, the deadline passes, or (checked every 0.1 s)
  // the user interrupts.
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(m_timeout_s));
  bool timed_out = false;
  bool failed = false;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(m_shared->mu);
      const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
      m_shared->cv.wait_until(lk, slice,
                              [&] { return m_shared->pending == 0 || m_shared->failed; });
      failed = m_shared->failed;
      if (m_shared->pending == 0 || failed) break;
    }
    if (Clock::now() >= deadline) {
      timed_out = true;
      break;
    }
    if (m_interrupt_check) {
      try {
        m_interrupt_check();
      } catch (...) {
        abort();  // the interrupt wins; the communicators cannot be trusted mid-collective
        throw;
      }
    }
  }

  if (!failed && !timed_out) {
    // All done; out-of-memory (agreed by every rank) is the one error that leaves the
    // session usable.
    for (auto& w : m_workers) {
      if (w->error) std::rethrow_exception(w->error);
    }
    return;
  }
  abort();
  // The first rank's own error, if one reported it; else the timeout.
  for (auto& w : m_workers) {
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> lock(w->mu);
      err = w->error;
    }
    if (stops_others(err)) std::rethrow_exception(err);
  }
  std::ostringstream os;
  os << what << " did not finish within " << m_timeout_s
     << " s (--timeout; raise it for long runs); the NCCL communicators were aborted";
  throw TimeoutError(os.str(), static_cast<int>(ncclRemoteError));
}

namespace {

// A measurement's inputs and outputs, owned by the task so that no worker ever writes into a
// stack frame that is gone.
struct MeasureState {
  MeasureArgs args;
  MeasureResult out;
};

}  // namespace

MeasureResult CommSession::measure(const MeasureArgs& args) {
  const OpDesc& op = find_op(args.op);
  if (args.inplace && !op.inplace) {
    throw std::invalid_argument(args.op + " has no in-place form");
  }
  dtype_info(args.dtype);
  parse_redop(args.redop);
  if (args.root < 0 || args.root >= m_nranks) {
    throw std::invalid_argument("root " + std::to_string(args.root) + " is not a rank");
  }
  if (args.iters < 0 || args.min_iters < 1 || args.max_iters < args.min_iters ||
      !(args.min_time_s > 0) || args.min_time_s > 1e4 || !(args.sample_target_s > 0)) {
    throw std::invalid_argument(
        "iteration rule out of range: need iters >= 0, 1 <= min_iters <= max_iters, "
        "0 < min_time_s <= 1e4, sample_target_s > 0");
  }
  auto state = std::make_shared<MeasureState>();
  state->args = args;
  const size_t n = m_workers.size();
  state->out.burst_seconds.assign(n, 0.0);
  state->out.samples.assign(n, {});
  state->out.wrong.assign(n, 0);
  state->out.first_wrong.assign(n, -1);
  state->out.first_wrong_got.assign(n, 0.0);
  state->out.first_wrong_want.assign(n, 0.0);
  std::ostringstream what;
  what << args.op << " at " << args.bytes << " bytes";
  run_on_all([state](Worker& w) { w.measure(state->args, state->out, w.index); }, what.str());
  return state->out;
}

}  // namespace mgpu
