// The Hopper (sm_90a) prefill kernel: warp-specialised, wgmma on tensor cores, mbarrier pipeline.
// Layer: src/kernels (device code; included only by the generated prefill_sm90 instantiations).
//
// Same work list, packing and outputs as attention.cuh: an item is (request, K/V head, 128 packed
// query rows (192 in prefill_sm90_wide), key range), the group's query heads (x query tokens)
// packed into the rows, so each K/V tile is read once per group. CTAs are persistent: each starts
// with item blockIdx.x and then claims the next one from a counter in the workspace header (the
// last CTA resets it). The CTA has three warpgroups (four in prefill_sm90_wide):
//   producer (warpgroup 0, registers lowered by setmaxnreg): copies Q, then streams K/V tiles into
//     kStages shared-memory stages: a tile that lies whole in one page (or in ragged K/V) by TMA,
//     others by cp.async gathers (any page size, either layout); the copies arrive on the stage's
//     "full" mbarrier of K or V when they land. It runs ahead into the next item once the
//     consumers have read Q (the q_empty mbarrier);
//   consumers (warpgroups 1 and 2, and 3 in prefill_sm90_wide; 64 query rows each): wait "full",
//     S = Q K^T with wgmma (both operands in shared memory), online softmax in registers, O += P V
//     with P from registers and V read transposed from shared memory; K's "empty" mbarrier is
//     arrived on after the S GEMM, V's after P V.
// The consumers share only the stages and take turns issuing their GEMMs, so one's softmax
// overlaps another's GEMMs (prefill_sm90 at hd64: turns at the softmax's exponentials instead,
// kExpTurns). With kSplitKeys (every item <= 64 rows: decode rows of a request and
// K/V head) both consumers take the same 64 rows, each the half of every K/V tile's keys
// (consumer c keys [c, c + 1) x kTile / 2), and consumer 1 hands its softmax state to consumer 0
// at the end of the item through Q's rows 64..127, which the producer then leaves alone.
// Shared-memory tiles use the 128-byte swizzle that the wgmma descriptors describe, in whole
// 64-column blocks: at head_dim 80, 96 and 112 a row holds kCols = 128 columns (hd128's tiles), of
// which the copies fill and the GEMMs read the first HeadDim (S's k-steps, P V's N = HeadDim).
#pragma once

#include <cuda.h>  // CUtensorMap (types only; the encoder comes through the runtime's entry points)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "api/env_flag.h"
#include "kernels/attention.cuh"
#include "prims/sm90.cuh"
#include "prims/tma_encoder.h"
#include "prims/wgmma_ops.cuh"

namespace gqattn::kernels {

// Element offset of 16-byte chunk `chunk` of row `row` in a [Rows][kCols] tile stored as
// column blocks of 64 elements: block-major, 128-byte rows, chunks XOR-swizzled by row % 8.
template <int Rows>
__device__ __forceinline__ int sw128_offset(int row, int chunk) {
  return (chunk >> 3) * (Rows * 64) + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
}

// TMA descriptions of the K and V pools, for K/V tiles that lie wholly inside an item's keys;
// built on the host for each run (Sm90Prefill::make_tma). Dimension 0 is head_dim (boxes of 64
// columns, 128-byte swizzle: the layout sw128_offset describes; at 80, 96 and 112 the second box
// lies partly past head_dim: TMA writes zeros there and counts the whole box's bytes); the head
// and the key-in-page dimensions follow in stride order, then the page (paged: rank 4; ragged:
// rank 3, tokens).
struct Sm90Tma {
  CUtensorMap k, v;
  CUtensorMap o;  // hd64: O as {hd, head, token}, boxes of {64, group, 64 / group} (o_group > 0)
  int o_group;    // 0: O stored from the registers; else the group size the O map's box was made for
  int enabled;    // 0: every tile by cp.async gathers
  int paged;      // 0: ragged {hd, head, token}; 1: {hd, ., ., page}; 2: one K/V head {hd, key, page}
  int token_dim;  // paged == 1: coordinate index (1 or 2) of the key within its page; the head is the other
  int key_boxes;  // boxes along a tile's keys: 1, or tile / page_size for pages of 8 .. tile / 2 keys
};

// kTma: whole tiles by TMA (the run's tensor maps in `tma`), the rest by gathers; without it the
// producer loop holds only the gathers (one instantiation each: with the TMA branch compiled in,
// the gather-only runs measured ~12% slower). kSplitKeys: see above (AttentionParams::split_item_keys).
// F: prefill_sm90 (two consumer warpgroups) or prefill_sm90_wide (three; attention_config.h).
template <typename T, int HeadDim, Family F, bool kTma, bool kSplitKeys>
__global__ void __launch_bounds__(AttnShape<F, HeadDim>::kThreads, 1)
    attention_sm90_kernel(const AttentionParams p, const __grid_constant__ Sm90Tma tma) {
#if defined(__CUDA_ARCH__)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  namespace sm90 = prims::sm90;
  using Cfg = AttnConfig<F, HeadDim>;
  using Shape = AttnShape<F, HeadDim>;
  constexpr int kTile = Cfg::kKVTile;
  constexpr int kStages = Cfg::kStages;
  constexpr int kCtaRows = Shape::kCtaRows;
  constexpr int kCols = Shape::kCols;             // a row's columns in shared memory (>= HeadDim)
  constexpr int kChunks = HeadDim / 8;            // 16-byte chunks of a row that hold data
  constexpr int kColChunks = kCols / 8;           // 16-byte chunks of a row in shared memory
  // O's accumulator columns: P V's N. HeadDim (80, 96 and 112 read V's second 64-column block in
  // part); kCols would multiply the padding too (its columns then ignored), at 1.2-1.6x P V's work.
  constexpr int kOCols = HeadDim;
  constexpr int kRowsPerPass = 128 / kColChunks;  // rows one producer pass covers
  constexpr int kQPasses = kCtaRows / kRowsPerPass;
  // Keys of a tile that one consumer warpgroup multiplies: all, or its half (kSplitKeys).
  constexpr int kSTile = kSplitKeys ? kTile / 2 : kTile;
  static_assert(!kSplitKeys || (kSTile >= 64 && Cfg::kConsumers == 2), "split keys: 64-key halves, two consumers");
  // Whether consumers skip their item's tiles past their keys (my_tiles below): where a
  // consumer's 64 rows can end a whole tile before its item's last rows in aligned causal MHA,
  // i.e. hd256's 64-key tiles. prefill_sm90_wide's consumer 0 could too (128-key tiles, 192-row
  // items), but there ptxas then spilled more (100 -> 124 bytes) and copied the softmax (+464
  // instructions) for under 1% of its tiles.
  constexpr bool kSkipMaskedTiles = !kSplitKeys && kTile <= 64;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  T* s_q = reinterpret_cast<T*>(smem);
  T* s_kv = reinterpret_cast<T*>(smem + Shape::kQBytes);
  // K and V have their own barriers: a stage's K is released once the S GEMM has read it, its V
  // once P V has, so the producer refills K one iteration before V (the consumer holds K of tile
  // t and V of tile t - 1 at once; with a shared barrier two stages gave no lookahead at all).
  uint64_t* full_k = reinterpret_cast<uint64_t*>(smem + Shape::kQBytes + kStages * Shape::kStageBytes);
  uint64_t* full_v = full_k + kStages;
  uint64_t* empty_k = full_v + kStages;
  uint64_t* empty_v = empty_k + kStages;
  uint64_t* q_full = empty_v + kStages;
  uint64_t* q_empty = q_full + 1;
  // The producer hands each item index to the consumers through shared memory (s_item[0];
  // >= num_work ends the loop), published by q_full; s_item[1..2]: the next item for the
  // producer's own warps (double-buffered across items). At hd <= 128 the item itself goes the
  // same way (s_work: the consumers would otherwise load it from global memory after q_full, on
  // their critical path); at hd256 the consumers keep the global load (read from shared memory,
  // ptxas spilled ~108 bytes of their registers there).
  constexpr bool kItemInSmem = HeadDim <= 128;
  volatile int* s_item = reinterpret_cast<volatile int*>(q_empty + 1);
  WorkItem* s_work = reinterpret_cast<WorkItem*>(reinterpret_cast<unsigned char*>(full_k) + Shape::kWorkItemOffset);

  const int tid = threadIdx.x;
  const int wg = sm90::warp_uniform(tid / 128);
  const int group = static_cast<int>(p.group.divisor);
  const int num_work = p.header->num_work;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(&full_k[s], 128);  // every producer thread, on cp.async completion (or TMA bytes)
      sm90::mbar_init(&full_v[s], 128);
      sm90::mbar_init(&empty_k[s], 4 * Cfg::kConsumers);  // one lane per consumer warp
      sm90::mbar_init(&empty_v[s], 4 * Cfg::kConsumers);
    }
    sm90::mbar_init(q_full, 128 + 1);  // every producer thread on its Q copies, + thread 0 on s_item
    sm90::mbar_init(q_empty, 128 * Cfg::kConsumers);  // every consumer thread, after its warp's last S GEMM
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----------------------------------------------------------------------------
    sm90::setmaxnreg_dec<Cfg::kProducerRegs>();
    const int load_row = tid / kColChunks;
    const int load_chunk = tid % kColChunks;
    const T* q = static_cast<const T*>(p.q);
    const T* k = static_cast<const T*>(p.k);
    const T* v = static_cast<const T*>(p.v);
    uint32_t it = 0;  // K/V tiles issued so far (over all items): stage and phase
    // Persistent: CTA b starts with item b, then takes the next unclaimed one from the counter.
    // Item b is loaded now, beside num_work's load, not after the test of it (in bounds whatever
    // num_work says: the workspace holds kMaxWorkItems items and no grid is larger).
    int item = blockIdx.x;
    const WorkItem first = p.work[item];
    for (uint32_t items_done = 0;; ++items_done) {
      // The producer runs ahead into the next item: its Q waits only until the consumers' last
      // S GEMM of the previous item has read Q (their P V and epilogue overlap this item's loads);
      // its K/V tiles wait on the stages' own "empty" barriers.
      // The item's description is loaded before that wait, its latency hidden behind it.
      const bool done = item >= num_work;
      WorkItem w{};
      if (!done) w = items_done == 0 ? first : p.work[item];
      __syncwarp();
      if (items_done > 0) sm90::mbar_wait(q_empty, (items_done - 1) & 1);
      if (tid == 0) {
        if (kItemInSmem && !done) *s_work = w;
        s_item[0] = item;
        sm90::mbar_arrive(q_full);  // release: s_item and s_work are visible to the consumers
      }
      __syncwarp();
      if (done) {
        sm90::mbar_arrive(q_full);
        if (tid == 0) {  // the last CTA to finish resets the counters for the next run
          __threadfence();
          if (atomicAdd(p.item_counters + 1, 1) == static_cast<int>(gridDim.x) - 1) {
            atomicExch(p.item_counters, 0);
            atomicExch(p.item_counters + 1, 0);
          }
        }
        break;
      }
      const ItemKeys keys = item_keys(w, p, kCtaRows, kTile);
      const int rows = keys.rows;
      const int kv_stop = keys.kv_stop;
      const int num_tiles = keys.num_tiles;

#pragma unroll
      for (int i = 0; i < kQPasses; ++i) {
        const int r = load_row + i * kRowsPerPass;
        if (kSplitKeys && r >= 64) continue;  // rows 64.. hold the consumers' hand-over
        if (kChunks < kColChunks && load_chunk >= kChunks) continue;  // past head_dim: never read
        const int ra = w.row_begin + r;
        const bool valid = ra < rows;
        const T* src = valid ? q_row<T>(p, w, ra) + load_chunk * 8 : q;
        prims::cp_async_16(s_q + sw128_offset<kCtaRows>(r, load_chunk), src, valid);
      }
      sm90::mbar_arrive_on_cp_async(q_full);

      // K/V tiles: warp pw copies rows [pw * kRowsPerWarp, +kRowsPerWarp) of each tile, four rows
      // an instruction: lane l takes row l / 8 of the four and its 16-byte chunk l % 8 of every
      // 64-column block, so each instruction reads whole 128-byte lines and a lane's blocks are
      // immediates apart in both memories. Lane l looks up the page of row l once per tile; the
      // copy loop takes row offsets (bytes) from it by shuffle.
      constexpr int kBlocks = kCols / 64;  // 128-byte column blocks a row
      constexpr int kRowsPerWarp = kTile / 4;
      constexpr int kRowsPerIter = 4;
      constexpr int kIters = kRowsPerWarp / kRowsPerIter;
      // A thread's rows repeat the 128-byte swizzle every 8 rows, kPeriod iterations: its shared
      // addresses are kPeriod bases plus multiples of 8 rows and of a block (immediates).
      constexpr int kPeriod = 8 / kRowsPerIter;
      constexpr uint32_t kPeriodBytes = 8 * 64 * sizeof(T);
      constexpr uint32_t kBlockBytes = kTile * 64 * sizeof(T);    // the next column block of a tile
      constexpr uint32_t kVBytes = kTile * kCols * sizeof(T);     // V's buffer after K's
      static_assert(kCols % 64 == 0 && kRowsPerWarp <= 32 && kRowsPerWarp % 8 == 0,
                    "producer mapping: each warp's first row starts a swizzle period");
      const int pwarp = sm90::warp_uniform(tid / 32), plane = tid & 31;
      const int sub = plane / 8, chunk = plane % 8;
      // Block b's chunk of this lane holds data (the chunks past head_dim are not copied).
      auto chunk_in = [&](int b) { return kChunks == kColChunks || b * 8 + chunk < kChunks; };
      uint32_t dst_base[kPeriod];
#pragma unroll
      for (int j = 0; j < kPeriod; ++j) {
        dst_base[j] = sizeof(T) * sw128_offset<kTile>(pwarp * kRowsPerWarp + j * kRowsPerIter + sub, chunk);
      }
      const char* k_lane = reinterpret_cast<const char*>(k) + chunk * 16;
      const char* v_lane = reinterpret_cast<const char*>(v) + chunk * 16;
      const int64_t head_offset = static_cast<int64_t>(w.kv_head) * p.kv_head_stride;
      for (int t = 0; t < num_tiles; ++t, ++it) {
        const int stage = static_cast<int>(it % kStages);
        const int key0 = w.kv_begin + t * kTile;
        T* s_k = s_kv + stage * (2 * kTile * kCols);
        T* s_v = s_k + kTile * kCols;
        if (kTma && key0 + kTile <= kv_stop && key0 % kTile == 0) {
          // A whole tile in one page (or ragged rows), or in whole pages of key_boxes to a tile:
          // lanes of warp 0 issue one TMA box each (64 columns x kTile / key_boxes keys), first
          // K's boxes, then, once V's buffer is free, V's; lane 0 announces the bytes, the others
          // arrive.
          const int key_boxes = tma.key_boxes;
          const int box_keys = kTile / key_boxes;
          const int block = plane % kBlocks, box = plane / kBlocks;
          uint32_t page = 0, slot = 0;
          int id = 0;
          if (tma.paged != 0 && box < key_boxes) {
            p.page.divmod(static_cast<uint32_t>(key0 + box * box_keys), page, slot);
            id = __ldg(p.page_indices + w.page_begin + page);
          }
          for (int kv = 0; kv < 2; ++kv) {
            uint64_t* full = kv == 0 ? &full_k[stage] : &full_v[stage];
            sm90::mbar_wait(kv == 0 ? &empty_k[stage] : &empty_v[stage], ((it / kStages) & 1) ^ 1);
            if (pwarp == 0) {
              sm90::fence_proxy_async_smem();  // earlier generic (cp.async) writes of this buffer
              if (plane == 0) sm90::mbar_arrive_expect_tx(full, kTile * kCols * sizeof(T));
              else sm90::mbar_arrive(full);
              __syncwarp();
              if (box < key_boxes) {
                T* dst = (kv == 0 ? s_k : s_v) + block * (kTile * 64) + box * (box_keys * 64);
                const CUtensorMap* map = kv == 0 ? &tma.k : &tma.v;
                if (tma.paged == 2) {
                  sm90::tma_load_3d(dst, map, full, block * 64, static_cast<int>(slot), id);
                } else if (tma.paged != 0) {
                  const int c1 = tma.token_dim == 1 ? static_cast<int>(slot) : w.kv_head;
                  const int c2 = tma.token_dim == 1 ? w.kv_head : static_cast<int>(slot);
                  sm90::tma_load_4d(dst, map, full, block * 64, c1, c2, id);
                } else {
                  sm90::tma_load_3d(dst, map, full, block * 64, w.kv_head, w.page_begin + key0);
                }
              }
              __syncwarp();
            } else {
              sm90::mbar_arrive(full);
            }
          }
          continue;
        }
        int64_t my_offset = -1;  // bytes; -1: past the keys of this item (zero-filled)
        {
          const int key = key0 + pwarp * kRowsPerWarp + plane;
          if (plane < kRowsPerWarp && key < kv_stop) {
            uint32_t page, slot;
            p.page.divmod(static_cast<uint32_t>(key), page, slot);
            const int64_t id = p.page_indices ? __ldg(p.page_indices + w.page_begin + page) : w.page_begin + page;
            my_offset = (id * p.kv_page_stride + static_cast<int64_t>(slot) * p.kv_token_stride + head_offset) *
                        static_cast<int64_t>(sizeof(T));
          }
        }
        // A tile wholly inside the item's keys (all but its last) copies without the zero-fill
        // predicate; its shared addresses are the stage's base plus the thread's constants.
        const bool whole = key0 + kTile <= kv_stop;
        const uint32_t s_k_addr = prims::smem_addr(s_k);
        auto copy_rows = [&](bool with_k, bool with_v) {  // this thread's 16-byte chunks of the tile
          if (whole) {
#pragma unroll
            for (int i = 0; i < kIters; ++i) {
              const int64_t offset = __shfl_sync(0xffffffffu, my_offset, i * kRowsPerIter + sub);
              const uint32_t dst = s_k_addr + dst_base[i % kPeriod] + (i / kPeriod) * kPeriodBytes;
              const char* k_row = k_lane + offset;
              const char* v_row = v_lane + offset;
#pragma unroll
              for (int b = 0; b < kBlocks; ++b) {
                if (!chunk_in(b)) continue;
                if (with_k) prims::cp_async_16_at(dst + b * kBlockBytes, k_row + b * 128);
                if (with_v) prims::cp_async_16_at(dst + kVBytes + b * kBlockBytes, v_row + b * 128);
              }
            }
            return;
          }
#pragma unroll
          for (int i = 0; i < kIters; ++i) {
            const int rr = i * kRowsPerIter + sub;
            const int64_t offset = __shfl_sync(0xffffffffu, my_offset, rr);
            const int r = pwarp * kRowsPerWarp + rr;
            const bool valid = offset >= 0;
            const int64_t src = valid ? offset : 0;
#pragma unroll
            for (int b = 0; b < kBlocks; ++b) {
              if (!chunk_in(b)) continue;
              const int c = b * 8 + chunk;
              if (with_k) prims::cp_async_16(s_k + sw128_offset<kTile>(r, c), k_lane + src + b * 128, valid);
              if (with_v) prims::cp_async_16(s_v + sw128_offset<kTile>(r, c), v_lane + src + b * 128, valid);
            }
          }
        };
        const uint32_t parity = ((it / kStages) & 1) ^ 1;
        if constexpr (kStages < 3) {
          // Two stages: K's rows as soon as K's buffer is free, V's once V's is, so that K has a
          // tile of lookahead. Each arrival covers this thread's copies so far.
          sm90::mbar_wait(&empty_k[stage], parity);
          copy_rows(true, false);
          sm90::mbar_arrive_on_cp_async(&full_k[stage]);
          sm90::mbar_wait(&empty_v[stage], parity);
          copy_rows(false, true);
        } else {
          // Three stages: K and V rows together once the whole stage is free (K ahead of V made
          // page-16 gathers 10-20% slower: docs/perf-notes.md, item 16).
          sm90::mbar_wait(&empty_k[stage], parity);
          sm90::mbar_wait(&empty_v[stage], parity);
          copy_rows(true, true);
          sm90::mbar_arrive_on_cp_async(&full_k[stage]);
        }
        sm90::mbar_arrive_on_cp_async(&full_v[stage]);
      }
      // The next item, claimed once this one's loads are issued (the producer runs stages ahead of
      // the consumers, so the atomic's latency is hidden), for every producer warp (named barrier
      // 4: the producer warpgroup only).
      const int slot = 1 + static_cast<int>(items_done & 1);
      if (tid == 0) s_item[slot] = atomicAdd(p.item_counters, 1) + static_cast<int>(gridDim.x);
      __syncwarp();
      sm90::named_barrier_sync(4, 128);
      item = sm90::warp_uniform(s_item[slot]);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // ---- consumers ------------------------------------------------------------------------------
  sm90::setmaxnreg_inc<Cfg::kConsumerRegs>();
  // Ping-pong: the consumer warpgroups take turns, in a ring (named barriers 2, 3 and, with three
  // consumers, 6). Each warpgroup passes its own barrier, does its turn's work, then opens the
  // next one's; the last consumer opens consumer 0's first turn. The turn's work is either the
  // issue of a tile's GEMMs, so that the others' softmax runs while one's GEMMs hold the tensor
  // cores, or (kExpTurns) a tile's exponentials and row sums, so that one warpgroup at a time
  // holds the MUFU lanes (16 an SM: at hd64 a tile's 64 x 128 exponentials take as long as its
  // two GEMMs) while the other's GEMMs, issued whenever their operands are ready, run. Only with
  // two consumers at hd64: with three (prefill_sm90_wide) and at hd128 the exponentials' turns
  // lost (perf-notes item 291).
  constexpr bool kExpTurns = HeadDim == 64 && Cfg::kConsumers == 2;
  constexpr bool kTmaStoreO = HeadDim == 64;  // O by a TMA store where the item allows (epilogue)
  // The consumers' O tiles (kTmaStoreO): after the barriers, aligned up to 1024 bytes.
  const uint32_t o_stage =
      (prims::smem_addr(reinterpret_cast<unsigned char*>(full_k) + Shape::kBarrierBytes) + 1023u) & ~1023u;
  constexpr uint32_t kTurnThreads = 256;
  constexpr int kConsumers = Cfg::kConsumers;  // two or three (Sm90Shape)
  const int cw = wg - 1;
  const int my_turn = kConsumers == 2 || cw < 2 ? 2 + cw : 6;
  const int next_turn = kConsumers == 2 ? 3 - cw : (cw == 0 ? 3 : cw == 1 ? 6 : 2);
  if (cw == kConsumers - 1) sm90::named_barrier_arrive(2, kTurnThreads);
  const int lane = tid & 31;
  const int warp = (tid / 32) & 3;  // warp within the consumer warpgroup
  const int wg_row0 = kSplitKeys ? 0 : cw * 64;  // this warpgroup's first row in the CTA tile
  const int key_off = kSplitKeys ? cw * kSTile : 0;  // its first key in each tile
  uint32_t it = 0;
  for (uint32_t items_done = 0;; ++items_done) {
    __syncwarp();  // the epilogue's row guard may have split the warp
    sm90::mbar_wait(q_full, items_done & 1);  // this item's Q has landed; s_item[0] names it
    const int item = sm90::warp_uniform(s_item[0]);
    if (item >= num_work) break;
    const WorkItem w = kItemInSmem ? *s_work : p.work[item];
    const ItemKeys keys = item_keys(w, p, kCtaRows, kTile);
    const int rows = keys.rows;
    const int num_tiles = sm90::warp_uniform(keys.num_tiles);
    const int all_rows_see = keys.all_rows_see;
    // The tiles this warpgroup multiplies. In a causal item its 64 rows end before the item's
    // last rows, so the item's last tiles may lie wholly past every key they see (MHA at hd256's
    // 64-key tiles: consumer 0's last tile of every item whose rows end at the keys' end). Those
    // tiles get no GEMM and no softmax (which would add P = 0); the loop below still waits for
    // them and releases them, and takes their turns. At least one tile where the item has any: a
    // warpgroup that sees no key of the chunk runs its first tile, masked, as before.
    int my_tiles = num_tiles;
    if constexpr (kSkipMaskedTiles) {
      if (p.causal && num_tiles > 1) {
        const int wg_stop = keys.row_limit(w, p, min(w.row_begin + wg_row0 + 63, rows - 1));
        my_tiles = sm90::warp_uniform(min(num_tiles, max(1, (wg_stop - w.kv_begin + kTile - 1) / kTile)));
      }
    }
    int row_limit[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) row_limit[i] = keys.row_limit(w, p, w.row_begin + wg_row0 + warp * 16 + (lane >> 2) + i * 8);

    float o_acc[kOCols / 2];
#pragma unroll
    for (int j = 0; j < kOCols / 2; ++j) o_acc[j] = 0.f;
    float m[2] = {prims::kNegInf, prims::kNegInf};
    float d[2] = {0.f, 0.f};

    sm90::fence_proxy_async_smem();
    const T* q_wg = s_q + wg_row0 * 64;
    // After this warp's last S GEMM has completed, Q may be overwritten with the next item's, and
    // s_item[0] / s_work too. Every lane arrives: an arrival releases only its own thread's
    // earlier reads of s_item / s_work (racecheck flagged lane 0 alone, even after a __syncwarp,
    // once CTAs took several items: perf-notes item 69).
    auto release_q = [&]() {
      sm90::mbar_arrive(q_empty);
      __syncwarp();
    };
    if (num_tiles == 0) release_q();

    // S = Q K^T (64 rows x kSTile keys from key_off) into s: K-major operands, k-steps of 16
    // columns. Descriptors: a base per operand plus the constant byte offset of each k-step (>> 4);
    // key_off's rows start 1024-byte aligned in every 64-column block, as the swizzle needs.
    const sm90::SmemDesc q_desc = sm90::smem_desc_sw128(q_wg, 16);
    auto issue_s = [&](float (&s)[kSTile / 2], const T* s_k) {
      const sm90::SmemDesc k_desc = sm90::smem_desc_sw128(s_k + key_off * 64, 16);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HeadDim / 16; ++kk) {
        constexpr int kQBlock = kCtaRows * 64 / 8, kKBlock = kTile * 64 / 8;  // 16-byte units
        sm90::Wgmma<T, kSTile>::ss(s, q_desc.at((kk >> 2) * kQBlock + (kk & 3) * 2),
                                   k_desc.at((kk >> 2) * kKBlock + (kk & 3) * 2), kk > 0 ? 1 : 0);
      }
      sm90::wgmma_commit();
    };
    // Keeps O's reads and writes on their side of a wgmma fence or wait.
    auto fence_o = [&]() {
#pragma unroll
      for (int j = 0; j < kOCols / 2; ++j) sm90::fence_operand(o_acc[j]);
    };
    // O += P V: P as the register A operand (16 keys per step), V read MN-major.
    auto issue_pv = [&](uint32_t (&pa)[kSTile / 16][4], const T* s_v) {
      const sm90::SmemDesc v_desc = sm90::smem_desc_sw128(s_v, kTile * 128) + (key_off / 16) * 128;
      fence_o();
      sm90::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kSTile / 16; ++ks) sm90::Wgmma<T, kOCols>::rs_tb(o_acc, pa[ks], v_desc.at(ks * 128), 1);
      sm90::wgmma_commit();
    };
    // Online softmax of tile t in place (s becomes P in fp32); scale[i] is the factor O's row i
    // must take before P V of this tile is added. Touches neither o_acc nor a P register in flight.
    constexpr float kRescaleSlack = 8.f;
    auto softmax = [&](float (&s)[kSTile / 2], int t, float (&scale)[2]) {
      if (w.kv_begin + (t + 1) * kTile > all_rows_see) {  // a tile that some row must not see
        const int key0 = w.kv_begin + t * kTile + key_off + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < kSTile / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (key0 + 8 * j + (e & 1) >= row_limit[e >> 1]) s[4 * j + e] = prims::kNegInf;
      }
      // The scale (> 0) is folded into the exponent: exp2(s * scale - max(s) * scale) in one FFMA.
      const float sc = p.sm_scale_log2;
      float raws[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float raw = prims::kNegInf;
#pragma unroll
        for (int j = 0; j < kSTile / 8; ++j) raw = fmaxf(raw, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
        raw = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 1));
        raws[i] = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 2));
      }
      if constexpr (kExpTurns) sm90::named_barrier_sync(my_turn, kTurnThreads);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float raw = raws[i];
        // The row's max moves only when this tile's exceeds it by more than kRescaleSlack (log2
        // units): otherwise P stays <= 2^kRescaleSlack (exact to bf16 / fp16 rounding, summed in
        // fp32) and O needs no rescale (scale 1: the warpgroup skips the FMULs when every row's
        // is). A row that has seen no key (m = -inf) has O = 0 and d = 0: it takes the tile's
        // max without a rescale.
        const float mx = fmaxf(m[i], raw * sc);
        const bool grow = mx > m[i] + kRescaleSlack;
        scale[i] = grow && m[i] != prims::kNegInf ? exp2f(m[i] - mx) : 1.f;
        if (grow) m[i] = mx;
        const float mu = prims::safe_max(m[i]);
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kSTile / 8; ++j) {
          const float e0 = prims::fast_exp2(fmaf(s[4 * j + 2 * i], sc, -mu));
          const float e1 = prims::fast_exp2(fmaf(s[4 * j + 2 * i + 1], sc, -mu));
          s[4 * j + 2 * i] = e0;
          s[4 * j + 2 * i + 1] = e1;
          sum += e0 + e1;
        }
        d[i] = d[i] * scale[i] + sum;
      }
      if constexpr (kExpTurns)  // after the exponentials, which the row sums wait for
        sm90::named_barrier_arrive_after(next_turn, kTurnThreads, __float_as_uint(d[0]) | __float_as_uint(d[1]));
    };
    auto pack_p = [&](const float (&s)[kSTile / 2], uint32_t (&pa)[kSTile / 16][4]) {
#pragma unroll
      for (int ks = 0; ks < kSTile / 16; ++ks) {
        pa[ks][0] = prims::pack2<T>(s[8 * ks + 0], s[8 * ks + 1]);
        pa[ks][1] = prims::pack2<T>(s[8 * ks + 2], s[8 * ks + 3]);
        pa[ks][2] = prims::pack2<T>(s[8 * ks + 4], s[8 * ks + 5]);
        pa[ks][3] = prims::pack2<T>(s[8 * ks + 6], s[8 * ks + 7]);
      }
    };
    auto rescale_o = [&](const float (&scale)[2]) {  // O's rows by the softmax's factors
#pragma unroll
      for (int j = 0; j < kOCols / 8; ++j) {
        o_acc[4 * j] *= scale[0];
        o_acc[4 * j + 1] *= scale[0];
        o_acc[4 * j + 2] *= scale[1];
        o_acc[4 * j + 3] *= scale[1];
      }
    };
    // The wait for P V after the softmax (below) at hd > 64: +1-4% on hd128's long rows; at hd64
    // (prefill_sm90_wide's three consumers) it measured 0.95-0.98x (perf-notes item 140). 80, 96
    // and 112 run in hd128's tiles and take its choice (not measured there).
    constexpr bool kWaitAfterSoftmax = HeadDim > 64;
    // Waits until tile `tile`'s K (kv = 0) or V (kv = 1) has landed; returns the stage's K tile (V
    // follows it).
    auto wait_tile = [&](uint32_t tile, int kv) {
      const int stage = static_cast<int>(tile % kStages);
      sm90::mbar_wait(kv == 0 ? &full_k[stage] : &full_v[stage], (tile / kStages) & 1);
      sm90::fence_proxy_async_smem();
      return s_kv + stage * (2 * kTile * kCols);
    };
    auto release = [&](uint64_t* bars, uint32_t tile) {  // one lane per warp: tile's K or V is read
      if (lane == 0) sm90::mbar_arrive(&bars[tile % kStages]);
      __syncwarp();  // converged again before the next .aligned wgmma / barrier
    };

    // Intra-warpgroup pipelining: S of tile t is issued, then P V of tile t - 1; the softmax of
    // tile t runs while the tensor cores do that P V, and O is rescaled once it has completed.
    if (num_tiles > 0) {
      float s[kSTile / 2];
      uint32_t pa[kSTile / 16][4];
      float scale[2];
      const T* k_first = wait_tile(it, 0);
      if constexpr (!kExpTurns) sm90::named_barrier_sync(my_turn, kTurnThreads);
      issue_s(s, k_first);
      if constexpr (!kExpTurns) sm90::named_barrier_arrive(next_turn, kTurnThreads);
      sm90::wgmma_wait<0>();
      release(empty_k, it);
      if (my_tiles == 1) release_q();
#pragma unroll
      for (int j = 0; j < kSTile / 2; ++j) sm90::fence_operand(s[j]);
      softmax(s, 0, scale);
      pack_p(s, pa);
      for (int t = 1; t < my_tiles; ++t) {
        // Both tiles' addresses from `it` (uniform), not carried over from the last iteration: a
        // carried pointer left V's descriptors off the uniform datapath (perf-notes item 133).
        const T* k_cur = wait_tile(it + 1, 0);
        const T* v_prev = wait_tile(it, 1) + kTile * kCols;
        if constexpr (!kExpTurns) sm90::named_barrier_sync(my_turn, kTurnThreads);
        issue_s(s, k_cur);
        issue_pv(pa, v_prev);
        if constexpr (!kExpTurns) sm90::named_barrier_arrive(next_turn, kTurnThreads);
        sm90::wgmma_wait<1>();  // S of tile t is done; P V of tile t - 1 may still run
        release(empty_k, it + 1);
        if (t == my_tiles - 1) release_q();
#pragma unroll
        for (int j = 0; j < kSTile / 2; ++j) sm90::fence_operand(s[j]);
        softmax(s, t, scale);
        if constexpr (kWaitAfterSoftmax) {
          // The wait for P V of tile t - 1 must follow the softmax: ptxas issues a wgmma wait
          // first in its basic block, which put the whole softmax behind P V (perf-notes item
          // 140). So the wait opens the arms of a branch that ends the softmax's block, taken by
          // the whole warpgroup (named barrier 8 + cw) where some row's max moved (rarely, with
          // kRescaleSlack, perf-notes item 142): O is rescaled only then (x * 1 == x: the same
          // bits as an unconditional rescale).
          if (sm90::named_barrier_any(8 + cw, 128, scale[0] != 1.f || scale[1] != 1.f)) {
            sm90::wgmma_wait<0>();
            fence_o();
            rescale_o(scale);
          } else {
            sm90::wgmma_wait_alt<0>();
            fence_o();
          }
          release(empty_v, it);  // tile t - 1 fully read
        } else {
          sm90::wgmma_wait<0>();
          fence_o();
          release(empty_v, it);
          rescale_o(scale);
        }
        ++it;
        pack_p(s, pa);
      }
      const T* v_last = wait_tile(it, 1) + kTile * kCols;
      if constexpr (!kExpTurns) sm90::named_barrier_sync(my_turn, kTurnThreads);
      issue_pv(pa, v_last);
      if constexpr (!kExpTurns) sm90::named_barrier_arrive(next_turn, kTurnThreads);
      sm90::wgmma_wait<0>();
      fence_o();
      release(empty_v, it);
      ++it;
      // Tiles past this warpgroup's keys (my_tiles above): each stage is released only once its
      // copies have landed (an arrival before the producer refilled the stage would count toward
      // its previous use), and each turn is still taken: the ring pairs the consumers' turns one
      // to one, num_tiles + 1 an item each (num_tiles with kExpTurns: one a softmax).
#pragma unroll 1
      for (int t = my_tiles; t < num_tiles; ++t, ++it) {
        wait_tile(it, 0);
        wait_tile(it, 1);
        release(empty_k, it);
        release(empty_v, it);
        sm90::named_barrier_sync(my_turn, kTurnThreads);
        sm90::named_barrier_arrive(next_turn, kTurnThreads);
      }
    }

    // kSplitKeys: consumer 1 hands its state (m, d, then O in two halves) to consumer 0 through
    // Q's rows 64..127: in each 64-column block of Q their 8 KB, 16 floats a consumer thread,
    // thread-major so that a warp's 32 floats fill the 32 banks. The threads of one warp and lane
    // in the two warpgroups hold the same rows and columns; d is still per thread (the quad sums
    // it below), m per row. Consumer 0 merges and writes; consumer 1 goes on to the next item.
    if constexpr (kSplitKeys) {
      const int x = tid % 128;
      auto slot = [&](int j) -> float& {  // j < kOCols / 4
        constexpr int kBlockBytes = kCtaRows * 64 * static_cast<int>(sizeof(T));
        float* upper = reinterpret_cast<float*>(smem + (j / 16) * kBlockBytes + kBlockBytes / 2);
        return upper[(j % 16) * 128 + x];
      };
      auto handover = [&]() { sm90::named_barrier_sync(5, 256); };  // both consumer warpgroups
      float f0[2] = {0.f, 0.f}, f1[2] = {0.f, 0.f};  // consumer 0: factors of its state and of 1's
      if (cw == 1) {
        slot(0) = m[0];
        slot(1) = m[1];
        slot(2) = d[0];
        slot(3) = d[1];
      }
      handover();
      if (cw == 0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float m1 = slot(i), d1 = slot(2 + i);
          const float mx = fmaxf(m[i], m1);
          f0[i] = prims::rescale_factor(m[i], mx);
          f1[i] = prims::rescale_factor(m1, mx);
          m[i] = mx;
          d[i] = d[i] * f0[i] + d1 * f1[i];
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        constexpr int kHalf = kOCols / 4;
        handover();  // consumer 0 has read the previous hand-over
        if (cw == 1) {
#pragma unroll
          for (int j = 0; j < kHalf; ++j) slot(j) = o_acc[half * kHalf + j];
        }
        handover();
        if (cw == 0) {
#pragma unroll
          for (int j = 0; j < kHalf; ++j) {
            const int i = (j >> 1) & 1;  // the accumulator's row (kHalf is a multiple of 4)
            o_acc[half * kHalf + j] = o_acc[half * kHalf + j] * f0[i] + slot(j) * f1[i];
          }
        }
      }
      handover();  // consumer 1 may write the next item's state
      if (cw == 1) continue;
    }

    // Epilogue: normalise and write this thread's two rows. At hd <= 128 straight from the
    // accumulators: the quad's four lanes swap words (prims::quad_transpose) so that each lane
    // stores 16 contiguous bytes of its row: a quarter of the store instructions of 4-byte
    // pieces, each touching as many cache lines (non-causal 16 x 1K +4-9%: perf-notes item 46).
    // The shuffles need the whole warp, so only the stores are guarded. At hd256 through shared
    // memory (below) in items of at most Shape::kStagedOMaxKeys keys, longer items' rows 4 bytes a
    // lane straight from the accumulators. Split rows (fp32 partials) go straight out at every
    // head dim.
    float dsum[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float dd = d[i];
      dd += __shfl_xor_sync(0xffffffffu, dd, 1);
      dd += __shfl_xor_sync(0xffffffffu, dd, 2);
      dsum[i] = dd;
    }
    // Row i (of two) of this thread's accumulator: a packed row of the item.
    auto thread_row = [&](int i) { return w.row_begin + wg_row0 + warp * 16 + (lane >> 2) + i * 8; };
    // A split item's row i of this thread (packed row ra): fp32 partial O, normalised by inv.
    auto store_partial_row = [&](int ra, int i, float inv) {
      float* dst = p.partial_o + (static_cast<int64_t>(w.partial_base) + ra) * HeadDim + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < HeadDim / 8; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o_acc[4 * j + 2 * i] * inv, o_acc[4 * j + 2 * i + 1] * inv);
    };
    const float inv[2] = {prims::inv_row_sum(dsum[0]), prims::inv_row_sum(dsum[1])};  // O's row factors
    // hd64: where the warpgroup's 64 rows are whole (the request has them all) and the O map exists
    // (the group divides 64, O's strides fit TMA), O leaves by one TMA store of the warpgroup's 64 x
    // 64 tile: each warp stmatrix-es its 16 rows into the warpgroup's buffer in the map's 128-byte
    // swizzle, then one thread issues the store (cuDNN's epilogue, perf-notes item 302: our quad
    // transpose and per-row stores were about one tile's time an item). The buffer is reused one item
    // later, once that thread has seen the last store read it. Named barrier 11 + cw: this warpgroup.
    bool o_by_tma = false;
    if constexpr (kTmaStoreO) {
      o_by_tma = tma.o_group > 0 && w.partial_base < 0 && w.row_begin + wg_row0 + 64 <= rows;
      if (o_by_tma) {
        const uint32_t s_buf = o_stage + static_cast<uint32_t>(cw) * (64 * 64 * sizeof(T));
        if (tid % 128 == 0) sm90::bulk_wait_read<0>();  // the last item's store has read the buffer
        sm90::named_barrier_sync(11 + cw, 128);
        // Lane l addresses row l % 8 of matrix l / 8: accumulator row half (l / 8) % 2 of 8-column
        // block j + l / 16, at its place in the map's 128-byte swizzle (sw128_offset, as the K/V tiles).
        // From an opaque copy of the thread's index (an empty asm), as at hd256: from warp and lane
        // themselves ptxas kept the four stmatrix addresses live across the tile loop (the 192-row
        // kernel spilled them).
        uint32_t x = tid % 128;
        sm90::fence_operand(x);
        const uint32_t r = x / 32 * 16 + ((x >> 3) & 1) * 8 + (x & 7), jb = (x >> 4) & 1;
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
          uint32_t frag[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int jj = j + (k >> 1), i = k & 1;
            frag[k] = prims::pack2<T>(o_acc[4 * jj + 2 * i] * inv[i], o_acc[4 * jj + 2 * i + 1] * inv[i]);
          }
          sm90::stmatrix_x4(s_buf + sizeof(T) * sw128_offset<64>(r, j + jb), frag);
        }
        sm90::fence_proxy_async_smem();  // the generic-proxy writes, before the TMA engine reads them
        sm90::named_barrier_sync(11 + cw, 128);
        if (tid % 128 == 0) {
          uint32_t tok0, g0;  // g0 = 0: the rows start at a multiple of 64, which the group divides
          p.group.divmod(w.row_begin + wg_row0, tok0, g0);
          sm90::tma_store_3d(&tma.o, s_buf, 0, w.kv_head * group, static_cast<int>(w.qo_begin + tok0));
          sm90::bulk_commit();
        }
      }
    }
    // hd256: this item's O through shared memory (below). The same for the whole CTA (from the
    // item alone), so each warpgroup's named barriers there see all of its threads.
    const bool staged_o =
        HeadDim > 128 && w.partial_base < 0 && w.kv_end - w.kv_begin <= Shape::kStagedOMaxKeys;
    if constexpr (HeadDim > 128) {
      // hd256: O's rows through this warpgroup's 64 x 128 buffer, 128 columns at a time (16-byte
      // chunks XOR-swizzled by row: conflict-free both ways), then each warp stores two rows'
      // 256 contiguous bytes a pass, 16 bytes a lane (the 4-byte stores from the accumulators
      // touched eight rows' lines an instruction; the quad transpose of hd <= 128 spills here).
      // Named barrier 11 + cw: this warpgroup alone.
      if (staged_o) {
        constexpr int kStageCols = Shape::kOutStageCols;  // not the kernel's kCols (a tile row)
        const uint32_t s_out = prims::smem_addr(reinterpret_cast<unsigned char*>(full_k) + Shape::kBarrierBytes) +
                               cw * 64 * kStageCols * static_cast<uint32_t>(sizeof(T));  // this warpgroup's buffer
        // Byte offsets in the buffer: row r at r * 2 * kStageCols, its 16-byte chunk c at
        // (c ^ (r & 7)) * 16, i.e. the row's chunk 0 offset XORed with c * 16. They come from an
        // opaque copy of the thread's index (an empty asm), so that they are computed here: from
        // the thread's index itself the compiler hoisted all 32 store addresses out of the item
        // loop, live across the tile loop (48 bytes spilled; 144 once the direct stores of long
        // items were beside them).
        static_assert((kStageCols / 8 & (kStageCols / 8 - 1)) == 0, "a power of two of chunks a row (the XOR)");
        uint32_t x = tid % 128;  // warp * 32 + lane
        sm90::fence_operand(x);
        // This thread's accumulator rows: r0 = warp * 16 + lane / 4 and r0 + 8 (the same swizzle).
        const uint32_t r0 = x / 32 * 16 + x % 32 / 4;
        const uint32_t st_off = r0 * (2 * kStageCols) + ((r0 & 7) << 4) + 4 * (x % 4);
        // The read-back: chunk x % 16 of rows x / 16 + 8 k (one swizzle for all k).
        const uint32_t ld_row = x / (kStageCols / 8), chunk = x % (kStageCols / 8);
        const uint32_t ld_off = ld_row * (2 * kStageCols) + ((chunk ^ (ld_row & 7)) << 4);
#pragma unroll
        for (int part = 0; part < HeadDim / kStageCols; ++part) {
          __syncwarp();
          sm90::named_barrier_sync(11 + cw, 128);  // the buffer's last contents are read
#pragma unroll
          for (int j = 0; j < kStageCols / 8; ++j) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int jj = part * (kStageCols / 8) + j;  // the accumulator's 8-column block
              prims::st_shared_32(s_out + ((st_off ^ (j << 4)) + i * 8 * (2 * kStageCols)),
                                  prims::pack2<T>(o_acc[4 * jj + 2 * i] * inv[i], o_acc[4 * jj + 2 * i + 1] * inv[i]));
            }
          }
          sm90::named_barrier_sync(11 + cw, 128);  // written
          static_assert((64 * kStageCols / 8) % 128 == 0, "whole 16-byte chunks of the 64-row buffer a thread");
#pragma unroll 1
          for (int k = 0; k < 64 * kStageCols / 8 / 128; ++k) {  // the buffer's 16-byte chunks, 8 a thread
            const int row = static_cast<int>(ld_row) + k * (128 / (kStageCols / 8));
            const int ra = w.row_begin + wg_row0 + row;
            if (ra < rows) {
              uint32_t tok, g;
              p.group.divmod(ra, tok, g);
              T* dst = static_cast<T*>(p.o) + (w.qo_begin + static_cast<int64_t>(tok)) * p.o_stride_n +
                       (w.kv_head * group + static_cast<int>(g)) * p.o_stride_h + part * kStageCols + chunk * 8;
              const uint4 v = prims::ld_shared_16(s_out + ld_off + k * (128 / (kStageCols / 8)) * (2 * kStageCols));
              prims::st_global_16(dst, v.x, v.y, v.z, v.w);
            }
          }
        }
        __syncwarp();
      } else if (w.partial_base >= 0) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
          if (thread_row(i) < rows) store_partial_row(thread_row(i), i, inv[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int ra = thread_row(i);
      const bool row_ok = ra < rows;
      const float lse2 = prims::row_lse2(m[i], dsum[i]);
      uint32_t tok, g;
      p.group.divmod(ra, tok, g);
      if (w.partial_base < 0) {
        const int64_t token = w.qo_begin + static_cast<int64_t>(tok);
        const int head = w.kv_head * group + g;
        T* dst = static_cast<T*>(p.o) + token * p.o_stride_n + head * p.o_stride_h;  // the row
        if (o_by_tma) {
          // stored above
        } else if constexpr (HeadDim <= 128) {
#pragma unroll
          for (int j4 = 0; j4 < HeadDim / 32; ++j4) {  // 8-column blocks 4 j4 .. 4 j4 + 3; this lane's: 4 j4 + lane % 4
            uint32_t word[4];
#pragma unroll
            for (int b = 0; b < 4; ++b)
              word[b] = prims::pack2<T>(o_acc[4 * (4 * j4 + b) + 2 * i] * inv[i], o_acc[4 * (4 * j4 + b) + 2 * i + 1] * inv[i]);
            prims::quad_transpose(word, lane);
            if (row_ok) prims::st_global_16(dst + 32 * j4 + 8 * (lane & 3), word[0], word[1], word[2], word[3]);
          }
          // hd80 and hd112 end in two 8-column blocks past the last whole 32 columns: 4 bytes a lane.
#pragma unroll
          for (int j = HeadDim / 32 * 4; j < HeadDim / 8; ++j)
            if (row_ok)
              *reinterpret_cast<uint32_t*>(dst + 8 * j + 2 * (lane & 3)) =
                  prims::pack2<T>(o_acc[4 * j + 2 * i] * inv[i], o_acc[4 * j + 2 * i + 1] * inv[i]);
        } else if (row_ok && !staged_o) {  // hd256 past kStagedOMaxKeys keys (staged_o: stored
          // above); 4-byte pieces: the shuffled words beside O's 128 registers spilled 108 bytes
#pragma unroll
          for (int j = 0; j < HeadDim / 8; ++j)
            *reinterpret_cast<uint32_t*>(dst + 8 * j + 2 * (lane & 3)) =
                prims::pack2<T>(o_acc[4 * j + 2 * i] * inv[i], o_acc[4 * j + 2 * i + 1] * inv[i]);
        }
        if (row_ok && p.lse != nullptr && (lane & 3) == 0) p.lse[token * p.num_qo_heads + head] = lse2 * prims::kLn2;
      } else if (row_ok) {
        if constexpr (HeadDim <= 128) store_partial_row(ra, i, inv[i]);  // hd > 128: stored above
        if ((lane & 3) == 0) p.partial_lse[static_cast<int64_t>(w.partial_base) + ra] = lse2;
      }
    }
  }
  if constexpr (kTmaStoreO)
    if (tid % 128 == 0) sm90::bulk_wait_read<0>();  // the CTA's shared memory outlives the last store's reads
#else
  __trap();  // compiled for an architecture without wgmma; select_kernel never picks it there
#endif
#endif
}

template <typename T, int HeadDim, Family F>
struct Sm90Prefill {
  using Shape = AttnShape<F, HeadDim>;
  static constexpr int kTile = AttnConfig<F, HeadDim>::kKVTile;

  // The TMA maps of this run's K/V pools, or enabled = 0 (cp.async for every tile) when the
  // layout does not fit: page sizes that are not a multiple of the tile, except hd256's pages of
  // 32 keys (one box a page, items 30 and 41), strides out of order, no encoder, or
  // GQATTN_DISABLE_TMA set. One box a page lost to the gathers at hd128 (sessions 2 and 7; decode
  // items, item 71) and, since the gathers copy whole 128-byte lines (item 113), at hd256 pages of
  // 8 and 16 keys (1.06-1.52x, item 115).
  static Sm90Tma make_tma(const AttentionParams& p) {
    Sm90Tma t = make_kv_tma(p);
    if constexpr (HeadDim == 64) add_o_map(p, t);
    return t;
  }

  // hd64's O map for the epilogue's TMA store (o_group > 0): O as {hd, head, token} with a box of
  // one item's 64 packed rows, {64, group, 64 / group}; only where the group divides 64 (a
  // warpgroup's rows start at a multiple of 64, so they are whole tokens), O is 16-byte aligned
  // and its head and token strides are multiples of 16 bytes, head before token. Its extent is O's
  // own (o_tokens), so a box past O's end would be clipped; the kernel stores only boxes of rows
  // its request has.
  static void add_o_map(const AttentionParams& p, Sm90Tma& t) {
    static const bool disabled = env_flag("GQATTN_DISABLE_TMA") || env_flag("GQATTN_DISABLE_TMA_STORE_O");
    const PFN_cuTensorMapEncodeTiled_v12000 encode = prims::tensor_map_encoder();
    const uint32_t group = p.group.divisor;
    const uint64_t es = sizeof(T);
    const uint64_t head_stride = static_cast<uint64_t>(p.o_stride_h) * es, token_stride = static_cast<uint64_t>(p.o_stride_n) * es;
    if (disabled || encode == nullptr || p.o == nullptr || p.num_qo_heads <= 0 || p.o_tokens <= 0 ||
        p.o_tokens > 0x7fffffff || group == 0 || 64 % group != 0 ||
        reinterpret_cast<uintptr_t>(p.o) % 16 != 0 || head_stride % 16 != 0 || token_stride % 16 != 0 ||
        head_stride < HeadDim * es || token_stride < head_stride * static_cast<uint64_t>(p.num_qo_heads) ||
        token_stride >= (uint64_t(1) << 40))
      return;
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(HeadDim), static_cast<cuuint64_t>(p.num_qo_heads),
                                static_cast<cuuint64_t>(p.o_tokens)};
    const cuuint64_t strides[2] = {head_stride, token_stride};
    const cuuint32_t box[3] = {64, group, 64 / group};
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    const CUtensorMapDataType type =
        std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    if (encode(&t.o, type, 3, p.o, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS)
      t.o_group = static_cast<int>(group);
  }

  static Sm90Tma make_kv_tma(const AttentionParams& p) {
    Sm90Tma t;
    std::memset(&t, 0, sizeof(t));
    static const bool tma_disabled = env_flag("GQATTN_DISABLE_TMA");  // read once per process
    if (tma_disabled) return t;
    const PFN_cuTensorMapEncodeTiled_v12000 encode = prims::tensor_map_encoder();
    if (encode == nullptr || p.kv_rows <= 0 || p.num_kv_heads <= 0) return t;
    const bool paged = p.page_indices != nullptr;
    const int64_t page_size = paged ? static_cast<int64_t>(p.page.divisor) : 1;
    t.key_boxes = 1;
    if (paged && page_size % kTile != 0) {
      // Boxes of whole pages (hd256, 32 keys: two a 64-key tile): 8-row multiples keep the
      // 128-byte swizzle's 1024-byte period, and warp 0 issues (64-column blocks) x (pages a
      // tile) boxes, one a lane.
      const int64_t boxes = kTile / page_size;
      if (HeadDim < 256 || kTile % page_size != 0 || page_size < 32 || boxes * (HeadDim / 64) > 32) return t;
      t.key_boxes = static_cast<int>(boxes);
    }
    const int64_t rows = kTile / t.key_boxes;
    const uint64_t es = sizeof(T);
    const uint64_t head_stride = static_cast<uint64_t>(p.kv_head_stride) * es;
    const uint64_t key_stride = static_cast<uint64_t>(paged ? p.kv_token_stride : p.kv_page_stride) * es;
    cuuint64_t dims[4] = {static_cast<cuuint64_t>(HeadDim), 0, 0, 0};
    cuuint64_t strides[3] = {0, 0, 0};
    cuuint32_t box[4] = {64, 1, 1, 1};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    // With one K/V head its stride is irrelevant (ragged MQA has head_stride == key_stride).
    const bool head_first = head_stride < key_stride || p.num_kv_heads == 1;
    int rank = paged ? 4 : 3;
    if (paged && p.num_kv_heads == 1) {  // no head dimension: {hd, key in page, page}
      rank = 3;
      t.paged = 2;
      dims[1] = static_cast<cuuint64_t>(page_size);
      strides[0] = key_stride;
      box[1] = static_cast<cuuint32_t>(rows);
      dims[2] = static_cast<cuuint64_t>(p.kv_rows);
      strides[1] = static_cast<uint64_t>(p.kv_page_stride) * es;
    } else if (paged) {
      t.paged = 1;
      t.token_dim = head_first ? 2 : 1;
      dims[head_first ? 1 : 2] = static_cast<cuuint64_t>(p.num_kv_heads);
      strides[head_first ? 0 : 1] = head_stride;
      dims[t.token_dim] = static_cast<cuuint64_t>(page_size);
      strides[t.token_dim - 1] = key_stride;
      box[t.token_dim] = static_cast<cuuint32_t>(rows);
      dims[3] = static_cast<cuuint64_t>(p.kv_rows);
      strides[2] = static_cast<uint64_t>(p.kv_page_stride) * es;
    } else {
      if (!head_first) return t;
      dims[1] = static_cast<cuuint64_t>(p.num_kv_heads);
      strides[0] = head_stride;
      dims[2] = static_cast<cuuint64_t>(p.kv_rows);
      strides[1] = key_stride;
      box[2] = static_cast<cuuint32_t>(rows);
    }
    for (int i = 0; i < rank - 1; ++i)
      if (strides[i] % 16 != 0 || (i > 0 && strides[i] < strides[i - 1])) return t;
    // The encoder's limits (dims in [1, 2^32], strides < 2^40 bytes; a negative stride wraps past
    // them), checked here rather than trusted to the driver: a pool beyond them takes the gathers,
    // whose offsets are 64-bit. The kernel's coordinates (page ids, ragged token rows) come from
    // int32 tables, so they stay in TMA's int32 range.
    for (int i = 0; i < rank; ++i)
      if (dims[i] == 0 || dims[i] > (cuuint64_t(1) << 32)) return t;
    for (int i = 0; i < rank - 1; ++i)
      if (strides[i] >= (cuuint64_t(1) << 40)) return t;
    if (reinterpret_cast<uintptr_t>(p.k) % 16 != 0 || reinterpret_cast<uintptr_t>(p.v) % 16 != 0) return t;
    const CUtensorMapDataType type =
        sizeof(T) == 2 && std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    for (int which = 0; which < 2; ++which) {
      const CUresult r = encode(which == 0 ? &t.k : &t.v, type, rank, const_cast<void*>(which == 0 ? p.k : p.v), dims,
                                strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (r != CUDA_SUCCESS) return Sm90Tma{};
    }
    t.enabled = 1;
    return t;
  }

  // Split keys exist where a tile halves into 64-key halves between two consumers; the plan asks
  // for them only there (KernelChoice::split_keys).
  static constexpr bool kHasSplitKeys = AttnConfig<F, HeadDim>::kSplitKeys;

  template <bool kTma, bool kSplitKeys>
  static void launch_variant(const AttentionParams& params, const Sm90Tma& tma, int num_ctas, cudaStream_t s) {
    attention_sm90_kernel<T, HeadDim, F, kTma, kSplitKeys><<<num_ctas, Shape::kThreads, Shape::kSmemBytes, s>>>(params, tma);
  }

  static void launch(const AttentionParams& params, int num_ctas, void* stream) {
    ensure_smem_limit<attention_sm90_kernel<T, HeadDim, F, true, false>, Shape::kSmemBytes>();
    ensure_smem_limit<attention_sm90_kernel<T, HeadDim, F, false, false>, Shape::kSmemBytes>();
    if constexpr (kHasSplitKeys) {
      ensure_smem_limit<attention_sm90_kernel<T, HeadDim, F, true, true>, Shape::kSmemBytes>();
      ensure_smem_limit<attention_sm90_kernel<T, HeadDim, F, false, true>, Shape::kSmemBytes>();
    }
    if (num_ctas <= 0) return;
    GQ_CHECK(!params.split_item_keys || kHasSplitKeys, "split_item_keys: no 64-key halves at head_dim ", HeadDim);
    const Sm90Tma tma = make_tma(params);
    const auto s = static_cast<cudaStream_t>(stream);
    if constexpr (kHasSplitKeys) {
      if (params.split_item_keys) {
        if (tma.enabled) launch_variant<true, true>(params, tma, num_ctas, s);
        else launch_variant<false, true>(params, tma, num_ctas, s);
        GQ_CUDA_CHECK(cudaGetLastError());
        return;
      }
    }
    if (tma.enabled) launch_variant<true, false>(params, tma, num_ctas, s);
    else launch_variant<false, false>(params, tma, num_ctas, s);
    GQ_CUDA_CHECK(cudaGetLastError());
  }
  // All instantiations have the same shape, so any gives the occupancy.
  static int ctas_per_sm() {
    ensure_smem_limit<attention_sm90_kernel<T, HeadDim, F, false, false>, Shape::kSmemBytes>();
    int blocks = 0;
    GQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, attention_sm90_kernel<T, HeadDim, F, false, false>,
                                                                Shape::kThreads, Shape::kSmemBytes));
    return blocks > 0 ? blocks : 1;
  }
};

}  // namespace gqattn::kernels

// The AttentionKernel<..., kPrefillSm90 / kPrefillSm90Wide> members that select_kernel() points
// to (launch.h). FAMILY: PrefillSm90 or PrefillSm90Wide.
#define GQATTN_SM90_PREFILL(DTYPE, HEAD_DIM, FAMILY)                                                        \
  namespace gqattn::kernels {                                                                               \
  template <>                                                                                               \
  void AttentionKernel<DTYPE, HEAD_DIM, Family::k##FAMILY>::launch(const AttentionParams& p, int n,         \
                                                                   void* stream) {                          \
    Sm90Prefill<CudaType<DTYPE>::type, HEAD_DIM, Family::k##FAMILY>::launch(p, n, stream);                  \
  }                                                                                                         \
  template <>                                                                                               \
  int AttentionKernel<DTYPE, HEAD_DIM, Family::k##FAMILY>::ctas_per_sm() {                                  \
    return Sm90Prefill<CudaType<DTYPE>::type, HEAD_DIM, Family::k##FAMILY>::ctas_per_sm();                  \
  }                                                                                                         \
  }
