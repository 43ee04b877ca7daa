// GPU test helpers: device copies of host tensors (same shape and strides), poisoning, a workspace,
// and the skip-without-GPU guard. Layer: tests (host code using the CUDA runtime).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>

#include "common/test_util.h"
#include "prims/cuda_check.h"

namespace gqattn::test {

// Skips the test, visibly, when no CUDA device is present.
#define GQ_REQUIRE_GPU()                                                         \
  do {                                                                           \
    if (::gqattn::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped"; \
  } while (0)

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevicePtr = std::unique_ptr<void, CudaFree>;

inline DevicePtr device_alloc(size_t bytes) {
  void* p = nullptr;
  GQ_CUDA_CHECK(cudaMalloc(&p, bytes > 0 ? bytes : 16));
  return DevicePtr(p);
}

// A device copy of a host tensor's whole storage (padding included) with the same view.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  explicit DeviceTensor(const HostTensor& host) : bytes_(host.bytes()), mem_(device_alloc(host.bytes())) {
    if (bytes_ > 0) GQ_CUDA_CHECK(cudaMemcpy(mem_.get(), host.data(), bytes_, cudaMemcpyHostToDevice));
    view_ = host.view();
    view_.data = view_.numel() > 0 ? mem_.get() : nullptr;
    view_.device = Device::kCUDA;
    view_.device_id = 0;
  }
  const TensorView& view() const { return view_; }
  // Every byte set to 0xFF: NaN in bf16, fp16 and fp32, so an unwritten element shows.
  void poison() { GQ_CUDA_CHECK(cudaMemset(mem_.get(), 0xFF, bytes_ > 0 ? bytes_ : 16)); }
  // Copies the device bytes back into `host` (which must be the tensor this was made from).
  void copy_to(HostTensor& host) const {
    GQ_CHECK(host.bytes() == bytes_, "copy_to: size mismatch");
    if (bytes_ > 0) GQ_CUDA_CHECK(cudaMemcpy(host.data(), mem_.get(), bytes_, cudaMemcpyDeviceToHost));
  }
  HostTensor to_host(const HostTensor& like) const {
    HostTensor out = like;
    copy_to(out);
    return out;
  }

 private:
  size_t bytes_ = 0;
  DevicePtr mem_;
  TensorView view_;
};

struct DevicePagedKV {
  DeviceTensor k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len;
  KVLayout layout = KVLayout::kNHD;
  explicit DevicePagedKV(const PagedKVHost& h)
      : k_pages(h.k_pages), v_pages(h.v_pages), kv_page_indptr(h.kv_page_indptr),
        kv_page_indices(h.kv_page_indices), kv_last_page_len(h.kv_last_page_len), layout(h.layout) {}
  PagedKV view() const { return paged_kv_view(*this); }
};

struct DeviceWorkspace {
  DevicePtr mem = device_alloc(kRecommendedWorkspaceBytes);
  Workspace get() const { return {mem.get(), kRecommendedWorkspaceBytes}; }
};

inline void sync_and_check() {
  GQ_CUDA_CHECK(cudaGetLastError());
  GQ_CUDA_CHECK(cudaDeviceSynchronize());
}

// Tolerances against the float64 oracle for outputs stored in `dtype` (the kernel rounds P to the
// input dtype before the PV product, so the bound is a few of the dtype's rounding steps).
inline double max_abs_tol(DType dtype) { return dtype == DType::kBF16 ? 2e-2 : 3e-3; }
inline double rel_l2_tol(DType dtype) { return dtype == DType::kBF16 ? 1.5e-2 : 3e-3; }
constexpr double kLseTol = 2e-2;

}  // namespace gqattn::test
