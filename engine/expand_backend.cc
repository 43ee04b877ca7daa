// The "expand" attention backend, the reference for what native GQA kernels save: every step and
// layer, the requests' K/V pages are copied out to one K/V head per query head (a scratch pool
// of [pages, page_size, num_qo_heads, head_dim]), then attention runs as MHA over the copy (gqattn
// with num_kv_heads == num_qo_heads, which pays the traffic an MHA kernel pays). The cache itself
// stays grouped-query. Layer: engine (host-only).
#include <numeric>
#include <vector>

#include "attention_backend.h"
#include "gqattn/error.h"
#include "step_attention.h"

namespace gqattn::engine {

namespace {

class ExpandBackend final : public AttentionBackend {
 public:
  explicit ExpandBackend(const AttentionContext& c)
      : compute_(*c.compute), capacity_(c.max_step_pages),
        step_(*c.compute, c.num_qo_heads, c.num_qo_heads, c.head_dim, c.page_size) {
    GQ_CHECK(capacity_ >= 1, "expand backend: max_step_pages (", capacity_, ") must be >= 1");
    const DType dtype = c.compute->act_dtype();
    const size_t pool_bytes = size_t(capacity_) * c.page_size * c.num_qo_heads * c.head_dim * dtype_size(dtype);
    k_buffer_ = compute_.alloc(pool_bytes);
    v_buffer_ = compute_.alloc(pool_bytes);
    k_scratch_ = view_of(k_buffer_.data(), {capacity_, c.page_size, c.num_qo_heads, c.head_dim}, dtype, compute_);
    v_scratch_ = view_of(v_buffer_.data(), {capacity_, c.page_size, c.num_qo_heads, c.head_dim}, dtype, compute_);
    // Scratch page i holds the step's i-th listed page: the identity page list.
    std::vector<int32_t> identity(static_cast<size_t>(capacity_));
    std::iota(identity.begin(), identity.end(), 0);
    identity_buffer_ = compute_.alloc(identity.size() * sizeof(int32_t));
    compute_.upload(identity_buffer_.data(), identity.data(), identity.size() * sizeof(int32_t));
    compute_.synchronize();
    identity_ = view_of(identity_buffer_.data(), {capacity_}, DType::kInt32, compute_);
  }

  std::string name() const override { return "expand"; }
  void plan(const AttentionMetadata& meta) override {
    GQ_CHECK(meta.kv_page_indptr.back() <= capacity_, "expand backend: the step lists ", meta.kv_page_indptr.back(),
             " pages but the scratch holds ", capacity_, " (max_step_pages)");
    step_.plan(meta);
  }
  int graph_variant() const override { return step_.graph_variant(); }
  void forward(const LayerCache& cache, const TensorView& q, const TensorView& o,
               const AttentionMetadata& meta) override {
    compute_.expand_kv_pages(step_kv(cache, meta), meta.batch(), k_scratch_, v_scratch_);
    step_.run(q, o, k_scratch_, v_scratch_, KVLayout::kNHD, identity_, meta);  // the scratch is NHD
  }

 private:
  Compute& compute_;
  int64_t capacity_;
  StepAttention step_;
  DeviceBuffer k_buffer_, v_buffer_, identity_buffer_;
  TensorView k_scratch_, v_scratch_, identity_;
};

}  // namespace

std::unique_ptr<AttentionBackend> make_expand_backend(const AttentionContext& context) {
  return std::make_unique<ExpandBackend>(context);
}

}  // namespace gqattn::engine
