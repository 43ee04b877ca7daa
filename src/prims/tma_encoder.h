// The driver's cuTensorMapEncodeTiled, reached through the runtime's entry-point query (no link
// against libcuda), for every kernel that builds TMA tensor maps on the host (today the Hopper
// prefill; wip/engine-gemm-sm90.patch uses it too). Layer: src/prims (host only).
#pragma once

#include <cuda.h>  // CUtensorMap and the encoder's types only
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

namespace gqattn::prims {

// The encoder, or nullptr when the driver does not offer it (callers then skip TMA). Looked up once.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace gqattn::prims
