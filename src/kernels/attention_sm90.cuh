// The Hopper (sm_90a) prefill kernel: warp-specialised, wgmma on tensor cores, mbarrier pipeline.
// Layer: src/kernels (device code; included only by the generated prefill_sm90 instantiations).
//
// Same work list, packing and outputs as attention.cuh: an item is (request, K/V head, 128 packed
// query rows, key range), the group's query heads (x query tokens) packed into the rows, so each
// K/V tile is read once per group. The CTA has three warpgroups:
//   producer (warpgroup 0, registers lowered by setmaxnreg): copies Q, then streams K/V tiles with
//     cp.async gathers (any page size, either layout, ragged or paged) into kStages shared-memory
//     stages; each thread's copies arrive on the stage's "full" mbarrier when they land;
//   consumers (warpgroups 1 and 2, 64 query rows each): wait "full", S = Q K^T with wgmma (both
//     operands in shared memory), online softmax in registers, O += P V with P from registers and
//     V read transposed from shared memory, then arrive on the stage's "empty" mbarrier.
// The two consumers are not synchronised with each other, so one's softmax overlaps the other's
// GEMMs. Shared-memory tiles use the 128-byte swizzle that the wgmma descriptors describe.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/attention.cuh"
#include "prims/sm90.cuh"
#include "prims/wgmma_ops.cuh"

namespace gqattn::kernels {

// Element offset of 16-byte chunk `chunk` of row `row` in a [Rows][HeadDim] tile stored as
// column blocks of 64 elements: block-major, 128-byte rows, chunks XOR-swizzled by row % 8.
template <int Rows>
__device__ __forceinline__ int sw128_offset(int row, int chunk) {
  return (chunk >> 3) * (Rows * 64) + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
}

template <typename T, int HeadDim>
__global__ void __launch_bounds__(AttnShape<Family::kPrefillSm90, HeadDim>::kThreads, 1)
    attention_sm90_kernel(const AttentionParams p) {
#if defined(__CUDA_ARCH__)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  namespace sm90 = prims::sm90;
  using Cfg = AttnConfig<Family::kPrefillSm90, HeadDim>;
  using Shape = AttnShape<Family::kPrefillSm90, HeadDim>;
  constexpr int kTile = Cfg::kKVTile;
  constexpr int kStages = Cfg::kStages;
  constexpr int kCtaRows = Shape::kCtaRows;
  constexpr int kChunks = HeadDim / 8;            // 16-byte chunks per row
  constexpr int kRowsPerPass = 128 / kChunks;     // rows one producer pass covers
  constexpr int kQPasses = kCtaRows / kRowsPerPass;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  T* s_q = reinterpret_cast<T*>(smem);
  T* s_kv = reinterpret_cast<T*>(smem + Shape::kQBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Shape::kQBytes + kStages * Shape::kStageBytes);
  uint64_t* empty = full + kStages;
  uint64_t* q_full = empty + kStages;

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int group = static_cast<int>(p.group.divisor);
  const int num_work = p.header->num_work;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(&full[s], 128);                 // every producer thread, on cp.async completion
      sm90::mbar_init(&empty[s], 4 * Cfg::kConsumers);  // one lane per consumer warp
    }
    sm90::mbar_init(q_full, 128);
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----------------------------------------------------------------------------
    sm90::setmaxnreg_dec<Cfg::kProducerRegs>();
    const int load_row = tid / kChunks;
    const int load_chunk = tid % kChunks;
    const T* q = static_cast<const T*>(p.q);
    const T* k = static_cast<const T*>(p.k);
    const T* v = static_cast<const T*>(p.v);
    uint32_t it = 0;  // K/V tiles issued so far (over all items): stage and phase
    for (int item = blockIdx.x; item < num_work; item += gridDim.x) {
      // The consumers are done with the previous item's Q and stages. A named barrier with a count,
      // not __syncthreads: the roles reach it from different code.
      __syncwarp();
      sm90::named_barrier_sync(1, Shape::kThreads);
      const WorkItem w = p.work[item];
      const ItemKeys keys = item_keys(w, p, kCtaRows, kTile);
      const int rows = keys.rows;
      const int kv_stop = keys.kv_stop;
      const int num_tiles = keys.num_tiles;

#pragma unroll
      for (int i = 0; i < kQPasses; ++i) {
        const int r = load_row + i * kRowsPerPass;
        const int ra = w.row_begin + r;
        const bool valid = ra < rows;
        const T* src = valid ? q_row<T>(p, w, ra) + load_chunk * 8 : q;
        prims::cp_async_16(s_q + sw128_offset<kCtaRows>(r, load_chunk), src, valid);
      }
      sm90::mbar_arrive_on_cp_async(q_full);

      // K/V tiles: warp pw copies rows [pw * kRowsPerWarp, +kRowsPerWarp) of each tile. Lane l
      // looks up the page of row l once per tile; the copy loop takes row offsets from it by
      // shuffle, kLanesPerRow lanes covering one row's contiguous bytes per instruction.
      constexpr int kRowsPerWarp = kTile / 4;
      constexpr int kLanesPerRow = kChunks < 32 ? kChunks : 32;
      constexpr int kRowsPerIter = 32 / kLanesPerRow;
      static_assert(kChunks <= 32 && kRowsPerWarp <= 32 && kRowsPerWarp % kRowsPerIter == 0, "producer mapping");
      const int pwarp = tid / 32, plane = tid & 31;
      const int sub = plane / kLanesPerRow, chunk = plane % kLanesPerRow;
      const int64_t head_offset = static_cast<int64_t>(w.kv_head) * p.kv_head_stride;
      for (int t = 0; t < num_tiles; ++t, ++it) {
        const int stage = static_cast<int>(it % kStages);
        int64_t my_offset = -1;  // -1: past the keys of this item (zero-filled)
        {
          const int key = w.kv_begin + t * kTile + pwarp * kRowsPerWarp + plane;
          if (plane < kRowsPerWarp && key < kv_stop) {
            uint32_t page, slot;
            p.page.divmod(static_cast<uint32_t>(key), page, slot);
            const int64_t id = p.page_indices ? __ldg(p.page_indices + w.page_begin + page) : w.page_begin + page;
            my_offset = id * p.kv_page_stride + static_cast<int64_t>(slot) * p.kv_token_stride + head_offset;
          }
        }
        sm90::mbar_wait(&empty[stage], ((it / kStages) & 1) ^ 1);
        T* s_k = s_kv + stage * (2 * kTile * HeadDim);
        T* s_v = s_k + kTile * HeadDim;
#pragma unroll
        for (int i = 0; i < kRowsPerWarp / kRowsPerIter; ++i) {
          const int rr = i * kRowsPerIter + sub;
          const int64_t offset = __shfl_sync(0xffffffffu, my_offset, rr);
          const int r = pwarp * kRowsPerWarp + rr;
          const bool valid = offset >= 0;
          const int64_t src = valid ? offset + chunk * 8 : 0;
          prims::cp_async_16(s_k + sw128_offset<kTile>(r, chunk), k + src, valid);
          prims::cp_async_16(s_v + sw128_offset<kTile>(r, chunk), v + src, valid);
        }
        sm90::mbar_arrive_on_cp_async(&full[stage]);
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // ---- consumers ------------------------------------------------------------------------------
  sm90::setmaxnreg_inc<Cfg::kConsumerRegs>();
  // Ping-pong: the two consumer warpgroups take turns issuing their GEMMs (named barriers 2 and
  // 3), so one's softmax runs while the other's GEMMs hold the tensor cores. Each warpgroup
  // passes its barrier, issues, then opens the other's; consumer 1 opens consumer 0's first turn.
  constexpr uint32_t kTurnThreads = 256;
  if (wg == 2) sm90::named_barrier_arrive(2, kTurnThreads);
  const int cw = wg - 1;
  const int lane = tid & 31;
  const int warp = (tid / 32) & 3;  // warp within the consumer warpgroup
  const int wg_row0 = cw * 64;      // this warpgroup's first row in the CTA tile
  uint32_t it = 0;
  uint32_t items_done = 0;
  for (int item = blockIdx.x; item < num_work; item += gridDim.x, ++items_done) {
    __syncwarp();  // the epilogue's row guard may have split the warp
    sm90::named_barrier_sync(1, Shape::kThreads);
    const WorkItem w = p.work[item];
    const ItemKeys keys = item_keys(w, p, kCtaRows, kTile);
    const int rows = keys.rows;
    const int num_tiles = keys.num_tiles;
    const int all_rows_see = keys.all_rows_see;
    int row_limit[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) row_limit[i] = keys.row_limit(w, p, w.row_begin + wg_row0 + warp * 16 + (lane >> 2) + i * 8);

    float o_acc[HeadDim / 2];
#pragma unroll
    for (int j = 0; j < HeadDim / 2; ++j) o_acc[j] = 0.f;
    float m[2] = {prims::kNegInf, prims::kNegInf};
    float d[2] = {0.f, 0.f};

    sm90::mbar_wait(q_full, items_done & 1);
    sm90::fence_proxy_async_smem();
    const T* q_wg = s_q + wg_row0 * 64;

    // S = Q K^T (64 rows x kTile keys) into s: K-major operands, k-steps of 16 columns.
    // Descriptors: a base per operand plus the constant byte offset of each k-step (>> 4).
    const uint64_t q_desc = sm90::smem_desc_sw128(q_wg, 16, 1024);
    auto issue_s = [&](float (&s)[kTile / 2], const T* s_k) {
      const uint64_t k_desc = sm90::smem_desc_sw128(s_k, 16, 1024);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HeadDim / 16; ++kk) {
        constexpr int kQBlock = kCtaRows * 64 / 8, kKBlock = kTile * 64 / 8;  // 16-byte units
        sm90::Wgmma<T, kTile>::ss(s, q_desc + (kk >> 2) * kQBlock + (kk & 3) * 2,
                                  k_desc + (kk >> 2) * kKBlock + (kk & 3) * 2, kk > 0 ? 1 : 0);
      }
      sm90::wgmma_commit();
    };
    // O += P V: P as the register A operand (16 keys per step), V read MN-major.
    auto issue_pv = [&](uint32_t (&pa)[kTile / 16][4], const T* s_v) {
      const uint64_t v_desc = sm90::smem_desc_sw128(s_v, kTile * 128, 1024);
#pragma unroll
      for (int j = 0; j < HeadDim / 2; ++j) sm90::fence_operand(o_acc[j]);
      sm90::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kTile / 16; ++ks) sm90::Wgmma<T, HeadDim>::rs_tb(o_acc, pa[ks], v_desc + ks * 128, 1);
      sm90::wgmma_commit();
    };
    // Online softmax of tile t in place (s becomes P in fp32); scale[i] is the factor O's row i
    // must take before P V of this tile is added. Touches neither o_acc nor a P register in flight.
    auto softmax = [&](float (&s)[kTile / 2], int t, float (&scale)[2]) {
      if (w.kv_begin + (t + 1) * kTile > all_rows_see) {  // a tile that some row must not see
        const int key0 = w.kv_begin + t * kTile + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < kTile / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (key0 + 8 * j + (e & 1) >= row_limit[e >> 1]) s[4 * j + e] = prims::kNegInf;
      }
      // The scale (> 0) is folded into the exponent: exp2(s * scale - max(s) * scale) in one FFMA.
      const float sc = p.sm_scale_log2;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float raw = prims::kNegInf;
#pragma unroll
        for (int j = 0; j < kTile / 8; ++j) raw = fmaxf(raw, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
        raw = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 1));
        raw = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 2));
        const float mx = fmaxf(m[i], raw * sc);
        scale[i] = prims::rescale_factor(m[i], mx);
        const float mu = prims::safe_max(mx);
        m[i] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kTile / 8; ++j) {
          const float e0 = prims::fast_exp2(fmaf(s[4 * j + 2 * i], sc, -mu));
          const float e1 = prims::fast_exp2(fmaf(s[4 * j + 2 * i + 1], sc, -mu));
          s[4 * j + 2 * i] = e0;
          s[4 * j + 2 * i + 1] = e1;
          sum += e0 + e1;
        }
        d[i] = d[i] * scale[i] + sum;
      }
    };
    auto pack_p = [&](const float (&s)[kTile / 2], uint32_t (&pa)[kTile / 16][4]) {
#pragma unroll
      for (int ks = 0; ks < kTile / 16; ++ks) {
        pa[ks][0] = prims::pack2<T>(s[8 * ks + 0], s[8 * ks + 1]);
        pa[ks][1] = prims::pack2<T>(s[8 * ks + 2], s[8 * ks + 3]);
        pa[ks][2] = prims::pack2<T>(s[8 * ks + 4], s[8 * ks + 5]);
        pa[ks][3] = prims::pack2<T>(s[8 * ks + 6], s[8 * ks + 7]);
      }
    };
    auto wait_stage = [&](uint32_t tile) {
      const int stage = static_cast<int>(tile % kStages);
      sm90::mbar_wait(&full[stage], (tile / kStages) & 1);
      sm90::fence_proxy_async_smem();
      return s_kv + stage * (2 * kTile * HeadDim);  // K tile; V follows it
    };

    // Intra-warpgroup pipelining: S of tile t is issued, then P V of tile t - 1; the softmax of
    // tile t runs while the tensor cores do that P V, and O is rescaled once it has completed.
    if (num_tiles > 0) {
      float s[kTile / 2];
      uint32_t pa[kTile / 16][4];
      float scale[2];
      const T* prev = wait_stage(it);
      sm90::named_barrier_sync(2 + (wg - 1), kTurnThreads);
      issue_s(s, prev);
      sm90::named_barrier_arrive(2 + (2 - wg), kTurnThreads);
      sm90::wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < kTile / 2; ++j) sm90::fence_operand(s[j]);
      softmax(s, 0, scale);
      pack_p(s, pa);
      for (int t = 1; t < num_tiles; ++t) {
        const T* cur = wait_stage(it + 1);
        sm90::named_barrier_sync(2 + (wg - 1), kTurnThreads);
        issue_s(s, cur);
        issue_pv(pa, prev + kTile * HeadDim);
        sm90::named_barrier_arrive(2 + (2 - wg), kTurnThreads);
        sm90::wgmma_wait<1>();  // S of tile t is done; P V of tile t - 1 may still run
#pragma unroll
        for (int j = 0; j < kTile / 2; ++j) sm90::fence_operand(s[j]);
        softmax(s, t, scale);
        sm90::wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < HeadDim / 2; ++j) sm90::fence_operand(o_acc[j]);
        if (lane == 0) sm90::mbar_arrive(&empty[it % kStages]);  // tile t - 1 fully read
        __syncwarp();  // converged again before the next .aligned wgmma / barrier
        ++it;
#pragma unroll
        for (int j = 0; j < HeadDim / 8; ++j) {
          o_acc[4 * j] *= scale[0];
          o_acc[4 * j + 1] *= scale[0];
          o_acc[4 * j + 2] *= scale[1];
          o_acc[4 * j + 3] *= scale[1];
        }
        pack_p(s, pa);
        prev = cur;
      }
      sm90::named_barrier_sync(2 + (wg - 1), kTurnThreads);
      issue_pv(pa, prev + kTile * HeadDim);
      sm90::named_barrier_arrive(2 + (2 - wg), kTurnThreads);
      sm90::wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < HeadDim / 2; ++j) sm90::fence_operand(o_acc[j]);
      if (lane == 0) sm90::mbar_arrive(&empty[it % kStages]);
        __syncwarp();  // converged again before the next .aligned wgmma / barrier
      ++it;
    }

    // Epilogue: normalise and write this thread's two rows straight from the accumulators.
    float dsum[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float dd = d[i];
      dd += __shfl_xor_sync(0xffffffffu, dd, 1);
      dd += __shfl_xor_sync(0xffffffffu, dd, 2);
      dsum[i] = dd;
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int ra = w.row_begin + wg_row0 + warp * 16 + (lane >> 2) + i * 8;
      if (ra >= rows) continue;
      const float inv = dsum[i] > 0.f ? 1.f / dsum[i] : 0.f;
      const float lse2 = dsum[i] > 0.f ? m[i] + log2f(dsum[i]) : prims::kNegInf;
      uint32_t tok, g;
      p.group.divmod(ra, tok, g);
      const int col = 2 * (lane & 3);
      if (w.partial_base < 0) {
        const int64_t token = w.qo_begin + static_cast<int64_t>(tok);
        const int head = w.kv_head * group + g;
        T* dst = static_cast<T*>(p.o) + token * p.o_stride_n + head * p.o_stride_h + col;
#pragma unroll
        for (int j = 0; j < HeadDim / 8; ++j)
          *reinterpret_cast<uint32_t*>(dst + 8 * j) =
              prims::pack2<T>(o_acc[4 * j + 2 * i] * inv, o_acc[4 * j + 2 * i + 1] * inv);
        if (p.lse != nullptr && (lane & 3) == 0) p.lse[token * p.num_qo_heads + head] = lse2 * prims::kLn2;
      } else {
        const int64_t prow = static_cast<int64_t>(w.partial_base) + ra;
        float* dst = p.partial_o + prow * HeadDim + col;
#pragma unroll
        for (int j = 0; j < HeadDim / 8; ++j)
          *reinterpret_cast<float2*>(dst + 8 * j) =
              make_float2(o_acc[4 * j + 2 * i] * inv, o_acc[4 * j + 2 * i + 1] * inv);
        if ((lane & 3) == 0) p.partial_lse[prow] = lse2;
      }
    }
  }
#else
  __trap();  // compiled for an architecture without wgmma; select_kernel never picks it there
#endif
#endif
}

template <typename T, int HeadDim>
struct Sm90Prefill {
  using Shape = AttnShape<Family::kPrefillSm90, HeadDim>;
  static void launch(const AttentionParams& params, int num_ctas, void* stream) {
    ensure_smem_limit<attention_sm90_kernel<T, HeadDim>, Shape::kSmemBytes>();
    if (num_ctas <= 0) return;
    attention_sm90_kernel<T, HeadDim>
        <<<num_ctas, Shape::kThreads, Shape::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(params);
    GQ_CUDA_CHECK(cudaGetLastError());
  }
  static int ctas_per_sm() {
    ensure_smem_limit<attention_sm90_kernel<T, HeadDim>, Shape::kSmemBytes>();
    int blocks = 0;
    GQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, attention_sm90_kernel<T, HeadDim>,
                                                                Shape::kThreads, Shape::kSmemBytes));
    return blocks > 0 ? blocks : 1;
  }
};

}  // namespace gqattn::kernels

// The AttentionKernel<..., kPrefillSm90> members that select_kernel() points to (launch.h).
#define GQATTN_SM90_PREFILL(DTYPE, HEAD_DIM)                                                            \
  namespace gqattn::kernels {                                                                           \
  template <>                                                                                           \
  void AttentionKernel<DTYPE, HEAD_DIM, Family::kPrefillSm90>::launch(const AttentionParams& p, int n,  \
                                                                      void* stream) {                   \
    Sm90Prefill<CudaType<DTYPE>::type, HEAD_DIM>::launch(p, n, stream);                                 \
  }                                                                                                     \
  template <>                                                                                           \
  int AttentionKernel<DTYPE, HEAD_DIM, Family::kPrefillSm90>::ctas_per_sm() {                           \
    return Sm90Prefill<CudaType<DTYPE>::type, HEAD_DIM>::ctas_per_sm();                                 \
  }                                                                                                     \
  }
