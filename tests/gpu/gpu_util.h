// GPU test helpers: device copies of host tensors (same shape and strides), poisoning, a workspace,
// and the skip-without-GPU guard. Layer: tests (host code using the CUDA runtime).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
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
  explicit DeviceTensor(const HostTensor& host) : DeviceTensor(host, 0) {}
  // The host tensor placed `lead_rows` rows (of dim 0) into a larger allocation: the view has
  // shape[0] + lead_rows rows and the host's rows are its last ones; the lead rows are allocated,
  // never written. A page pool so placed has every page past 2^32 bytes (pages_past_4gib).
  DeviceTensor(const HostTensor& host, int64_t lead_rows)
      : lead_bytes_(size_t(lead_rows) * size_t(host.view().ndim > 0 ? host.view().strides[0] : 0) *
                    dtype_size(host.view().dtype)),
        bytes_(host.bytes()), mem_(device_alloc(lead_bytes_ + host.bytes())) {
    GQ_CHECK(lead_rows >= 0 && (lead_rows == 0 || host.view().ndim > 0), "DeviceTensor: bad lead_rows");
    if (bytes_ > 0) GQ_CUDA_CHECK(cudaMemcpy(at_host_rows(), host.data(), bytes_, cudaMemcpyHostToDevice));
    view_ = host.view();
    if (lead_rows > 0) view_.shape[0] += lead_rows;
    view_.data = view_.numel() > 0 ? mem_.get() : nullptr;
    view_.device = Device::kCUDA;
    view_.device_id = 0;
  }
  const TensorView& view() const { return view_; }
  // Every byte of the host's rows set to 0xFF: NaN in bf16, fp16 and fp32, so an unwritten element
  // shows.
  void poison() {
    if (bytes_ > 0) GQ_CUDA_CHECK(cudaMemset(at_host_rows(), 0xFF, bytes_));
  }
  // Copies the device bytes of the host's rows back into `host` (the tensor this was made from).
  void copy_to(HostTensor& host) const {
    GQ_CHECK(host.bytes() == bytes_, "copy_to: size mismatch");
    if (bytes_ > 0) GQ_CUDA_CHECK(cudaMemcpy(host.data(), at_host_rows(), bytes_, cudaMemcpyDeviceToHost));
  }
  HostTensor to_host(const HostTensor& like) const {
    HostTensor out = like;
    copy_to(out);
    return out;
  }

 private:
  void* at_host_rows() const { return static_cast<uint8_t*>(mem_.get()) + lead_bytes_; }

  size_t lead_bytes_ = 0, bytes_ = 0;
  DevicePtr mem_;
  TensorView view_;
};

// The first page id from which every page of `pool` (dim 0: pages) starts past 2^32 bytes, so past
// 2^31 elements of a 16-bit dtype: a 32-bit offset or byte count anywhere on the way shows.
inline int64_t pages_past_4gib(const HostTensor& pool) {
  const int64_t page_bytes = pool.view().strides[0] * int64_t(dtype_size(pool.view().dtype));
  return (int64_t(1) << 32) / page_bytes + 1;
}

// Page ids `shift` higher than the host's.
inline HostTensor shifted_page_ids(const HostTensor& ids, int64_t shift) {
  std::vector<int32_t> v(size_t(ids.view().numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int32_t(ids.view().ptr<int32_t>()[i] + shift);
  return HostTensor::from_int32(v);
}

// A contiguous host tensor's dim-0 rows copied `row_stride` elements apart into one device
// allocation (the other dims as on the host): with spread_past_4gib's stride, the last quarter of
// the rows starts past 2^32 bytes.
class DeviceSpreadRows {
 public:
  DeviceSpreadRows(const HostTensor& host, int64_t row_stride) : view_(host.view()) {
    GQ_CHECK(view_.ndim >= 1 && view_.is_contiguous() && row_stride >= view_.strides[0],
             "DeviceSpreadRows: a contiguous host tensor and a stride of at least its rows");
    const size_t elem = dtype_size(view_.dtype), row_bytes = size_t(view_.strides[0]) * elem;
    const size_t rows = size_t(view_.shape[0]);
    mem_ = device_alloc(rows * size_t(row_stride) * elem);
    if (rows > 0 && row_bytes > 0) {
      GQ_CUDA_CHECK(cudaMemcpy2D(mem_.get(), size_t(row_stride) * elem, host.data(), row_bytes, row_bytes, rows,
                                 cudaMemcpyHostToDevice));
    }
    view_.strides[0] = row_stride;
    view_.data = view_.numel() > 0 ? mem_.get() : nullptr;
    view_.device = Device::kCUDA;
    view_.device_id = 0;
  }
  const TensorView& view() const { return view_; }

 private:
  DevicePtr mem_;
  TensorView view_;
};

// A row stride (a multiple of 8 elements, so rows stay 16-byte aligned) that puts rows from
// 3/4 of `rows` on past 2^32 bytes.
inline int64_t spread_past_4gib(int64_t rows, DType dtype) {
  const int64_t first_far = std::max<int64_t>(1, rows * 3 / 4);
  const int64_t stride = ((int64_t(1) << 32) / int64_t(dtype_size(dtype)) + first_far - 1) / first_far;
  return (stride + 7) / 8 * 8;
}

struct DevicePagedKV {
  DeviceTensor k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len;
  KVLayout layout = KVLayout::kNHD;
  // far: the host's pages placed past 4 GiB of each pool (pages_past_4gib); page ids follow.
  explicit DevicePagedKV(const PagedKVHost& h, bool far = false)
      : DevicePagedKV(h, far ? pages_past_4gib(h.k_pages) : 0) {}
  PagedKV view() const { return paged_kv_view(*this); }

 private:
  DevicePagedKV(const PagedKVHost& h, int64_t first_page)
      : k_pages(h.k_pages, first_page), v_pages(h.v_pages, first_page), kv_page_indptr(h.kv_page_indptr),
        kv_page_indices(shifted_page_ids(h.kv_page_indices, first_page)), kv_last_page_len(h.kv_last_page_len),
        layout(h.layout) {}
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
