// sendrecv: a ring of point-to-point transfers; rank r sends its buffer to rank r+1 and
// receives rank r-1's. busbw = algbw. No in-place form: with one buffer the peer's data can
// land before ours has left (seen on 2x H200 at 64 MiB: 13% of elements wrong), and nccl-tests'
// in-place sendrecv column measures that race.
#include "op.hpp"

namespace mgpu {
namespace {

Expect expect(int rank, int nranks, int /*root*/, const OpCounts& c) {
  Expect e;
  e.from_rank = (rank - 1 + nranks) % nranks;
  e.count = c.recv_count;
  return e;
}

ncclResult_t launch(const LaunchArgs& a) {
  const int next = (a.rank + 1) % a.nranks;
  const int prev = (a.rank - 1 + a.nranks) % a.nranks;
  ncclResult_t res = ncclGroupStart();
  if (res != ncclSuccess) return res;
  res = ncclSend(a.send, a.count, a.type, next, a.comm, a.stream);
  if (res == ncclSuccess) res = ncclRecv(a.recv, a.count, a.type, prev, a.comm, a.stream);
  const ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

const OpDesc sendrecv{"sendrecv", false, false, false, whole_buffer_counts, expect, launch};
MGPU_REGISTER_OP(sendrecv);

}  // namespace
}  // namespace mgpu
