// reduce: the root ends with the reduction of all ranks' buffers. busbw = algbw.
#include "op.hpp"

namespace mgpu {
namespace {

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

const OpDesc reduce{"reduce", true, true, true, whole_buffer_counts, expect, launch};
MGPU_REGISTER_OP(reduce);

}  // namespace
}  // namespace mgpu
