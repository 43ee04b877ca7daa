// The CPU compute device: plain loops with float32 activations and float64 accumulation; the
// path CI runs, and the reference the CUDA path is compared with. Layer: engine (host-only).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "api/host_float.h"
#include "compute.h"
#include "gqattn/error.h"
#include "random.h"
#include "sampler.h"

namespace gqattn::engine {

namespace {

constexpr size_t kAlignBytes = 256;

void check_fp32(const TensorView& t, const char* what) {
  GQ_CHECK(t.dtype == DType::kFP32, "cpu compute: ", what, " must be fp32, got ", t.describe());
}

class CpuCompute final : public Compute {
 public:
  Device device() const override { return Device::kCPU; }
  DType act_dtype() const override { return DType::kFP32; }

  DeviceBuffer alloc(size_t bytes) override {
    const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
    void* p = std::aligned_alloc(kAlignBytes, rounded);
    GQ_CHECK(p != nullptr, "cpu compute: cannot allocate ", bytes, " bytes");
    return DeviceBuffer(p, bytes, [](void* q) { std::free(q); });
  }
  size_t free_bytes() const override { return std::numeric_limits<size_t>::max(); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void synchronize() override {}

  double measure_read_bandwidth_gbps() override {
    constexpr size_t kBytes = size_t(512) << 20;
    constexpr int kReps = 5;
    std::vector<uint64_t> data(kBytes / sizeof(uint64_t), 1);
    double best = 0;
    uint64_t sink = 0;
    for (int r = 0; r < kReps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      uint64_t acc = 0;
      for (uint64_t v : data) acc += v;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      sink += acc;
      best = std::max(best, double(kBytes) / s / 1e9);
    }
    return sink == 0 ? 0 : best;  // uses the sums, so the loop is not optimised away
  }

  void fill_random(const TensorView& t, uint64_t seed, uint64_t tensor_id, float half_width) override {
    GQ_CHECK(t.dtype == DType::kBF16 && t.is_contiguous(), "fill_random: needs a contiguous bf16 tensor");
    auto* p = t.ptr<uint16_t>();
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) p[i] = float_to_bf16(random_weight(seed, tensor_id, uint64_t(i), half_width));
  }
  void fill(const TensorView& t, float value) override {
    GQ_CHECK(t.is_contiguous(), "fill: needs a contiguous tensor");
    for (int64_t i = 0; i < t.numel(); ++i) store_from_double(t.data, t.dtype, i, value);
  }

  void embed(const TensorView& token_ids, const TensorView& table, const TensorView& residual) override {
    check_fp32(residual, "residual");
    const int64_t n = token_ids.shape[0], hidden = table.shape[1];
    for (int64_t i = 0; i < n; ++i) {
      const int32_t tok = token_ids.ptr<int32_t>()[i];
      GQ_CHECK(tok >= 0 && tok < table.shape[0], "embed: token id ", tok, " outside the vocabulary [0, ",
               table.shape[0], ")");
      const uint16_t* row = table.ptr<uint16_t>() + tok * table.strides[0];
      float* out = residual.ptr<float>() + i * residual.strides[0];
      for (int64_t j = 0; j < hidden; ++j) out[j] = bf16_to_float(row[j]);
    }
  }

  void add_rmsnorm(const TensorView& residual, const TensorView& delta, const TensorView& weight, float eps,
                   const TensorView& out) override {
    check_fp32(residual, "residual");
    check_fp32(out, "out");
    const int64_t n = residual.shape[0], hidden = residual.shape[1];
    for (int64_t i = 0; i < n; ++i) {
      float* r = residual.ptr<float>() + i * residual.strides[0];
      if (delta.defined()) {
        const float* d = delta.ptr<float>() + i * delta.strides[0];
        for (int64_t j = 0; j < hidden; ++j) r[j] += d[j];
      }
      double sum_sq = 0;
      for (int64_t j = 0; j < hidden; ++j) sum_sq += double(r[j]) * r[j];
      const double inv_rms = 1.0 / std::sqrt(sum_sq / double(hidden) + double(eps));
      float* o = out.ptr<float>() + i * out.strides[0];
      for (int64_t j = 0; j < hidden; ++j) o[j] = float(r[j] * inv_rms * bf16_to_float(weight.ptr<uint16_t>()[j]));
    }
  }

  void gemm(const TensorView& x, const TensorView& w, const TensorView& y) override {
    check_fp32(x, "gemm x");
    check_fp32(y, "gemm y");
    GQ_CHECK(w.dtype == DType::kBF16 && x.shape[1] == w.shape[1] && y.shape[1] == w.shape[0] &&
                 y.shape[0] == x.shape[0],
             "gemm: x ", x.describe(), " . w ", w.describe(), "^T -> y ", y.describe());
    const int64_t n = x.shape[0], m = w.shape[0], k = w.shape[1];
    std::vector<float> wrow(static_cast<size_t>(k));
    for (int64_t o = 0; o < m; ++o) {
      const uint16_t* wr = w.ptr<uint16_t>() + o * w.strides[0];
      for (int64_t j = 0; j < k; ++j) wrow[j] = bf16_to_float(wr[j]);
      for (int64_t i = 0; i < n; ++i) {
        const float* xr = x.ptr<float>() + i * x.strides[0];
        double acc = 0;
        for (int64_t j = 0; j < k; ++j) acc += double(xr[j]) * wrow[j];
        y.ptr<float>()[i * y.strides[0] + o] = float(acc);
      }
    }
  }

  void rope(const TensorView& q, const TensorView& k, const TensorView& positions,
            const TensorView& inv_freq) override {
    const int64_t half = inv_freq.shape[0];
    for (const TensorView* t : {&q, &k}) {
      check_fp32(*t, "rope input");
      for (int64_t i = 0; i < t->shape[0]; ++i) {
        const double pos = positions.ptr<int32_t>()[i];
        for (int64_t h = 0; h < t->shape[1]; ++h) {
          float* x = t->ptr<float>() + i * t->strides[0] + h * t->strides[1];
          for (int64_t j = 0; j < half; ++j) {
            const double angle = pos * double(inv_freq.ptr<float>()[j]);
            const double c = std::cos(angle), s = std::sin(angle);
            const double x1 = x[j], x2 = x[j + half];
            x[j] = float(x1 * c - x2 * s);
            x[j + half] = float(x2 * c + x1 * s);
          }
        }
      }
    }
  }

  void swiglu(const TensorView& gate_up, const TensorView& out) override {
    check_fp32(gate_up, "swiglu input");
    check_fp32(out, "swiglu output");
    const int64_t n = out.shape[0], f = out.shape[1];
    for (int64_t i = 0; i < n; ++i) {
      const float* g = gate_up.ptr<float>() + i * gate_up.strides[0];
      float* o = out.ptr<float>() + i * out.strides[0];
      for (int64_t j = 0; j < f; ++j) {
        const double gate = g[j];
        o[j] = float(gate / (1.0 + std::exp(-gate)) * g[f + j]);
      }
    }
  }

  void gather_rows(const TensorView& x, const TensorView& rows, const TensorView& out) override {
    const size_t row_bytes = size_t(x.shape[1]) * dtype_size(x.dtype);
    const int64_t elem = int64_t(dtype_size(x.dtype));
    for (int64_t r = 0; r < rows.shape[0]; ++r) {
      const int32_t src = rows.ptr<int32_t>()[r];
      GQ_CHECK(src >= 0 && src < x.shape[0], "gather_rows: row ", src, " outside [0, ", x.shape[0], ")");
      std::memcpy(static_cast<char*>(out.data) + r * out.strides[0] * elem,
                  static_cast<const char*>(x.data) + src * x.strides[0] * elem, row_bytes);
    }
  }

  void argmax(const TensorView& logits, const TensorView& tokens) override {
    check_fp32(logits, "logits");
    for (int64_t r = 0; r < logits.shape[0]; ++r)
      tokens.ptr<int32_t>()[r] = engine::argmax(logits.ptr<float>() + r * logits.strides[0], int(logits.shape[1]));
  }

  void expand_kv_pages(const PagedKV& kv, int batch, const TensorView& dst_k, const TensorView& dst_v) override {
    const int32_t* indptr = kv.kv_page_indptr.ptr<int32_t>();
    const int32_t* indices = kv.kv_page_indices.ptr<int32_t>();
    const int64_t pages = indptr[batch], page_size = kv.page_size(), head_dim = kv.head_dim();
    const int64_t qo_heads = dst_k.shape[2], group_size = qo_heads / kv.num_kv_heads();
    GQ_CHECK(pages <= dst_k.shape[0], "expand_kv_pages: ", pages, " pages exceed the scratch (", dst_k.shape[0], ")");
    const int64_t elem = int64_t(dtype_size(dst_k.dtype));
    const size_t row_bytes = size_t(head_dim * elem);
    for (int64_t i = 0; i < pages; ++i) {
      const int64_t src_page = indices[i];
      for (int64_t t = 0; t < page_size; ++t) {
        for (int64_t h = 0; h < qo_heads; ++h) {
          const int64_t src = src_page * kv.page_stride() + t * kv.token_stride() + (h / group_size) * kv.head_stride();
          const int64_t dst = i * dst_k.strides[0] + t * dst_k.strides[1] + h * dst_k.strides[2];
          const auto* k_src = static_cast<const char*>(kv.k_pages.data) + src * elem;
          const auto* v_src = static_cast<const char*>(kv.v_pages.data) + src * elem;
          std::memcpy(static_cast<char*>(dst_k.data) + dst * elem, k_src, row_bytes);
          std::memcpy(static_cast<char*>(dst_v.data) + dst * elem, v_src, row_bytes);
        }
      }
    }
  }
};

}  // namespace

std::unique_ptr<Compute> make_cpu_compute() { return std::make_unique<CpuCompute>(); }

}  // namespace gqattn::engine
