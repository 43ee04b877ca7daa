// The CUDA compute device's primitives one by one against host references: add_rmsnorm, rope
// (and its fused K/V store against rope + append_kv), swiglu, embed, gather_rows and argmax (ties,
// NaN), a failed graph capture (later steps stay eager), GEMMs of odd (unaligned) strides; the
// elementwise ones on shapes that take the 16-byte vector kernels (Llama's 4096 / 11008 / head_dim
// 128, 128 rows) and shapes whose length, stride or offset forces the scalar
// ones; the cuBLASLt GEMM tuned (<= 256 tokens), untuned (more), with padded strides, fp32 output,
// repeatable bit for bit, first met inside a stream capture, and chosen by the search of item 221
// (perf-notes) on the decode shapes. Layer: tests (label gpu; skipped with a message without a GPU).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "api/host_float.h"
#include "compute.h"
#include "gqattn/attention.h"
#include "sampler.h"

namespace gqattn::engine {
namespace {

// bf16 keeps 8 significant bits: one rounding of the output is within 2^-9 of it; the bound
// leaves room for the fp32 math before it (rsqrtf, sincosf, __expf).
constexpr double kBf16Rel = 1.0 / 128;

// Host data and a device copy: `rows` rows of `stride` elements (the first `cols` of each are the
// view's), `offset_elems` elements past a 256-byte aligned start.
struct DeviceMatrix {
  DeviceBuffer buffer;
  TensorView view;
  std::vector<uint16_t> bf16;  // host copy for bf16 matrices
  std::vector<float> fp32;     // host copy for fp32 matrices
};

class ComputeOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
    gpu_ = make_cuda_compute(0);
  }

  float next_uniform() {  // in [-1, 1)
    seed_ = seed_ * 6364136223846793005ull + 1442695040888963407ull;
    return float(int64_t(seed_ >> 40) - (int64_t(1) << 23)) / float(int64_t(1) << 23);
  }

  DeviceMatrix matrix(DType dtype, int64_t rows, int64_t cols, int64_t stride, float scale, int64_t offset_elems = 0) {
    DeviceMatrix m;
    const size_t elem = dtype_size(dtype);
    const size_t n = size_t(rows * stride);
    m.buffer = gpu_->alloc((n + size_t(offset_elems)) * elem);
    void* data = static_cast<char*>(m.buffer.data()) + offset_elems * int64_t(elem);
    if (dtype == DType::kBF16) {
      for (size_t i = 0; i < n; ++i) m.bf16.push_back(float_to_bf16(scale * next_uniform()));
      gpu_->upload(data, m.bf16.data(), n * elem);
    } else {
      for (size_t i = 0; i < n; ++i) m.fp32.push_back(scale * next_uniform());
      gpu_->upload(data, m.fp32.data(), n * elem);
    }
    m.view = TensorView::contiguous(data, {rows, cols}, dtype, Device::kCUDA, 0);
    m.view.strides[0] = stride;
    return m;
  }

  TensorView int32_tensor(const std::vector<int32_t>& values) {
    buffers_.push_back(gpu_->alloc(values.size() * sizeof(int32_t)));
    gpu_->upload(buffers_.back().data(), values.data(), values.size() * sizeof(int32_t));
    return TensorView::contiguous(buffers_.back().data(), {int64_t(values.size())}, DType::kInt32, Device::kCUDA, 0);
  }

  TensorView fp32_tensor(const std::vector<float>& values) {
    buffers_.push_back(gpu_->alloc(values.size() * sizeof(float)));
    gpu_->upload(buffers_.back().data(), values.data(), values.size() * sizeof(float));
    return TensorView::contiguous(buffers_.back().data(), {int64_t(values.size())}, DType::kFP32, Device::kCUDA, 0);
  }

  // All rows x stride elements of a 2-D view.
  template <typename T>
  std::vector<T> download(const TensorView& t) {
    std::vector<T> out(size_t(t.shape[0] * t.strides[0]));
    gpu_->download(out.data(), t.data, out.size() * sizeof(T));
    return out;
  }

  std::unique_ptr<Compute> gpu_;
  std::vector<DeviceBuffer> buffers_;
  uint64_t seed_ = 99;
};

struct RmsnormCase {
  int rows, hidden;
  bool with_delta;
  int64_t delta_pad;  // extra elements per delta row (1: rows not 16-byte aligned)
};

TEST_F(ComputeOps, AddRmsnormMatchesTheHostOnVectorAndScalarPaths) {
  const float eps = 1e-5f;
  for (const RmsnormCase& c : {RmsnormCase{128, 4096, true, 0}, RmsnormCase{1, 4096, false, 0},
                               RmsnormCase{3, 256, true, 0}, RmsnormCase{2, 24, true, 0}, RmsnormCase{5, 36, true, 0},
                               RmsnormCase{4, 4096, true, 1}, RmsnormCase{2, 16392, true, 0}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << " rows x " << c.hidden << (c.with_delta ? " with delta" : "")
                                      << " pad " << c.delta_pad);
    DeviceMatrix residual = matrix(DType::kFP32, c.rows, c.hidden, c.hidden, 2.f);
    DeviceMatrix delta = matrix(DType::kBF16, c.rows, c.hidden, c.hidden + c.delta_pad, 1.f);
    DeviceMatrix weight = matrix(DType::kBF16, 1, c.hidden, c.hidden, 1.5f);
    DeviceMatrix out = matrix(DType::kBF16, c.rows, c.hidden, c.hidden, 0.f);
    TensorView w = weight.view;
    w.ndim = 1;
    w.shape[0] = c.hidden;
    w.strides[0] = 1;
    gpu_->add_rmsnorm(residual.view, c.with_delta ? delta.view : TensorView(), w, eps, out.view);
    const std::vector<float> got_r = download<float>(residual.view);
    const std::vector<uint16_t> got_o = download<uint16_t>(out.view);
    for (int i = 0; i < c.rows; ++i) {
      std::vector<float> r(size_t(c.hidden));
      double sum_sq = 0;
      for (int j = 0; j < c.hidden; ++j) {
        r[j] = residual.fp32[size_t(i) * c.hidden + j];
        if (c.with_delta) r[j] += bf16_to_float(delta.bf16[size_t(i) * (c.hidden + c.delta_pad) + j]);
        sum_sq += double(r[j]) * r[j];
        ASSERT_EQ(got_r[size_t(i) * c.hidden + j], r[j]) << "residual row " << i << " column " << j;
      }
      const double inv_rms = 1.0 / std::sqrt(sum_sq / c.hidden + eps);
      for (int j = 0; j < c.hidden; ++j) {
        const double want = r[j] * inv_rms * bf16_to_float(weight.bf16[j]);
        const double got = bf16_to_float(got_o[size_t(i) * c.hidden + j]);
        ASSERT_NEAR(got, want, kBf16Rel * std::abs(want) + 1e-6) << "out row " << i << " column " << j;
      }
    }
  }
}

struct RopeCase {
  int tokens, q_heads, k_heads, head_dim;
};

TEST_F(ComputeOps, RopeMatchesTheHostOnVectorAndScalarPaths) {
  const double theta = 10000.0;
  for (const RopeCase& c : {RopeCase{128, 32, 8, 128}, RopeCase{1, 32, 8, 128}, RopeCase{3, 4, 2, 64},
                            RopeCase{5, 3, 1, 24}}) {
    SCOPED_TRACE(::testing::Message() << c.tokens << " tokens, " << c.q_heads << "/" << c.k_heads << " heads, head_dim "
                                      << c.head_dim);
    const int half = c.head_dim / 2;
    const int64_t width = int64_t(c.q_heads + 2 * c.k_heads) * c.head_dim;  // a fused QKV row
    DeviceMatrix qkv = matrix(DType::kBF16, c.tokens, width, width, 3.f);
    std::vector<int32_t> positions;
    for (int i = 0; i < c.tokens; ++i) positions.push_back(int32_t((next_uniform() + 1.f) * 2048));
    std::vector<float> inv_freq;
    for (int j = 0; j < half; ++j) inv_freq.push_back(float(std::pow(theta, -2.0 * j / c.head_dim)));
    TensorView q = head_view(qkv.view, 0, c.q_heads, c.head_dim);
    TensorView k = head_view(qkv.view, int64_t(c.q_heads) * c.head_dim, c.k_heads, c.head_dim);
    gpu_->rope(q, k, int32_tensor(positions), fp32_tensor(inv_freq));
    const std::vector<uint16_t> got = download<uint16_t>(qkv.view);
    for (int i = 0; i < c.tokens; ++i) {
      for (int h = 0; h < c.q_heads + 2 * c.k_heads; ++h) {
        const size_t base = size_t(i * width + int64_t(h) * c.head_dim);
        for (int j = 0; j < half; ++j) {
          const double x1 = bf16_to_float(qkv.bf16[base + j]), x2 = bf16_to_float(qkv.bf16[base + j + half]);
          double y1 = x1, y2 = x2;  // V is not rotated
          if (h < c.q_heads + c.k_heads) {
            const double angle = double(float(positions[i]) * inv_freq[j]);
            y1 = x1 * std::cos(angle) - x2 * std::sin(angle);
            y2 = x2 * std::cos(angle) + x1 * std::sin(angle);
          }
          const double tol = kBf16Rel * (std::abs(x1) + std::abs(x2)) + 1e-6;
          ASSERT_NEAR(bf16_to_float(got[base + j]), y1, tol) << "token " << i << " head " << h << " pair " << j;
          ASSERT_NEAR(bf16_to_float(got[base + j + half]), y2, tol) << "token " << i << " head " << h << " pair " << j;
        }
      }
    }
  }
}

struct RopeStoreCase {
  int tokens, q_heads, k_heads, head_dim, page_size;
  KVLayout layout;
  bool far = false;  // the pages used lie past 4 GiB of their pools
};

// The fused RoPE + K/V store writes bit for bit what rope followed by gqattn::append_kv writes
// (the default Compute::rope_store_kv): q and k in place, k and v at each token's page slot, a
// token beyond its request's pages skipped; on the fused path (head_dim % 16 == 0) and the
// fallback (head_dim 24), NHD and HND pools, pages of 1, 3 and 16 tokens; and pools of more than
// 4 GiB whose used pages all lie past 2^32 bytes (a 32-bit slot offset shows), on both paths.
TEST_F(ComputeOps, RopeStoreKvEqualsRopeThenAppendKv) {
  for (const RopeStoreCase& c :
       {RopeStoreCase{128, 32, 8, 128, 16, KVLayout::kNHD}, RopeStoreCase{128, 32, 1, 128, 16, KVLayout::kNHD},
        RopeStoreCase{7, 4, 2, 64, 3, KVLayout::kHND}, RopeStoreCase{9, 4, 4, 128, 1, KVLayout::kNHD},
        RopeStoreCase{5, 3, 1, 24, 3, KVLayout::kNHD}, RopeStoreCase{128, 32, 8, 128, 16, KVLayout::kHND, true},
        RopeStoreCase{9, 4, 1, 128, 1, KVLayout::kNHD, true}, RopeStoreCase{5, 3, 1, 24, 3, KVLayout::kHND, true}}) {
    SCOPED_TRACE(::testing::Message() << c.tokens << " tokens, " << c.q_heads << "/" << c.k_heads << " heads, head_dim "
                                      << c.head_dim << ", page " << c.page_size << ", " << layout_name(c.layout)
                                      << (c.far ? ", pages past 4 GiB" : ""));
    const int64_t width = int64_t(c.q_heads + 2 * c.k_heads) * c.head_dim;
    // Three requests: the tokens split among them in order, each request's positions consecutive
    // from a random start; the last token's request owns too few pages (its write is skipped).
    const int requests = 3;
    std::vector<int32_t> batch_indices, positions, indptr = {0}, indices;
    const int64_t pages_total = 64;
    int32_t next_page = 5;  // pages listed out of order: every 7th page of the pool
    for (int r = 0; r < requests; ++r) {
      const int first = c.tokens * r / requests, last = c.tokens * (r + 1) / requests;
      const int start = int((next_uniform() + 1.f) * 6);
      for (int t = first; t < last; ++t) {
        batch_indices.push_back(r);
        positions.push_back(start + (t - first));
      }
      int need = last > first ? (start + (last - first) + c.page_size - 1) / c.page_size : 0;
      if (r == requests - 1 && need > 0) --need;  // the last position of the last request falls off
      for (int i = 0; i < need; ++i) {
        indices.push_back(next_page);
        next_page = int32_t((next_page + 7) % pages_total);
      }
      indptr.push_back(int32_t(indices.size()));
    }
    ASSERT_LE(int64_t(indices.size()), pages_total);
    const int64_t page_elems = int64_t(c.page_size) * c.k_heads * c.head_dim;
    const int64_t pool_elems = pages_total * page_elems;
    // far: `lead` pages before the 64 that are filled and compared, allocated and never written;
    // the page ids move up by as many.
    const int64_t lead = c.far ? (int64_t(1) << 32) / (page_elems * 2) + 1 : 0;
    for (int32_t& page : indices) page = int32_t(page + lead);
    const auto pool = [&](const DeviceMatrix& m) {
      void* base = static_cast<uint16_t*>(m.view.data) - lead * page_elems;
      return c.layout == KVLayout::kNHD
                 ? TensorView::contiguous(base, {lead + pages_total, c.page_size, c.k_heads, c.head_dim},
                                          DType::kBF16, Device::kCUDA, 0)
                 : TensorView::contiguous(base, {lead + pages_total, c.k_heads, c.page_size, c.head_dim},
                                          DType::kBF16, Device::kCUDA, 0);
    };
    // Two copies of everything: one for the fused call, one for the two-call reference.
    DeviceMatrix qkv[2], kp[2], vp[2];
    for (int w = 0; w < 2; ++w) {
      const uint64_t seed = seed_;
      qkv[w] = matrix(DType::kBF16, c.tokens, width, width, 3.f);
      kp[w] = matrix(DType::kBF16, 1, pool_elems, pool_elems, 1.f, lead * page_elems);
      vp[w] = matrix(DType::kBF16, 1, pool_elems, pool_elems, 1.f, lead * page_elems);
      if (w == 0) seed_ = seed;  // the second copy draws the same values
    }
    std::vector<float> inv_freq;
    for (int j = 0; j < c.head_dim / 2; ++j) inv_freq.push_back(float(std::pow(10000.0, -2.0 * j / c.head_dim)));
    const TensorView pos = int32_tensor(positions), rows = int32_tensor(batch_indices);
    const TensorView kv_indptr = int32_tensor(indptr);
    const TensorView kv_indices = int32_tensor(indices.empty() ? std::vector<int32_t>{0} : indices);
    const TensorView freq = fp32_tensor(inv_freq);
    for (int w = 0; w < 2; ++w) {
      Compute::KVStore store;
      store.kv.k_pages = pool(kp[w]);
      store.kv.v_pages = pool(vp[w]);
      store.kv.layout = c.layout;
      store.kv.kv_page_indptr = kv_indptr;
      store.kv.kv_page_indices = kv_indices;
      store.v = head_view(qkv[w].view, int64_t(c.q_heads + c.k_heads) * c.head_dim, c.k_heads, c.head_dim);
      store.batch_indices = rows;
      const TensorView q = head_view(qkv[w].view, 0, c.q_heads, c.head_dim);
      const TensorView k = head_view(qkv[w].view, int64_t(c.q_heads) * c.head_dim, c.k_heads, c.head_dim);
      if (w == 0) {
        gpu_->rope_store_kv(q, k, pos, freq, store);
      } else {
        gpu_->Compute::rope_store_kv(q, k, pos, freq, store);
      }
    }
    EXPECT_EQ(download<uint16_t>(qkv[0].view), download<uint16_t>(qkv[1].view));
    const std::vector<uint16_t> k0 = download<uint16_t>(kp[0].view), k1 = download<uint16_t>(kp[1].view);
    const std::vector<uint16_t> v0 = download<uint16_t>(vp[0].view), v1 = download<uint16_t>(vp[1].view);
    EXPECT_EQ(k0, k1);
    EXPECT_EQ(v0, v1);
    // The reference did write: the pools differ from their initial values somewhere.
    EXPECT_NE(k1, kp[1].bf16);
  }
}

struct SwigluCase {
  int rows, f;
  int64_t out_pad;  // extra elements per output row
};

TEST_F(ComputeOps, SwigluMatchesTheHostOnVectorAndScalarPaths) {
  for (const SwigluCase& c : {SwigluCase{128, 11008, 0}, SwigluCase{1, 11008, 0}, SwigluCase{3, 16, 0},
                              SwigluCase{3, 12, 0}, SwigluCase{4, 16, 4}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << " rows, f " << c.f << ", pad " << c.out_pad);
    DeviceMatrix gate_up = matrix(DType::kBF16, c.rows, 2 * c.f, 2 * c.f, 4.f);
    DeviceMatrix out = matrix(DType::kBF16, c.rows, c.f, c.f + c.out_pad, 0.f);
    gpu_->swiglu(gate_up.view, out.view);
    const std::vector<uint16_t> got = download<uint16_t>(out.view);
    for (int i = 0; i < c.rows; ++i) {
      for (int j = 0; j < c.f; ++j) {
        const double g = bf16_to_float(gate_up.bf16[size_t(i) * 2 * c.f + j]);
        const double u = bf16_to_float(gate_up.bf16[size_t(i) * 2 * c.f + c.f + j]);
        const double want = g / (1 + std::exp(-g)) * u;
        ASSERT_NEAR(bf16_to_float(got[size_t(i * (c.f + c.out_pad) + j)]), want, kBf16Rel * std::abs(want) + 1e-6)
            << "row " << i << " column " << j;
      }
    }
  }
}

TEST_F(ComputeOps, EmbedCopiesRowsAndZeroesUnknownIds) {
  const int vocab = 50;
  for (int hidden : {4096, 12}) {
    SCOPED_TRACE(::testing::Message() << "hidden " << hidden);
    DeviceMatrix table = matrix(DType::kBF16, vocab, hidden, hidden, 1.f);
    const std::vector<int32_t> ids = {7, 0, vocab - 1, vocab, 7};
    DeviceMatrix residual = matrix(DType::kFP32, int64_t(ids.size()), hidden, hidden, 1.f);
    gpu_->embed(int32_tensor(ids), table.view, residual.view);
    const std::vector<float> got = download<float>(residual.view);
    for (size_t i = 0; i < ids.size(); ++i)
      for (int j = 0; j < hidden; ++j) {
        const float want = ids[i] < vocab ? bf16_to_float(table.bf16[size_t(ids[i]) * hidden + j]) : 0.f;
        ASSERT_EQ(got[i * hidden + j], want) << "token " << i << " column " << j;
      }
  }
}

TEST_F(ComputeOps, GatherRowsCopiesBf16AndFp32Rows) {
  const std::vector<int32_t> rows = {3, 0, 9, 3};
  for (DType dtype : {DType::kBF16, DType::kFP32}) {
    for (int cols : {4096, 12, 3}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << ", " << cols << " columns");
      DeviceMatrix x = matrix(dtype, 10, cols, cols, 1.f);
      DeviceMatrix out = matrix(dtype, int64_t(rows.size()), cols, cols, 0.f);
      gpu_->gather_rows(x.view, int32_tensor(rows), out.view);
      const size_t elem = dtype_size(dtype);
      std::vector<char> got(rows.size() * size_t(cols) * elem);
      gpu_->download(got.data(), out.view.data, got.size());
      const char* src = dtype == DType::kBF16 ? reinterpret_cast<const char*>(x.bf16.data())
                                              : reinterpret_cast<const char*>(x.fp32.data());
      for (size_t r = 0; r < rows.size(); ++r)
        ASSERT_EQ(std::memcmp(got.data() + r * cols * elem, src + size_t(rows[r]) * cols * elem, cols * elem), 0)
            << "row " << r;
    }
  }
}

// argmax over rows that end inside a block's last stride (5000 = 4 x 1024 + 904 columns, rows
// 5003 apart): the maximum tied between threads either way round, NaN beside the maximum and in
// whole rows, rows of -inf, +inf twice, the last column, a constant row. Each token must be
// engine::argmax's (the CPU path's rule: smallest index on ties, NaN as -inf).
TEST_F(ComputeOps, ArgmaxBreaksTiesAndTreatsNanAsTheCpuPathDoes) {
  const int vocab = 5000;
  const int64_t stride = 5003;
  std::vector<std::vector<float>> rows(10, std::vector<float>(size_t(vocab)));
  for (auto& row : rows)
    for (float& v : row) v = next_uniform();
  rows[1][7] = rows[1][1030] = rows[1][4999] = 2.f;  // threads 7, 6 and 903: index 7
  rows[2][2051] = rows[2][1029] = 2.f;                // thread 3 holds the larger index: 1029
  for (int j = 0; j < vocab; j += 3) rows[3][size_t(j)] = NAN;
  rows[3][4321] = 2.f;
  std::fill(rows[4].begin(), rows[4].end(), NAN);
  std::fill(rows[5].begin(), rows[5].end(), -INFINITY);
  for (int j = 0; j < vocab; ++j) rows[6][size_t(j)] = j % 2 == 0 ? NAN : -INFINITY;
  rows[7][2500] = rows[7][3000] = INFINITY;
  rows[8][4999] = 2.f;
  std::fill(rows[9].begin(), rows[9].end(), 0.5f);
  const std::vector<int32_t> want_fixed = {-1, 7, 1029, 4321, 0, 0, 0, 2500, 4999, 0};
  std::vector<float> flat(rows.size() * size_t(stride), 0.f);
  for (size_t r = 0; r < rows.size(); ++r) std::copy(rows[r].begin(), rows[r].end(), flat.begin() + r * stride);
  TensorView logits =
      TensorView::contiguous(fp32_tensor(flat).data, {int64_t(rows.size()), vocab}, DType::kFP32, Device::kCUDA, 0);
  logits.strides[0] = stride;
  const TensorView tokens = int32_tensor(std::vector<int32_t>(rows.size(), -1));
  gpu_->argmax(logits, tokens);
  std::vector<int32_t> got(rows.size());
  gpu_->download(got.data(), tokens.data, got.size() * sizeof(int32_t));
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(got[r], argmax(rows[r].data(), vocab)) << "row " << r;
    if (want_fixed[r] >= 0) {
      EXPECT_EQ(got[r], want_fixed[r]) << "row " << r;
    }
  }
}

struct GemmCase {
  int n, m, k;
  DType out;
  int64_t pad;     // extra elements per row of x and y
  int64_t offset;  // elements x starts past an aligned address
};

// y (its bytes as downloaded, rows of m + pad) against the float64 product x . w^T: every column,
// or (column_step > 1) every column_step-th, starting at a column that moves with the row.
void expect_host_product(const GemmCase& c, const DeviceMatrix& x, const DeviceMatrix& w, const std::vector<char>& y,
                         int column_step) {
  for (int i = 0; i < c.n; ++i) {
    for (int o = i % column_step; o < c.m; o += column_step) {
      double want = 0, magnitude = 0;
      for (int j = 0; j < c.k; ++j) {
        const double p =
            double(bf16_to_float(x.bf16[size_t(i * (c.k + c.pad) + j)])) * bf16_to_float(w.bf16[size_t(o) * c.k + j]);
        want += p;
        magnitude += std::abs(p);
      }
      const size_t at = size_t(i * (c.m + c.pad) + o);
      double got = 0;
      if (c.out == DType::kBF16) {
        uint16_t bits = 0;
        std::memcpy(&bits, y.data() + at * 2, 2);
        got = bf16_to_float(bits);
      } else {
        float f = 0;
        std::memcpy(&f, y.data() + at * 4, 4);
        got = f;
      }
      const double tol = (c.out == DType::kBF16 ? kBf16Rel * std::abs(want) : 0) + 1e-5 * magnitude + 1e-6;
      ASSERT_NEAR(got, want, tol) << "row " << i << " column " << o;
    }
  }
}

// y = x . w^T against a float64 host product, twice (the second run takes the cached algorithm)
// with bit-equal results.
TEST_F(ComputeOps, GemmMatchesTheHostAndRepeatsBitForBit) {
  for (const GemmCase& c : {GemmCase{1, 512, 256, DType::kBF16, 0, 0}, GemmCase{128, 384, 4096, DType::kBF16, 0, 0},
                            GemmCase{5, 1000, 256, DType::kFP32, 0, 0}, GemmCase{300, 256, 512, DType::kBF16, 0, 0},
                            GemmCase{16, 264, 520, DType::kBF16, 8, 0}, GemmCase{8, 256, 256, DType::kBF16, 0, 8},
                            GemmCase{4, 509, 250, DType::kFP32, 0, 0}, GemmCase{3, 250, 330, DType::kBF16, 0, 0},
                            GemmCase{5, 264, 264, DType::kBF16, 1, 0}}) {
    SCOPED_TRACE(::testing::Message() << "n " << c.n << ", m " << c.m << ", k " << c.k << ", " << dtype_name(c.out)
                                      << ", pad " << c.pad << ", offset " << c.offset);
    DeviceMatrix x = matrix(DType::kBF16, c.n, c.k, c.k + c.pad, 1.f, c.offset);
    DeviceMatrix w = matrix(DType::kBF16, c.m, c.k, c.k, 0.1f);
    DeviceMatrix y = matrix(c.out, c.n, c.m, c.m + c.pad, 0.f);
    const auto run = [&] {
      gpu_->gemm(x.view, w.view, y.view);
      std::vector<char> bytes(size_t(c.n * (c.m + c.pad)) * dtype_size(c.out));
      gpu_->download(bytes.data(), y.view.data, bytes.size());
      return bytes;
    };
    const std::vector<char> first = run();
    ASSERT_EQ(run(), first) << "a second run differs";
    ASSERT_NO_FATAL_FAILURE(expect_host_product(c, x, w, first, 1));
  }
}

// With the tuner's search on (as in the engine's warm-up: perf-notes item 221), the chosen
// configuration, a heuristic candidate or a variant of one (split-K reduced in fp32, another tile),
// still gives the float64 product on the Llama-2-7B decode shapes at 128 tokens (every 29th
// output column checked), and repeats bit for bit.
TEST_F(ComputeOps, GemmSearchedConfigurationsMatchTheHost) {
  gpu_->set_gemm_search(true);
  for (const GemmCase& c : {GemmCase{128, 4096, 4096, DType::kBF16, 0, 0}, GemmCase{128, 4096, 11008, DType::kBF16, 0, 0},
                            GemmCase{128, 4352, 4096, DType::kBF16, 0, 0}, GemmCase{32, 4096, 4096, DType::kFP32, 0, 0}}) {
    SCOPED_TRACE(::testing::Message() << "n " << c.n << ", m " << c.m << ", k " << c.k << ", " << dtype_name(c.out));
    DeviceMatrix x = matrix(DType::kBF16, c.n, c.k, c.k, 1.f);
    DeviceMatrix w = matrix(DType::kBF16, c.m, c.k, c.k, 0.05f);
    DeviceMatrix y = matrix(c.out, c.n, c.m, c.m, 0.f);
    const auto run = [&] {
      gpu_->gemm(x.view, w.view, y.view);
      std::vector<char> bytes(size_t(c.n * c.m) * dtype_size(c.out));
      gpu_->download(bytes.data(), y.view.data, bytes.size());
      return bytes;
    };
    const std::vector<char> first = run();
    ASSERT_EQ(run(), first) << "a second run differs";
    ASSERT_NO_FATAL_FAILURE(expect_host_product(c, x, w, first, 29));
  }
}

// A shape first met while the stream is being captured runs the heuristic's first algorithm in the
// graph (no timing, no sync); the next eager call tunes it; both give the host's product.
TEST_F(ComputeOps, GemmFirstMetDuringCaptureRunsFromTheGraphThenTunes) {
  const int n = 7, m = 136, k = 264;
  DeviceMatrix x = matrix(DType::kBF16, n, k, k, 1.f);
  DeviceMatrix w = matrix(DType::kBF16, m, k, k, 0.1f);
  DeviceMatrix y = matrix(DType::kFP32, n, m, m, 0.f);
  std::vector<double> want(size_t(n) * m);
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < m; ++o)
      for (int j = 0; j < k; ++j)
        want[size_t(i) * m + o] += double(bf16_to_float(x.bf16[size_t(i) * k + j])) * bf16_to_float(w.bf16[size_t(o) * k + j]);
  const auto check = [&](const char* what) {
    const std::vector<float> got = download<float>(y.view);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3) << what << ", element " << i;
  };
  auto stream = static_cast<cudaStream_t>(gpu_->stream());
  gpu_->synchronize();
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  gpu_->gemm(x.view, w.view, y.view);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  check("graph");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  gpu_->fill(y.view, 0.f);
  gpu_->gemm(x.view, w.view, y.view);
  check("eager");
}

// A step whose capture fails without the body throwing (here an unsafe call inside the capture,
// as a library's hidden synchronisation would be; cudaStreamEndCapture then fails) has run
// eagerly, is reported on stderr, and leaves later steps eager: their launches still succeed
// (the failed call's error is not left for the next launch's check to report).
TEST_F(ComputeOps, AFailedCaptureLeavesLaterStepsEager) {
  DeviceMatrix y = matrix(DType::kFP32, 1, 64, 64, 0.f);
  auto stream = static_cast<cudaStream_t>(gpu_->stream());
  int calls = 0;
  const auto body = [&] {
    ++calls;
    gpu_->fill(y.view, float(calls));
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status == cudaStreamCaptureStatusActive)
      (void)cudaStreamSynchronize(stream);  // invalid while capturing: invalidates the capture
  };
  gpu_->run_graph(3, body);  // eager, then the capture that fails
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(gpu_->num_graphs(), 0);
  ASSERT_NO_THROW(gpu_->run_graph(3, body));  // eager again, no capture
  EXPECT_EQ(calls, 3);
  ASSERT_NO_THROW(gpu_->fill(y.view, 4.f));
  EXPECT_EQ(download<float>(y.view), std::vector<float>(64, 4.f));
}

}  // namespace
}  // namespace gqattn::engine
