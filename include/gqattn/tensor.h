// TensorView: a non-owning view of a strided tensor (pointer, shape, strides, dtype, device).
// Layer: include/gqattn (public, host-only). No framework types: bindings build these from DLPack.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace gqattn {

enum class DType { kBF16, kFP16, kFP32, kInt32 };
enum class Device { kCPU, kCUDA };

// Bytes per element.
size_t dtype_size(DType dtype);
// "bf16", "fp16", "fp32", "int32".
const char* dtype_name(DType dtype);
const char* device_name(Device device);

constexpr int kMaxDims = 4;

// A view of someone else's memory. Strides are in elements (not bytes), like PyTorch.
// An undefined view (data == nullptr and ndim == 0) means "argument not given" for optional
// tensors such as lse.
struct TensorView {
  void* data = nullptr;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  int64_t strides[kMaxDims] = {0, 0, 0, 0};
  DType dtype = DType::kFP32;
  Device device = Device::kCPU;
  int device_id = 0;

  // A row-major (contiguous) view of `data` with the given shape.
  static TensorView contiguous(void* data, std::initializer_list<int64_t> shape, DType dtype,
                               Device device = Device::kCPU, int device_id = 0);

  bool defined() const { return ndim > 0; }
  int64_t numel() const;
  int64_t size(int dim) const { return shape[dim]; }
  int64_t stride(int dim) const { return strides[dim]; }
  // True when the last dimension has stride 1 (every kernel needs that).
  bool last_dim_contiguous() const { return ndim == 0 || strides[ndim - 1] == 1 || shape[ndim - 1] <= 1; }
  bool is_contiguous() const;
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  // "[2, 32, 128] bf16 cuda:0", for error messages.
  std::string describe() const;
};

}  // namespace gqattn
