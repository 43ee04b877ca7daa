// The compute device under the model runner: memory, copies and the forward pass's primitives,
// implemented on the CPU (float32 activations, float64 accumulation: cpu_compute.cc) and on CUDA
// (bf16 activations, cuBLAS GEMMs with fp32 compute, the engine's kernels, CUDA graphs:
// cuda_compute.cu). The model runner writes the forward pass once against this interface.
// Layer: engine (host interface).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gqattn/paged_kv.h"
#include "gqattn/tensor.h"

namespace gqattn::engine {

// Owning device memory; releases it through the device that made it.
class DeviceBuffer {
 public:
  using Deleter = std::function<void(void*)>;
  DeviceBuffer() = default;
  DeviceBuffer(void* data, size_t bytes, Deleter deleter) : data_(data), bytes_(bytes), deleter_(std::move(deleter)) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  void reset();

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Deleter deleter_;
};

// Tensors are gqattn::TensorView: weights bf16; activations of act_dtype(); the residual stream
// and logits fp32; index tensors int32. Row strides (strides[0]) may exceed the row length (views
// into a fused QKV buffer); the last dimension is contiguous. Every op is ordered on stream() and
// allocates nothing; on CUDA none synchronises, so a step can be captured in a graph.
class Compute {
 public:
  virtual ~Compute() = default;

  virtual Device device() const = 0;
  virtual int device_id() const { return 0; }
  // Activations and the K/V cache: fp32 on the CPU, bf16 on CUDA.
  virtual DType act_dtype() const = 0;
  virtual void* stream() const { return nullptr; }
  virtual bool supports_graphs() const { return false; }

  // ---- memory ----
  // 256-byte aligned, uninitialised. Throws gqattn::Error (naming the size) when it fails.
  virtual DeviceBuffer alloc(size_t bytes) = 0;
  // Bytes that can still be allocated (the CPU reports SIZE_MAX: its pool size is explicit).
  virtual size_t free_bytes() const = 0;
  // Host -> device, ordered on the stream; the source may be reused as soon as this returns.
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  // Device -> host; waits for the stream.
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  // Device -> device, ordered on the stream.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Device -> host without waiting for the stream: the copy is ordered after the work queued so
  // far, into host buffer `slot` (0 .. kDownloadSlots - 1), and work queued after it may still run
  // when download_finish(slot) returns its bytes. So the host can queue step n + 1 before it reads
  // step n's tokens. Here (the CPU) the copy is done at once; CUDA copies into pinned memory and
  // waits on an event.
  static constexpr int kDownloadSlots = 4;
  virtual void download_start(int slot, const void* src, size_t bytes);
  // Waits for slot's copy (only) and copies its `bytes` to dst.
  virtual void download_finish(int slot, void* dst, size_t bytes);
  virtual void synchronize() = 0;
  // Read bandwidth in GB/s from a streaming read of a buffer well past the caches (the decode
  // step's ceiling for the memory-traffic floor). Allocates and frees its buffer.
  virtual double measure_read_bandwidth_gbps() = 0;

  // ---- weights ----
  // t (bf16, contiguous) element i = random_weight(seed, tensor_id, i, half_width) (random.h).
  virtual void fill_random(const TensorView& t, uint64_t seed, uint64_t tensor_id, float half_width) = 0;
  // t (bf16 or fp32, contiguous) = value.
  virtual void fill(const TensorView& t, float value) = 0;

  // ---- the forward pass ----
  // residual[i, :] = table[token_ids[i], :]. token_ids int32 [n]; table bf16 [vocab, hidden];
  // residual fp32 [n, hidden].
  virtual void embed(const TensorView& token_ids, const TensorView& table, const TensorView& residual) = 0;
  // residual += delta (skipped when delta is undefined); out = residual / rms(residual) * weight.
  // residual fp32 [n, hidden]; delta, out act [n, hidden]; weight bf16 [hidden].
  virtual void add_rmsnorm(const TensorView& residual, const TensorView& delta, const TensorView& weight,
                           float eps, const TensorView& out) = 0;
  // y[n, m] = x[n, k] . w[m, k]^T. x act, w bf16, y act or fp32. On CUDA the first eager call of
  // a shape with n <= 256 times cuBLASLt's candidate algorithms on these buffers: it synchronises
  // (and the first such call allocates an L2-flush buffer); later calls, and calls during a graph
  // capture, do neither.
  virtual void gemm(const TensorView& x, const TensorView& w, const TensorView& y) = 0;
  // Rotates q [n, num_qo_heads, head_dim] and k [n, num_kv_heads, head_dim] in place by the angle
  // positions[i] * inv_freq[j] (Hugging Face's rotate-half pairing j, j + head_dim / 2).
  // positions int32 [n]; inv_freq fp32 [head_dim / 2].
  virtual void rope(const TensorView& q, const TensorView& k, const TensorView& positions,
                    const TensorView& inv_freq) = 0;
  // rope(), then the step's new K/V written at the tokens' slots of store.kv (gqattn::append_kv:
  // k rotated, v as given; on CUDA tokens beyond their request's pages, the graph buckets' padding,
  // are skipped; on the CPU, which never pads, append_kv throws for them, after the rotation). This
  // default makes the two calls; CUDA fuses them into one kernel (GQATTN_DISABLE_ENGINE_ROPE_STORE=1:
  // the two calls).
  struct KVStore {
    PagedKV kv;                // the layer's pools and the step's page table (CSR)
    TensorView v;              // [n, num_kv_heads, head_dim], k's dtype
    TensorView batch_indices;  // int32 [n]: each token's request
  };
  virtual void rope_store_kv(const TensorView& q, const TensorView& k, const TensorView& positions,
                             const TensorView& inv_freq, const KVStore& store);
  // out[n, f] = silu(gate_up[n, f]) * gate_up[n, F + f], F = out's width. act.
  virtual void swiglu(const TensorView& gate_up, const TensorView& out) = 0;
  // out[r, :] = x[rows[r], :]. rows int32 [m]; x, out of one dtype.
  virtual void gather_rows(const TensorView& x, const TensorView& rows, const TensorView& out) = 0;
  // tokens[r] = the index of row r's largest value (smallest index on ties; NaN counts as -inf).
  // logits fp32 [m, vocab].
  virtual void argmax(const TensorView& logits, const TensorView& tokens) = 0;
  // The "expand" reference attention's copy: for i in [0, kv.kv_page_indptr[batch]), page
  // kv.kv_page_indices[i] of kv's pools is copied to page i of dst_k / dst_v, each query head h
  // getting K/V head h / group_size. dst [pages, page_size, num_qo_heads, head_dim] (NHD).
  virtual void expand_kv_pages(const PagedKV& kv, int batch, const TensorView& dst_k, const TensorView& dst_v) = 0;

  // Runs `body` (a step's launches) as CUDA graph `key`: on the first call with that key body runs
  // and is then captured; later calls replay the graph (body is not called). Without graph
  // support body simply runs.
  virtual void run_graph(int key, const std::function<void()>& body) {
    (void)key;
    body();
  }
  // CUDA graphs captured so far (a failed capture is reported on stderr and leaves steps eager).
  virtual int num_graphs() const { return 0; }
  // While on, a GEMM shape met for the first time is tuned over more than its heuristic's
  // candidates (CUDA: the search of perf-notes item 221, ~0.1 s a shape). ModelRunner::warm_up
  // turns it on for its steps only, so a shape first met inside a run (after a preemption, say)
  // costs the step no more than the heuristic's candidates. A no-op without a tuner.
  virtual void set_gemm_search(bool on) { (void)on; }
  // Starts (on) or stops (off) the profiler's collection window (CUDA: cudaProfilerStart / Stop,
  // for `ncu --profile-from-start off`; gqattn-serve bench's GQATTN_PROFILE_STEPS). A no-op without
  // a profiler.
  virtual void set_profiling(bool on) { (void)on; }

 private:
  std::vector<char> host_slots_[kDownloadSlots];  // download_start's buffers (this default)
};

std::unique_ptr<Compute> make_cpu_compute();
// Throws gqattn::Error when the build has no CUDA or the device cannot be used.
std::unique_ptr<Compute> make_cuda_compute(int device_id = 0);

// ---- views ----
// Rows [begin, end) of a view (dimension 0).
TensorView slice_rows(const TensorView& t, int64_t begin, int64_t end);
// A [rows, heads, head_dim] view of columns [col, col + heads * head_dim) of a 2-D view.
TensorView head_view(const TensorView& t2d, int64_t col, int64_t heads, int64_t head_dim);
// A contiguous view of `data`.
TensorView view_of(void* data, std::initializer_list<int64_t> shape, DType dtype, const Compute& compute);

}  // namespace gqattn::engine
