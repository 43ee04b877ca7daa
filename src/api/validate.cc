// Argument checks of the public entries (plan inputs, decode/prefill runs, append_kv,
// merge_states). Every message names the argument and the values involved.
// Layer: src/api (host-only). Reads index tensors only when they live on the CPU.
#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/cuda_backend.h"
#include "gqattn/error.h"

namespace gqattn {

namespace {

// No size is this (a -1 from a hand-made plan must not read as "any size").
constexpr int64_t kAny = INT64_MIN;

// One expected dimension: its name in messages and its size (kAny: any size).
struct DimSpec {
  const char* name;
  int64_t size;
};

std::string shape_str(const TensorView& t) {
  std::ostringstream os;
  os << '[';
  for (int d = 0; d < t.ndim && d < kMaxDims; ++d) os << (d ? ", " : "") << t.shape[d];
  os << ']';
  return os.str();
}

std::string strides_str(const TensorView& t) {
  std::ostringstream os;
  os << '[';
  for (int d = 0; d < t.ndim && d < kMaxDims; ++d) os << (d ? ", " : "") << t.strides[d];
  os << ']';
  return os.str();
}

std::string spec_names(std::initializer_list<DimSpec> dims) {
  std::ostringstream os;
  os << '[';
  int d = 0;
  for (const DimSpec& s : dims) os << (d++ ? ", " : "") << s.name;
  os << ']';
  return os.str();
}

std::string spec_values(std::initializer_list<DimSpec> dims) {
  std::ostringstream os;
  os << '[';
  int d = 0;
  for (const DimSpec& s : dims) {
    os << (d++ ? ", " : "");
    if (s.size == kAny) os << '*'; else os << s.size;
  }
  os << ']';
  return os.str();
}

// `hint` ends the message (a hand-made plan's says where plans come from).
void check_known_device(Device device, const std::string& arg, const char* hint = "") {
  GQ_CHECK(device == Device::kCPU || device == Device::kCUDA, arg, ": unknown device value ", int(device), hint);
}

std::string device_str(Device device, int device_id) {
  return device == Device::kCUDA ? detail::concat("cuda:", device_id) : std::string("cpu");
}

// The element count and every element's offset fit in int64 with room to spare (2^62 bytes): the
// count decides whether a null pointer is allowed, the offsets are what the kernels compute. A
// shape whose product wraps would otherwise pass as empty.
void check_extent(const TensorView& t, const std::string& arg) {
  constexpr int64_t kMaxBytes = int64_t(1) << 62;
  const int64_t elem = std::max<int64_t>(1, int64_t(dtype_size(t.dtype)));
  int64_t count = 1, reach = 0;
  bool empty = false;
  for (int d = 0; d < t.ndim; ++d) empty = empty || t.shape[d] == 0;
  for (int d = 0; d < t.ndim && !empty; ++d) {
    const int64_t n = t.shape[d];
    // |stride|, clamped before the negation (-INT64_MIN overflows); a dim of size 1 never uses it.
    const int64_t stride = t.strides[d] <= -kMaxBytes ? kMaxBytes : t.strides[d] < 0 ? -t.strides[d] : t.strides[d];
    const bool fits = count <= kMaxBytes / elem / n && (n == 1 || stride <= (kMaxBytes / elem - reach) / (n - 1));
    GQ_CHECK(fits, arg, ": shape ", shape_str(t), " with strides ", strides_str(t), " spans more than 2^62 bytes");
    count *= n;
    reach += stride * (n - 1);
  }
}

void check_shape(const TensorView& t, const std::string& arg, std::initializer_list<DimSpec> dims) {
  GQ_CHECK(t.defined(), arg, ": not given (undefined tensor); expected ", spec_names(dims));
  GQ_CHECK(t.ndim <= kMaxDims, arg, ": ", t.ndim, " dims, more than a TensorView holds (", kMaxDims, ")");
  GQ_CHECK(t.ndim == int(dims.size()), arg, ": expected ", dims.size(), " dims ", spec_names(dims),
           ", got ", shape_str(t));
  int d = 0;
  for (const DimSpec& s : dims) {
    GQ_CHECK(t.shape[d] >= 0, arg, ": ", s.name, " (dim ", d, ") is negative (", t.shape[d], ")");
    GQ_CHECK(s.size == kAny || t.shape[d] == s.size, arg, ": ", s.name, " (dim ", d, ") is ",
             t.shape[d], ", expected ", s.size, " (", arg, " is ", shape_str(t), ", expected ",
             spec_names(dims), " = ", spec_values(dims), ")");
    ++d;
  }
  check_extent(t, arg);
}

void check_dtype(const TensorView& t, const std::string& arg, DType expected, const char* why) {
  GQ_CHECK(t.dtype == expected, arg, ": dtype is ", dtype_name(t.dtype), ", expected ",
           dtype_name(expected), why);
}

// bf16 or fp16; fp32 too on the CPU.
void check_storage_dtype(const TensorView& t, const std::string& arg, Device device) {
  const bool ok = t.dtype == DType::kBF16 || t.dtype == DType::kFP16 ||
                  (t.dtype == DType::kFP32 && device == Device::kCPU);
  GQ_CHECK(ok, arg, ": dtype ", dtype_name(t.dtype), " is not supported on ", device_name(device),
           " (expected bf16 or fp16", device == Device::kCPU ? " or fp32)" : ")");
}

void check_device(const TensorView& t, const std::string& arg, Device device, int device_id,
                  const char* reference) {
  const bool same = t.device == device && (device == Device::kCPU || t.device_id == device_id);
  GQ_CHECK(same, arg, ": is on ", device_str(t.device, t.device_id), " but ", reference, " is on ",
           device_str(device, device_id));
}

// The data pointer aligned to the dtype, on every device (the CPU backend loads whole elements).
void check_elem_aligned(const TensorView& t, const std::string& arg) {
  const auto address = reinterpret_cast<uintptr_t>(t.data);
  const uintptr_t elem = std::max<uintptr_t>(1, dtype_size(t.dtype));
  GQ_CHECK(address % elem == 0, arg, ": data pointer is not aligned to its dtype ", dtype_name(t.dtype), " (address % ",
           elem, " = ", address % elem, ")");
}

// Data pointer present and aligned, last dimension contiguous.
void check_memory(const TensorView& t, const std::string& arg) {
  GQ_CHECK(t.data != nullptr || t.numel() == 0, arg, ": data pointer is null but the tensor holds ",
           t.numel(), " elements");
  check_elem_aligned(t, arg);
  GQ_CHECK(t.last_dim_contiguous(), arg, ": last dimension must be contiguous (stride 1), got strides ",
           strides_str(t), " for shape ", shape_str(t));
}

// The GPU kernels load rows with 16-byte vectors: the pointer and every stride that moves
// between rows must keep that alignment.
void check_aligned(const TensorView& t, const std::string& arg, Device device) {
  if (device != Device::kCUDA) return;
  const auto address = reinterpret_cast<uintptr_t>(t.data);
  GQ_CHECK(address % kCudaAlignBytes == 0, arg, ": data pointer must be ", kCudaAlignBytes,
           "-byte aligned on the GPU (address % ", kCudaAlignBytes, " = ", address % kCudaAlignBytes, ")");
  const int64_t elem = int64_t(dtype_size(t.dtype));
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] <= 1 || t.strides[d] == 1) continue;
    const int64_t bytes = t.strides[d] * elem;
    GQ_CHECK(bytes % kCudaAlignBytes == 0, arg, ": stride of dim ", d, " (", t.strides[d],
             " elements = ", bytes, " bytes) must be a multiple of ", kCudaAlignBytes,
             " bytes on the GPU");
  }
}

// A tensor argument and its name in messages (a literal: nothing is built unless a check fails).
struct Named {
  const TensorView* view;
  const char* name;
};

// The bytes [begin, end) from t's lowest to its highest element (strides may be negative).
std::pair<uintptr_t, uintptr_t> byte_span(const TensorView& t) {
  int64_t low = 0, high = 0;
  for (int d = 0; d < t.ndim; ++d) {
    const int64_t reach = (t.shape[d] - 1) * t.strides[d];
    (reach < 0 ? low : high) += reach;
  }
  const int64_t elem = int64_t(dtype_size(t.dtype));
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  return {base + uintptr_t(low * elem), base + uintptr_t((high + 1) * elem)};
}

// The same elements in the same order: pointer, dtype, shape and (for dims of size > 1) strides.
bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d) {
    if (a.shape[d] != b.shape[d] || (a.shape[d] > 1 && a.strides[d] != b.strides[d])) return false;
  }
  return true;
}

// Whether two elements of t may share an address: its dims of size > 1, from the smallest |stride| up,
// must each step past everything the smaller ones reach (a sufficient test for distinct elements,
// met by every layout made by slicing, permuting or padding a contiguous tensor).
bool self_overlapping(const TensorView& t) {
  int64_t stride[kMaxDims], size[kMaxDims];
  int n = 0;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] <= 1) continue;
    stride[n] = t.strides[d] < 0 ? -t.strides[d] : t.strides[d];
    size[n++] = t.shape[d];
  }
  for (int i = 1; i < n; ++i) {  // insertion sort by |stride|
    for (int j = i; j > 0 && stride[j] < stride[j - 1]; --j) {
      std::swap(stride[j], stride[j - 1]);
      std::swap(size[j], size[j - 1]);
    }
  }
  int64_t reach = 0;  // the largest offset the smaller dims reach
  for (int i = 0; i < n; ++i) {
    if (stride[i] <= reach) return true;
    reach += stride[i] * (size[i] - 1);
  }
  return false;
}

// Outputs must not share memory with each other or with an input: a later read would see a
// value already written, or two writes would land on one element. The one exception is o = q (the
// same view): each row of q is read before its row of o is written, by the same thread (CPU) or
// CTA (GPU). Views that are not contiguous are compared by their first element only: their spans
// may interleave without a common element (the K and V halves of one [pages, 2, ...] cache), so a
// partial overlap among such views goes unseen, as in torch's checks. An output must also hold
// distinct elements: a dim of size > 1 with stride 0 (a broadcast view) writes one memory twice.
// `inputs`: any range of Named (an array, or NamedInputs).
template <typename Inputs>
void check_outputs(std::initializer_list<Named> outputs, const Inputs& inputs, const TensorView* o = nullptr,
                   const TensorView* q = nullptr) {
  auto check_apart = [](const Named& out, const Named& other, bool may_be_same) {
    const TensorView& a = *out.view;
    const TensorView& b = *other.view;
    if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) return;
    if (may_be_same && same_view(a, b)) return;
    bool overlap = a.data == b.data;
    if (!overlap && a.is_contiguous() && b.is_contiguous()) {
      const auto [a_begin, a_end] = byte_span(a);
      const auto [b_begin, b_end] = byte_span(b);
      overlap = a_begin < b_end && b_begin < a_end;
    }
    GQ_CHECK(!overlap, out.name, ": shares memory with ", other.name,
             may_be_same ? " but is not the same view (an output may be that input itself, not a part of it)"
                         : " (an output must not overlap another argument)");
  };
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    const TensorView& t = *out->view;
    for (int d = 0; t.defined() && d < t.ndim; ++d) {
      GQ_CHECK(t.shape[d] <= 1 || t.strides[d] != 0, out->name, ": dim ", d,
               " has stride 0 (a broadcast view of ", shape_str(t), "); an output needs distinct elements");
    }
    GQ_CHECK(t.numel() == 0 || !self_overlapping(t), out->name, ": strides ", strides_str(t), " for shape ",
             shape_str(t), " give two elements one address; an output needs distinct elements");
    for (auto other = out + 1; other != outputs.end(); ++other) check_apart(*out, *other, false);
    for (const Named& in : inputs) check_apart(*out, in, out->view == o && in.view == q);
  }
}

// A PagedKV's five tensors and their names (kPagedNames of the argument `kv` or `paged`).
using PagedNames = const char* const[5];
constexpr PagedNames kKvNames = {"kv.k_pages", "kv.v_pages", "kv.kv_page_indptr", "kv.kv_page_indices",
                                 "kv.kv_last_page_len"};
constexpr PagedNames kPagedNames = {"paged.k_pages", "paged.v_pages", "paged.kv_page_indptr",
                                    "paged.kv_page_indices", "paged.kv_last_page_len"};

// A run's named inputs, on the stack: every decode / prefill run is validated, without a heap
// allocation. At most seven: a PagedKV's five, q and qo_indptr.
class NamedInputs {
 public:
  void add(const TensorView& t, const char* name) { items_[size_++] = Named{&t, name}; }
  void add_paged(const PagedKV& kv, const PagedNames& names) {
    const TensorView* views[5] = {&kv.k_pages, &kv.v_pages, &kv.kv_page_indptr, &kv.kv_page_indices,
                                  &kv.kv_last_page_len};
    for (int i = 0; i < 5; ++i) add(*views[i], names[i]);
  }
  const Named* begin() const { return items_; }
  const Named* end() const { return items_ + size_; }

 private:
  Named items_[7] = {};
  int size_ = 0;
};

// A 1-D int32 index tensor with `length` entries (kAny: any), contiguous, on the device.
void check_index(const TensorView& t, const std::string& arg, const char* dim_name, int64_t length,
                 Device device, int device_id, const char* reference) {
  check_shape(t, arg, {{dim_name, length}});
  check_dtype(t, arg, DType::kInt32, " (index tensors are int32)");
  check_device(t, arg, device, device_id, reference);
  GQ_CHECK(t.data != nullptr || t.numel() == 0, arg, ": data pointer is null but the tensor holds ",
           t.numel(), " elements");
  check_elem_aligned(t, arg);
  GQ_CHECK(t.shape[0] <= 1 || t.strides[0] == 1, arg, ": must be contiguous (stride 1), got stride ",
           t.strides[0]);
}

// q or o of a plan: [total_qo, num_qo_heads, head_dim] of the plan's dtype.
void check_qo(const TensorView& t, const std::string& arg, const Plan& plan) {
  check_shape(t, arg, {{"tokens", plan.total_qo}, {"num_qo_heads", plan.num_qo_heads},
                       {"head_dim", plan.head_dim}});
  check_dtype(t, arg, plan.dtype, " (the plan's dtype)");
  check_device(t, arg, plan.device, plan.device_id, "the plan");
  check_memory(t, arg);
  check_aligned(t, arg, plan.device);
}

void check_lse(const TensorView& lse, const std::string& arg, int64_t tokens, int64_t heads,
               const char* heads_name, Device device, int device_id, const char* reference) {
  GQ_CHECK(lse.defined() || lse.data == nullptr, arg, ": 0 dims but a data pointer; expected [tokens, ",
           heads_name, "] or no tensor (data null and 0 dims)");
  if (!lse.defined()) return;
  check_shape(lse, arg, {{"tokens", tokens}, {heads_name, heads}});
  check_dtype(lse, arg, DType::kFP32, " (log-sum-exp is fp32)");
  check_device(lse, arg, device, device_id, reference);
  check_memory(lse, arg);
}

// lse of a decode or prefill run: fp32 [total_qo, num_qo_heads]. The GPU kernels write it as one
// contiguous array (they take no lse strides), so there it must be contiguous.
void check_run_lse(const TensorView& lse, const Plan& plan) {
  check_lse(lse, "lse", plan.total_qo, plan.num_qo_heads, "num_qo_heads", plan.device, plan.device_id,
            "the plan");
  GQ_CHECK(!lse.defined() || plan.device != Device::kCUDA || lse.is_contiguous(),
           "lse: must be contiguous on the GPU (the kernels write its rows back to back), got strides ",
           strides_str(lse), " for shape ", shape_str(lse));
}

// Monotone indptr starting at 0. `what` names the vector.
void check_indptr(const std::vector<int32_t>& indptr, const char* what) {
  GQ_CHECK(!indptr.empty(), what, ": must hold batch + 1 entries, got none");
  GQ_CHECK(indptr[0] == 0, what, "[0] must be 0, got ", indptr[0]);
  for (size_t i = 1; i < indptr.size(); ++i) {
    GQ_CHECK(indptr[i] >= indptr[i - 1], what, " must be non-decreasing: ", what, "[", i, "] (",
             indptr[i], ") < ", what, "[", i - 1, "] (", indptr[i - 1], ")");
  }
}

// The scalar fields of a problem, as plan() checks them in its inputs and run() in a plan (which
// may be hand-made): `field` prefixes each field's name ("" or "plan."), `hint` ends each message.
void check_problem(Device device, int device_id, int64_t num_qo_heads, int64_t num_kv_heads, DType dtype,
                   int64_t head_dim, int64_t page_size, bool is_decode, const char* field, const char* hint) {
  check_known_device(device, detail::concat(field, "device"), hint);
  const bool cpu = device == Device::kCPU;
  GQ_CHECK(cpu || device_id >= 0, field, "device_id (", device_id, ") must be >= 0", hint);
  GQ_CHECK(num_qo_heads > 0, field, "num_qo_heads (", num_qo_heads, ") must be > 0", hint);
  GQ_CHECK(num_kv_heads > 0, field, "num_kv_heads (", num_kv_heads, ") must be > 0", hint);
  GQ_CHECK(num_qo_heads % num_kv_heads == 0, field, "num_qo_heads (", num_qo_heads,
           ") must be divisible by num_kv_heads (", num_kv_heads, ")", hint);
  GQ_CHECK(dtype == DType::kBF16 || dtype == DType::kFP16 || dtype == DType::kFP32 || dtype == DType::kInt32, field,
           "dtype: unknown dtype value ", int(dtype), hint);
  GQ_CHECK(dtype != DType::kInt32, field, "dtype: int32 is not an attention dtype (bf16 or fp16; fp32 on the CPU)",
           hint);
  GQ_CHECK(cpu || dtype != DType::kFP32, field,
           "dtype: fp32 runs on the CPU backend only; the GPU kernels take bf16 or fp16", hint);
  GQ_CHECK(head_dim >= 1, field, "head_dim (", head_dim, ") must be >= 1", hint);
  GQ_CHECK(!cpu || head_dim <= kCpuMaxHeadDim, field, "head_dim (", head_dim, ") must be in [1, ", kCpuMaxHeadDim,
           "] on the CPU", hint);
  GQ_CHECK(page_size >= 0, field, "page_size (", page_size, ") must be >= 1 (paged) or 0 (ragged)", hint);
  GQ_CHECK(!is_decode || page_size >= 1, field, "page_size (", page_size, ") must be >= 1: decode reads paged K/V",
           hint);
}

// A plan as plan() returns it: the host vectors agree with batch, qo_indptr keeps the rows
// within total_qo, kv lengths are >= 0 and the query heads are whole groups per K/V head (guards
// hand-made plans: the CPU backend divides by num_kv_heads and reads kv_len keys of a request).
void check_plan(const Plan& plan) {
  constexpr const char* kMadeBy = "; pass a plan returned by decode_plan or prefill_plan";
  GQ_CHECK(plan.batch >= 0 && plan.kv_len.size() == size_t(plan.batch) &&
               plan.qo_indptr.size() == size_t(plan.batch) + 1,
           "plan: inconsistent (batch ", plan.batch, ", ", plan.kv_len.size(), " kv lengths, ",
           plan.qo_indptr.size(), " qo_indptr entries)", kMadeBy);
  GQ_CHECK(plan.qo_indptr.back() == plan.total_qo, "plan: total_qo (", plan.total_qo,
           ") differs from plan.qo_indptr[batch] (", plan.qo_indptr.back(), ")", kMadeBy);
  check_indptr(plan.qo_indptr, "plan.qo_indptr");
  for (int b = 0; b < plan.batch; ++b) {
    GQ_CHECK(plan.kv_len[b] >= 0, "plan.kv_len[", b, "] (", plan.kv_len[b], ") is negative", kMadeBy);
  }
  check_problem(plan.device, plan.device_id, plan.num_qo_heads, plan.num_kv_heads, plan.dtype, plan.head_dim,
                plan.page_size, plan.is_decode, "plan.", kMadeBy);
  GQ_CHECK(plan.num_pages >= -1 && (plan.num_pages < 0 || plan.page_size >= 1), "plan.num_pages (", plan.num_pages,
           ") must be -1, or >= 0 in a paged plan", kMadeBy);
}

// The GPU kernels fold the scale into the exponent as a positive factor, so a negative one is
// rejected on every device (the CPU backend would take it, the GPU not).
void check_scale(float sm_scale) {
  GQ_CHECK(std::isfinite(sm_scale) && sm_scale >= 0.f, "sm_scale (", sm_scale,
           ") must be finite and >= 0 (0 means 1/sqrt(head_dim))");
}

int64_t pages_for(int64_t kv_len, int64_t page_size) { return (kv_len + page_size - 1) / page_size; }

// Pages the plan's requests need in total (the CSR kv_page_indptr[batch] they were planned with).
int64_t planned_pages(const Plan& plan) {
  int64_t pages = 0;
  for (int32_t len : plan.kv_len) pages += pages_for(len, plan.page_size);
  return pages;
}

int64_t planned_keys(const Plan& plan) {
  int64_t keys = 0;
  for (int32_t len : plan.kv_len) keys += len;
  return keys;
}

// K and V page pools: 4 dims in the descriptor's layout, same shape and strides, one dtype.
// Expected sizes may be kAny (append_kv has no plan).
void check_pools(const PagedKV& kv, const std::string& name, DType dtype, bool dtype_from_plan,
                 int64_t num_kv_heads, int64_t page_size, int64_t head_dim, Device device,
                 int device_id, const char* reference) {
  const std::string k = name + ".k_pages";
  const std::string v = name + ".v_pages";
  GQ_CHECK(kv.layout == KVLayout::kNHD || kv.layout == KVLayout::kHND, name, ".layout: unknown layout value ",
           int(kv.layout));
  if (kv.layout == KVLayout::kHND) {
    check_shape(kv.k_pages, k, {{"num_pages", kAny}, {"num_kv_heads", num_kv_heads},
                                {"page_size", page_size}, {"head_dim", head_dim}});
  } else {
    check_shape(kv.k_pages, k, {{"num_pages", kAny}, {"page_size", page_size},
                                {"num_kv_heads", num_kv_heads}, {"head_dim", head_dim}});
  }
  GQ_CHECK(kv.v_pages.defined(), v, ": not given (undefined tensor); expected the shape of ", k, " ",
           shape_str(kv.k_pages));
  GQ_CHECK(kv.v_pages.ndim == kv.k_pages.ndim, v, ": ", kv.v_pages.ndim, " dims, expected ", kv.k_pages.ndim,
           " (the shape of ", k, " ", shape_str(kv.k_pages), ")");
  // A dim of size 1 is only ever indexed at 0: its stride may differ (a pool of one K/V head viewed
  // from HND as NHD).
  bool same_shape = true, same_strides = true;
  for (int d = 0; d < kv.k_pages.ndim; ++d) {
    same_shape = same_shape && kv.v_pages.shape[d] == kv.k_pages.shape[d];
    same_strides = same_strides && (kv.k_pages.shape[d] <= 1 || kv.v_pages.strides[d] == kv.k_pages.strides[d]);
  }
  GQ_CHECK(same_shape, v, ": shape ", shape_str(kv.v_pages), " differs from ", k, " ",
           shape_str(kv.k_pages));
  GQ_CHECK(same_strides, v, ": strides ", strides_str(kv.v_pages), " differ from ", k, " strides ",
           strides_str(kv.k_pages), " (the kernels address K and V pages with one set of strides)");
  GQ_CHECK(kv.page_size() >= 1, k, ": page_size (", kv.page_size(), ") must be >= 1 (layout ",
           layout_name(kv.layout), ")");
  if (dtype_from_plan) {
    check_dtype(kv.k_pages, k, dtype, " (the plan's dtype)");
  } else {
    check_storage_dtype(kv.k_pages, k, device);
  }
  check_dtype(kv.v_pages, v, kv.k_pages.dtype, detail::concat(" (the dtype of ", k, ")").c_str());
  check_device(kv.k_pages, k, device, device_id, reference);
  check_device(kv.v_pages, v, device, device_id, reference);
  check_memory(kv.k_pages, k);
  check_memory(kv.v_pages, v);
  check_aligned(kv.k_pages, k, device);
  check_aligned(kv.v_pages, v, device);
}

// The paged descriptor of a run against its plan.
void check_paged(const PagedKV& kv, const std::string& name, const Plan& plan) {
  check_pools(kv, name, plan.dtype, true, plan.num_kv_heads, plan.page_size, plan.head_dim,
              plan.device, plan.device_id, "the plan");
  check_index(kv.kv_page_indptr, name + ".kv_page_indptr", "batch + 1", int64_t(plan.batch) + 1,
              plan.device, plan.device_id, "the plan");
  check_index(kv.kv_last_page_len, name + ".kv_last_page_len", "batch", plan.batch, plan.device,
              plan.device_id, "the plan");
  check_index(kv.kv_page_indices, name + ".kv_page_indices", "pages", kAny, plan.device,
              plan.device_id, "the plan");
  GQ_CHECK(plan.num_pages < 0 || kv.num_pages() >= plan.num_pages, name, ".k_pages: holds ", kv.num_pages(),
           " pages but the plan checked its page ids against num_pages (", plan.num_pages, ")");
  const int64_t needed = planned_pages(plan);
  GQ_CHECK(kv.kv_page_indices.shape[0] >= needed, name, ".kv_page_indices: holds ",
           kv.kv_page_indices.shape[0], " page ids but the plan's kv lengths need ", needed,
           " pages of ", plan.page_size, " tokens");
}

// CPU only: the index tensors' contents against the plan and the pool.
void check_paged_contents(const PagedKV& kv, const std::string& name, const Plan& plan) {
  const int32_t* indptr = kv.kv_page_indptr.ptr<int32_t>();
  const int32_t* last = kv.kv_last_page_len.ptr<int32_t>();
  const int32_t* indices = kv.kv_page_indices.ptr<int32_t>();
  const int64_t num_indices = kv.kv_page_indices.shape[0];
  GQ_CHECK(indptr[0] == 0, name, ".kv_page_indptr[0] must be 0, got ", indptr[0]);
  for (int b = 0; b < plan.batch; ++b) {
    const int64_t pages = int64_t(indptr[b + 1]) - indptr[b];
    GQ_CHECK(pages >= 0, name, ".kv_page_indptr must be non-decreasing: entry ", b + 1, " (",
             indptr[b + 1], ") < entry ", b, " (", indptr[b], ")");
    if (pages == 0) {
      GQ_CHECK(last[b] == 0, name, ".kv_last_page_len[", b, "] (", last[b],
               ") must be 0: request ", b, " owns no page");
    } else {
      GQ_CHECK(last[b] >= 1 && last[b] <= plan.page_size, name, ".kv_last_page_len[", b, "] (",
               last[b], ") must be in [1, page_size (", plan.page_size, ")]");
    }
    const int64_t len = pages == 0 ? 0 : (pages - 1) * plan.page_size + last[b];
    GQ_CHECK(len == plan.kv_len[b], name, ".kv_page_indptr / kv_last_page_len: request ", b,
             " holds ", len, " keys but the plan was made for ", plan.kv_len[b]);
  }
  GQ_CHECK(indptr[plan.batch] <= num_indices, name, ".kv_page_indices: holds ", num_indices,
           " entries but ", name, ".kv_page_indptr[batch] is ", indptr[plan.batch]);
  const int64_t num_pages = kv.num_pages();
  for (int64_t i = 0; i < indptr[plan.batch]; ++i) {
    GQ_CHECK(indices[i] >= 0 && indices[i] < num_pages, name, ".kv_page_indices[", i, "] (",
             indices[i], ") is outside the page pool [0, ", num_pages, ")");
  }
}

void check_ragged(const RaggedKV& kv, const std::string& name, const Plan& plan) {
  const std::string k = name + ".k";
  const std::string v = name + ".v";
  check_shape(kv.k, k, {{"kv_tokens", kAny}, {"num_kv_heads", plan.num_kv_heads},
                        {"head_dim", plan.head_dim}});
  check_shape(kv.v, v, {{"kv_tokens", kv.k.shape[0]}, {"num_kv_heads", plan.num_kv_heads},
                        {"head_dim", plan.head_dim}});
  for (int d = 0; d < 3; ++d) {  // a dim of size 1 is only ever indexed at 0
    GQ_CHECK(kv.k.shape[d] <= 1 || kv.v.strides[d] == kv.k.strides[d], v, ": strides ", strides_str(kv.v),
             " differ from ", k, " strides ", strides_str(kv.k),
             " (the kernels address K and V with one set of strides)");
  }
  for (const auto* t : {&kv.k, &kv.v}) {
    const std::string& arg = t == &kv.k ? k : v;
    check_dtype(*t, arg, plan.dtype, " (the plan's dtype)");
    check_device(*t, arg, plan.device, plan.device_id, "the plan");
    check_memory(*t, arg);
    check_aligned(*t, arg, plan.device);
  }
  const int64_t keys = planned_keys(plan);
  GQ_CHECK(kv.k.shape[0] >= keys, k, ": holds ", kv.k.shape[0],
           " rows but the plan's requests need ", keys, " (the sum of kv_len)");
  check_index(kv.kv_indptr, name + ".kv_indptr", "batch + 1", int64_t(plan.batch) + 1, plan.device,
              plan.device_id, "the plan");
  if (plan.device != Device::kCPU) return;
  const int32_t* indptr = kv.kv_indptr.ptr<int32_t>();
  GQ_CHECK(indptr[0] == 0, name, ".kv_indptr[0] must be 0, got ", indptr[0]);
  for (int b = 0; b < plan.batch; ++b) {
    const int64_t len = int64_t(indptr[b + 1]) - indptr[b];
    GQ_CHECK(len == plan.kv_len[b], name, ".kv_indptr: request ", b, " holds ", len,
             " keys but the plan was made for ", plan.kv_len[b]);
  }
}

}  // namespace

void validate_plan_inputs(const PlanInputs& in, bool is_decode) {
  const bool cpu = in.device == Device::kCPU;
  check_problem(in.device, in.device_id, in.num_qo_heads, in.num_kv_heads, in.dtype, in.head_dim, in.page_size,
                is_decode, "", "");
  GQ_CHECK(in.max_num_splits >= 0, "max_num_splits (", in.max_num_splits,
           ") must be >= 0 (0: the planner decides)");
  GQ_CHECK(in.fixed_split_size >= 0, "fixed_split_size (", in.fixed_split_size,
           ") must be >= 0 (0: the planner decides)");
  GQ_CHECK(in.fixed_split_size == 0 || in.max_num_splits == 0, "fixed_split_size (", in.fixed_split_size,
           ") and max_num_splits (", in.max_num_splits, "): set at most one (a fixed chunk decides the splits)");
  GQ_CHECK(!in.graph_per_split || in.enable_cuda_graph,
           "graph_per_split: set without enable_cuda_graph (it chooses how CUDA-graph plans launch the merge)");
  GQ_CHECK(in.num_pages >= -1, "num_pages (", in.num_pages, ") must be -1 (unknown) or >= 0");

  const bool paged = in.page_size >= 1;
  check_indptr(in.kv_indptr, paged ? "kv_indptr (page indptr)" : "kv_indptr (token indptr)");
  const int64_t batch = int64_t(in.kv_indptr.size()) - 1;

  std::vector<int64_t> kv_len(batch);
  if (paged) {
    GQ_CHECK(int64_t(in.kv_last_page_len.size()) == batch, "kv_last_page_len: expected ", batch,
             " entries (batch, from kv_indptr), got ", in.kv_last_page_len.size());
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t pages = int64_t(in.kv_indptr[b + 1]) - in.kv_indptr[b];
      const int32_t last = in.kv_last_page_len[b];
      if (pages == 0) {
        GQ_CHECK(last == 0, "kv_last_page_len[", b, "] (", last, ") must be 0: request ", b,
                 " owns no page");
        kv_len[b] = 0;
      } else {
        GQ_CHECK(last >= 1 && last <= in.page_size, "kv_last_page_len[", b, "] (", last,
                 ") must be in [1, page_size (", in.page_size, ")]: request ", b, " owns ", pages,
                 " pages");
        kv_len[b] = (pages - 1) * in.page_size + last;
      }
    }
  } else {
    GQ_CHECK(in.kv_last_page_len.empty(), "kv_last_page_len: must be empty for ragged K/V (page_size 0), got ",
             in.kv_last_page_len.size(), " entries");
    for (int64_t b = 0; b < batch; ++b) kv_len[b] = int64_t(in.kv_indptr[b + 1]) - in.kv_indptr[b];
  }
  // Paged pools may list one page many times, so a request's keys are not bounded by memory.
  for (int64_t b = 0; b < batch; ++b) {
    GQ_CHECK(kv_len[b] <= kMaxKvLen, "kv_len of request ", b, " (", kv_len[b], ") exceeds ", kMaxKvLen,
             " keys (the kernels index a request's keys in int32)");
  }

  std::vector<int64_t> qo_len(batch);
  if (is_decode) {
    GQ_CHECK(in.qo_indptr.empty(), "qo_indptr: must be empty for decode (set qo_len), got ",
             in.qo_indptr.size(), " entries");
    GQ_CHECK(in.qo_len >= 1, "qo_len (", in.qo_len, ") must be >= 1");
    GQ_CHECK(cpu || in.qo_len <= kCudaMaxDecodeQoLen, "qo_len (", in.qo_len,
             ") must be in [1, ", kCudaMaxDecodeQoLen, "] for a CUDA decode");
    GQ_CHECK(batch * in.qo_len <= INT32_MAX, "batch (", batch, ") x qo_len (", in.qo_len,
             ") query tokens do not fit in int32");
    for (int64_t b = 0; b < batch; ++b) qo_len[b] = in.qo_len;
  } else {
    check_indptr(in.qo_indptr, "qo_indptr");
    GQ_CHECK(int64_t(in.qo_indptr.size()) == batch + 1, "qo_indptr: expected ", batch + 1,
             " entries (batch + 1, from kv_indptr), got ", in.qo_indptr.size());
    for (int64_t b = 0; b < batch; ++b) qo_len[b] = int64_t(in.qo_indptr[b + 1]) - in.qo_indptr[b];
  }

  // A request's packed rows (its query tokens x the group's query heads) are int32 row indices in
  // the work list and the kernels: a product past them would wrap there (and in the CPU backend).
  const int64_t group_size = in.num_qo_heads / in.num_kv_heads;
  for (int64_t b = 0; b < batch; ++b) {
    GQ_CHECK(qo_len[b] * group_size <= kMaxPackedRows, "request ", b, ": qo_len (", qo_len[b],
             ") x group size (num_qo_heads / num_kv_heads = ", group_size, ") is ", qo_len[b] * group_size,
             " packed query rows, more than ", kMaxPackedRows, " (split the request)");
  }

  // A causal mask puts the new tokens at the end of the KV, so there must be room for them
  // (an empty KV is allowed: its rows see no key and produce 0).
  if (in.causal || is_decode) {
    for (int64_t b = 0; b < batch; ++b) {
      GQ_CHECK(kv_len[b] == 0 || qo_len[b] <= kv_len[b], "request ", b, ": qo_len (", qo_len[b],
               ") exceeds kv_len (", kv_len[b],
               "); with a causal mask the new tokens are the last qo_len keys of the KV");
    }
  }

  // Checked mode: page ids given, or a pool size (an empty list of page ids is checked too: against
  // kv_indptr[batch], which must then be 0).
  if (!in.kv_page_indices.empty() || in.num_pages >= 0) {
    GQ_CHECK(paged, "kv_page_indices: checked mode needs paged K/V (page_size 0 means ragged)");
    GQ_CHECK(in.num_pages >= 0, "num_pages (", in.num_pages,
             ") must be set when kv_page_indices is given (checked mode)");
    GQ_CHECK(int64_t(in.kv_page_indices.size()) == in.kv_indptr.back(), "kv_page_indices: holds ",
             in.kv_page_indices.size(), " page ids but kv_indptr[batch] is ", in.kv_indptr.back());
    for (size_t i = 0; i < in.kv_page_indices.size(); ++i) {
      const int32_t page = in.kv_page_indices[i];
      GQ_CHECK(page >= 0 && page < in.num_pages, "kv_page_indices[", i, "] (", page,
               ") is outside the page pool [0, num_pages (", in.num_pages, "))");
    }
  }

  if (!cpu) cuda_backend::check_supported(in.dtype, in.head_dim);
}

void validate_decode_args(const Plan& plan, const DecodeArgs& args) {
  GQ_CHECK(plan.is_decode, "plan: made by prefill_plan; decode_run needs a plan from decode_plan");
  check_plan(plan);
  check_scale(args.sm_scale);
  check_qo(args.q, "q", plan);
  check_qo(args.o, "o", plan);
  check_run_lse(args.lse, plan);
  GQ_CHECK(args.kv.defined(), "kv: not given (kv.k_pages is undefined)");
  check_paged(args.kv, "kv", plan);
  NamedInputs inputs;
  inputs.add_paged(args.kv, kKvNames);
  inputs.add(args.q, "q");
  check_outputs({{&args.o, "o"}, {&args.lse, "lse"}}, inputs, &args.o, &args.q);
  if (plan.device == Device::kCPU) check_paged_contents(args.kv, "kv", plan);
}

void validate_prefill_args(const Plan& plan, const PrefillArgs& args) {
  GQ_CHECK(!plan.is_decode, "plan: made by decode_plan; prefill_run needs a plan from prefill_plan");
  check_plan(plan);
  GQ_CHECK(args.causal == plan.causal, "causal: prefill_run was called with causal=",
           args.causal ? "true" : "false", " but the plan was made with causal=",
           plan.causal ? "true" : "false");
  check_scale(args.sm_scale);
  GQ_CHECK(!(args.paged.defined() && args.ragged.defined()),
           "paged, ragged: exactly one K/V source must be given, got both");
  GQ_CHECK(args.paged.defined() || args.ragged.defined(),
           "paged, ragged: exactly one K/V source must be given, got neither");
  GQ_CHECK(!args.paged.defined() || plan.page_size >= 1,
           "paged: K/V is paged but the plan was made for ragged K/V (page_size 0)");
  GQ_CHECK(!args.ragged.defined() || plan.page_size == 0, "ragged: K/V is ragged but the plan was "
           "made for paged K/V (page_size ", plan.page_size, ")");
  check_qo(args.q, "q", plan);
  check_qo(args.o, "o", plan);
  check_run_lse(args.lse, plan);
  check_index(args.qo_indptr, "qo_indptr", "batch + 1", int64_t(plan.batch) + 1, plan.device,
              plan.device_id, "the plan");
  NamedInputs inputs;
  if (args.paged.defined()) {
    check_paged(args.paged, "paged", plan);
    inputs.add_paged(args.paged, kPagedNames);
  } else {
    check_ragged(args.ragged, "ragged", plan);
    inputs.add(args.ragged.k, "ragged.k");
    inputs.add(args.ragged.v, "ragged.v");
    inputs.add(args.ragged.kv_indptr, "ragged.kv_indptr");
  }
  inputs.add(args.q, "q");
  inputs.add(args.qo_indptr, "qo_indptr");
  check_outputs({{&args.o, "o"}, {&args.lse, "lse"}}, inputs, &args.o, &args.q);
  if (plan.device != Device::kCPU) return;
  const int32_t* qo_indptr = args.qo_indptr.ptr<int32_t>();
  for (int b = 0; b <= plan.batch; ++b) {
    GQ_CHECK(qo_indptr[b] == plan.qo_indptr[b], "qo_indptr[", b, "] (", qo_indptr[b],
             ") differs from the plan's (", plan.qo_indptr[b], ")");
  }
  if (args.paged.defined()) check_paged_contents(args.paged, "paged", plan);
}

void validate_append_kv(const PagedKV& kv, const TensorView& k_new, const TensorView& v_new,
                        const TensorView& batch_indices, const TensorView& positions) {
  GQ_CHECK(kv.k_pages.defined(), "kv.k_pages: not given (undefined tensor)");
  check_known_device(kv.k_pages.device, "kv.k_pages");
  const Device device = kv.k_pages.device;
  const int device_id = kv.k_pages.device_id;
  const char* ref = "kv.k_pages";
  check_pools(kv, "kv", DType::kBF16, false, kAny, kAny, kAny, device, device_id, ref);
  const int64_t heads = kv.num_kv_heads();
  const int64_t head_dim = kv.head_dim();
  check_shape(k_new, "k_new", {{"num_tokens", kAny}, {"num_kv_heads", heads}, {"head_dim", head_dim}});
  const int64_t tokens = k_new.shape[0];
  // The GPU kernel's token count is an int (a count past it would be truncated: tokens skipped).
  GQ_CHECK(tokens <= INT32_MAX, "k_new: num_tokens (", tokens, ") does not fit in int32");
  check_shape(v_new, "v_new", {{"num_tokens", tokens}, {"num_kv_heads", heads}, {"head_dim", head_dim}});
  for (const auto* t : {&k_new, &v_new}) {
    const char* arg = t == &k_new ? "k_new" : "v_new";
    check_dtype(*t, arg, kv.k_pages.dtype, " (the dtype of kv.k_pages)");
    check_device(*t, arg, device, device_id, ref);
    check_memory(*t, arg);
    check_aligned(*t, arg, device);
  }
  for (int d = 0; d < 3; ++d) {
    GQ_CHECK(v_new.shape[d] <= 1 || v_new.strides[d] == k_new.strides[d], "v_new: strides ",
             strides_str(v_new), " differ from k_new strides ", strides_str(k_new),
             " (the kernel reads k_new and v_new with one set of strides)");
  }
  check_index(batch_indices, "batch_indices", "num_tokens", tokens, device, device_id, ref);
  check_index(positions, "positions", "num_tokens", tokens, device, device_id, ref);
  check_index(kv.kv_page_indptr, "kv.kv_page_indptr", "batch + 1", kAny, device, device_id, ref);
  GQ_CHECK(kv.kv_page_indptr.shape[0] >= 1, "kv.kv_page_indptr: must hold batch + 1 entries, got none");
  const int64_t batch = kv.batch();
  check_index(kv.kv_page_indices, "kv.kv_page_indices", "pages", kAny, device, device_id, ref);
  if (kv.kv_last_page_len.defined()) {
    check_index(kv.kv_last_page_len, "kv.kv_last_page_len", "batch", batch, device, device_id, ref);
  }
  const Named inputs[] = {{&k_new, "k_new"},
                          {&v_new, "v_new"},
                          {&batch_indices, "batch_indices"},
                          {&positions, "positions"},
                          {&kv.kv_page_indptr, "kv.kv_page_indptr"},
                          {&kv.kv_page_indices, "kv.kv_page_indices"},
                          {&kv.kv_last_page_len, "kv.kv_last_page_len"}};
  check_outputs({{&kv.k_pages, "kv.k_pages"}, {&kv.v_pages, "kv.v_pages"}}, inputs);
  if (device != Device::kCPU) return;

  const int32_t* indptr = kv.kv_page_indptr.ptr<int32_t>();
  const int32_t* indices = kv.kv_page_indices.ptr<int32_t>();
  GQ_CHECK(indptr[0] == 0, "kv.kv_page_indptr[0] must be 0, got ", indptr[0]);
  for (int64_t b = 0; b < batch; ++b) {
    GQ_CHECK(indptr[b + 1] >= indptr[b], "kv.kv_page_indptr must be non-decreasing: entry ", b + 1,
             " (", indptr[b + 1], ") < entry ", b, " (", indptr[b], ")");
  }
  GQ_CHECK(indptr[batch] <= kv.kv_page_indices.shape[0], "kv.kv_page_indices: holds ",
           kv.kv_page_indices.shape[0], " entries but kv.kv_page_indptr[batch] is ", indptr[batch]);
  const int64_t page_size = kv.page_size();
  const int32_t* bidx = batch_indices.ptr<int32_t>();
  const int32_t* pos = positions.ptr<int32_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t b = bidx[t];
    GQ_CHECK(b >= 0 && b < batch, "batch_indices[", t, "] (", b, ") is outside [0, batch (", batch, "))");
    const int64_t pages = int64_t(indptr[b + 1]) - indptr[b];
    GQ_CHECK(pos[t] >= 0 && pos[t] / page_size < pages, "positions[", t, "] (", pos[t],
             ") lies outside the pages of request ", b, " (", pages, " pages of ", page_size,
             " tokens)");
    const int32_t page = indices[indptr[b] + pos[t] / page_size];
    GQ_CHECK(page >= 0 && page < kv.num_pages(), "kv.kv_page_indices[", indptr[b] + pos[t] / page_size,
             "] (", page, ") is outside the page pool [0, ", kv.num_pages(), ")");
  }
}

void validate_merge_states(const TensorView& v, const TensorView& s, const TensorView& v_merged,
                           const TensorView& s_merged) {
  check_shape(v, "v", {{"n", kAny}, {"num_states", kAny}, {"num_heads", kAny}, {"head_dim", kAny}});
  check_known_device(v.device, "v");
  const Device device = v.device;
  const int device_id = v.device_id;
  const int64_t n = v.shape[0], states = v.shape[1], heads = v.shape[2], head_dim = v.shape[3];
  // The GPU kernel takes these three as int (n, and n x num_heads, in int64).
  GQ_CHECK(states <= INT32_MAX && heads <= INT32_MAX && head_dim <= INT32_MAX, "v: num_states (", states,
           "), num_heads (", heads, ") and head_dim (", head_dim, ") must each fit in int32");
  const char* ref = "v";
  const DType fp32 = DType::kFP32;
  check_shape(s, "s", {{"n", n}, {"num_states", states}, {"num_heads", heads}});
  check_shape(v_merged, "v_merged", {{"n", n}, {"num_heads", heads}, {"head_dim", head_dim}});
  if (s_merged.defined()) check_shape(s_merged, "s_merged", {{"n", n}, {"num_heads", heads}});
  for (const auto* t : {&v, &v_merged}) {
    const char* arg = t == &v ? "v" : "v_merged";
    GQ_CHECK(t->dtype == DType::kBF16 || t->dtype == DType::kFP16 || t->dtype == fp32, arg,
             ": dtype ", dtype_name(t->dtype), " is not supported (expected bf16, fp16 or fp32)");
    check_device(*t, arg, device, device_id, ref);
    check_memory(*t, arg);
    check_aligned(*t, arg, device);
  }
  check_dtype(s, "s", fp32, " (log-sum-exp is fp32)");
  check_device(s, "s", device, device_id, ref);
  check_memory(s, "s");
  check_lse(s_merged, "s_merged", n, heads, "num_heads", device, device_id, ref);
  const Named inputs[] = {{&v, "v"}, {&s, "s"}};
  check_outputs({{&v_merged, "v_merged"}, {&s_merged, "s_merged"}}, inputs);
}

}  // namespace gqattn
