// The planner: lengths -> work list. Pure host functions, shared by the CUDA backend and the tests.
// Layer: src/plan (host-only).
#include "plan/planner.h"

#include <algorithm>

#include "gqattn/error.h"

namespace gqattn::plan {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A work item's fixed cost (Q load, pipeline fill, epilogue) in keys streamed: about 2 us of one
// CTA's share of the H200's bandwidth at head_dim 128.
constexpr int64_t kItemOverheadKeys = 64;
// A split must beat the best plan so far by 3%: ties go to fewer chunks (less merge traffic).
constexpr double kMinGain = 0.97;
// The split merge, in the same units (keys one CTA streams): a fixed part (the second launch, the
// partial rows' write and read: the caller's merge_fixed_keys, kMergeFixedKeys for the mma.sync
// kernels) plus a part per merged row (one block per query row and head). Fitted to the H200's
// hd128 decode sweep run with and without splits (docs/perf-notes.md, item 12): MQA 128 x 512
// merged 4096 rows in ~15 us, GQA-8 32 x 512 1024 rows in ~12 us, MHA batch 1 x 512 32 rows in
// ~5 us, at ~30 keys per us.
constexpr double kMergeKeysPerRow = 0.18;

// The work items of a list in chunks of `chunk` keys (row tiles x K/V heads x chunks, a request
// shorter than the chunk one), as build_work_list makes them.
int64_t count_items(const std::vector<int32_t>& kv_len, const std::vector<int32_t>& row_tiles, int num_kv_heads,
                    int64_t chunk) {
  int64_t items = 0;
  for (size_t b = 0; b < kv_len.size(); ++b)
    items += int64_t(row_tiles[b]) * num_kv_heads * std::max<int64_t>(1, ceil_div(kv_len[b], chunk));
  return items;
}

}  // namespace

Plan describe(const PlanInputs& in, bool is_decode) {
  Plan p;
  p.device = in.device;
  p.device_id = in.device_id;
  p.dtype = in.dtype;
  p.num_qo_heads = in.num_qo_heads;
  p.num_kv_heads = in.num_kv_heads;
  p.head_dim = in.head_dim;
  p.page_size = in.page_size;
  p.num_pages = in.num_pages;
  p.is_decode = is_decode;
  p.causal = is_decode ? true : in.causal;
  p.batch = in.kv_indptr.empty() ? 0 : static_cast<int>(in.kv_indptr.size()) - 1;
  if (is_decode) {
    p.qo_indptr.resize(p.batch + 1);
    for (int b = 0; b <= p.batch; ++b) p.qo_indptr[b] = b * in.qo_len;
  } else {
    p.qo_indptr = in.qo_indptr;
  }
  p.total_qo = p.qo_indptr.empty() ? 0 : p.qo_indptr.back();
  if (in.page_size > 0) {
    p.kv_len = kv_lengths(in.kv_indptr, in.kv_last_page_len, in.page_size);
  } else {
    p.kv_len.resize(p.batch);
    for (int b = 0; b < p.batch; ++b) p.kv_len[b] = in.kv_indptr[b + 1] - in.kv_indptr[b];
  }
  return p;
}

int choose_kv_chunk(const std::vector<int32_t>& kv_len, const std::vector<int32_t>& row_tiles,
                    int num_kv_heads, int target_ctas, int kv_tile, int min_chunk, int max_splits,
                    double merge_rows, double merge_fixed_keys, bool split_full, int64_t max_items) {
  GQ_CHECK(kv_len.size() == row_tiles.size(), "choose_kv_chunk: kv_len and row_tiles differ in size");
  GQ_CHECK(kv_tile > 0 && target_ctas > 0, "choose_kv_chunk: kv_tile and target_ctas must be positive");
  if (max_splits == 1) return 0;
  int64_t base_ctas = 0, work_tokens = 0, max_kv = 0, min_kv = INT64_MAX;
  for (size_t b = 0; b < kv_len.size(); ++b) {
    base_ctas += int64_t(row_tiles[b]) * num_kv_heads;
    work_tokens += int64_t(row_tiles[b]) * num_kv_heads * kv_len[b];
    // A request without query rows (prefill, qo_len 0) has no item: its keys are no item's.
    if (row_tiles[b] > 0) {
      max_kv = std::max<int64_t>(max_kv, kv_len[b]);
      min_kv = std::min<int64_t>(min_kv, kv_len[b]);
    }
  }
  if (max_kv == 0) return 0;
  // Without split_full, a GPU already full without splitting keeps its items whole. With it, and
  // requests of nearly equal lengths (the shortest at least 7/8 of the longest), the cost model
  // below decides: 272 equal items on 264 slots take two waves of the longest item, and chunks of
  // an eighth take nine of an eighth (GQA-8 34 x 4K ran 2.7 TB/s unsplit against 4.2 TB/s at 33
  // requests, perf-notes item 213); whole waves (7.76 of them for MHA 128 x 4K) gain less than
  // kMinGain and stay unsplit. Mixed lengths keep the early return: the CTAs of short items exit
  // early and the next ones start, so charging every wave the longest item overstates an unsplit
  // plan's time there (not measured).
  const bool equal_lengths = min_kv * 8 >= max_kv * 7;
  if (base_ctas >= target_ctas && !(split_full && equal_lengths)) return 0;
  // Estimated time in keys streamed by one CTA: whole waves of the longest item (plus a fixed
  // per-item cost), never below the evenly spread work. Equal chunks that fill the last wave
  // beat chunks that spill a few items into a second one (ncu on the H200: MQA 128 x 8K split
  // into 384 items ran 1.45 waves at 2.7 TB/s).
  auto cost = [&](int64_t chunk, int64_t items) {
    const int64_t waves = ceil_div(items, target_ctas);
    const double longest = static_cast<double>(std::min(chunk, max_kv) + kItemOverheadKeys);
    return std::max(waves * longest, static_cast<double>(work_tokens) / target_ctas);
  };
  int64_t best_chunk = max_kv;
  double best_cost = cost(max_kv, base_ctas);
  for (int64_t splits = 2;; ++splits) {
    if (max_splits > 1 && splits > max_splits) break;
    const int64_t chunk = ceil_div(ceil_div(max_kv, splits), kv_tile) * kv_tile;
    if (chunk < min_chunk) break;
    // Smaller chunks only add items: past the work-list limit the plan would fail where the
    // unsplit one fits (split_full: 481 x 16K and 1,000 short GQA-8 requests, 11,848 items,
    // scored best at 512-key chunks, 131,136 items).
    const int64_t items = count_items(kv_len, row_tiles, num_kv_heads, chunk);
    if (items > max_items) break;
    if (chunk < max_kv) {
      const double c = cost(chunk, items) + merge_fixed_keys + kMergeKeysPerRow * merge_rows;
      if (c < best_cost * kMinGain) {
        best_cost = c;
        best_chunk = chunk;
      }
    }
    // Every larger split count rounds to this one tile: nothing new to score (a kernel whose tile
    // is min_chunk keys, the wgmma one at hd128, never gets below min_chunk to stop above).
    if (chunk == kv_tile) break;
    // The split counts below ceil(max_kv / (chunk - kv_tile)) round to this same chunk: the same
    // cost, which cannot beat the best once more. Skip to the first count of a smaller chunk (the
    // same choice; scoring each count cost 13 ms a plan at 1M keys and 264 requests, 52 ms at 4M,
    // 26 s at 2^31 - 1).
    splits = std::max(splits, ceil_div(max_kv, chunk - kv_tile) - 1);
  }
  return best_chunk >= max_kv ? 0 : static_cast<int>(best_chunk);
}

int fixed_kv_chunk(const std::vector<int32_t>& kv_len, const std::vector<int32_t>& row_tiles, int num_kv_heads,
                   int fixed_keys, int kv_tile, int64_t max_items) {
  GQ_CHECK(kv_len.size() == row_tiles.size(), "fixed_kv_chunk: kv_len and row_tiles differ in size");
  GQ_CHECK(fixed_keys > 0 && kv_tile > 0, "fixed_kv_chunk: fixed_keys and kv_tile must be positive");
  int64_t max_kv = 0;
  for (size_t b = 0; b < kv_len.size(); ++b)
    if (row_tiles[b] > 0) max_kv = std::max<int64_t>(max_kv, kv_len[b]);
  // In int64: a chunk near INT32_MAX rounds past it; it then holds every request whole.
  const int64_t chunk = ceil_div(int64_t(fixed_keys), kv_tile) * kv_tile;
  if (chunk >= max_kv) return 0;
  // The items counted first: the caller's chunk is not bounded by a cost model, and the list it
  // would build may not fit in memory.
  const int64_t items = count_items(kv_len, row_tiles, num_kv_heads, chunk);
  GQ_CHECK(items <= max_items, "fixed_split_size (", fixed_keys, "): chunks of ", chunk, " keys make ", items,
           " work items, over the limit of ", max_items, " (a larger chunk)");
  return static_cast<int>(chunk);
}

WorkList build_work_list(const Plan& plan, const std::vector<int32_t>& kv_indptr, int cta_rows,
                         int kv_chunk) {
  GQ_CHECK(cta_rows > 0, "build_work_list: cta_rows must be positive");
  const int group_size = plan.num_qo_heads / plan.num_kv_heads;
  WorkList list;
  list.requests.resize(plan.batch);
  for (int b = 0; b < plan.batch; ++b) {
    const int32_t qo_begin = plan.qo_indptr[b];
    const int32_t qo_len = plan.qo_indptr[b + 1] - qo_begin;
    const int32_t kv_len = plan.kv_len[b];
    const int64_t rows = int64_t(qo_len) * group_size;
    const int64_t tiles = ceil_div(rows, cta_rows);
    const int num_chunks =
        (kv_chunk > 0 && kv_len > kv_chunk) ? static_cast<int>(ceil_div(kv_len, kv_chunk)) : 1;
    MergeRequest& req = list.requests[b];
    req.qo_begin = qo_begin;
    req.qo_len = qo_len;
    req.num_chunks = num_chunks;
    req.partial_base = -1;
    if (num_chunks > 1 && rows > 0) {
      req.partial_base = static_cast<int32_t>(list.partial_rows);
      list.partial_rows += int64_t(plan.num_kv_heads) * num_chunks * rows;
      list.split = true;
      list.max_splits = std::max(list.max_splits, num_chunks);
    }
    for (int h = 0; h < plan.num_kv_heads; ++h) {
      // Causal prefill: the last row tiles see the most keys; listing them first lets the
      // heaviest CTAs start in the first wave.
      for (int64_t ti = tiles - 1; ti >= 0; --ti) {
        for (int c = 0; c < num_chunks; ++c) {
          WorkItem w{};
          w.request = b;
          w.kv_head = h;
          w.row_begin = static_cast<int32_t>(ti * cta_rows);
          w.kv_begin = num_chunks > 1 ? c * kv_chunk : 0;
          // In int64: the last chunk's end may pass INT32_MAX (kv_len near it, a chunk of millions).
          w.kv_end = num_chunks > 1 ? static_cast<int32_t>(std::min<int64_t>(kv_len, int64_t(c + 1) * kv_chunk))
                                    : kv_len;
          w.qo_begin = qo_begin;
          w.qo_len = qo_len;
          w.kv_len = kv_len;
          w.page_begin = kv_indptr[b];
          w.partial_base = num_chunks > 1
                               ? static_cast<int32_t>(req.partial_base + (int64_t(h) * num_chunks + c) * rows)
                               : -1;
          list.items.push_back(w);
        }
      }
    }
  }
  return list;
}

int64_t item_keys_visible(const WorkItem& w, int group_size, int cta_rows, bool causal) {
  int64_t stop = w.kv_end;
  if (causal) {
    const int64_t rows = int64_t(w.qo_len) * group_size;
    const int64_t last_row = std::min<int64_t>(w.row_begin + cta_rows, rows) - 1;
    stop = std::min<int64_t>(stop, int64_t(w.kv_len) - w.qo_len + 1 + last_row / group_size);
  }
  return std::max<int64_t>(0, stop - w.kv_begin);
}

void order_longest_first(WorkList& list, int group_size, int cta_rows, bool causal) {
  GQ_CHECK(!list.split, "order_longest_first: the split merge expects each request's chunks in order");
  std::stable_sort(list.items.begin(), list.items.end(), [&](const WorkItem& a, const WorkItem& b) {
    if (a.request != b.request) return a.request < b.request;
    if (a.kv_head != b.kv_head) return a.kv_head < b.kv_head;
    return item_keys_visible(a, group_size, cta_rows, causal) > item_keys_visible(b, group_size, cta_rows, causal);
  });
}

}  // namespace gqattn::plan
