// Known data for collectives: what each rank writes, and a check on the device of what each
// rank received.
//
// Rank r writes v(r, i) at index i of its send buffer:
//   x = (i mod 2^32) * 1103515245 + 12345 + r * 2246822519   (mod 2^32)
//   v = scale * (((x >> 16) mod (2k + 1)) - k)
// or, when k == 0 ("one-hot"), v = scale if ((x0 >> 16) mod n) == r else 0, with x0 the same
// hash taken at r = 0. k is chosen so that every partial sum of n values is an integer the
// dtype represents exactly (|sum| <= n*k*scale <= the dtype's exact-integer limit); then sum,
// max and min results are exact and any difference is a wrong element. avg uses values that
// are multiples of n (scale = n) and a tolerance of a few ulps, since NCCL pre-multiplies by
// 1/n for floating types. mgpu_bench/torch_backend.py implements the same v(r, i).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>

#include "dtype.hpp"
#include "op.hpp"

namespace mgpu {

struct Pattern {
  int k = 0;      // values in [-k, k] (times scale); 0 selects the one-hot pattern
  int scale = 1;  // n for avg, 1 otherwise
  int nranks = 1;
};

Pattern make_pattern(DType dtype, bool op_reduces, ncclRedOp_t redop, int nranks);

void fill_values(void* ptr, DType dtype, size_t count, int rank, const Pattern& p,
                 cudaStream_t stream);

// Adds to *d_wrong (device memory) the number of elements of `out` that differ from `e`.
// d_wrong[1] (initialised to ~0 by the caller) is lowered to the index of the first of them,
// and d_wrong[2], d_wrong[3] get the bits of two doubles: that element as read and as
// expected (left alone when no element differs).
void check_values(const void* out, DType dtype, const Expect& e, const Pattern& p,
                  ncclRedOp_t redop, unsigned long long* d_wrong, cudaStream_t stream);

}  // namespace mgpu
