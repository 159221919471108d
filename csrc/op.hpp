// A collective as the shared timing loop sees it (the nccl-tests idea): how a requested size
// becomes buffer counts, what each rank's output must hold, and how to enqueue the call.
// Each op lives in one file under csrc/ops/ and registers itself with MGPU_REGISTER_OP;
// nothing else needs to change to add one.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <string>
#include <vector>

namespace mgpu {

// Element counts for one measurement. `bytes` is what nccl-tests prints in its size column
// (per-rank buffer for allreduce, the whole gathered output for allgather, ...), after rounding
// the requested size down to what the op and rank count allow.
struct OpCounts {
  size_t bytes = 0;
  size_t count = 0;       // the count argument of the NCCL call
  size_t send_count = 0;  // elements in each rank's send buffer
  size_t recv_count = 0;  // elements in each rank's receive buffer
  // In-place runs use one buffer of max(send_count, recv_count) elements: the send region
  // starts at send_inplace_offset * rank, the receive region at recv_inplace_offset * rank.
  size_t send_inplace_offset = 0;
  size_t recv_inplace_offset = 0;
};

// What one rank's receive buffer must hold after the call, in terms of the value v(r, i) that
// rank r wrote at index i of its send buffer (see comm_data.cuh):
//   reduce:          out[e] = redop over all ranks r of v(r, base + e)
//   chunk > 0:       out[e] = v(e / chunk, base + e % chunk)
//   otherwise:       out[e] = v(from_rank, base + e)
struct Expect {
  bool defined = true;  // false: this rank's output is unspecified (reduce on a non-root)
  bool reduce = false;
  int from_rank = 0;
  size_t chunk = 0;
  size_t base = 0;
  size_t count = 0;  // elements of the receive buffer to check
};

struct LaunchArgs {
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t type;
  size_t type_size;
  ncclRedOp_t redop;
  int root;
  int rank;
  int nranks;
  ncclComm_t comm;
  cudaStream_t stream;
};

struct OpDesc {
  const char* name;
  bool reduces;  // takes a reduction operator
  bool rooted;   // has a root rank
  bool inplace;  // has an in-place form (alltoall and sendrecv have none: received data
                 // would overwrite data not yet sent)
  OpCounts (*counts)(size_t bytes, size_t type_size, int nranks);
  Expect (*expect)(int rank, int nranks, int root, const OpCounts& counts);
  ncclResult_t (*launch)(const LaunchArgs& a);
};

// Counts of ops whose size is one rank's whole buffer, sent and received alike (allreduce,
// broadcast, reduce, sendrecv).
OpCounts whole_buffer_counts(size_t bytes, size_t type_size, int nranks);

const std::vector<const OpDesc*>& op_registry();
const OpDesc& find_op(const std::string& name);  // throws std::invalid_argument

struct OpRegistrar {
  explicit OpRegistrar(const OpDesc* desc);
};

}  // namespace mgpu

#define MGPU_REGISTER_OP(desc) static ::mgpu::OpRegistrar mgpu_registrar_##desc(&desc)
