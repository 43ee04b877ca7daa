// Helpers shared by the CPU and GPU tests: an owning host tensor, seeded random fills, random
// page tables over a pool larger than needed, paged (HND / NHD) and ragged K/V built from dense
// per-token K/V, error measures, and K/V expansion per query head. Header-only so that .cu tests
// can include it. Layer: tests (host-only).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "api/host_float.h"
#include "gqattn/attention.h"
#include "gqattn/error.h"
#include "gqattn/paged_kv.h"
#include "gqattn/tensor.h"
#include "prims/counter_random.h"

namespace gqattn::test {

// Row-major element offsets of a shape, in the order of the logical (multi-)index.
inline int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// Calls fn(logical_index, element_offset) for every element of a view (row-major order).
template <typename Fn>
void for_each_element(const TensorView& t, Fn&& fn) {
  if (t.ndim == 0) return;
  const int64_t n = t.numel();
  int64_t idx[kMaxDims] = {0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) {
    int64_t offset = 0;
    for (int d = 0; d < t.ndim; ++d) offset += idx[d] * t.strides[d];
    fn(i, offset);
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
}

// A host tensor that owns its bytes; view() is the TensorView the library takes.
class HostTensor {
 public:
  HostTensor() = default;
  // Contiguous, zero-filled.
  HostTensor(const std::vector<int64_t>& shape, DType dtype)
      : HostTensor(shape, contiguous_strides(shape), dtype) {}
  // Explicit element strides (for padded or permuted layouts); the storage covers the largest
  // offset reached.
  HostTensor(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, DType dtype) {
    GQ_CHECK(shape.size() == strides.size() && !shape.empty() && shape.size() <= size_t(kMaxDims),
             "HostTensor: bad rank");
    int64_t extent = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 0) extent = 0;
    }
    if (extent != 0) {
      for (size_t d = 0; d < shape.size(); ++d) extent += (shape[d] - 1) * strides[d];
    }
    storage_.assign(size_t(extent) * dtype_size(dtype), 0);
    view_.ndim = int(shape.size());
    view_.dtype = dtype;
    for (size_t d = 0; d < shape.size(); ++d) {
      view_.shape[d] = shape[d];
      view_.strides[d] = strides[d];
    }
    view_.data = storage_.empty() ? nullptr : storage_.data();
  }
  static HostTensor from_int32(const std::vector<int32_t>& values) {
    HostTensor t({int64_t(values.size())}, DType::kInt32);
    if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(int32_t));
    return t;
  }
  static std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
    std::vector<int64_t> strides(shape.size(), 1);
    for (int d = int(shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
    return strides;
  }

  HostTensor(const HostTensor& other) : storage_(other.storage_), view_(other.view_) { repoint(); }
  HostTensor& operator=(const HostTensor& other) {
    storage_ = other.storage_;
    view_ = other.view_;
    repoint();
    return *this;
  }
  HostTensor(HostTensor&& other) noexcept = default;  // the vector keeps its buffer
  HostTensor& operator=(HostTensor&& other) noexcept = default;

  const TensorView& view() const { return view_; }
  TensorView& view() { return view_; }
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  size_t bytes() const { return storage_.size(); }
  DType dtype() const { return view_.dtype; }
  int64_t storage_elems() const { return int64_t(storage_.size() / dtype_size(view_.dtype)); }
  const std::vector<uint8_t>& storage() const { return storage_; }

  // Element at a logical index, through the strides.
  double at(std::initializer_list<int64_t> index) const {
    return load_as_double(data(), view_.dtype, offset(index));
  }
  void set(std::initializer_list<int64_t> index, double value) {
    store_from_double(data(), view_.dtype, offset(index), value);
  }
  int64_t offset(std::initializer_list<int64_t> index) const {
    int64_t off = 0;
    int d = 0;
    for (int64_t i : index) off += i * view_.strides[d++];
    return off;
  }
  // Logical elements, row-major, as doubles.
  std::vector<double> to_doubles() const {
    std::vector<double> out(size_t(view_.numel()));
    for_each_element(view_, [&](int64_t i, int64_t off) { out[size_t(i)] = load_as_double(data(), view_.dtype, off); });
    return out;
  }
  // Sets the logical elements from a row-major vector (rounded to the dtype).
  void from_doubles(const std::vector<double>& values) {
    for_each_element(view_, [&](int64_t i, int64_t off) { store_from_double(data(), view_.dtype, off, values[size_t(i)]); });
  }
  // Every storage byte set to `byte` (padding included): poison before a call that must not write.
  void fill_bytes(uint8_t byte) { std::fill(storage_.begin(), storage_.end(), byte); }

 private:
  void repoint() { view_.data = storage_.empty() ? nullptr : storage_.data(); }
  std::vector<uint8_t> storage_;
  TensorView view_;
};

// Seeded values in [-1, -0.05] U [0.05, 1] for every storage element (padding too): random,
// never zero, exactly representable after rounding to the tensor's dtype. Storage element i is
// a function of (seed, i) alone (prims/counter_random.h): ~3 ns an element, where mt19937_64 and
// a distribution took ~20 and made the inputs most of a GPU decode test's time.
inline void fill_random(HostTensor& t, uint64_t seed) {
  const int64_t n = t.storage_elems();
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t bits = prims::random_bits(seed, 0, uint64_t(i));
    const double mag = 0.05 + 0.95 * prims::uniform01(bits);
    store_from_double(t.data(), t.dtype(), i, mag * (2.0 * double(bits & 1) - 1.0));  // the sign without a branch
  }
}

inline HostTensor random_tensor(const std::vector<int64_t>& shape, DType dtype, uint64_t seed) {
  HostTensor t(shape, dtype);
  fill_random(t, seed);
  return t;
}

// ---- page tables -----------------------------------------------------------------------------

// A CSR page table whose pages are a random choice (random order) from a pool of num_pages.
struct PageTable {
  std::vector<int32_t> kv_len;
  std::vector<int32_t> kv_page_indptr;
  std::vector<int32_t> kv_page_indices;
  std::vector<int32_t> kv_last_page_len;
  int64_t num_pages = 0;
  int page_size = 1;
};

// Pages for `kv_len` tokens per request; the pool holds `extra_pages` more pages than needed
// (negative: half as many again, plus 3) so that pages are neither contiguous nor in order.
inline PageTable make_random_page_table(const std::vector<int32_t>& kv_len, int page_size,
                                        uint64_t seed, int64_t extra_pages = -1) {
  PageTable t;
  t.kv_len = kv_len;
  t.page_size = page_size;
  t.kv_page_indptr.push_back(0);
  int64_t needed = 0;
  for (int32_t len : kv_len) {
    const int64_t pages = (int64_t(len) + page_size - 1) / page_size;
    needed += pages;
    t.kv_page_indptr.push_back(int32_t(needed));
    t.kv_last_page_len.push_back(pages == 0 ? 0 : int32_t(len - (pages - 1) * page_size));
  }
  t.num_pages = needed + (extra_pages < 0 ? needed / 2 + 3 : extra_pages);
  std::vector<int32_t> pool(size_t(t.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(pool.begin(), pool.end(), rng);
  t.kv_page_indices.assign(pool.begin(), pool.begin() + needed);
  return t;
}

// Request b's tokens as a page table reports them: prefix sums of kv_len.
inline std::vector<int32_t> token_indptr(const std::vector<int32_t>& kv_len) {
  std::vector<int32_t> indptr(1, 0);
  for (int32_t len : kv_len) indptr.push_back(indptr.back() + len);
  return indptr;
}

// The PagedKV over the views of a struct's pools and index tensors (PagedKVHost here, the GPU
// tests' DevicePagedKV): members k_pages, v_pages, kv_page_indptr, kv_page_indices,
// kv_last_page_len and layout.
template <typename Pools>
PagedKV paged_kv_view(const Pools& p) {
  PagedKV kv;
  kv.k_pages = p.k_pages.view();
  kv.v_pages = p.v_pages.view();
  kv.layout = p.layout;
  kv.kv_page_indptr = p.kv_page_indptr.view();
  kv.kv_page_indices = p.kv_page_indices.view();
  kv.kv_last_page_len = p.kv_last_page_len.view();
  return kv;
}

// A page pool pair with its index tensors, on the host.
struct PagedKVHost {
  HostTensor k_pages, v_pages;
  HostTensor kv_page_indptr, kv_page_indices, kv_last_page_len;
  KVLayout layout = KVLayout::kNHD;
  PageTable table;

  PagedKV view() const { return paged_kv_view(*this); }
};

inline std::vector<int64_t> pool_shape(KVLayout layout, int64_t num_pages, int64_t num_kv_heads,
                                       int64_t page_size, int64_t head_dim) {
  return layout == KVLayout::kHND ? std::vector<int64_t>{num_pages, num_kv_heads, page_size, head_dim}
                                  : std::vector<int64_t>{num_pages, page_size, num_kv_heads, head_dim};
}

// Element offset of (page, kv head, row) in a pool of `layout`, dim 0.
inline int64_t pool_offset(const TensorView& pool, KVLayout layout, int64_t page, int64_t head,
                           int64_t row) {
  return layout == KVLayout::kHND
             ? page * pool.strides[0] + head * pool.strides[1] + row * pool.strides[2]
             : page * pool.strides[0] + row * pool.strides[1] + head * pool.strides[2];
}

// Pools in `layout` holding dense K/V: k_dense, v_dense [total_kv, num_kv_heads, head_dim] with
// request b's tokens at rows token_indptr(kv_len)[b] ... Unused pool slots hold random values
// (never zeros), so reading past a request's keys shows. Same dtype as the dense tensors.
inline PagedKVHost make_paged_kv(const HostTensor& k_dense, const HostTensor& v_dense,
                                 const std::vector<int32_t>& kv_len, int page_size, KVLayout layout,
                                 uint64_t seed, int64_t extra_pages = -1) {
  PagedKVHost out;
  out.layout = layout;
  out.table = make_random_page_table(kv_len, page_size, seed, extra_pages);
  const TensorView& kd = k_dense.view();
  const int64_t heads = kd.shape[1], head_dim = kd.shape[2];
  const auto shape = pool_shape(layout, out.table.num_pages, heads, page_size, head_dim);
  out.k_pages = HostTensor(shape, kd.dtype);
  out.v_pages = HostTensor(shape, kd.dtype);
  fill_random(out.k_pages, seed + 1);
  fill_random(out.v_pages, seed + 2);
  const std::vector<int32_t> first = token_indptr(kv_len);
  GQ_CHECK(kd.strides[2] == 1 && v_dense.view().strides[2] == 1 && v_dense.view().strides[0] == kd.strides[0] &&
               v_dense.view().strides[1] == kd.strides[1],
           "make_paged_kv: dense K and V with the same strides, rows contiguous");
  const size_t elem = dtype_size(kd.dtype), row_bytes = size_t(head_dim) * elem;
  auto* k_pool = static_cast<uint8_t*>(out.k_pages.data());
  auto* v_pool = static_cast<uint8_t*>(out.v_pages.data());
  for (size_t b = 0; b < kv_len.size(); ++b) {
    for (int64_t j = 0; j < kv_len[b]; ++j) {
      const int64_t page = out.table.kv_page_indices[out.table.kv_page_indptr[b] + j / page_size];
      for (int64_t h = 0; h < heads; ++h) {
        const size_t dst = size_t(pool_offset(out.k_pages.view(), layout, page, h, j % page_size)) * elem;
        const size_t src = size_t(k_dense.offset({first[b] + j, h, 0})) * elem;
        std::memcpy(k_pool + dst, static_cast<const uint8_t*>(k_dense.data()) + src, row_bytes);
        std::memcpy(v_pool + dst, static_cast<const uint8_t*>(v_dense.data()) + src, row_bytes);
      }
    }
  }
  out.kv_page_indptr = HostTensor::from_int32(out.table.kv_page_indptr);
  out.kv_page_indices = HostTensor::from_int32(out.table.kv_page_indices);
  out.kv_last_page_len = HostTensor::from_int32(out.table.kv_last_page_len);
  return out;
}

// Contiguous (ragged) K/V on the host.
struct RaggedKVHost {
  HostTensor k, v, kv_indptr;
  RaggedKV view() const {
    RaggedKV kv;
    kv.k = k.view();
    kv.v = v.view();
    kv.kv_indptr = kv_indptr.view();
    return kv;
  }
};

inline RaggedKVHost make_ragged_kv(const HostTensor& k_dense, const HostTensor& v_dense,
                                   const std::vector<int32_t>& kv_len) {
  RaggedKVHost out;
  out.k = k_dense;
  out.v = v_dense;
  out.kv_indptr = HostTensor::from_int32(token_indptr(kv_len));
  return out;
}

// K/V per query head: [tokens, num_kv_heads, head_dim] -> [tokens, num_qo_heads, head_dim],
// query head h holding K/V head h / group_size (what MHA would see for the same GQA problem).
inline HostTensor expand_kv_per_query_head(const HostTensor& kv, int num_qo_heads) {
  const TensorView& t = kv.view();
  const int64_t tokens = t.shape[0], kv_heads = t.shape[1], head_dim = t.shape[2];
  const int64_t group_size = num_qo_heads / kv_heads;
  HostTensor out({tokens, num_qo_heads, head_dim}, t.dtype);
  for (int64_t i = 0; i < tokens; ++i)
    for (int64_t h = 0; h < num_qo_heads; ++h)
      for (int64_t d = 0; d < head_dim; ++d) out.set({i, h, d}, kv.at({i, h / group_size, d}));
  return out;
}

// ---- comparison ------------------------------------------------------------------------------

struct Diff {
  double max_abs = 0;    // largest |got - ref| (inf when only one side is infinite)
  double rel_l2 = 0;     // ||got - ref|| / ||ref|| over finite pairs (0 when ref is all zeros and got too)
  int64_t nan_count = 0; // NaNs in got
};

// Compares two equally long sequences of logical elements; matching infinities count as equal.
inline Diff compare_values(const std::vector<double>& got, const std::vector<double>& ref) {
  GQ_CHECK(got.size() == ref.size(), "compare: ", got.size(), " vs ", ref.size(), " elements");
  Diff diff;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) {
      ++diff.nan_count;
      continue;
    }
    if (std::isinf(got[i]) || std::isinf(ref[i])) {
      if (got[i] != ref[i]) diff.max_abs = std::numeric_limits<double>::infinity();
      continue;
    }
    const double e = std::abs(got[i] - ref[i]);
    diff.max_abs = std::max(diff.max_abs, e);
    num += e * e;
    den += ref[i] * ref[i];
  }
  diff.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return diff;
}

inline Diff compare(const HostTensor& got, const HostTensor& ref) {
  return compare_values(got.to_doubles(), ref.to_doubles());
}
inline Diff compare(const HostTensor& got, const std::vector<double>& ref) {
  return compare_values(got.to_doubles(), ref);
}

// Every storage byte equal to `byte` (an output that a rejected call must not have touched).
inline bool all_bytes_equal(const HostTensor& t, uint8_t byte) {
  return std::all_of(t.storage().begin(), t.storage().end(), [byte](uint8_t b) { return b == byte; });
}

// Half an ulp of the dtype at 1.0: the relative rounding error of storing a value.
inline double dtype_eps(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return 1.0 / 256;
    case DType::kFP16: return 1.0 / 2048;
    default: return 1.0 / (1 << 24);
  }
}

}  // namespace gqattn::test
