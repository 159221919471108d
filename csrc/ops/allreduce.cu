// allreduce: every rank ends with the reduction of all ranks' buffers.
// busbw = algbw * 2(n-1)/n (mgpu_bench/formulas.py).
#include "op.hpp"

namespace mgpu {
namespace {

Expect expect(int /*rank*/, int /*nranks*/, int /*root*/, const OpCounts& c) {
  Expect e;
  e.reduce = true;
  e.count = c.recv_count;
  return e;
}

ncclResult_t launch(const LaunchArgs& a) {
  return ncclAllReduce(a.send, a.recv, a.count, a.type, a.redop, a.comm, a.stream);
}

const OpDesc allreduce{"allreduce", true, false, true, whole_buffer_counts, expect, launch};
MGPU_REGISTER_OP(allreduce);

}  // namespace
}  // namespace mgpu
