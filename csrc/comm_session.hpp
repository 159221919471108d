// A set of NCCL ranks driven by this process: one host thread, one CUDA stream and one
// communicator per local GPU. In one process the session holds every rank; under a launcher
// (torchrun, Slurm, MPI) each process holds one rank and the NCCL unique id comes from the
// launcher's store. Every measurement runs the same loop for every op (measure()).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtype.hpp"
#include "op.hpp"

namespace mgpu {

struct MeasureArgs {
  std::string op;
  std::string dtype;
  std::string redop = "sum";
  size_t bytes = 0;  // requested size (nccl-tests' size column), rounded down by the op
  bool inplace = false;
  int root = 0;
  int warmup_iters = 5;
  int iters = 0;  // 0: choose from min_time_s (agreed across all ranks: the max estimate wins)
  double min_time_s = 0.03;  // as mgpu_bench.measurement.TimingOptions
  int min_iters = 20;
  int max_iters = 10000;
  bool graph = false;
  bool check = true;
  double sample_target_s = 0.5e-3;  // see MeasureResult::samples
  // Test hook: this global rank overwrites the first element of its output after the checked
  // call, so tests can prove a corruption is counted. -1: off.
  int corrupt_rank = -1;
  // Test hook: this global rank fails before its first collective, so tests can prove that
  // the other ranks stop at once and that rank's error is the one reported. -1: off.
  int fail_rank = -1;
};

struct MeasureResult {
  OpCounts counts;
  int iters = 0;
  // Per local rank: (end - start) / iters of a back-to-back burst with events only at its ends
  // (what nccl-tests reports as time).
  std::vector<double> burst_seconds;
  // Per local rank, per sample: seconds per iteration over `batch` consecutive iterations,
  // from events recorded every `batch` iterations in a second pass of the same length (so the
  // burst carries no inner events). batch is the smallest count whose run lasts >= 0.5 ms at
  // the warm-up estimate, so that an event's own cost (a few us) stays under 1%; sizes whose
  // iteration takes longer get one sample per iteration.
  std::vector<std::vector<double>> samples;
  int batch = 1;
  // Per local rank: elements that differ from the known result (0 when check is off).
  std::vector<uint64_t> wrong;
  // Per local rank: the index of the first of them in the checked output (-1: none), and that
  // element as read and as expected.
  std::vector<int64_t> first_wrong;
  std::vector<double> first_wrong_got;
  std::vector<double> first_wrong_want;
  double warmup_seconds_per_iter = 0.0;  // the estimate the iteration count came from
};

struct Worker;
struct SessionShared;

class CommSession {
 public:
  // devices: local CUDA devices, one rank each, global ranks first_rank, first_rank + 1, ...
  // unique_id: NCCL_UNIQUE_ID_BYTES bytes from nccl_unique_id() on one process.
  // interrupt_check: called about every 0.1 s while waiting for the ranks (initialisation
  // included); an exception it throws (the Python layer raises KeyboardInterrupt on Ctrl-C)
  // aborts the communicators and propagates.
  CommSession(std::vector<int> devices, int nranks, int first_rank, const std::string& unique_id,
              double timeout_s, std::function<void()> interrupt_check = {});
  ~CommSession();
  CommSession(const CommSession&) = delete;
  CommSession& operator=(const CommSession&) = delete;

  // Blocks until every local rank is done; throws the first rank's error. After a timeout or
  // an NCCL error the communicators are aborted and the session is unusable (alive() false).
  // An OutOfMemoryError leaves it usable.
  MeasureResult measure(const MeasureArgs& args);

  bool alive() const { return !m_dead; }
  int nranks() const { return m_nranks; }
  int first_rank() const { return m_first_rank; }
  const std::vector<int>& devices() const { return m_devices; }
  double timeout() const { return m_timeout_s; }
  void set_timeout(double seconds) { m_timeout_s = seconds; }
  // Aborts all communicators now; the session becomes unusable.
  void abort();

 private:
  // Runs fn on every worker thread and waits, enforcing the timeout.
  void run_on_all(const std::function<void(Worker&)>& fn, const std::string& what);
  void post(Worker& w, std::function<void(Worker&)> fn);
  // Waits until at most `allowed` ranks are still running a task; false on timeout.
  bool wait_idle(std::chrono::steady_clock::duration limit, int allowed = 0);
  static bool is_busy(Worker& w);
  void abort_all_comms();
  void shutdown() noexcept;

  std::vector<int> m_devices;
  int m_nranks;
  int m_first_rank;
  double m_timeout_s;
  std::vector<std::unique_ptr<Worker>> m_workers;
  std::shared_ptr<SessionShared> m_shared;
  std::atomic<bool> m_dead{false};
  std::function<void()> m_interrupt_check;
};

std::string nccl_unique_id();

}  // namespace mgpu
