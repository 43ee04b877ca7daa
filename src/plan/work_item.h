// The work list that plan() writes into the workspace and the attention kernel reads.
// Layer: src/plan (host-only types, also included by device code; plain data, no methods).
#pragma once

#include <cstdint>

namespace gqattn {

// One CTA's share of the attention: packed query rows [row_begin, row_begin + cta_rows) of one
// request and one K/V head, against keys [kv_begin, kv_end). A packed row r is query token
// r / group_size of the request and query head kv_head * group_size + r % group_size.
struct WorkItem {
  int32_t request;
  int32_t kv_head;
  int32_t row_begin;     // packed row of the request
  int32_t kv_begin;      // first key of this chunk
  int32_t kv_end;        // one past the last key of this chunk
  int32_t qo_begin;      // first query token of the request in q / o
  int32_t qo_len;        // query tokens of the request
  int32_t kv_len;        // keys of the request (for the causal offset)
  int32_t page_begin;    // paged: first entry of the request in kv_page_indices; ragged: kv_indptr[b]
  int32_t partial_base;  // -1: write o directly; else partial row of packed row 0 of this chunk
  int32_t pad0;
  int32_t pad1;
};
static_assert(sizeof(WorkItem) == 48, "WorkItem is read as three 16-byte vectors");

// Per-request merge information for split-KV (read by the merge kernel).
struct MergeRequest {
  int32_t qo_begin;
  int32_t qo_len;
  int32_t num_chunks;    // <= 1: not split, nothing to merge
  int32_t partial_base;  // partial row of (kv head 0, chunk 0, packed row 0)
};

// Workspace header (first bytes of the workspace).
struct PlanHeader {
  int32_t num_work;
  int32_t batch;
  int32_t total_qo;
  int32_t max_splits;  // most chunks of any request: 1 = nothing to merge (a graph's merge exits at once)
  // Work-stealing counters of the persistent sm_90a kernel: the next item to hand out (minus the
  // grid size) and the CTAs that have finished. Zero when planned; the last CTA of a run resets
  // them, so a CUDA-graph replay starts from zero too.
  int32_t next_item;
  int32_t ctas_done;
  int32_t pad[2];
};

}  // namespace gqattn
