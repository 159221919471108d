#include "links.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>

#include "cuda_util.hpp"
#include "errors.hpp"

namespace mgpu {
namespace {

// 16-byte loads from (possibly peer) memory, 16-byte stores to local memory.
__global__ void read_copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                 size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = src[i];
  }
}

__global__ void chase_kernel(const uint32_t* buf, uint32_t start, int loads, uint32_t* out) {
  uint32_t i = start;
  for (int k = 0; k < loads; ++k) i = buf[i];
  *out = i;  // keeps the chain alive
}

void enable_peer(int a, int b) {
  ScopedDevice on(a);
  const cudaError_t st = cudaDeviceEnablePeerAccess(b, 0);
  if (st == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return;
  }
  MGPU_CUDA_CHECK(st);
}

// Times `iters` rounds of one or two legs running at once. A leg enqueues its copy on its
// stream; the first leg's stream carries the timing events and waits for the second.
std::vector<double> time_legs(const std::vector<std::pair<Stream*, std::function<void()>>>& legs,
                              int warmup, int iters) {
  Stream& first = *legs[0].first;
  Event start(first.device(), true), end(first.device(), true);
  std::vector<std::unique_ptr<Event>> join;
  for (const auto& leg : legs) join.push_back(std::make_unique<Event>(leg.first->device(), false));
  std::vector<double> out;
  for (int it = -warmup; it < iters; ++it) {
    {
      ScopedDevice on(first.device());
      MGPU_CUDA_CHECK(cudaEventRecord(start.get(), first.get()));
    }
    for (size_t l = 0; l < legs.size(); ++l) {
      Stream& s = *legs[l].first;
      ScopedDevice on(s.device());
      if (l > 0) MGPU_CUDA_CHECK(cudaStreamWaitEvent(s.get(), start.get(), 0));
      legs[l].second();
      MGPU_CUDA_CHECK(cudaEventRecord(join[l]->get(), s.get()));
    }
    {
      ScopedDevice on(first.device());
      for (size_t l = 1; l < legs.size(); ++l) {
        MGPU_CUDA_CHECK(cudaStreamWaitEvent(first.get(), join[l]->get(), 0));
      }
      MGPU_CUDA_CHECK(cudaEventRecord(end.get(), first.get()));
      MGPU_CUDA_CHECK(cudaEventSynchronize(end.get()));
    }
    if (it >= 0) out.push_back(elapsed(start, end));
  }
  return out;
}

}  // namespace

bool can_access_peer(int a, int b) {
  check_device(a);
  check_device(b);
  int ab = 0, ba = 0;
  MGPU_CUDA_CHECK(cudaDeviceCanAccessPeer(&ab, a, b));
  MGPU_CUDA_CHECK(cudaDeviceCanAccessPeer(&ba, b, a));
  return ab && ba;
}

CopyResult measure_copy(const CopyArgs& a) {
  check_device(a.src);
  check_device(a.dst);
  if (a.src == a.dst) throw std::invalid_argument("source and destination are the same GPU");
  if (a.engine != "ce" && a.engine != "sm") {
    throw std::invalid_argument("engine must be 'ce' or 'sm'");
  }
  if (a.iters < 1 || a.warmup < 0) throw std::invalid_argument("need iters >= 1, warmup >= 0");
  const size_t bytes = a.bytes / 16 * 16;
  if (bytes == 0) throw std::invalid_argument("copy size below 16 bytes");
  CopyResult r;
  r.peer_access = can_access_peer(a.src, a.dst);
  if (r.peer_access) {
    enable_peer(a.src, a.dst);
    enable_peer(a.dst, a.src);
  } else if (a.engine == "sm") {
    throw std::invalid_argument("no peer access between GPU " + std::to_string(a.src) +
                                " and GPU " + std::to_string(a.dst) + ": SM copies need it");
  }
  DeviceBuffer src_buf(a.src, bytes), dst_buf(a.dst, bytes);
  DeviceBuffer src_in(a.src, a.bidirectional ? bytes : 16), dst_out(a.dst, a.bidirectional ? bytes : 16);
  // "ce": the copy is issued on the source GPU's stream. "sm": a kernel on the reading GPU.
  Stream s_src(a.src), s_dst(a.dst);
  int sms = 0;
  MGPU_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a.dst));
  const unsigned blocks = static_cast<unsigned>(sms) * 4;
  auto ce = [bytes](Stream& s, void* dst, int dst_dev, const void* src, int src_dev) {
    return [&s, bytes, dst, dst_dev, src, src_dev] {
      MGPU_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, bytes, s.get()));
    };
  };
  auto sm = [bytes, blocks](Stream& s, void* dst, const void* src) {
    return [&s, bytes, blocks, dst, src] {
      read_copy_kernel<<<blocks, 512, 0, s.get()>>>(static_cast<const uint4*>(src),
                                                   static_cast<uint4*>(dst), bytes / 16);
      MGPU_CUDA_CHECK(cudaGetLastError());
    };
  };
  std::vector<std::pair<Stream*, std::function<void()>>> legs;
  if (a.engine == "ce") {
    legs.emplace_back(&s_src, ce(s_src, dst_buf.get(), a.dst, src_buf.get(), a.src));
    if (a.bidirectional) {
      legs.emplace_back(&s_dst, ce(s_dst, src_in.get(), a.src, dst_out.get(), a.dst));
    }
  } else {
    legs.emplace_back(&s_dst, sm(s_dst, dst_buf.get(), src_buf.get()));
    if (a.bidirectional) legs.emplace_back(&s_src, sm(s_src, src_in.get(), dst_out.get()));
  }
  r.seconds = time_legs(legs, a.warmup, a.iters);
  return r;
}

std::vector<double> measure_read_latency(int reader, int owner, size_t span_bytes, int loads,
                                         int iters) {
  check_device(reader);
  check_device(owner);
  if (loads < 1 || iters < 1) throw std::invalid_argument("need loads >= 1, iters >= 1");
  constexpr size_t kSlot = 256 / sizeof(uint32_t);  // slots 256 bytes apart
  const size_t slots = span_bytes / 256;
  if (slots < 2) throw std::invalid_argument("span below 512 bytes");
  if (reader != owner) {
    if (!can_access_peer(reader, owner)) {
      throw std::invalid_argument("no peer access between GPU " + std::to_string(reader) +
                                  " and GPU " + std::to_string(owner));
    }
    enable_peer(reader, owner);
  }
  // A random cycle through all slots, so that no prefetcher or cache line helps.
  std::vector<uint32_t> order(slots);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937 rng(12345);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<uint32_t> host(slots * kSlot, 0);
  for (size_t k = 0; k < slots; ++k) {
    host[order[k] * kSlot] = static_cast<uint32_t>(order[(k + 1) % slots] * kSlot);
  }
  DeviceBuffer chain(owner, host.size() * sizeof(uint32_t));
  {
    ScopedDevice on(owner);
    MGPU_CUDA_CHECK(cudaMemcpy(chain.get(), host.data(), host.size() * sizeof(uint32_t),
                               cudaMemcpyHostToDevice));
  }
  DeviceBuffer out(reader, sizeof(uint32_t));
  Stream s(reader);
  const auto* buf = static_cast<const uint32_t*>(chain.get());
  const uint32_t start = order[0] * static_cast<uint32_t>(kSlot);
  std::vector<std::pair<Stream*, std::function<void()>>> legs;
  legs.emplace_back(&s, [&] {
    chase_kernel<<<1, 1, 0, s.get()>>>(buf, start, loads, static_cast<uint32_t*>(out.get()));
    MGPU_CUDA_CHECK(cudaGetLastError());
  });
  std::vector<double> t = time_legs(legs, 1, iters);
  for (double& x : t) x /= loads;
  return t;
}

std::vector<double> measure_host_copy(int dev, size_t bytes, bool to_device, int warmup,
                                      int iters) {
  check_device(dev);
  if (bytes == 0 || iters < 1 || warmup < 0) {
    throw std::invalid_argument("need bytes > 0, iters >= 1, warmup >= 0");
  }
  void* host = nullptr;
  MGPU_CUDA_CHECK(cudaMallocHost(&host, bytes));
  std::vector<double> t;
  try {
    std::fill_n(static_cast<unsigned char*>(host), bytes, static_cast<unsigned char>(0x5A));
    DeviceBuffer d(dev, bytes);
    Stream s(dev);
    std::vector<std::pair<Stream*, std::function<void()>>> legs;
    legs.emplace_back(&s, [&] {
      MGPU_CUDA_CHECK(cudaMemcpyAsync(to_device ? d.get() : host, to_device ? host : d.get(),
                                      bytes,
                                      to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                      s.get()));
    });
    t = time_legs(legs, warmup, iters);
  } catch (...) {
    cudaFreeHost(host);
    throw;
  }
  MGPU_CUDA_WARN(cudaFreeHost(host));
  return t;
}

}  // namespace mgpu
