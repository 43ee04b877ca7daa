// TensorView methods and the names of dtypes, devices and KV layouts.
// Layer: src/api (host-only), behind include/gqattn/tensor.h and paged_kv.h.
#include "gqattn/tensor.h"

#include <sstream>

#include "gqattn/error.h"
#include "gqattn/paged_kv.h"

namespace gqattn {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kFP16: return 2;
    case DType::kFP32:
    case DType::kInt32: return 4;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
    case DType::kFP32: return "fp32";
    case DType::kInt32: return "int32";
  }
  return "unknown";
}

const char* device_name(Device device) {
  switch (device) {
    case Device::kCPU: return "cpu";
    case Device::kCUDA: return "cuda";
  }
  return "unknown";
}

const char* layout_name(KVLayout layout) {
  switch (layout) {
    case KVLayout::kNHD: return "NHD";
    case KVLayout::kHND: return "HND";
  }
  return "unknown";
}

TensorView TensorView::contiguous(void* data, std::initializer_list<int64_t> shape, DType dtype,
                                  Device device, int device_id) {
  GQ_CHECK(shape.size() >= 1 && shape.size() <= size_t(kMaxDims),
           "TensorView::contiguous: expected 1 to ", kMaxDims, " dims, got ", shape.size());
  TensorView t;
  t.data = data;
  t.ndim = int(shape.size());
  t.dtype = dtype;
  t.device = device;
  t.device_id = device_id;
  int i = 0;
  for (int64_t s : shape) {
    GQ_CHECK(s >= 0, "TensorView::contiguous: dim ", i, " is negative (", s, ")");
    t.shape[i++] = s;
  }
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

int64_t TensorView::numel() const {
  if (ndim == 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;  // a size-1 dim's stride is never used
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorView::describe() const {
  if (!defined()) return "undefined";
  std::ostringstream os;
  os << '[';
  for (int d = 0; d < ndim; ++d) os << (d ? ", " : "") << shape[d];
  os << "] " << dtype_name(dtype) << ' ' << device_name(device);
  if (device == Device::kCUDA) os << ':' << device_id;
  return os.str();
}

}  // namespace gqattn
