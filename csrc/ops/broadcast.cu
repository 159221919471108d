// broadcast: every rank ends with the root's buffer. busbw = algbw.
#include "op.hpp"

namespace mgpu {
namespace {

Expect expect(int /*rank*/, int /*nranks*/, int root, const OpCounts& c) {
  Expect e;
  e.from_rank = root;
  e.count = c.recv_count;
  return e;
}

ncclResult_t launch(const LaunchArgs& a) {
  return ncclBroadcast(a.send, a.recv, a.count, a.type, a.root, a.comm, a.stream);
}

const OpDesc broadcast{"broadcast", false, true, true, whole_buffer_counts, expect, launch};
MGPU_REGISTER_OP(broadcast);

}  // namespace
}  // namespace mgpu
