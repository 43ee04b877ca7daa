// One benchmark configuration and its result, shared by the CLI (CPU timing) and the GPU runner.
// Layer: bench (host-only). Columns follow ../shared/BENCHMARKS.md "Outputs".
#pragma once

#include <string>
#include <vector>

#include "gqattn/paged_kv.h"
#include "gqattn/tensor.h"
#include "prims/median.h"

namespace gqattn::bench {

// A row of bench/sweeps/<family>.csv:
//   family,dtype,num_qo_heads,num_kv_heads,head_dim,page_size,batch,qo_len,kv_len,causal
// family is decode or prefill; page_size 0 means ragged (contiguous) K/V (prefill only).
// For prefill with qo_len < kv_len the new tokens sit at the end of each request's KV
// (chunked prefill over a cached prefix).
struct BenchCase {
  std::string family = "decode";
  DType dtype = DType::kBF16;
  int num_qo_heads = 32;
  int num_kv_heads = 8;
  int head_dim = 128;
  int page_size = 16;
  int batch = 1;
  int qo_len = 1;
  int kv_len = 1024;
  bool causal = true;
  KVLayout layout = KVLayout::kNHD;
  int max_num_splits = 0;  // the plan's cap on split-KV chunks (0: the planner's choice), not a CSV column
  int fixed_split_size = 0;  // the plan's split-KV chunk in keys (--kv-chunk; 0: the planner's), not a CSV column
  int settle_ms = 0;       // GPU: host sleep before the timed runs (--settle-ms), not a CSV column
  bool cuda_graph = false;  // plan as for a replayed CUDA graph (--cuda-graph), not a CSV column
};

struct Ceilings {
  double read_gbps = 0;    // streaming read bandwidth (decode ceiling)
  double copy_gbps = 0;    // device-to-device copy, read + write bytes
  double gemm_tflops = 0;  // bf16 cuBLAS GEMM 8192^3
};

struct BenchResult {
  double median_us = 0;
  double achieved = 0;        // GB/s for decode, TFLOP/s for prefill
  std::string unit;           // "GB/s" or "TFLOP/s"
  double pct_of_ceiling = 0;  // achieved / (read_gbps or gemm_tflops) * 100
  std::string status = "ok";  // ok, or why it could not run
  std::string plan;           // what the planner chose (GPU: kernel, key chunk, items, CTAs); not a CSV column
};

// Bytes a decode case must move: K + V of every page read, plus Q and O.
double decode_bytes(const BenchCase& c);
// FLOPs of a prefill case: 4 * visible (query, key) pairs * num_qo_heads * head_dim per request;
// causal counts only the visible keys (query i of qo_len sees keys [0, kv_len - qo_len + i]).
double prefill_flops(const BenchCase& c);
// The median of timed repetitions (src/prims/median.h, shared with the read ceiling's timing).
// values must not be empty.
using prims::median_of;

#ifdef GQATTN_WITH_CUDA
// Implemented in bench/gpu_bench.cu.
Ceilings gpu_measure_ceilings();
BenchResult gpu_run_case(const BenchCase& c, const Ceilings& ceilings, int iters);
#endif

}  // namespace gqattn::bench
