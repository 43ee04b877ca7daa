// The "gqattn" attention backend: attention read straight from the grouped-query pages by gqattn's decode and prefill kernels (each K/V page loaded once per
// group). Layer: engine (host-only).
#include "attention_backend.h"
#include "step_attention.h"

namespace gqattn::engine {

namespace {

class GqattnBackend final : public AttentionBackend {
 public:
  explicit GqattnBackend(const AttentionContext& c)
      : step_(*c.compute, c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size) {}

  std::string name() const override { return "gqattn"; }
  void plan(const AttentionMetadata& meta) override { step_.plan(meta); }
  int graph_variant() const override { return step_.graph_variant(); }
  void forward(const LayerCache& cache, const TensorView& q, const TensorView& o,
               const AttentionMetadata& meta) override {
    step_.run(q, o, cache.k_pages, cache.v_pages, cache.layout, meta.kv_page_indices_d, meta);
  }

 private:
  StepAttention step_;
};

}  // namespace

std::unique_ptr<AttentionBackend> make_gqattn_backend(const AttentionContext& context) {
  return std::make_unique<GqattnBackend>(context);
}

}  // namespace gqattn::engine
