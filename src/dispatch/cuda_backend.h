// The CUDA backend's host entry points, called by src/api after validation.
// Layer: src/dispatch (host-only declarations). Built from cuda_backend.cc when GQATTN_CUDA is ON;
// otherwise no_cuda.cc defines them to throw an Error that names the CMake option.
#pragma once

#include "gqattn/attention.h"

namespace gqattn::cuda_backend {

// A CUDA plan's limits: the workspace holds this many work items and requests (fixed regions).
constexpr size_t kMaxWorkItems = size_t(1) << 17;
constexpr size_t kMaxRequests = size_t(1) << 16;
// The workspace's data pointer and each region of it are aligned to this.
constexpr size_t kWorkspaceAlign = 256;
// The smallest workspace a CUDA plan accepts: header, work items, merge requests and one aligned
// slot for the partial rows (where none fits, nothing splits).
size_t min_workspace_bytes();

// Completes a plan described by plan::describe(): picks the kernel, chooses split-KV, builds the
// work list and uploads it into the workspace (async copy on `stream`).
void finish_plan(Plan& plan, const PlanInputs& inputs, const Workspace& workspace, void* stream);

void decode_run(const Plan& plan, const DecodeArgs& args, void* stream);
void prefill_run(const Plan& plan, const PrefillArgs& args, void* stream);
void append_kv(const PagedKV& kv, const TensorView& k_new, const TensorView& v_new,
               const TensorView& batch_indices, const TensorView& positions, void* stream);
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_merged,
                  const TensorView& s_merged, void* stream);

// Throws an Error naming the CMake option when this build cannot run the configuration on the
// GPU (head_dim or dtype not compiled, CUDA not built). Used by validation before any launch.
void check_supported(DType dtype, int head_dim);

int device_count();
void fill_build_info(BuildInfo& info);

}  // namespace gqattn::cuda_backend
