// GQ_HOST_DEVICE: a small function callable from host and device code (nvcc), or a plain inline
// function (host compilers). Layer: src/prims (header-only).
#pragma once

#if defined(__CUDACC__)
#define GQ_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GQ_HOST_DEVICE inline
#endif
