// reducescatter: rank r ends with block r of the reduction of all ranks' buffers. The size is
// the whole input; each rank receives size/n. busbw = algbw * (n-1)/n.
#include "op.hpp"

namespace mgpu {
namespace {

OpCounts counts(size_t bytes, size_t type_size, int nranks) {
  OpCounts c;
  const size_t per_rank = bytes / type_size / static_cast<size_t>(nranks);
  c.count = c.recv_count = per_rank;
  c.send_count = per_rank * static_cast<size_t>(nranks);
  c.bytes = c.send_count * type_size;
  c.recv_inplace_offset = per_rank;
  return c;
}

Expect expect(int rank, int /*nranks*/, int /*root*/, const OpCounts& c) {
  Expect e;
  e.reduce = true;
  e.base = static_cast<size_t>(rank) * c.recv_count;
  e.count = c.recv_count;
  return e;
}

ncclResult_t launch(const LaunchArgs& a) {
  return ncclReduceScatter(a.send, a.recv, a.count, a.type, a.redop, a.comm, a.stream);
}

const OpDesc reducescatter{"reducescatter", true, false, true, counts, expect, launch};
MGPU_REGISTER_OP(reducescatter);

}  // namespace
}  // namespace mgpu
