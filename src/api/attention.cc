// The public entry points of include/gqattn/attention.h: validate everything, then hand the call
// to the backend that the tensors' device names (src/cpu or src/dispatch's CUDA backend).
// Layer: src/api (host-only). Nothing is written before every check has passed.
#include "gqattn/attention.h"

#include "api/validate.h"
#include "cpu/cpu_backend.h"
#include "dispatch/cuda_backend.h"
#include "gqattn/error.h"
#include "plan/planner.h"

namespace gqattn {

namespace {

Plan make_plan(const PlanInputs& inputs, const Workspace& workspace, void* stream, bool is_decode) {
  validate_plan_inputs(inputs, is_decode);
  if (inputs.device == Device::kCUDA) {
    GQ_CHECK(workspace.data != nullptr && workspace.bytes > 0, "workspace: a CUDA plan needs a device "
             "workspace (data ", workspace.data, ", ", workspace.bytes, " bytes); kRecommendedWorkspaceBytes = ",
             kRecommendedWorkspaceBytes);
  }
  Plan plan = plan::describe(inputs, is_decode);
  if (inputs.device == Device::kCUDA) cuda_backend::finish_plan(plan, inputs, workspace, stream);
  return plan;
}

}  // namespace

Plan decode_plan(const PlanInputs& inputs, const Workspace& workspace, void* stream) {
  return make_plan(inputs, workspace, stream, /*is_decode=*/true);
}

Plan prefill_plan(const PlanInputs& inputs, const Workspace& workspace, void* stream) {
  return make_plan(inputs, workspace, stream, /*is_decode=*/false);
}

void decode_run(const Plan& plan, const DecodeArgs& args, void* stream) {
  validate_decode_args(plan, args);
  if (plan.device == Device::kCPU) {
    cpu::decode(plan, args);
  } else {
    cuda_backend::decode_run(plan, args, stream);
  }
}

void prefill_run(const Plan& plan, const PrefillArgs& args, void* stream) {
  validate_prefill_args(plan, args);
  if (plan.device == Device::kCPU) {
    cpu::prefill(plan, args);
  } else {
    cuda_backend::prefill_run(plan, args, stream);
  }
}

void append_kv(const PagedKV& kv, const TensorView& k_new, const TensorView& v_new,
               const TensorView& batch_indices, const TensorView& positions, void* stream) {
  validate_append_kv(kv, k_new, v_new, batch_indices, positions);
  if (kv.k_pages.device == Device::kCPU) {
    cpu::append_kv(kv, k_new, v_new, batch_indices, positions);
  } else {
    cuda_backend::append_kv(kv, k_new, v_new, batch_indices, positions, stream);
  }
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_merged,
                  const TensorView& s_merged, void* stream) {
  validate_merge_states(v, s, v_merged, s_merged);
  if (v.device == Device::kCPU) {
    cpu::merge_states(v, s, v_merged, s_merged);
  } else {
    cuda_backend::merge_states(v, s, v_merged, s_merged, stream);
  }
}

BuildInfo build_info() {
  BuildInfo info;
  cuda_backend::fill_build_info(info);
  return info;
}

int cuda_device_count() { return cuda_backend::device_count(); }

}  // namespace gqattn
