// The work measures of a benchmark case: bytes a decode must move, FLOPs a prefill must do.
// Layer: bench (host-only); declared in bench_case.h, shared by the CPU timing and the GPU runner.
#include "bench_case.h"


namespace gqattn::bench {

// K and V of every key of every request (kv_len tokens x num_kv_heads x head_dim, each read
// once, which is what a GQA kernel that loads a page once per group achieves), plus Q read and
// O written.
double decode_bytes(const BenchCase& c) {
  const double elem = double(dtype_size(c.dtype));
  const double kv = 2.0 * c.batch * double(c.kv_len) * c.num_kv_heads * c.head_dim * elem;
  const double qo = 2.0 * c.batch * double(c.qo_len) * c.num_qo_heads * c.head_dim * elem;
  return kv + qo;
}

// Two GEMMs (q k^T and p v) of 2 FLOPs per multiply-add: 4 * head_dim per (query, key, head)
// pair. Causal counts the visible pairs, the new tokens at the end of the KV (query i sees keys
// [0, kv_len - qo_len + i]): qo_len * (kv_len - qo_len) + qo_len * (qo_len + 1) / 2, which is
// bench/peers.py's count (bench/README.md "Figures"), so ours / peer is a ratio of times.
double prefill_flops(const BenchCase& c) {
  const double qo = c.qo_len, kv = c.kv_len;
  const double pairs = c.causal ? qo * (kv - qo) + qo * (qo + 1) / 2.0 : qo * kv;
  return 4.0 * c.batch * pairs * c.num_qo_heads * c.head_dim;
}

}  // namespace gqattn::bench
