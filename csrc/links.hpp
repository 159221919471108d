// GPU-to-GPU and host-to-GPU copy probes (`mgpu-bench links`): raw seconds per copy, timed
// with CUDA events; bandwidths and verdicts are computed in Python.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace mgpu {

struct CopyArgs {
  int src = 0;
  int dst = 1;
  size_t bytes = size_t(256) << 20;
  std::string engine = "ce";   // "ce": cudaMemcpyPeerAsync (copy engines); "sm": a kernel on
                               // dst reading src's memory through peer mappings
  bool bidirectional = false;  // also copy dst -> src at the same time
  int warmup = 3;
  int iters = 10;
};

struct CopyResult {
  std::vector<double> seconds;  // per copy (both directions done, when bidirectional)
  bool peer_access = false;     // cudaDeviceCanAccessPeer both ways
};

// Throws std::invalid_argument for bad arguments, and for engine "sm" without peer access.
CopyResult measure_copy(const CopyArgs& args);

// Seconds per dependent 4-byte load issued by one thread on `reader` from memory of `owner`
// (a pointer chase over `span_bytes`, slots 256 bytes apart in random order).
std::vector<double> measure_read_latency(int reader, int owner, size_t span_bytes, int loads,
                                         int iters);

// Pinned host memory <-> device `dev`: seconds per copy of `bytes`.
std::vector<double> measure_host_copy(int dev, size_t bytes, bool to_device, int warmup,
                                      int iters);

bool can_access_peer(int a, int b);

}  // namespace mgpu
