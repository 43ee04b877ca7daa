// The CPU backend: the same operations as the GPU kernels, computed in float64 with plain loops.
// Layer: src/cpu (host-only). It is the test oracle and the default when no GPU is present, so it
// favours being obviously right over speed. Callers validate first (src/api/validate.h).
#pragma once

#include "gqattn/attention.h"

namespace gqattn::cpu {

// Attention of every request's new tokens against its keys: for query head h (K/V head
// h / group_size), logits = scale * q.k over the visible keys, softmax in double with the maximum
// subtracted, o = sum p v rounded to o's dtype, lse = natural-log log-sum-exp. A row that sees
// no key gets o = 0 and lse = -inf. Decode is causal among each request's qo_len new tokens;
// prefill is causal when the plan is, aligned to the end of the KV.
void decode(const Plan& plan, const DecodeArgs& args);
void prefill(const Plan& plan, const PrefillArgs& args);

// Copies each new token's K/V rows into its page slot.
void append_kv(const PagedKV& kv, const TensorView& k_new, const TensorView& v_new,
               const TensorView& batch_indices, const TensorView& positions);

// Combines partial (v, lse) states over disjoint key sets; empty states (lse -inf) are skipped.
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_merged,
                  const TensorView& s_merged);

}  // namespace gqattn::cpu
