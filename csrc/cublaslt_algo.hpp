// The config attributes that name a cuBLASLt algorithm, read the same way by the GEMM probe (each
// candidate the heuristic proposes) and the sdc probe (the one algorithm it pins).
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>

namespace mgpu {

// One attribute of the algorithm's config; T{} where this cuBLASLt does not give it.
template <typename T>
T algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return T{};
  }
  return v;
}

// Fills the naming members (algo_id, tile, stages, split_k, reduction, swizzle, custom, cluster)
// of `out`, a GemmCandidate or an SdcAlgo: enough to name and reproduce the algorithm.
template <typename Out>
void name_algo(const cublasLtMatmulAlgo_t& algo, Out& out) {
  out.algo_id = algo_attr<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID);
  out.tile = static_cast<int>(algo_attr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID));
  out.stages = static_cast<int>(algo_attr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID));
  out.split_k = algo_attr<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  out.reduction = static_cast<int>(algo_attr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME));
  out.swizzle = static_cast<int>(algo_attr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING));
  out.custom = static_cast<int>(algo_attr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
  out.cluster = static_cast<int>(algo_attr<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

}  // namespace mgpu
