// reduce: the root ends with the reduction of all ranks' buffers. busbw = algbw.
#include "op.hpp"

namespace mgpu {
namespace {

OpCounts counts(size_t bytes, size_t type_size, int /*nranks*/) {
  OpCounts c;
  c.count = c.send_count = c.recv_count = bytes / type_size;
  c.bytes = c.count * type_size;
  return c;
}

Expect expect(int rank, int /*nranks*/, int root, const OpCounts& c) {
  Expect e;
  e.defined = rank == root;
  e.reduce = true;
  e.count = c.recv_count;
  return e;
}

ncclResult_t launch(const LaunchArgs& a) {
  return ncclReduce(a.send, a.recv, a.count, a.type, a.redop, a.root, a.comm, a.stream);
}

const OpDesc reduce{"reduce", true, true, true, counts, expect, launch};
MGPU_REGISTER_OP(reduce);

}  // namespace
}  // namespace mgpu
