// The CUDA backend's entry points for a build without CUDA: each one that would run on the GPU
// throws an Error naming the CMake option; device_count() is 0 and build_info says cuda = false.
// Layer: src/dispatch (host-only). Compiled instead of cuda_backend.cc when GQATTN_CUDA is OFF.
#include "dispatch/cuda_backend.h"

#include <string>

#include "gqattn/error.h"

namespace gqattn::cuda_backend {

namespace {

[[noreturn]] void no_cuda(const char* what) {
  throw Error(std::string(what) +
              " needs the CUDA backend: this build has none (configure with -DGQATTN_CUDA=ON and "
              "a CUDA compiler)");
}

}  // namespace

size_t min_workspace_bytes() { no_cuda("a CUDA workspace"); }
void finish_plan(Plan&, const PlanInputs&, const Workspace&, void*) { no_cuda("a CUDA plan"); }
void decode_run(const Plan&, const DecodeArgs&, void*) { no_cuda("decode_run on CUDA tensors"); }
void prefill_run(const Plan&, const PrefillArgs&, void*) { no_cuda("prefill_run on CUDA tensors"); }
void append_kv(const PagedKV&, const TensorView&, const TensorView&, const TensorView&,
               const TensorView&, void*) {
  no_cuda("append_kv on CUDA tensors");
}
void merge_states(const TensorView&, const TensorView&, const TensorView&, const TensorView&, void*) {
  no_cuda("merge_states on CUDA tensors");
}
void check_supported(DType dtype, int head_dim) {
  no_cuda(detail::concat("device cuda (dtype ", dtype_name(dtype), ", head_dim ", head_dim, ")").c_str());
}

int device_count() { return 0; }

void fill_build_info(BuildInfo& info) {
  info.cuda = false;
  info.head_dims.clear();
  info.dtypes.clear();
  info.cuda_archs.clear();
}

}  // namespace gqattn::cuda_backend
