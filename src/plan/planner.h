// The planner: pure host functions that turn a batch's lengths into a work list.
// Layer: src/plan (host-only). Unit-tested on the CPU; the CUDA backend uploads what they return.
#pragma once

#include <cstdint>
#include <vector>

#include "gqattn/attention.h"
#include "plan/work_item.h"

namespace gqattn::plan {

// Fills the backend-independent fields of a plan from validated inputs: dims, dtype, batch,
// total_qo, host copies of qo_indptr (decode: built from qo_len) and kv_len.
Plan describe(const PlanInputs& inputs, bool is_decode);

// The split's fixed cost (the merge's launch, the partial rows' write and read) in keys one CTA of
// the mma.sync kernels streams; the wgmma kernel's is its own (KernelChoice::merge_fixed_keys).
inline constexpr double kMergeFixedKeys = 64;

// How many tokens each split-KV chunk holds, or 0 for no split.
//   kv_len:     keys of each request; row_tiles: row tiles of each request (0: no item, its keys
//               ignored); the items without splitting are row tiles x num_kv_heads summed
//   target_ctas: CTAs that fill the GPU (SMs x resident CTAs per SM)
//   kv_tile:    keys per pipeline tile; chunks are whole tiles
//   min_chunk:  a chunk never holds fewer keys than this (the merge must stay cheap)
//   max_splits: most chunks per request (0: no cap; 1: no split)
//   merge_rows: rows the split merge covers (query tokens x query heads), scaled to this kernel's
//               time per key
//   merge_fixed_keys: the split's fixed cost (the merge's launch, the partial rows' write and
//               read) in keys of this kernel (KernelChoice::merge_fixed_keys)
//   split_full: also score splits where the unsplit items already fill target_ctas (a partial last
//               wave: decode, whose items of a request are equally long), where the requests'
//               lengths are within 7/8 of each other; false keeps such plans unsplit (prefill, whose
//               causal items differ in length, so the longest-item model overstates the last wave)
//   max_items:  no chunk whose items (row tiles x num_kv_heads x chunks) pass this is chosen (the
//               backend's work-list limit): a full GPU's split multiplies thousands of items
// Picks the chunk by a small cost model (whole waves of the longest item, plus the merge when
// split); docs/perf-notes.md, "Split-KV heuristic".
int choose_kv_chunk(const std::vector<int32_t>& kv_len, const std::vector<int32_t>& row_tiles,
                    int num_kv_heads, int target_ctas, int kv_tile, int min_chunk, int max_splits,
                    double merge_rows = 0, double merge_fixed_keys = kMergeFixedKeys, bool split_full = false,
                    int64_t max_items = INT64_MAX);

// The chunk of PlanInputs::fixed_split_size: fixed_keys rounded up to kv_tile, or 0 (no split)
// where that chunk holds the longest request with query rows (row_tiles > 0) whole. Throws an
// Error naming fixed_split_size where the chunks make more than max_items items, before any work
// list is built (a chunk of one tile over millions of keys would be millions of items).
int fixed_kv_chunk(const std::vector<int32_t>& kv_len, const std::vector<int32_t>& row_tiles, int num_kv_heads,
                   int fixed_keys, int kv_tile, int64_t max_items = INT64_MAX);

struct WorkList {
  std::vector<WorkItem> items;
  std::vector<MergeRequest> requests;
  int64_t partial_rows = 0;  // fp32 partial rows needed
  int max_splits = 1;
  bool split = false;
};

// Builds the work list for a plan whose kernel processes `cta_rows` packed rows per CTA.
// kv_indptr is the plan input's (page indptr for paged, token indptr for ragged).
WorkList build_work_list(const Plan& plan, const std::vector<int32_t>& kv_indptr, int cta_rows,
                         int kv_chunk);

// Keys that the rows [row_begin, row_begin + cta_rows) of an item see (the causal mask aligned
// to the end of the request's keys), i.e. the item's work.
int64_t item_keys_visible(const WorkItem& w, int group_size, int cta_rows, bool causal);

// Reorders an unsplit work list so that within each (request, K/V head) the items come longest
// first (stable); requests and heads keep their order. For a persistent grid whose CTAs take
// items in list order: CTAs running at the same time share one head's K/V in L2 (a global
// longest-first order measured up to 12% slower for causal MHA), and each head's short causal
// row tiles fill the gaps at its end.
void order_longest_first(WorkList& list, int group_size, int cta_rows, bool causal);

}  // namespace gqattn::plan
