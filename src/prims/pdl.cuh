// Programmatic dependent launch (sm_90+): a kernel launched with programmatic stream
// serialization may start while the kernel before it on the stream is still running, once every
// CTA of that kernel has called grid_allow_dependents() (or exited); it must call
// grid_dependency_wait() before it touches anything the earlier kernel writes. Both are no-ops
// below sm_90, where the launch attribute is not set (launch_programmatic in merge_states.cu).
// Layer: src/prims (device only).
#pragma once

namespace gqattn::prims {

// Blocks until the grids this one depends on have completed and their writes are visible.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next kernel on the stream, if launched programmatically, be scheduled now.
__device__ __forceinline__ void grid_allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

}  // namespace gqattn::prims
