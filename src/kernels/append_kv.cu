// append_kv: writes new tokens' K/V rows into their page slots (16 bytes per thread).
// Layer: src/kernels (kernel + host launcher).
#include <cuda_runtime.h>

#include "kernels/launch.h"
#include "kernels/paged_slot.cuh"
#include "prims/cuda_check.h"

namespace gqattn::kernels {
namespace {

constexpr int kAppendThreads = 256;

__global__ void append_kv_kernel(const AppendKVParams p) {
  const int chunks = p.head_dim * p.elem_bytes / 16;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = static_cast<int64_t>(p.num_tokens) * p.num_kv_heads * chunks;
  if (idx >= total) return;
  const int chunk = static_cast<int>(idx % chunks);
  const int head = static_cast<int>((idx / chunks) % p.num_kv_heads);
  const int token = static_cast<int>(idx / (static_cast<int64_t>(chunks) * p.num_kv_heads));
  const int64_t slot = paged_slot(p.kv_page_indptr, p.kv_page_indices, p.batch_indices[token], p.positions[token],
                                  p.page, p.page_stride, p.token_stride);
  if (slot < 0) return;  // beyond the request's pages: skipped
  const int64_t dst = slot + head * p.head_stride;
  const int64_t src = token * p.new_stride_n + head * p.new_stride_h;
  const int64_t byte_off = static_cast<int64_t>(chunk) * 16;
  const char* ks = static_cast<const char*>(p.k_new) + src * p.elem_bytes + byte_off;
  const char* vs = static_cast<const char*>(p.v_new) + src * p.elem_bytes + byte_off;
  char* kd = static_cast<char*>(p.k_pages) + dst * p.elem_bytes + byte_off;
  char* vd = static_cast<char*>(p.v_pages) + dst * p.elem_bytes + byte_off;
  *reinterpret_cast<uint4*>(kd) = *reinterpret_cast<const uint4*>(ks);
  *reinterpret_cast<uint4*>(vd) = *reinterpret_cast<const uint4*>(vs);
}

}  // namespace

AppendKVParams append_kv_params(const PagedKV& kv, const TensorView& k_new, const TensorView& v_new,
                                const TensorView& batch_indices, const TensorView& positions) {
  AppendKVParams p;
  p.k_pages = kv.k_pages.data;
  p.v_pages = kv.v_pages.data;
  p.page_stride = kv.page_stride();
  p.token_stride = kv.token_stride();
  p.head_stride = kv.head_stride();
  p.kv_page_indptr = kv.kv_page_indptr.ptr<const int32_t>();
  p.kv_page_indices = kv.kv_page_indices.ptr<const int32_t>();
  p.k_new = k_new.data;
  p.v_new = v_new.data;
  p.new_stride_n = k_new.strides[0];
  p.new_stride_h = k_new.strides[1];
  p.batch_indices = batch_indices.ptr<const int32_t>();
  p.positions = positions.ptr<const int32_t>();
  p.num_tokens = static_cast<int>(k_new.shape[0]);
  p.num_kv_heads = static_cast<int>(k_new.shape[1]);
  p.head_dim = static_cast<int>(k_new.shape[2]);
  p.elem_bytes = static_cast<int>(dtype_size(k_new.dtype));
  p.page = FastDivmod(static_cast<uint32_t>(kv.page_size()));
  return p;
}

void launch_append_kv(const AppendKVParams& p, void* stream) {
  GQ_CHECK((p.head_dim * p.elem_bytes) % 16 == 0, "append_kv: head_dim * element size (", p.head_dim * p.elem_bytes,
           " bytes) must be a multiple of 16 on the GPU");
  const int64_t total = static_cast<int64_t>(p.num_tokens) * p.num_kv_heads * (p.head_dim * p.elem_bytes / 16);
  if (total == 0) return;
  const unsigned blocks = static_cast<unsigned>((total + kAppendThreads - 1) / kAppendThreads);
  append_kv_kernel<<<blocks, kAppendThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  GQ_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gqattn::kernels
