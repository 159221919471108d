// alltoall: rank r sends block j of its buffer to rank j and receives rank j's block r into
// block j. The size is the whole per-rank buffer. busbw = algbw * (n-1)/n.
#include "op.hpp"

namespace mgpu {
namespace {

OpCounts counts(size_t bytes, size_t type_size, int nranks) {
  OpCounts c;
  const size_t per_peer = bytes / type_size / static_cast<size_t>(nranks);
  c.count = per_peer;
  c.send_count = c.recv_count = per_peer * static_cast<size_t>(nranks);
  c.bytes = c.send_count * type_size;
  return c;
}

Expect expect(int rank, int /*nranks*/, int /*root*/, const OpCounts& c) {
  Expect e;
  e.chunk = c.count;
  e.base = static_cast<size_t>(rank) * c.count;
  e.count = c.recv_count;
  return e;
}

// Grouped point-to-point, as nccl-tests' alltoall does (the reference the figures compare with).
ncclResult_t launch(const LaunchArgs& a) {
  const size_t block_bytes = a.count * a.type_size;
  ncclResult_t res = ncclGroupStart();
  if (res != ncclSuccess) return res;
  for (int peer = 0; peer < a.nranks && res == ncclSuccess; ++peer) {
    const size_t off = static_cast<size_t>(peer) * block_bytes;
    res = ncclSend(static_cast<const char*>(a.send) + off, a.count, a.type, peer, a.comm,
                   a.stream);
    if (res == ncclSuccess) {
      res = ncclRecv(static_cast<char*>(a.recv) + off, a.count, a.type, peer, a.comm, a.stream);
    }
  }
  const ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

const OpDesc alltoall{"alltoall", false, false, false, counts, expect, launch};
MGPU_REGISTER_OP(alltoall);

}  // namespace
}  // namespace mgpu
