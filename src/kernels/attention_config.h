// The attention kernel's config table: tiles, warps and pipeline stages per family and head_dim.
// Layer: src/kernels (host-includable constexpr data, read by the kernel and by the dispatcher, so
// host heuristics and device configs cannot drift apart). A row changes speed, never results.
#pragma once

namespace gqattn::kernels {

// decode: few packed query rows (group_size x qo_len <= 16), many keys: one warp row, four warps
//         splitting each K/V tile, a deep cp.async pipeline to keep HBM busy (hd256: two warps
//         on the keys times two on the output's columns).
// decode_long: the decode family's rows at hd64 where a few hundred requests x K/V heads stream
//         thousands of keys each (hd64 only): tiles of 128 keys (an hd128 tile's bytes), two CTAs
//         an SM, where the decode family's 64-key tiles fit four.
// decode_mid: 17..32 packed rows at head_dim <= 128 (MQA with 32 query heads, GQA-8 with 4 draft
//         tokens): one warp row of two 16-row tiles, four warps splitting each K/V tile, so that
//         all four warps compute on 32 rows (decode_wide idles its second row warp there).
// decode_wide: up to 64 packed rows (MQA, or GQA with several draft tokens): two warps along the
//         rows (two 16-row tiles each) times two warps along the keys, the same deep pipeline.
// decode_many: the decode family's rows where many items fill the GPU (hd128 only): tiles of 32
//         keys over two warps, so that four CTAs an SM overlap each item's start and end with three
//         other CTAs' streams (the decode family's two CTAs keep one key tile per round trip for
//         split and latency-bound plans).
// prefill: many query rows: four warps along the rows (kMTiles x 16 rows each), each K/V tile
//         shared by all of them.
// prefill_sm90: the Hopper path (attention_sm90.cuh): one producer warpgroup streams K/V tiles
//         into an mbarrier pipeline, two consumer warpgroups of 64 rows each run wgmma.
// prefill_sm90_wide: the same kernel with three consumer warpgroups (192 rows an item), hd64 only,
//         for long query rows (select_kernel).
enum class Family { kDecode = 0, kPrefill = 1, kDecodeWide = 2, kPrefillSm90 = 3, kDecodeMid = 4, kDecodeMany = 5,
                    kDecodeLong = 6, kPrefillSm90Wide = 7 };

template <Family F, int HeadDim>
struct AttnConfig;

// The decode and decode_mid families' cp.async stages: three leave room for two CTAs an SM at
// head_dim 128 (2 x 2 x 32 KB of K/V in flight an SM while each computes a tile). Rows of 80
// elements take four, still two CTAs an SM, 2 x 3 x 20 KB in flight: with three, hd80 decode ran
// three CTAs an SM of 2 x 20 KB (396 slots: 512 items took two waves) and decode_mid two (170
// registers). Measured (perf-notes item 200, session 42): hd80 1.04-1.34x; hd96 with four 0.97-1.01x, so it
// keeps three; hd112 has no room for a fourth (124 KB: one CTA).
constexpr int decode_stages(int head_dim) { return head_dim == 80 ? 4 : 3; }

template <int HeadDim>
struct AttnConfig<Family::kDecode, HeadDim> {
  static constexpr int kWarpsM = 1;
  static constexpr int kMTiles = 1;
  // hd256: tiles of 32 keys over two warps, so that three stages (96 KB) leave room for two CTAs
  // per SM as at hd <= 128 (64-key tiles took 192 KB: one CTA, 3.72 TB/s; perf-notes item 47).
  static constexpr int kWarpsKV = HeadDim <= 128 ? 4 : 2;
  static constexpr int kKVTile = HeadDim <= 128 ? 64 : 32;
  // hd256: each key warp is a pair of warps that compute the same scores and multiply P by their
  // own half of V's columns, so an SM's two CTAs run two warps a scheduler, not one (two warps of
  // 256 columns issued every 2.6 cycles from a single warp: perf-notes item 101).
  static constexpr int kWarpsN = HeadDim <= 128 ? 1 : 2;
  // Stages that leave room for two CTAs per SM (decode_stages): while one waits at its barrier or
  // computes, the other keeps issuing. Measured on the H200 at hd128: 3.56 TB/s with 6 stages and
  // one CTA per SM, 4.46 TB/s with 3 stages and two (docs/perf-notes.md, "decode: CTAs per SM").
  static constexpr int kStages = decode_stages(HeadDim);
};

// decode_mid exists up to this head dim. Above it two row tiles do not fit the registers and two
// warps of one tile each spilled, so 17..32 rows take decode_wide (select_kernel).
constexpr int kDecodeMidMaxHeadDim = 128;

template <int HeadDim>
struct AttnConfig<Family::kDecodeMid, HeadDim> {
  static constexpr int kWarpsN = 1;  // warps along the output's columns (see decode)
  static_assert(HeadDim <= kDecodeMidMaxHeadDim, "decode_mid is built for head_dim <= 128 only");
  static constexpr int kWarpsM = 1;
  static constexpr int kMTiles = 2;
  static constexpr int kWarpsKV = 4;
  static constexpr int kKVTile = 64;
  static constexpr int kStages = decode_stages(HeadDim);  // two CTAs per SM
};

// decode_many exists for this head dim only (measured there: perf-notes items 85, 86).
constexpr int kDecodeManyHeadDim = 128;

template <int HeadDim>
struct AttnConfig<Family::kDecodeMany, HeadDim> {
  // Two warps along the output's columns (see decode): each pair computes the same scores and
  // multiplies P by its half of V, so that four CTAs an SM run sixteen warps (118 registers), not
  // eight: item 180's shapes lost with every warp an SM they gave up (item 181).
  static constexpr int kWarpsN = 2;
  static_assert(HeadDim == kDecodeManyHeadDim, "decode_many is built for head_dim 128 only");
  static constexpr int kWarpsM = 1;
  static constexpr int kMTiles = 1;
  // 32-key tiles over two key warps, three stages: 52 KB, four CTAs an SM (the same 2 x 2 x 32 KB
  // of tiles in flight as the decode family's two CTAs).
  static constexpr int kWarpsKV = 2;
  static constexpr int kKVTile = 32;
  static constexpr int kStages = 3;
};

// decode_long exists for this head dim only (measured there: perf-notes items 96, 99).
constexpr int kDecodeLongHeadDim = 64;

template <int HeadDim>
struct AttnConfig<Family::kDecodeLong, HeadDim> {
  static_assert(HeadDim == kDecodeLongHeadDim, "decode_long is built for head_dim 64 only");
  static constexpr int kWarpsN = 1;  // warps along the output's columns (see decode)
  static constexpr int kWarpsM = 1;
  static constexpr int kMTiles = 1;
  // 128-key tiles over four warps, three stages: 98 KB, two CTAs an SM (the bytes in flight of the
  // decode family at hd128, with half the barriers a byte of hd64's 64-key tiles).
  static constexpr int kWarpsKV = 4;
  static constexpr int kKVTile = 128;
  static constexpr int kStages = 3;
};

template <int HeadDim>
struct AttnConfig<Family::kDecodeWide, HeadDim> {
  static constexpr int kWarpsN = 1;  // warps along the output's columns (see decode)
  // hd256: four single-tile warps over the whole key tile (two row tiles would not fit registers).
  static constexpr int kWarpsM = HeadDim <= 128 ? 2 : 4;
  static constexpr int kMTiles = HeadDim <= 128 ? 2 : 1;
  static constexpr int kWarpsKV = HeadDim <= 128 ? 2 : 1;
  // hd256: 32-key tiles, so that two stages (64 KB) and Q (32 KB) leave room for two CTAs per SM
  // (64-key tiles took 160 KB: one CTA of four warps an SM; the decode family's item 47).
  static constexpr int kKVTile = HeadDim <= 128 ? 64 : 32;
  static constexpr int kStages = HeadDim <= 128 ? 3 : 2;  // two CTAs per SM
};

template <int HeadDim>
struct AttnConfig<Family::kPrefill, HeadDim> {
  static constexpr int kWarpsN = 1;  // warps along the output's columns (see decode)
  static constexpr int kWarpsM = 4;
  // Two 16-row MMA tiles per warp share every K/V fragment read from shared memory, halving the
  // shared-memory traffic per FLOP (hd256 keeps one: its accumulators fill the registers).
  static constexpr int kMTiles = HeadDim <= 128 ? 2 : 1;
  static constexpr int kWarpsKV = 1;
  // hd128 with two row tiles per warp: 32-key tiles keep S and O in registers without spills.
  static constexpr int kKVTile = HeadDim <= 64 ? 64 : 32;
  static constexpr int kStages = HeadDim <= 128 ? 3 : 2;
};

// Elements a row of a [rows][head_dim] tile takes in the portable kernel's shared memory. Where a
// row has a multiple of 8 16-byte chunks (head_dim 64, 128, 256) it is head_dim, the chunks
// XOR-swizzled by the row; otherwise (80, 96, 112) the row is padded to an odd number of chunks,
// so that ldmatrix's eight rows of one chunk fall into eight different bank groups unswizzled.
constexpr bool xor_swizzled_rows(int head_dim) { return (head_dim / 8) % 8 == 0; }
constexpr int smem_row_elems(int head_dim) { return xor_swizzled_rows(head_dim) ? head_dim : ((head_dim / 8) | 1) * 8; }

// Derived sizes, identical on host and device.
template <Family F, int HeadDim, typename Cfg = AttnConfig<F, HeadDim>>
struct AttnShape {
  static constexpr int kElemBytes = 2;
  static constexpr int kWarps = Cfg::kWarpsM * Cfg::kWarpsKV * Cfg::kWarpsN;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpRows = 16 * Cfg::kMTiles;
  static constexpr int kCtaRows = kWarpRows * Cfg::kWarpsM;
  static constexpr int kWarpKV = Cfg::kKVTile / Cfg::kWarpsKV;  // keys per warp per tile
  static constexpr int kWarpCols = HeadDim / Cfg::kWarpsN;       // output columns per warp
  static constexpr int kRowElems = smem_row_elems(HeadDim);  // a Q, K or V row in shared memory
  static constexpr int kQBytes = kCtaRows * kRowElems * kElemBytes;
  static constexpr int kStageBytes = 2 * Cfg::kKVTile * kRowElems * kElemBytes;  // K + V
  // Epilogue: each KV-warp's fp32 O rows (padded by 4 floats against bank conflicts), then m, d.
  static constexpr int kEpiStride = HeadDim + 4;
  static constexpr int kEpilogueBytes = Cfg::kWarpsKV * kCtaRows * (kEpiStride + 2) * 4;
  static constexpr int kKVBytes = Cfg::kStages * kStageBytes;
  static constexpr int kSmemBytes = kQBytes + (kKVBytes > kEpilogueBytes ? kKVBytes : kEpilogueBytes);

  static_assert(HeadDim % 16 == 0 && HeadDim >= 64, "head_dim must be a multiple of 16, >= 64 (MMA steps)");
  static_assert(kWarpKV % 16 == 0, "each warp takes whole 16-key MMA steps");
  static_assert(kWarpCols % 16 == 0, "each warp takes whole 16-column P V steps");
  // At head_dim 64, 128 and 256 each thread copies the same chunk of every row it loads, and the
  // tiles split evenly over the threads (the kernel's LoadSlots).
  static_assert(!xor_swizzled_rows(HeadDim) || (kThreads % (HeadDim / 8) == 0 &&
                                                 (Cfg::kKVTile * HeadDim / 8) % kThreads == 0 &&
                                                 (kCtaRows * HeadDim / 8) % kThreads == 0),
                "swizzled tiles' loads split evenly over whole rows");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory above the sm_90 limit");
};

// The Hopper prefill family (its shared memory: Sm90Shape below).
template <int HeadDim>
struct AttnConfig<Family::kPrefillSm90, HeadDim> {
  static constexpr int kConsumers = 2;  // consumer warpgroups, 64 query rows each
  static constexpr int kKVTile = HeadDim <= 128 ? 128 : 64;
  // The consumer holds K of tile t and V of tile t - 1; K and V have separate barriers, so even
  // two stages keep one tile of each in flight.
  static constexpr int kStages = HeadDim <= 128 ? 3 : 2;
  // setmaxnreg budgets: the launch gives 168 per thread (384 threads); the producer's release of
  // 80 pays for the consumers' 40 more (96/200 also fits; it measured no faster).
  static constexpr int kProducerRegs = 88;
  static constexpr int kConsumerRegs = 208;
  // Items of <= 64 rows may split each tile's keys between the two consumers (64-key halves;
  // AttentionParams::split_item_keys). Not at 80, 96 and 112: such items are decode rows, which
  // take the wgmma kernel at hd128 only (select_kernel), and the variant spilled 12 bytes there.
  static constexpr bool kSplitKeys = kKVTile >= 128 && HeadDim % 64 == 0;
};

// prefill_sm90_wide exists at this head dim only. There a tile's softmax costs about as much as
// its two GEMMs, so with two consumers the tensor cores idle whenever a softmax runs long; with a
// third, one warpgroup is at its GEMMs while two are in their softmax (H200, perf-notes item 126:
// hd64 1 x 16K +2-9%). Its 192-row items lose where rows are few (MHA 16 x 1K causal 0.79x).
constexpr int kPrefillSm90WideHeadDim = 64;

template <int HeadDim>
struct AttnConfig<Family::kPrefillSm90Wide, HeadDim> : AttnConfig<Family::kPrefillSm90, HeadDim> {
  static constexpr int kConsumers = 3;
  // 512 threads: the launch gives 128 per thread. The consumers spill ~60 bytes at 160 (loop
  // state reloaded once a tile); the producer at 32 spills a few of its gather addresses.
  static constexpr int kProducerRegs = 32;
  static constexpr int kConsumerRegs = 160;
  static constexpr bool kSplitKeys = false;
};

// The Hopper families' tiles hold whole 64-column blocks (128-byte swizzle): head_dim rounded up to
// them. At 80, 96 and 112 a row's columns past head_dim are never copied nor read (the S GEMM's
// k-steps and P V's N stop at head_dim), so those head dims run in hd128's tiles.
constexpr int sm90_smem_cols(int head_dim) { return (head_dim + 63) / 64 * 64; }

// Both Hopper families: Q (64 rows a consumer), kStages x (K tile + V tile), stored as
// 128-byte-swizzled column blocks of 64 elements (the wgmma operand layout), plus mbarriers.
template <int HeadDim, typename Cfg>
struct Sm90Shape {
  static constexpr int kElemBytes = 2;
  static constexpr int kThreads = 128 * (Cfg::kConsumers + 1);
  static constexpr int kCtaRows = 64 * Cfg::kConsumers;
  static constexpr int kCols = sm90_smem_cols(HeadDim);  // a Q, K or V row in shared memory
  static constexpr int kQBytes = kCtaRows * kCols * kElemBytes;
  static constexpr int kTileBytes = Cfg::kKVTile * kCols * kElemBytes;  // one of K or V
  static constexpr int kStageBytes = 2 * kTileBytes;
  // full_k/full_v/empty_k/empty_v[kStages], q_full, q_empty, 3 item indices; then the WorkItem
  // the producer hands to the consumers (48 bytes, 16-byte aligned).
  static constexpr int kWorkItemOffset = 128;
  static constexpr int kBarrierBytes = kWorkItemOffset + 64;
  // hd > 128: each consumer stages its O rows through 64 x 128 elements of its own (16 KB at
  // hd256), after the barriers, for 16-byte stores (attention_sm90.cuh's epilogue).
  // hd64: each consumer's 64 x 64 O tile for the TMA store (attention_sm90.cuh), 1024-byte aligned
  // for the 128-byte swizzle (hence the 1 KB slack).
  static constexpr int kOutStageCols = HeadDim > 128 ? 128 : HeadDim;
  static constexpr int kOutStageBytes = HeadDim > 128    ? Cfg::kConsumers * 64 * kOutStageCols * kElemBytes
                                        : HeadDim == 64 ? Cfg::kConsumers * 64 * 64 * kElemBytes + 1024
                                                        : 0;
  // Only items of at most this many keys (WorkItem kv_end - kv_begin: the request's keys, as only
  // unsplit items write O) take the staged epilogue; longer ones store straight from the
  // accumulators. Session 38 (perf-notes item 199): staged, hd256 16 x 1K and 8 x 2K gained
  // 1.02-1.13x, but 1 x 16K rows lost 0.92-0.98x.
  static constexpr int kStagedOMaxKeys = 2048;
  // +1024: the dynamic shared memory base is aligned up to the 1024-byte swizzle atom.
  static constexpr int kSmemBytes = 1024 + kQBytes + Cfg::kStages * kStageBytes + kBarrierBytes + kOutStageBytes;

  static_assert(HeadDim % 16 == 0 && (HeadDim % 64 == 0 || HeadDim < 128),
                "the sm90 path: 16-column k-steps, and a tile's padding within one 64-column block at most");
  static_assert(HeadDim <= 128 || HeadDim % kOutStageCols == 0, "O staged in whole 128-column parts");
  static_assert(Cfg::kConsumers == 2 || Cfg::kConsumers == 3, "turn barriers for two or three consumers");
  static_assert((4 * Cfg::kStages + 2) * 8 + 3 * 4 <= kWorkItemOffset, "barrier area too small");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory above the sm_90 limit");
  // setmaxnreg moves registers only within the launch's allocation (65,536 / threads, a multiple of 8).
  static_assert(128 * Cfg::kProducerRegs + 128 * Cfg::kConsumers * Cfg::kConsumerRegs <=
                    kThreads * ((65536 / kThreads) & ~7),
                "register file");
};

template <int HeadDim, typename Cfg>
struct AttnShape<Family::kPrefillSm90, HeadDim, Cfg> : Sm90Shape<HeadDim, Cfg> {};
template <int HeadDim, typename Cfg>
struct AttnShape<Family::kPrefillSm90Wide, HeadDim, Cfg> : Sm90Shape<HeadDim, Cfg> {};

// The head dims the Hopper prefill family takes (tools/gen_instantiations.py generates it at all
// of its head dims): whole 64-column blocks, and 80, 96, 112 in hd128's tiles (sm90_smem_cols).
constexpr bool sm90_head_dim(int head_dim) {
  return head_dim % 64 == 0 || (head_dim > 64 && head_dim < 128 && head_dim % 16 == 0);
}

constexpr bool is_sm90_family(Family f) { return f == Family::kPrefillSm90 || f == Family::kPrefillSm90Wide; }
// The families after which the split merge is a programmatic dependent launch (sm_90): they let it
// be scheduled at their start (prims::grid_allow_dependents), the dispatcher launches it so.
constexpr bool merge_starts_early(Family f) { return f == Family::kDecode || f == Family::kDecodeMid; }
// The families whose warps copy and wait for the keys they multiply (cp.async groups, then a
// barrier of just the kWarpsM x kWarpsN warps that share a key warp's rows: __syncwarp where that
// is one warp), not for a whole tile behind a CTA barrier: a CTA's key warps drift apart, so one
// issues copies while another computes, as two CTAs an SM do (perf-notes items 3 and 187).
// The kernel (kWarpPrivate) takes it where the family has more than one key warp and a warp's 32
// threads copy whole rows of 16-byte chunks: head_dim 64, 128 and 256, not 80, 96 and 112.
constexpr bool warp_private_kv(Family f) {
  return f == Family::kDecode || f == Family::kDecodeMid || f == Family::kDecodeLong || f == Family::kDecodeMany ||
         f == Family::kDecodeWide;
}

}  // namespace gqattn::kernels
