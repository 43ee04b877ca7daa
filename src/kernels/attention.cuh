// The attention kernel body (sm_80+: cp.async, ldmatrix, mma.sync) shared by decode and prefill.
// Layer: src/kernels (device code; included only by the generated files in src/instantiations).
//
// One CTA takes work items from the plan's list. An item is (request, K/V head, tile of packed
// query rows, key chunk): the group_size query heads of a K/V head (times the request's query
// tokens) are packed into the MMA's M dimension, so every K/V tile is read from memory once per
// group. K/V tiles stream through a cp.async pipeline kStages deep; pages are resolved per key
// row, so any page size and either layout works. Warps split the rows (kWarpsM), each tile's
// keys (kWarpsKV) and the output's columns (kWarpsN: the warps of one column split compute the
// same scores); the key warps' online-softmax states are merged in shared memory at the end, and
// the result goes to o (or, for a split-KV chunk, to the fp32 partial buffer merged later).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/attention_config.h"
#include "kernels/launch.h"
#include "kernels/tile_layout.h"
#include "prims/cuda_check.h"
#include "prims/mma.cuh"
#include "prims/pdl.cuh"
#include "prims/softmax_state.cuh"

namespace gqattn::kernels {

template <DType D>
struct CudaType;
template <>
struct CudaType<DType::kBF16> {
  using type = __nv_bfloat16;
};
template <>
struct CudaType<DType::kFP16> {
  using type = __half;
};

// The keys that one CTA's rows of a work item need. Packed row r sees keys
// [0, causal_base + r / group) under the causal mask (aligned to the end of the request's keys).
struct ItemKeys {
  int rows;          // packed rows of the request (qo_len x group)
  int causal_base;
  int kv_stop;       // no row of the CTA sees a key at or past this
  int all_rows_see;  // every row of the CTA sees all keys before this
  int num_tiles;     // kv_tile-key tiles from kv_begin that reach kv_stop

  // One past the last key that packed row r may see within the item's chunk.
  __device__ __forceinline__ int row_limit(const WorkItem& w, const AttentionParams& p, int r) const {
    return p.causal ? min(w.kv_end, causal_base + static_cast<int>(p.group.div(r))) : w.kv_end;
  }
};

__device__ __forceinline__ ItemKeys item_keys(const WorkItem& w, const AttentionParams& p, int cta_rows,
                                              int kv_tile) {
  ItemKeys k;
  k.rows = w.qo_len * static_cast<int>(p.group.divisor);
  k.causal_base = w.kv_len - w.qo_len + 1;
  k.kv_stop = w.kv_end;
  k.all_rows_see = w.kv_end;
  if (p.causal) {
    const int last_row = min(w.row_begin + cta_rows, k.rows) - 1;
    k.kv_stop = min(k.kv_stop, k.causal_base + static_cast<int>(p.group.div(last_row)));
    k.all_rows_see = min(k.all_rows_see, k.causal_base + static_cast<int>(p.group.div(w.row_begin)));
  }
  k.num_tiles = k.kv_stop > w.kv_begin ? (k.kv_stop - w.kv_begin + kv_tile - 1) / kv_tile : 0;
  return k;
}

// Packed row `r` of an item is query token r / group of the request and query head
// kv_head * group + r % group: its row of q.
template <typename T>
__device__ __forceinline__ const T* q_row(const AttentionParams& p, const WorkItem& w, int r) {
  uint32_t tok, g;
  p.group.divmod(r, tok, g);
  return static_cast<const T*>(p.q) + (w.qo_begin + static_cast<int64_t>(tok)) * p.q_stride_n +
         static_cast<int64_t>(w.kv_head * static_cast<int>(p.group.divisor) + static_cast<int>(g)) * p.q_stride_h;
}

template <typename T, int HeadDim, Family F>
__global__ void __launch_bounds__(AttnShape<F, HeadDim>::kThreads)
    attention_kernel(const AttentionParams p) {
  using Cfg = AttnConfig<F, HeadDim>;
  using Shape = AttnShape<F, HeadDim>;
  constexpr int kChunks = HeadDim / 8;  // 16-byte chunks per row
  constexpr int kThreads = Shape::kThreads;
  constexpr int kRowElems = Shape::kRowElems;
  using Slots = LoadSlots<kThreads, kChunks>;
  constexpr int kKVTile = Cfg::kKVTile;
  constexpr int kStages = Cfg::kStages;
  constexpr int kCtaRows = Shape::kCtaRows;
  constexpr int kWarpKV = Shape::kWarpKV;
  constexpr int kN = kWarpKV / 8;  // 8-key MMA tiles per warp per K/V tile
  constexpr int kWarpCols = Shape::kWarpCols;
  constexpr int kD = kWarpCols / 8;  // 8-column MMA tiles of this warp's output columns
  constexpr int kEpiStride = Shape::kEpiStride;
  constexpr int kMT = Cfg::kMTiles;  // 16-row MMA tiles per warp
  constexpr int kWarpRows = Shape::kWarpRows;

  extern __shared__ __align__(128) unsigned char smem[];
  T* s_q = reinterpret_cast<T*>(smem);
  T* s_kv = reinterpret_cast<T*>(smem + Shape::kQBytes);
  float* s_epi = reinterpret_cast<float*>(smem + Shape::kQBytes);  // reuses the K/V stages

  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp % Cfg::kWarpsM;
  // (kWarpsN == 1: wn is the constant 0, so the other families compile as without column warps)
  const int wk = Cfg::kWarpsN == 1 ? warp / Cfg::kWarpsM : (warp / Cfg::kWarpsM) % Cfg::kWarpsKV;
  const int wn = Cfg::kWarpsN == 1 ? 0 : warp / (Cfg::kWarpsM * Cfg::kWarpsKV);
  const int col0 = wn * kWarpCols;  // this warp's first output column
  const Slots slots(tid);
  const int group = static_cast<int>(p.group.divisor);
  const int num_work = p.header->num_work;
  // The CTA's first item is loaded beside num_work, not after the loop's test of it: one dependent
  // round trip less before its first page-id and K/V loads. In bounds whatever num_work says: the
  // workspace holds kMaxWorkItems items and no grid is larger.
  WorkItem w = p.work[blockIdx.x];
  // The split merge after decode and decode_mid may be scheduled now: it waits for this grid to
  // finish (the other families' merge is an ordinary launch: perf-notes items 82, 165).
  if constexpr (merge_starts_early(F)) prims::grid_allow_dependents();

  for (int item = blockIdx.x; item < num_work; item += gridDim.x) {
    if (item != static_cast<int>(blockIdx.x)) w = p.work[item];
    const ItemKeys keys = item_keys(w, p, kCtaRows, kKVTile);
    const int rows = keys.rows;
    const int kv_stop = keys.kv_stop;
    const int num_tiles = keys.num_tiles;

    int row_limit[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = w.row_begin + wm * kWarpRows + mt * 16 + (lane >> 2) + i * 8;
        row_limit[mt][i] = keys.row_limit(w, p, r);
      }
    }
    const bool warp_active = w.row_begin + wm * kWarpRows < rows;

    // Q tile: packed rows -> (token, head) rows of q; rows past the request are zero-filled.
    for (int i = 0; i < Slots::template passes<kCtaRows>(); ++i) {
      const int r = slots.row(i);
      if (!Slots::template in_tile<kCtaRows>(r)) continue;
      const int ra = w.row_begin + r;
      const bool valid = ra < rows;
      const T* src = valid ? q_row<T>(p, w, ra) + slots.chunk(i) * 8 : q;
      prims::cp_async_16(s_q + swizzle<HeadDim>(r, slots.chunk(i)), src, valid);
    }
    prims::cp_async_commit();

    // K/V tiles: each thread copies kKVPasses 16-byte chunks (LoadSlots). A key's page id is looked
    // up one tile before its copy is issued, so the index load's latency hides behind the tile in
    // flight instead of stalling the issue. kWarpPrivate: the kKeyWarpGroup warps of key warp wk
    // (its row and column warps) copy the kWarpKV rows they multiply, and only they wait for them.
    // Only where a warp's threads cover whole rows of chunks (head_dim 64, 128, 256; not 80, 96,
    // 112, whose LoadSlots passes straddle rows): every thread then copies one chunk of rows
    // kKVRowStep apart.
    constexpr bool kWarpPrivate = warp_private_kv(F) && Cfg::kWarpsKV > 1 && 32 % kChunks == 0;
    constexpr int kKeyWarpGroup = Cfg::kWarpsM * Cfg::kWarpsN;
    constexpr int kKVRowStep = kWarpPrivate ? 32 * kKeyWarpGroup / kChunks : 1;
    constexpr int kKVPasses = kWarpPrivate ? kWarpKV / kKVRowStep : Slots::template passes<kKVTile>();
    static_assert(!kWarpPrivate || kWarpKV % kKVRowStep == 0, "K/V loads split evenly");
    static_assert(!kWarpPrivate || Cfg::kWarpsKV <= 15, "a named barrier a key warp");
    // slots.chunk(i) (tid % kChunks, the same every pass) is then the group thread's chunk too
    // (group_tid % kChunks).
    static_assert(!kWarpPrivate || (32 % kChunks == 0 && Slots::kSameChunk),
                  "a warp's threads cover whole rows of chunks");
    const int group_tid = (wn * Cfg::kWarpsM + wm) * 32 + lane;  // thread of the key warp's group
    const int kv_row0 = kWarpPrivate ? wk * kWarpKV + group_tid / kChunks : 0;
    auto kv_row = [&](int i) { return kWarpPrivate ? kv_row0 + i * kKVRowStep : slots.row(i); };
    const int64_t head_offset =
        static_cast<int64_t>(w.kv_head) * p.kv_head_stride + (Slots::kSameChunk ? slots.chunk(0) * 8 : 0);
    int32_t page_ids[kKVPasses];
    auto fetch_pages = [&](int tile) {
      const int base = w.kv_begin + tile * kKVTile;
#pragma unroll
      for (int i = 0; i < kKVPasses; ++i) {
        const int key = base + kv_row(i);
        const int page = static_cast<int>(p.page.div(static_cast<uint32_t>(key)));
        page_ids[i] = (key < kv_stop && tile < num_tiles)
                          ? (p.page_indices ? __ldg(p.page_indices + w.page_begin + page) : w.page_begin + page)
                          : 0;
      }
    };
    auto issue_tile = [&](int tile, int slot) {
      T* s_k = s_kv + slot * 2 * kKVTile * kRowElems;
      T* s_v = s_k + kKVTile * kRowElems;
      const int base = w.kv_begin + tile * kKVTile;
#pragma unroll
      for (int i = 0; i < kKVPasses; ++i) {
        const int r = kv_row(i);
        if (!kWarpPrivate && !Slots::template in_tile<kKVTile>(r)) continue;
        const int key = base + r;
        const int chunk = slots.chunk(i);  // (in head_offset where it is the same every pass)
        const bool valid = key < kv_stop;
        uint32_t page, slot_in_page;
        p.page.divmod(static_cast<uint32_t>(key), page, slot_in_page);
        const int64_t offset = valid ? static_cast<int64_t>(page_ids[i]) * p.kv_page_stride +
                                           static_cast<int64_t>(slot_in_page) * p.kv_token_stride + head_offset +
                                           (Slots::kSameChunk ? 0 : chunk * 8)
                                     : 0;
        prims::cp_async_16(s_k + swizzle<HeadDim>(r, chunk), k + offset, valid);
        prims::cp_async_16(s_v + swizzle<HeadDim>(r, chunk), v + offset, valid);
      }
    };

    fetch_pages(0);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < num_tiles) issue_tile(s, s);
      prims::cp_async_commit();
      fetch_pages(s + 1);
    }
    if constexpr (kWarpPrivate) {  // Q, which every warp reads, is the one tile copied by all
      prims::cp_async_wait<kStages - 1>();
      __syncthreads();
    }

    float o_acc[kMT][kD][4];
    float m[kMT][2], d[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int j = 0; j < kD; ++j) o_acc[mt][j][0] = o_acc[mt][j][1] = o_acc[mt][j][2] = o_acc[mt][j][3] = 0.f;
      m[mt][0] = m[mt][1] = prims::kNegInf;
      d[mt][0] = d[mt][1] = 0.f;
    }

    for (int t = 0; t < num_tiles; ++t) {
      prims::cp_async_wait<kStages - 2>();
      if constexpr (kWarpPrivate && kKeyWarpGroup == 1) {
        __syncwarp();  // this warp's rows of tile t, copied by its lanes; slot t - 1 read by it alone
      } else if constexpr (kWarpPrivate) {  // the same over the key warp's group: barrier 1 + wk,
#pragma unroll                                // an immediate (a register id reserves all 16)
        for (int x = 0; x < Cfg::kWarpsKV; ++x)
          if (x == wk) prims::named_barrier_sync(1 + x, 32 * kKeyWarpGroup);
      } else {
        __syncthreads();
      }
      {
        const int next = t + kStages - 1;
        if (next < num_tiles) issue_tile(next, next % kStages);
        prims::cp_async_commit();
        fetch_pages(next + 1);
      }
      if (!warp_active) continue;
      const T* s_k = s_kv + (t % kStages) * 2 * kKVTile * kRowElems;
      const T* s_v = s_k + kKVTile * kRowElems;

      // S = Q K^T for this warp's kMT x 16 rows and kWarpKV keys; each K fragment serves all kMT.
      float s[kMT][kN][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int n = 0; n < kN; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < HeadDim / 16; ++kk) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
          prims::ldmatrix_x4(a[mt], s_q + swizzle<HeadDim>(wm * kWarpRows + mt * 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
        for (int n = 0; n < kN / 2; ++n) {
          uint32_t b[4];
          const int key_row = wk * kWarpKV + n * 16 + (lane & 7) + ((lane >> 4) << 3);
          prims::ldmatrix_x4(b, s_k + swizzle<HeadDim>(key_row, 2 * kk + ((lane >> 3) & 1)));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            prims::mma_16816<T>(s[mt][2 * n], a[mt], b[0], b[1]);
            prims::mma_16816<T>(s[mt][2 * n + 1], a[mt], b[2], b[3]);
          }
        }
      }

      // Scale to base 2, mask, and fold into the running softmax of each of this thread's rows.
      const int key0 = w.kv_begin + t * kKVTile + wk * kWarpKV + 2 * (lane & 3);
      const bool need_mask = w.kv_begin + (t + 1) * kKVTile > keys.all_rows_see;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int n = 0; n < kN; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[mt][n][e] *= p.sm_scale_log2;
            if (need_mask && key0 + n * 8 + (e & 1) >= row_limit[mt][e >> 1]) s[mt][n][e] = prims::kNegInf;
          }
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float mx = m[mt][i];
#pragma unroll
          for (int n = 0; n < kN; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * i], s[mt][n][2 * i + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float scale = prims::rescale_factor(m[mt][i], mx);
          const float mu = prims::safe_max(mx);
          m[mt][i] = mx;
          d[mt][i] *= scale;
#pragma unroll
          for (int j = 0; j < kD; ++j) {
            o_acc[mt][j][2 * i] *= scale;
            o_acc[mt][j][2 * i + 1] *= scale;
          }
#pragma unroll
          for (int n = 0; n < kN; ++n) {
            s[mt][n][2 * i] = prims::fast_exp2(s[mt][n][2 * i] - mu);
            s[mt][n][2 * i + 1] = prims::fast_exp2(s[mt][n][2 * i + 1] - mu);
            d[mt][i] += s[mt][n][2 * i] + s[mt][n][2 * i + 1];
          }
        }
      }

      // O += P V: the S accumulators are re-packed as the A operand, V is read transposed once
      // for all kMT row tiles.
#pragma unroll
      for (int ks = 0; ks < kWarpKV / 16; ++ks) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          a[mt][0] = prims::pack2<T>(s[mt][2 * ks][0], s[mt][2 * ks][1]);
          a[mt][1] = prims::pack2<T>(s[mt][2 * ks][2], s[mt][2 * ks][3]);
          a[mt][2] = prims::pack2<T>(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
          a[mt][3] = prims::pack2<T>(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
        }
        const int key_row = wk * kWarpKV + ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
        for (int dp = 0; dp < kWarpCols / 16; ++dp) {
          uint32_t b[4];
          prims::ldmatrix_x4_trans(b, s_v + swizzle<HeadDim>(key_row, col0 / 8 + 2 * dp + (lane >> 4)));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            prims::mma_16816<T>(o_acc[mt][2 * dp], a[mt], b[0], b[1]);
            prims::mma_16816<T>(o_acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }

    // Epilogue: every warp parks its unnormalised rows of the request and their (m, d) in shared
    // memory; then all threads merge the kWarpsKV states of each row and write 16-byte vectors.
    prims::cp_async_wait<0>();
    __syncthreads();
    float* s_o = s_epi + wk * kCtaRows * kEpiStride;
    float* s_md = s_epi + Cfg::kWarpsKV * kCtaRows * kEpiStride;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float dd = d[mt][i];
        dd += __shfl_xor_sync(0xffffffffu, dd, 1);
        dd += __shfl_xor_sync(0xffffffffu, dd, 2);
        const int rr = wm * kWarpRows + mt * 16 + (lane >> 2) + i * 8;
        // Rows past the request's (a one-token decode item has G of its 16) are never read below:
        // not parking them took 0.1-0.3 us off the epilogue (perf-notes item 274).
        if (w.row_begin + rr >= rows) continue;
#pragma unroll
        for (int j = 0; j < kD; ++j) {
          *reinterpret_cast<float2*>(&s_o[rr * kEpiStride + col0 + j * 8 + 2 * (lane & 3)]) =
              make_float2(o_acc[mt][j][2 * i], o_acc[mt][j][2 * i + 1]);
        }
        if ((lane & 3) == 0 && wn == 0) {  // the column warps hold the same (m, d)
          s_md[(wk * kCtaRows + rr) * 2] = m[mt][i];
          s_md[(wk * kCtaRows + rr) * 2 + 1] = dd;
        }
      }
    }
    __syncthreads();

    for (int u = tid; u < kCtaRows * kChunks; u += kThreads) {
      const int r = u / kChunks;
      const int c = u % kChunks;
      const int ra = w.row_begin + r;
      if (ra >= rows) continue;
      float m_all = prims::kNegInf;
#pragma unroll
      for (int x = 0; x < Cfg::kWarpsKV; ++x) m_all = fmaxf(m_all, s_md[(x * kCtaRows + r) * 2]);
      const float mu = prims::safe_max(m_all);
      float d_all = 0.f;
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int x = 0; x < Cfg::kWarpsKV; ++x) {
        const float sc = prims::rescale_factor(s_md[(x * kCtaRows + r) * 2], mu);
        d_all += s_md[(x * kCtaRows + r) * 2 + 1] * sc;
        const float4* src = reinterpret_cast<const float4*>(s_epi + (x * kCtaRows + r) * kEpiStride + c * 8);
        const float4 lo = src[0], hi = src[1];
        acc[0] += lo.x * sc; acc[1] += lo.y * sc; acc[2] += lo.z * sc; acc[3] += lo.w * sc;
        acc[4] += hi.x * sc; acc[5] += hi.y * sc; acc[6] += hi.z * sc; acc[7] += hi.w * sc;
      }
      const float inv = prims::inv_row_sum(d_all);
      const float lse2 = prims::row_lse2(m_all, d_all);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] *= inv;
      uint32_t tok, g;
      p.group.divmod(ra, tok, g);
      if (w.partial_base < 0) {
        const int64_t token = w.qo_begin + static_cast<int64_t>(tok);
        const int head = w.kv_head * group + g;
        uint4 packed;
        packed.x = prims::pack2<T>(acc[0], acc[1]);
        packed.y = prims::pack2<T>(acc[2], acc[3]);
        packed.z = prims::pack2<T>(acc[4], acc[5]);
        packed.w = prims::pack2<T>(acc[6], acc[7]);
        *reinterpret_cast<uint4*>(static_cast<T*>(p.o) + token * p.o_stride_n + head * p.o_stride_h + c * 8) = packed;
        if (p.lse != nullptr && c == 0) p.lse[token * p.num_qo_heads + head] = lse2 * prims::kLn2;
      } else {
        const int64_t prow = static_cast<int64_t>(w.partial_base) + ra;
        float4* dst = reinterpret_cast<float4*>(p.partial_o + prow * HeadDim + c * 8);
        dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
        if (c == 0) p.partial_lse[prow] = lse2;
      }
    }
    __syncthreads();
  }
}

// Raises one kernel's dynamic shared-memory limit once per device (plan() does it first, so a
// run() under CUDA-graph capture makes no attribute call). One flag set per kernel.
template <auto Kernel, int SmemBytes>
void ensure_smem_limit() {
  static std::atomic<uint64_t> done_devices{0};
  int device = 0;
  GQ_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t(1) << (device & 63);
  if (done_devices.load(std::memory_order_acquire) & bit) return;
  GQ_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemBytes));
  done_devices.fetch_or(bit, std::memory_order_acq_rel);
}

template <DType kDType, int HeadDim, Family F>
void AttentionKernel<kDType, HeadDim, F>::launch(const AttentionParams& params, int num_ctas, void* stream) {
  using T = typename CudaType<kDType>::type;
  using Shape = AttnShape<F, HeadDim>;
  auto kernel = attention_kernel<T, HeadDim, F>;
  ensure_smem_limit<attention_kernel<T, HeadDim, F>, Shape::kSmemBytes>();
  if (num_ctas <= 0) return;
  kernel<<<num_ctas, Shape::kThreads, Shape::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(params);
  GQ_CUDA_CHECK(cudaGetLastError());
}

template <DType kDType, int HeadDim, Family F>
int AttentionKernel<kDType, HeadDim, F>::ctas_per_sm() {
  using T = typename CudaType<kDType>::type;
  using Shape = AttnShape<F, HeadDim>;
  auto kernel = attention_kernel<T, HeadDim, F>;
  ensure_smem_limit<attention_kernel<T, HeadDim, F>, Shape::kSmemBytes>();
  int blocks = 0;
  GQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, Shape::kThreads, Shape::kSmemBytes));
  return blocks > 0 ? blocks : 1;
}

}  // namespace gqattn::kernels
