// The planner's pure functions against the contract of src/plan/planner.h: describe() fills the
// host fields; choose_kv_chunk() splits only when the GPU is not full (with split_full, a partial
// last wave too); build_work_list() covers every (request, kv head, packed row tile) once per
// chunk, and the chunks tile [0, kv_len).
// Layer: tests/cpu (label cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "common/expect_error.h"
#include "common/test_util.h"
#include "plan/planner.h"

namespace gqattn::test {
namespace {

constexpr int kTargetCtas = 132 * 2;  // an H100/H200-sized GPU with two CTAs per SM
constexpr int kKvTile = 64;
constexpr int kMinChunk = 256;

PlanInputs paged_inputs(const std::vector<int32_t>& kv_len, int page_size, int hq, int hkv) {
  const PageTable t = make_random_page_table(kv_len, page_size, 1);
  PlanInputs in;
  in.device = Device::kCPU;
  in.num_qo_heads = hq;
  in.num_kv_heads = hkv;
  in.head_dim = 128;
  in.page_size = page_size;
  in.kv_indptr = t.kv_page_indptr;
  in.kv_last_page_len = t.kv_last_page_len;
  return in;
}

TEST(PlanDescribe, DecodeFillsHostFields) {
  PlanInputs in = paged_inputs({13, 0, 40}, 16, 32, 8);
  in.qo_len = 2;
  const Plan p = plan::describe(in, true);
  EXPECT_TRUE(p.is_decode);
  EXPECT_TRUE(p.causal);
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.total_qo, 6);
  EXPECT_EQ(p.qo_indptr, (std::vector<int32_t>{0, 2, 4, 6}));
  EXPECT_EQ(p.kv_len, (std::vector<int32_t>{13, 0, 40}));
  EXPECT_EQ(p.num_qo_heads, 32);
  EXPECT_EQ(p.num_kv_heads, 8);
  EXPECT_EQ(p.head_dim, 128);
  EXPECT_EQ(p.page_size, 16);
  EXPECT_EQ(p.device, Device::kCPU);
}

TEST(PlanDescribe, RaggedPrefill) {
  PlanInputs in;
  in.device = Device::kCPU;
  in.num_qo_heads = 4;
  in.num_kv_heads = 4;
  in.head_dim = 64;
  in.page_size = 0;
  in.causal = true;
  in.qo_indptr = {0, 5, 5, 9};
  in.kv_indptr = {0, 10, 12, 16};
  const Plan p = plan::describe(in, false);
  EXPECT_FALSE(p.is_decode);
  EXPECT_TRUE(p.causal);
  EXPECT_EQ(p.total_qo, 9);
  EXPECT_EQ(p.kv_len, (std::vector<int32_t>{10, 2, 4}));
  EXPECT_EQ(p.page_size, 0);
}

// ---- choose_kv_chunk ---------------------------------------------------------------------------

TEST(ChooseKvChunk, NoSplitWhenTheGpuIsFull) {
  // 128 requests x 8 KV heads = 1024 CTAs >= 264: splitting only adds merge traffic.
  const std::vector<int32_t> kv_len(128, 4096), tiles(128, 1);
  EXPECT_EQ(plan::choose_kv_chunk(kv_len, tiles, 8, kTargetCtas, kKvTile, kMinChunk, 0), 0);
}

// split_full (decode): a partial last wave of equal items is split, whole waves are not.
TEST(ChooseKvChunk, SplitFullSplitsOnlyAPartialLastWave) {
  // GQA-8 34 x 4K: 272 items on 264 slots, two waves of 4K keys unsplit.
  const std::vector<int32_t> kv_len(34, 4096), tiles(34, 1);
  EXPECT_EQ(plan::choose_kv_chunk(kv_len, tiles, 8, kTargetCtas, kKvTile, kMinChunk, 0), 0);
  const int chunk = plan::choose_kv_chunk(kv_len, tiles, 8, kTargetCtas, kKvTile, kMinChunk, 0, 34 * 32, plan::kMergeFixedKeys,
                                          /*split_full=*/true);
  ASSERT_GT(chunk, 0);
  EXPECT_EQ(chunk % kKvTile, 0);
  // The chunks' waves end closer to the evenly spread work than two whole ones.
  const int64_t items = 272 * ((4096 + chunk - 1) / chunk);
  const int64_t waves = (items + kTargetCtas - 1) / kTargetCtas;
  EXPECT_LT(waves * chunk, 2 * 4096 * 0.75) << chunk;
  // Whole waves, or nearly: 264 and 528 items, GQA-8 128 x 4K (1,024: 3.9 waves), MHA 128 x 4K
  // (4,096: 15.5 waves); and a short partial wave's gain is below the split's cost.
  for (const auto& [batch, heads] : std::vector<std::pair<int, int>>{{33, 8}, {66, 8}, {128, 8}, {128, 32}}) {
    const std::vector<int32_t> len(size_t(batch), 4096), t(size_t(batch), 1);
    EXPECT_EQ(plan::choose_kv_chunk(len, t, heads, kTargetCtas, kKvTile, kMinChunk, 0, batch * 32.0, plan::kMergeFixedKeys,
                                    true), 0)
        << batch << " x " << heads;
  }
  // Short requests: the chunk floor (kMinChunk) leaves nothing to split.
  const std::vector<int32_t> short_len(40, 200), t40(40, 1);
  EXPECT_EQ(plan::choose_kv_chunk(short_len, t40, 8, kTargetCtas, kKvTile, kMinChunk, 0, 0, plan::kMergeFixedKeys, true), 0);
  // Mixed lengths (the shortest below 7/8 of the longest) keep a full GPU's items whole: a short
  // item's CTA exits early, so the waves of the longest item overstate the unsplit plan.
  std::vector<int32_t> mixed(34, 4096);
  mixed[0] = 3000;
  EXPECT_EQ(plan::choose_kv_chunk(mixed, tiles, 8, kTargetCtas, kKvTile, kMinChunk, 0, 34 * 32, plan::kMergeFixedKeys, true),
            0);
  mixed[0] = 3600;  // within 7/8: split as the equal batch
  EXPECT_GT(plan::choose_kv_chunk(mixed, tiles, 8, kTargetCtas, kKvTile, kMinChunk, 0, 34 * 32, plan::kMergeFixedKeys, true),
            0);
}

// split_full scores a full GPU's splits, which multiply thousands of items: no chunk whose items pass
// max_items (the backend's work-list limit) is chosen, where the unsplit plan fits.
TEST(ChooseKvChunk, SplitFullStaysWithinMaxItems) {
  // GQA-8 on 396 slots (three CTAs an SM): 1,288 requests of 256K keys, 10,304 items unsplit;
  // without the limit the model picks 16K-key chunks, 164,864 items.
  constexpr int kSlots = 132 * 3;
  const std::vector<int32_t> kv_len(1288, 262144), tiles(1288, 1);
  const int64_t max_items = int64_t(1) << 17;
  auto items = [&](int chunk) {
    int64_t n = 0;
    for (int32_t l : kv_len) n += 8 * (chunk > 0 && l > chunk ? (l + chunk - 1) / chunk : 1);
    return n;
  };
  const double merge_rows = 1288 * 32.0;
  const int unlimited = plan::choose_kv_chunk(kv_len, tiles, 8, kSlots, kKvTile, kMinChunk, 0, merge_rows,
                                              plan::kMergeFixedKeys, true);
  ASSERT_GT(items(unlimited), max_items) << unlimited;  // the case still needs the limit
  const int chunk = plan::choose_kv_chunk(kv_len, tiles, 8, kSlots, kKvTile, kMinChunk, 0, merge_rows,
                                          plan::kMergeFixedKeys, true, max_items);
  EXPECT_LE(items(chunk), max_items) << chunk;
  EXPECT_TRUE(chunk == 0 || chunk > unlimited) << chunk;
  // A limit below the unsplit items: no split (the backend then names the limit).
  EXPECT_EQ(plan::choose_kv_chunk(kv_len, tiles, 8, kSlots, kKvTile, kMinChunk, 0, merge_rows,
                                  plan::kMergeFixedKeys, true, 1000), 0);
}

TEST(ChooseKvChunk, SplitsWhenBatchTimesKvHeadsIsSmall) {
  // MQA, batch 1, 16K keys: one CTA would do all the work.
  for (const int max_splits : {0, 4, 32}) {
    const std::vector<int32_t> kv_len = {16384}, tiles = {1};
    const int chunk = plan::choose_kv_chunk(kv_len, tiles, 1, kTargetCtas, kKvTile, kMinChunk, max_splits);
    ASSERT_GT(chunk, 0) << max_splits;
    EXPECT_EQ(chunk % kKvTile, 0);
    EXPECT_GE(chunk, kMinChunk);
    EXPECT_LT(chunk, 16384);
    const int chunks = (16384 + chunk - 1) / chunk;
    EXPECT_GE(chunks, 2);
    if (max_splits > 0) { EXPECT_LE(chunks, max_splits); }
  }
  // GQA-8 at batch 1 x 4K: 8 CTAs, far fewer than the GPU holds.
  const int chunk = plan::choose_kv_chunk({4096}, {1}, 8, kTargetCtas, kKvTile, kMinChunk, 0);
  EXPECT_GT(chunk, 0);
  EXPECT_EQ(chunk % kKvTile, 0);
}

// A tile as long as the shortest chunk (the wgmma kernel at hd128: 128 keys): the split counts
// end once every chunk is one tile (the search looped forever there before).
TEST(ChooseKvChunk, TileOfMinChunkKeysEnds) {
  for (int max_kv : {1, 100, 128, 129, 200, 256, 300, 20011}) {
    const int chunk = plan::choose_kv_chunk({max_kv}, {1}, 1, kTargetCtas, 128, 128, 0);
    EXPECT_TRUE(chunk == 0 || (chunk % 128 == 0 && chunk < max_kv)) << max_kv << ": " << chunk;
  }
  EXPECT_EQ(plan::choose_kv_chunk({128}, {1}, 1, kTargetCtas, 128, 128, 0), 0);
  EXPECT_EQ(plan::choose_kv_chunk({20011}, {1}, 1, kTargetCtas, 128, 128, 0), 128);  // 157 chunks fill the GPU
}

TEST(ChooseKvChunk, NoSplitWhenTheMergeCostsMoreThanItSaves) {
  // MQA, 128 requests x 512 keys: 128 items half-fill the GPU; two chunks each would halve the
  // longest item, but the merge of 128 x 32 rows costs more (H200: 1.35x faster unsplit).
  const std::vector<int32_t> kv_len(128, 512), tiles(128, 1);
  EXPECT_EQ(plan::choose_kv_chunk(kv_len, tiles, 1, kTargetCtas, kKvTile, kMinChunk, 0), 256);  // merge free
  EXPECT_EQ(plan::choose_kv_chunk(kv_len, tiles, 1, kTargetCtas, kKvTile, kMinChunk, 0, 128 * 32), 0);
  // A long request still splits: GQA-8 at batch 1 x 32K merges only 32 rows.
  EXPECT_GT(plan::choose_kv_chunk({32768}, {1}, 4, kTargetCtas, kKvTile, kMinChunk, 0, 32), 0);
  // So does MHA at batch 1 x 512 (32 items, 32 rows: the merge is cheap).
  EXPECT_EQ(plan::choose_kv_chunk({512}, {1}, 32, kTargetCtas, kKvTile, kMinChunk, 0, 32), 256);
}

// The wgmma kernel's split costs more of its keys (KernelChoice::merge_fixed_keys 320): MQA at 32 x
// 512 (32 items of 128 rows, 1024 merged rows at key_time 1.36) stays unsplit, while 32 x 2K,
// with 4 draft tokens too, and batch 1 with 4 draft tokens still split (perf-notes item 156).
TEST(ChooseKvChunk, WgmmaKernelSplitsOnlyWhereItSavesItsFixedCost) {
  constexpr int kWgmmaCtas = 132, kWgmmaTile = 128;
  const std::vector<int32_t> tiles32(32, 1);
  const auto chunk = [&](int kv_len, double rows, const std::vector<int32_t>& tiles, double fixed) {
    const std::vector<int32_t> kv(tiles.size(), kv_len);
    return plan::choose_kv_chunk(kv, tiles, 1, kWgmmaCtas, kWgmmaTile, 128, 0, rows / 1.36, fixed);
  };
  EXPECT_EQ(chunk(512, 32 * 32, tiles32, 64), 128);  // the mma.sync kernels' fixed cost: split
  EXPECT_EQ(chunk(512, 32 * 32, tiles32, 320), 0);
  EXPECT_EQ(chunk(2048, 32 * 32, tiles32, 320), 512);
  EXPECT_EQ(chunk(2048, 32 * 4 * 32, tiles32, 320), 512);
  EXPECT_EQ(chunk(2048, 4 * 32, {1}, 320), 128);
}

TEST(ChooseKvChunk, SplittingDisabledOrPointless) {
  EXPECT_EQ(plan::choose_kv_chunk({16384}, {1}, 1, kTargetCtas, kKvTile, kMinChunk, 1), 0);
  EXPECT_EQ(plan::choose_kv_chunk({100}, {1}, 1, kTargetCtas, kKvTile, kMinChunk, 0), 0);  // < min_chunk
  EXPECT_EQ(plan::choose_kv_chunk({0, 0}, {1, 1}, 1, kTargetCtas, kKvTile, kMinChunk, 0), 0);
  EXPECT_EQ(plan::choose_kv_chunk({}, {}, 1, kTargetCtas, kKvTile, kMinChunk, 0), 0);
}

// A request without query rows (prefill, qo_len 0) has no items: its keys must not count as the
// longest item's. A 100K-key one made 300 keys split three ways, under a merge dearer than the gain.
TEST(ChooseKvChunk, RequestsWithoutRowsDoNotCount) {
  EXPECT_EQ(plan::choose_kv_chunk({300}, {1}, 1, kTargetCtas, 128, 128, 0, 2000), 0);
  EXPECT_EQ(plan::choose_kv_chunk({100000, 300}, {0, 1}, 1, kTargetCtas, 128, 128, 0, 2000), 0);
  EXPECT_EQ(plan::choose_kv_chunk({100000}, {0}, 1, kTargetCtas, 128, 128, 0), 0);
}

// One request of millions of keys beside 263 short ones, MQA (264 items leave an H200-sized GPU of
// 528 CTAs room to split): the split counts that round to a chunk already scored are skipped. The
// search scored every count up to max_kv / min_chunk over the whole batch before: 13 ms a plan at
// 1M keys, 52 ms at 4M, 26 s at 2^31 - 1. The chunks are those that exhaustive search chose.
TEST(ChooseKvChunk, LongestRequestOfMillionsOfKeys) {
  const std::pair<int32_t, int> cases[] = {{1 << 20, 1344}, {4 << 20, 1792}, {16 << 20, 2560}, {INT32_MAX, 153472}};
  for (const auto& [longest, chunk] : cases) {
    std::vector<int32_t> kv_len(264, 1024);
    const std::vector<int32_t> tiles(264, 1);
    kv_len[0] = longest;
    EXPECT_EQ(plan::choose_kv_chunk(kv_len, tiles, 1, 528, kKvTile, 128, 0, 264 * 32), chunk) << longest;
  }
}

// ---- fixed_kv_chunk (PlanInputs::fixed_split_size) ---------------------------------------------

TEST(FixedKvChunk, RoundsUpToTheTileAndSplitsOnlyLongerRequests) {
  const std::vector<int32_t> kv_len{100, 1000, 513}, tiles{1, 1, 1};
  EXPECT_EQ(plan::fixed_kv_chunk(kv_len, tiles, 1, 256, kKvTile), 256);
  EXPECT_EQ(plan::fixed_kv_chunk(kv_len, tiles, 1, 200, kKvTile), 256);  // rounded up to the tile
  EXPECT_EQ(plan::fixed_kv_chunk(kv_len, tiles, 1, 1, kKvTile), kKvTile);
  // A chunk that holds the longest request whole: no split.
  EXPECT_EQ(plan::fixed_kv_chunk(kv_len, tiles, 1, 1000, kKvTile), 0);
  EXPECT_EQ(plan::fixed_kv_chunk(kv_len, tiles, 1, 961, kKvTile), 0);  // 961 -> 1024 >= 1000
  EXPECT_EQ(plan::fixed_kv_chunk(kv_len, tiles, 1, 900, kKvTile), 960);
  // Near INT32_MAX the rounding passes int32: no split, no overflow.
  EXPECT_EQ(plan::fixed_kv_chunk(kv_len, tiles, 1, INT32_MAX, kKvTile), 0);
  // A request without query rows does not count as the longest.
  const std::vector<int32_t> rows_only_short{1, 0, 0};
  EXPECT_EQ(plan::fixed_kv_chunk(kv_len, rows_only_short, 1, 128, kKvTile), 0);  // longest with rows: 100
  EXPECT_EQ(plan::fixed_kv_chunk({}, {}, 1, 128, kKvTile), 0);
  EXPECT_THROW(plan::fixed_kv_chunk(kv_len, tiles, 1, 0, kKvTile), Error);
  EXPECT_THROW(plan::fixed_kv_chunk(kv_len, {1, 1}, 1, 128, kKvTile), Error);
}

// More items than max_items (the backend's work-list limit): an Error naming fixed_split_size,
// before any list is built; at the limit, the chunk.
TEST(FixedKvChunk, MoreItemsThanTheLimit) {
  // 2 requests x 2 K/V heads x ceil(1000 / 128) = 8 chunks, and one request of 100 keys whole.
  const std::vector<int32_t> kv_len{1000, 1000, 100}, tiles{1, 1, 1};
  const int64_t items = 2 * 2 * 8 + 2;
  EXPECT_EQ(plan::fixed_kv_chunk(kv_len, tiles, 2, 100, kKvTile, items), 128);
  expect_rejected([&] { plan::fixed_kv_chunk(kv_len, tiles, 2, 100, kKvTile, items - 1); },
                  {"fixed_split_size (100)", "chunks of 128 keys make 34 work items, over the limit of 33"});
  // One tile over 2^31 - 1 keys: 33.5M items a head, counted, not built.
  const std::vector<int32_t> huge{INT32_MAX}, one{1};
  expect_rejected([&] { plan::fixed_kv_chunk(huge, one, 8, 1, kKvTile, int64_t(1) << 17); },
                  {"fixed_split_size (1)", "268435456 work items"});
}

// The chunk it returns gives ceil(kv_len / chunk) items a request (and K/V head, row tile).
TEST(FixedKvChunk, WorkListHasTheFixedChunks) {
  Plan plan;
  plan.batch = 3;
  plan.num_qo_heads = 8;
  plan.num_kv_heads = 2;
  plan.qo_indptr = {0, 1, 2, 3};
  plan.kv_len = {100, 1000, 513};
  const std::vector<int32_t> tiles{1, 1, 1};
  const int chunk = plan::fixed_kv_chunk(plan.kv_len, tiles, plan.num_kv_heads, 256, kKvTile);
  const std::vector<int32_t> kv_indptr{0, 7, 70, 103};  // pages of 16
  const plan::WorkList list = plan::build_work_list(plan, kv_indptr, 16, chunk);
  EXPECT_EQ(list.items.size(), size_t(2 * (1 + 4 + 3)));
  EXPECT_EQ(list.requests[0].num_chunks, 1);
  EXPECT_EQ(list.requests[1].num_chunks, 4);
  EXPECT_EQ(list.requests[2].num_chunks, 3);
  EXPECT_EQ(list.max_splits, 4);
}

// ---- build_work_list ---------------------------------------------------------------------------

// Checks that the work list covers each (request, kv head, row tile) exactly once per chunk,
// that each tile's chunks tile [0, kv_len) without overlap, and that partial rows are disjoint.
void check_coverage(const Plan& plan, const std::vector<int32_t>& kv_indptr, int cta_rows, int kv_chunk) {
  const plan::WorkList list = plan::build_work_list(plan, kv_indptr, cta_rows, kv_chunk);
  const int group = plan.num_qo_heads / plan.num_kv_heads;
  std::map<std::tuple<int, int, int>, std::vector<std::pair<int, int>>> chunks;
  std::set<int64_t> partial_rows;
  int64_t expected_items = 0;
  for (const WorkItem& w : list.items) {
    ASSERT_GE(w.request, 0);
    ASSERT_LT(w.request, plan.batch);
    const int b = w.request;
    const int qo_len = plan.qo_indptr[b + 1] - plan.qo_indptr[b];
    const int rows = qo_len * group;
    EXPECT_GE(w.kv_head, 0);
    EXPECT_LT(w.kv_head, plan.num_kv_heads);
    EXPECT_EQ(w.row_begin % cta_rows, 0);
    EXPECT_LT(w.row_begin, rows);
    EXPECT_EQ(w.qo_begin, plan.qo_indptr[b]);
    EXPECT_EQ(w.qo_len, qo_len);
    EXPECT_EQ(w.kv_len, plan.kv_len[b]);
    EXPECT_EQ(w.page_begin, kv_indptr[b]);
    chunks[{b, w.kv_head, w.row_begin}].push_back({w.kv_begin, w.kv_end});
    if (w.partial_base >= 0) {
      const int tile_rows = std::min(cta_rows, rows - w.row_begin);
      for (int r = w.row_begin; r < w.row_begin + tile_rows; ++r) {
        const int64_t row = int64_t(w.partial_base) + r;
        EXPECT_LT(row, list.partial_rows);
        EXPECT_TRUE(partial_rows.insert(row).second) << "partial row " << row << " written twice";
      }
    }
  }
  for (int b = 0; b < plan.batch; ++b) {
    const int rows = (plan.qo_indptr[b + 1] - plan.qo_indptr[b]) * group;
    const int tiles = (rows + cta_rows - 1) / cta_rows;
    for (int h = 0; h < plan.num_kv_heads; ++h) {
      for (int t = 0; t < tiles; ++t) {
        auto it = chunks.find({b, h, t * cta_rows});
        ASSERT_NE(it, chunks.end()) << "request " << b << " head " << h << " tile " << t << " missing";
        std::vector<std::pair<int, int>> c = it->second;
        std::sort(c.begin(), c.end());
        EXPECT_EQ(c.front().first, 0);
        EXPECT_EQ(c.back().second, plan.kv_len[b]);
        for (size_t i = 0; i < c.size(); ++i) {
          EXPECT_LE(c[i].first, c[i].second);
          if (i > 0) { EXPECT_EQ(c[i].first, c[i - 1].second) << "gap or overlap"; }
          if (plan.kv_len[b] > 0) { EXPECT_LT(c[i].first, c[i].second) << "empty chunk"; }
          if (kv_chunk > 0) { EXPECT_LE(c[i].second - c[i].first, kv_chunk); }
        }
        if (kv_chunk == 0) { EXPECT_EQ(c.size(), 1u); }
        expected_items += int64_t(c.size());
      }
    }
    // Merge information: a request split into several chunks has its partial rows.
    const MergeRequest& m = list.requests[b];
    EXPECT_EQ(m.qo_begin, plan.qo_indptr[b]);
    EXPECT_EQ(m.qo_len, plan.qo_indptr[b + 1] - plan.qo_indptr[b]);
    if (tiles > 0 && plan.num_kv_heads > 0) {
      const size_t n = chunks[{b, 0, 0}].size();
      EXPECT_EQ(m.num_chunks <= 1, n <= 1);
      if (n > 1) {
        EXPECT_EQ(size_t(m.num_chunks), n);
        EXPECT_TRUE(list.split);
        EXPECT_GE(list.max_splits, m.num_chunks);
        EXPECT_GE(m.partial_base, 0);
      }
    }
  }
  EXPECT_EQ(int64_t(list.items.size()), expected_items) << "an item was listed twice";
  EXPECT_LE(int64_t(partial_rows.size()), list.partial_rows);
}

TEST(BuildWorkList, DecodeCoverage) {
  const std::vector<int32_t> kv_len = {1, 300, 0, 1000, 64, 65};
  for (const auto& heads : {std::pair{32, 32}, std::pair{32, 8}, std::pair{32, 1}, std::pair{14, 2}}) {
    PlanInputs in = paged_inputs(kv_len, 16, heads.first, heads.second);
    for (const int qo_len : {1, 4}) {
      in.qo_len = qo_len;
      const Plan plan = plan::describe(in, true);
      for (const int cta_rows : {16, 64})
        for (const int kv_chunk : {0, 64, 256})
          check_coverage(plan, in.kv_indptr, cta_rows, kv_chunk);
    }
  }
}

TEST(BuildWorkList, PrefillCoverageWithEmptyRequests) {
  PlanInputs in;
  in.device = Device::kCPU;
  in.num_qo_heads = 28;
  in.num_kv_heads = 4;
  in.head_dim = 128;
  in.page_size = 0;
  in.causal = true;
  in.qo_indptr = {0, 100, 100, 101, 301};
  in.kv_indptr = {0, 100, 150, 150, 650};
  const Plan plan = plan::describe(in, false);
  for (const int cta_rows : {64, 128})
    for (const int kv_chunk : {0, 128, 512})
      check_coverage(plan, in.kv_indptr, cta_rows, kv_chunk);
}

// A request of INT32_MAX keys (the most a plan's int32 lengths hold) in the chunks the planner picks
// for it: the last chunk's end, (c + 1) x kv_chunk, lies past INT32_MAX and wrapped negative in
// int, so that chunk held no key.
TEST(BuildWorkList, ChunksOfARequestOfInt32MaxKeys) {
  PlanInputs in;
  in.device = Device::kCPU;
  in.num_qo_heads = 1;
  in.num_kv_heads = 1;
  in.head_dim = 128;
  in.page_size = 0;
  in.qo_indptr = {0, 1};
  in.kv_indptr = {0, INT32_MAX};
  const Plan plan = plan::describe(in, false);
  check_coverage(plan, in.kv_indptr, 16, 153472);
}

TEST(BuildWorkList, NoSplitMeansDirectOutput) {
  PlanInputs in = paged_inputs({500, 20}, 16, 32, 8);
  const Plan plan = plan::describe(in, true);
  const plan::WorkList list = plan::build_work_list(plan, in.kv_indptr, 16, 0);
  EXPECT_FALSE(list.split);
  EXPECT_EQ(list.partial_rows, 0);
  for (const WorkItem& w : list.items) EXPECT_EQ(w.partial_base, -1);
  EXPECT_EQ(list.items.size(), size_t(2 * 8));  // 2 requests x 8 kv heads x 1 tile (4 rows)
}

TEST(BuildWorkList, LongestFirstWithinEachHeadKeepsEveryItem) {
  PlanInputs in;
  in.device = Device::kCPU;
  in.num_qo_heads = 8;
  in.num_kv_heads = 2;
  in.head_dim = 128;
  in.page_size = 0;
  in.causal = true;
  in.qo_indptr = {0, 700, 710, 1500};
  in.kv_indptr = {0, 700, 1710, 2510};  // request 1: 10 new tokens after 1000 cached keys
  const Plan plan = plan::describe(in, false);
  plan::WorkList list = plan::build_work_list(plan, in.kv_indptr, 128, 0);
  const std::vector<WorkItem> before = list.items;
  plan::order_longest_first(list, 4, 128, true);
  ASSERT_EQ(list.items.size(), before.size());
  for (size_t i = 1; i < list.items.size(); ++i) {
    const WorkItem& a = list.items[i - 1];
    const WorkItem& b = list.items[i];
    // Requests and heads keep their order; within one (request, head), visible keys never grow.
    ASSERT_LE(std::make_pair(a.request, a.kv_head), std::make_pair(b.request, b.kv_head));
    if (a.request == b.request && a.kv_head == b.kv_head) {
      EXPECT_GE(plan::item_keys_visible(a, 4, 128, true), plan::item_keys_visible(b, 4, 128, true));
    }
  }
  auto key = [](const WorkItem& w) { return std::make_tuple(w.request, w.kv_head, w.row_begin); };
  std::multiset<std::tuple<int, int, int>> a, b;
  for (const WorkItem& w : before) a.insert(key(w));
  for (const WorkItem& w : list.items) b.insert(key(w));
  EXPECT_EQ(a, b);
  // Request 0 (700 tokens x 4 heads = 2800 packed rows, 22 row tiles per head): its last row
  // tile (rows 2688..2799 -> tokens 672..699) sees all 700 keys and now comes first.
  EXPECT_EQ(list.items.front().request, 0);
  EXPECT_EQ(list.items.front().row_begin, 2688);
  EXPECT_EQ(plan::item_keys_visible(list.items.front(), 4, 128, true), 700);
  // Request 1's single row tile (40 packed rows) sees all 1010 keys.
  for (const WorkItem& w : list.items) {
    if (w.request == 1) {
      EXPECT_EQ(plan::item_keys_visible(w, 4, 128, true), 1010);
    }
  }
}

}  // namespace
}  // namespace gqattn::test
