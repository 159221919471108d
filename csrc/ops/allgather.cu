// allgather: every rank ends with all ranks' buffers, in rank order. The size is the gathered
// output; each rank contributes size/n. busbw = algbw * (n-1)/n.
#include "op.hpp"

namespace mgpu {
namespace {

OpCounts counts(size_t bytes, size_t type_size, int nranks) {
  OpCounts c;
  const size_t per_rank = bytes / type_size / static_cast<size_t>(nranks);
  c.count = c.send_count = per_rank;
  c.recv_count = per_rank * static_cast<size_t>(nranks);
  c.bytes = c.recv_count * type_size;
  c.send_inplace_offset = per_rank;
  return c;
}

Expect expect(int /*rank*/, int /*nranks*/, int /*root*/, const OpCounts& c) {
  Expect e;
  e.chunk = c.send_count;
  e.count = c.recv_count;
  return e;
}

ncclResult_t launch(const LaunchArgs& a) {
  return ncclAllGather(a.send, a.recv, a.count, a.type, a.comm, a.stream);
}

const OpDesc allgather{"allgather", false, false, true, counts, expect, launch};
MGPU_REGISTER_OP(allgather);

}  // namespace
}  // namespace mgpu
