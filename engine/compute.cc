// Device-independent parts of compute.h: DeviceBuffer, the default (synchronous) download slots,
// the default (unfused) rope_store_kv and tensor views.
// Layer: engine (host-only).
#include "compute.h"

#include <cstring>

#include "gqattn/attention.h"
#include "gqattn/error.h"

namespace gqattn::engine {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = other.data_;
    bytes_ = other.bytes_;
    deleter_ = std::move(other.deleter_);
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (data_ != nullptr && deleter_) deleter_(data_);
  data_ = nullptr;
  bytes_ = 0;
}

void Compute::rope_store_kv(const TensorView& q, const TensorView& k, const TensorView& positions,
                            const TensorView& inv_freq, const KVStore& store) {
  rope(q, k, positions, inv_freq);
  append_kv(store.kv, k, store.v, store.batch_indices, positions, stream());
}

void Compute::download_start(int slot, const void* src, size_t bytes) {
  GQ_CHECK(slot >= 0 && slot < kDownloadSlots, "download_start: slot ", slot, " outside [0, ", kDownloadSlots, ")");
  std::vector<char>& host = host_slots_[slot];
  host.resize(bytes);
  download(host.data(), src, bytes);
}

void Compute::download_finish(int slot, void* dst, size_t bytes) {
  GQ_CHECK(slot >= 0 && slot < kDownloadSlots && bytes <= host_slots_[slot].size(), "download_finish: slot ", slot,
           " holds no ", bytes, " bytes");
  std::memcpy(dst, host_slots_[slot].data(), bytes);
}

TensorView slice_rows(const TensorView& t, int64_t begin, int64_t end) {
  GQ_CHECK(t.ndim >= 1 && begin >= 0 && begin <= end && end <= t.shape[0], "slice_rows: [", begin, ", ",
           end, ") of ", t.describe());
  TensorView out = t;
  out.data = static_cast<char*>(t.data) + begin * t.strides[0] * int64_t(dtype_size(t.dtype));
  out.shape[0] = end - begin;
  return out;
}

TensorView head_view(const TensorView& t2d, int64_t col, int64_t heads, int64_t head_dim) {
  GQ_CHECK(t2d.ndim == 2 && col + heads * head_dim <= t2d.shape[1], "head_view: columns [", col, ", ",
           col + heads * head_dim, ") of ", t2d.describe());
  TensorView out;
  out.data = static_cast<char*>(t2d.data) + col * int64_t(dtype_size(t2d.dtype));
  out.ndim = 3;
  out.shape[0] = t2d.shape[0];
  out.shape[1] = heads;
  out.shape[2] = head_dim;
  out.strides[0] = t2d.strides[0];
  out.strides[1] = head_dim;
  out.strides[2] = 1;
  out.dtype = t2d.dtype;
  out.device = t2d.device;
  out.device_id = t2d.device_id;
  return out;
}

TensorView view_of(void* data, std::initializer_list<int64_t> shape, DType dtype, const Compute& compute) {
  return TensorView::contiguous(data, shape, dtype, compute.device(), compute.device_id());
}

}  // namespace gqattn::engine
