// GQ_CUDA_CHECK: turns a failed CUDA runtime call into a gqattn::Error naming the call.
// Layer: src/prims (host-side helper for .cu launchers and the CUDA backend).
#pragma once

#include <cuda_runtime_api.h>

#include "gqattn/error.h"

#define GQ_CUDA_CHECK(call)                                                                 \
  do {                                                                                      \
    const cudaError_t gq_status_ = (call);                                                  \
    if (gq_status_ != cudaSuccess)                                                          \
      throw ::gqattn::Error(::gqattn::detail::concat("CUDA error in ", #call, ": ",         \
                                                     cudaGetErrorString(gq_status_)));      \
  } while (0)
