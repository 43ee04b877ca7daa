// Merging partial attention states: the split-KV merge after a split plan, and the public
// merge_states operation. Both fold (o, lse) pairs through prims::MergeState.
// Layer: src/kernels (kernels + their host launchers).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "api/env_flag.h"
#include "kernels/launch.h"
#include "prims/cuda_check.h"
#include "prims/mma.cuh"
#include "prims/pdl.cuh"
#include "prims/softmax_state.cuh"

namespace gqattn::kernels {
namespace {

constexpr int kMergeWarps = 4;  // merge_states: warps per block, each merging one (n, head) row

template <typename T>
__device__ __forceinline__ T* typed(void* p) {
  return static_cast<T*>(p);
}

// Block widths of the split merge: rows of many chunks get the wide blocks (more chunk lanes),
// plans of few chunks a row the narrow ones (session 9: 256-thread blocks on every plan cost
// MQA batch 32-128, 2-8 chunks a row, 4-10%).
constexpr int kSplitMergeThreads = 128;
constexpr int kSplitMergeWideThreads = 256;
constexpr int kSplitMergeWideFrom = 32;  // chunks of one request
// From this many chunks a request, 1024 threads (32 lanes at head_dim 128, half the batch below):
// one round trip for up to 128 chunks (perf-notes item 272: a row of 256 chunks 5.4 us after the
// wait at 256 threads, 4.4 at 1024). Only after the families whose merge is a programmatic launch:
// after the wgmma kernel, whose CTA takes a whole register file, the 1024-thread blocks found
// room on its idle SMs for 8 of 32 rows only and the rest started as its CTAs left (32 / 1 heads
// x 32K keys x 4 tokens: +0.3 us).
constexpr int kSplitMergeWidestThreads = 1024;
constexpr int kSplitMergeWidestFrom = 128;
// Chunks whose loads a thread of the block kernels issues together (merge_chunks): with 8 chunk
// lanes at head_dim 128, a wide block keeps 64 chunks' loads outstanding, so a row of a few
// hundred chunks takes a few L2 round trips.
constexpr int kSplitMergeUnroll = 8;
// Plans of at most this many chunks a request take split_merge_rows_kernel: a team of head_dim / 4
// threads a row loads every chunk at once (perf-notes item 147).
constexpr int kSplitMergeRowsMaxChunks = 8;
// Chunks whose loads a thread issues together: a row of <= 4 chunks in the small batch, at 16 blocks
// an SM (<= 64 registers), one of 5-8 in the large one, at 8 (it spilled at 64 registers); each
// row's chunks are then one round trip (perf-notes item 272: two batches of 4 took ~0.2 us more).
constexpr int kSplitMergeRowsSmallBatch = 4;
constexpr int kSplitMergeRowsBatch = kSplitMergeRowsMaxChunks;
// Small blocks (two rows at head_dim 128) spread a plan of a few hundred rows over most SMs; 16
// resident an SM (<= 64 registers a thread) hold 32 rows an SM, so 4,096 rows fit one wave of the
// H200's 132 SMs. (256-thread blocks, 8 rows, lost 2-4% on plans of 32-256 rows: item 147.)
constexpr int kSplitMergeRowsThreads = 64;
constexpr int kSplitMergeRowsBlocksPerSm = 16;  // at the small batch; half of it at the large

// Folds lane state (m2, d2, acc2) into (m, d, acc): both normalised to the larger max.
__device__ __forceinline__ void combine_partial(prims::MergeState& st, float4& acc, const prims::MergeState& other,
                                                const float4& other_acc) {
  const float m_new = fmaxf(st.m, other.m);
  if (m_new == prims::kNegInf) return;
  const float a = prims::rescale_factor(st.m, m_new), b = prims::rescale_factor(other.m, m_new);
  acc.x = acc.x * a + other_acc.x * b;
  acc.y = acc.y * a + other_acc.y * b;
  acc.z = acc.z * a + other_acc.z * b;
  acc.w = acc.w * a + other_acc.w * b;
  st.combine(other);
}

// Where a (query token, query head) row's partial rows lie: the first (chunk 0) and the distance
// between chunks, for a request that was split.
struct SplitRow {
  int64_t first = 0, stride = 0;
  int num_chunks = 0;
};

// What the merge of a row reads before anything else: the plan header's batch and max_splits and
// a first guess of the token's request. Where the requests have equal query lengths (every decode
// plan) the token lies in request token / (total_qo / batch) of the host's plan. All three loads
// issue before any is used: one round trip, where the header, then a binary search over the
// requests (a round trip a step), took 2 + log2(batch).
struct RowLookup {
  int batch = 0, max_splits = 0, guess = 0;
  MergeRequest req;
};

// A 16-byte global load that stays where it is written (asm volatile): the compiler would sink a
// plain load below the branches after it, behind the header's round trip.
__device__ __forceinline__ int4 load_v4_now(const void* ptr) {
  int4 v;
  asm volatile("ld.volatile.global.v4.s32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

__device__ __forceinline__ RowLookup start_lookup(const SplitMergeParams& p, int token) {
  static_assert(offsetof(PlanHeader, batch) == 4 && offsetof(PlanHeader, max_splits) == 12,
                "the header's first 16 bytes are read as one vector");
  static_assert(sizeof(MergeRequest) == 16 && offsetof(MergeRequest, qo_len) == 4 &&
                    offsetof(MergeRequest, num_chunks) == 8 && offsetof(MergeRequest, partial_base) == 12,
                "a merge request is read as one vector");
  RowLookup l;
  const int4 h = load_v4_now(p.header);
  l.guess = max(min(static_cast<int>(p.per_request.div(static_cast<uint32_t>(token))), p.batch - 1), 0);  // < the host plan's batch
  const int4 q = load_v4_now(p.requests + l.guess);
  l.batch = h.y;
  l.max_splits = h.w;
  l.req.qo_begin = q.x;
  l.req.qo_len = q.y;
  l.req.num_chunks = q.z;
  l.req.partial_base = q.w;
  return l;
}

// Finds the token's request (requests are sorted by qo_begin: the last one starting at or before
// token), by the guess where it holds, else by binary search (varlen plans, and a CUDA graph's
// replay of a plan other than the captured one); false when that request was not split or the
// token is past the batch.
__device__ __forceinline__ bool locate_split_row(const SplitMergeParams& p, const RowLookup& l, int token, int head,
                                                 SplitRow& r) {
  int lo = l.guess;
  MergeRequest req = l.req;
  if (lo >= l.batch || req.qo_begin > token || token >= req.qo_begin + req.qo_len) {
    lo = 0;
    int hi = l.batch - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (p.requests[mid].qo_begin <= token) lo = mid; else hi = mid - 1;
    }
    req = p.requests[lo];
  }
  if (req.num_chunks <= 1 || token >= req.qo_begin + req.qo_len) return false;
  const int group = static_cast<int>(p.group.divisor);
  r.stride = static_cast<int64_t>(req.qo_len) * group;
  const int64_t packed = static_cast<int64_t>(token - req.qo_begin) * group + head % group;
  r.first = req.partial_base + static_cast<int64_t>(head / group) * req.num_chunks * r.stride + packed;
  r.num_chunks = req.num_chunks;
  return true;
}

// Writes a merged row's float4 column group cg (normalised) and, from column group 0, its LSE.
template <typename T>
__device__ __forceinline__ void store_merged_row(const SplitMergeParams& p, int token, int head, int cg,
                                                 const prims::MergeState& st, const float4& acc) {
  const float inv = st.inv_sum();
  T* out = typed<T>(p.o) + token * p.o_stride_n + head * p.o_stride_h + cg * 4;
  out[0] = prims::from_float<T>(acc.x * inv);
  out[1] = prims::from_float<T>(acc.y * inv);
  out[2] = prims::from_float<T>(acc.z * inv);
  out[3] = prims::from_float<T>(acc.w * inv);
  if (p.lse != nullptr && cg == 0) p.lse[static_cast<int64_t>(token) * p.num_qo_heads + head] = st.lse2() * prims::kLn2;
}

// Folds chunks first_chunk, first_chunk + step, ... (< r.num_chunks) of a row's float4 column group
// cg into (st, acc), kBatch chunks at a time: each batch's O pieces and LSEs are loaded before any
// is merged, so a batch costs one L2 round trip (a loop that merged each chunk as it loaded it,
// with a branch for empty chunks, kept one or two loads in flight: perf-notes item 149).
template <int kBatch>
__device__ __forceinline__ void merge_chunks(const SplitMergeParams& p, const SplitRow& r, int cg, int first_chunk,
                                             int step, prims::MergeState& st, float4& acc) {
  for (int c0 = first_chunk; c0 < r.num_chunks; c0 += kBatch * step) {
    float4 o[kBatch];
    float lse[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int c = c0 + i * step;
      const int64_t prow = r.first + c * r.stride;
      const bool valid = c < r.num_chunks;
      o[i] = valid ? reinterpret_cast<const float4*>(p.partial_o + prow * p.head_dim)[cg] : make_float4(0.f, 0.f, 0.f, 0.f);
      lse[i] = valid ? p.partial_lse[prow] : prims::kNegInf;
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      float scale, w;
      st.add(lse[i], scale, w);
      // An empty chunk (w = 0) leaves its O row out of the sum (it may hold anything).
      acc.x = acc.x * scale + (w != 0.f ? w * o[i].x : 0.f);
      acc.y = acc.y * scale + (w != 0.f ? w * o[i].y : 0.f);
      acc.z = acc.z * scale + (w != 0.f ? w * o[i].z : 0.f);
      acc.w = acc.w * scale + (w != 0.f ? w * o[i].w : 0.f);
    }
  }
}

// A programmatic launch lets a merge grid start, and so end, before the attention grid does; the work
// after it on the stream or in the graph waits only for the merge grid. A plan that split nothing leaves
// no block a split row to wait for, so block 0 waits here: the grid still ends after the attention
// grid, whose rows o the next kernel may read. (With split rows, their blocks wait.)
__device__ __forceinline__ void unsplit_wait() {
  if (blockIdx.x == 0) prims::grid_dependency_wait();
}

// One block per (query token, query head): finds the token's request, and if that request was
// split, merges its chunks' partial rows into o / lse. Thread t takes float4 column group
// t % (head_dim / 4) of chunks t / (head_dim / 4), t / (head_dim / 4) + lanes, ..., merging them
// online (its own max, sum and weighted sum: each chunk's LSE and O row load together, no pass
// over the LSEs first, merge_chunks), so a block has lanes x kSplitMergeUnroll chunk loads in flight; the
// lanes' states are then combined through shared memory, in a tree. kThreads: kSplitMergeThreads
// or, for plans of many chunks a row, a wide width (launch_split_merge). (ncu on the H200, session 1: one warp
// per row spent 30 us merging 32 chunks; session 9: a two-pass merge with 4 lanes cost ~45 ns a
// chunk a row, MQA batch 1 x 32K in 128-key chunks 0.80x of 256-key ones.)
template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads) split_merge_kernel(const SplitMergeParams p) {
  const int token = blockIdx.x / p.num_qo_heads;
  const int head = blockIdx.x % p.num_qo_heads;
  const RowLookup l = start_lookup(p, token);
  // A CUDA graph launches this kernel after every run; a plan that split nothing ends it here,
  // once the attention grid is done (unsplit_wait).
  if (l.max_splits <= 1) {
    unsplit_wait();
    return;
  }
  SplitRow r;
  if (!locate_split_row(p, l, token, head, r)) return;  // uniform per block
  // Launched programmatically on sm_90 (launch_programmatic): the attention kernel may still run.
  // The plan's header and requests were written before it started, so the lookup above ran
  // meanwhile; its partial rows are read only after it completes.
  prims::grid_dependency_wait();

  const int col_groups = p.head_dim / 4;
  const int lanes = kThreads / col_groups;  // threads past lanes x col_groups (head_dim 80, 96, 112) idle
  const int cg = threadIdx.x % col_groups;
  const int cl = threadIdx.x / col_groups;
  prims::MergeState st;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  // At 1024 threads (<= 64 registers) a batch of 8 spilled: 4 there.
  constexpr int kBatch = kThreads < kSplitMergeWidestThreads ? kSplitMergeUnroll : kSplitMergeUnroll / 2;
  if (cl < lanes) merge_chunks<kBatch>(p, r, cg, cl, lanes, st, acc);
  __shared__ float4 lane_acc[kThreads];
  __shared__ float lane_m[kThreads], lane_d[kThreads];
  lane_acc[threadIdx.x] = acc;
  lane_m[threadIdx.x] = st.m;
  lane_d[threadIdx.x] = st.d;
  // The lanes' states meet in a tree: lane l takes lane l + stride's, stride halving, so a row of
  // L lanes waits for log2(L) folds, not L - 1 (one warp folding them in turn took 0.4-0.6 us at
  // 4-8 lanes, 1.3 us at 32: perf-notes item 272).
  int stride = 1;
  while (stride * 2 < lanes) stride *= 2;
  for (; stride >= 1; stride >>= 1) {
    __syncthreads();
    if (cl < stride && cl + stride < lanes) {
      const int t = (cl + stride) * col_groups + cg;
      prims::MergeState other;
      other.m = lane_m[t];
      other.d = lane_d[t];
      combine_partial(st, acc, other, lane_acc[t]);
      if (stride > 1) {
        lane_acc[threadIdx.x] = acc;
        lane_m[threadIdx.x] = st.m;
        lane_d[threadIdx.x] = st.d;
      }
    }
  }
  if (cl == 0) store_merged_row<T>(p, token, head, cg, st, acc);
}

// Rows of few chunks (plans of <= kSplitMergeRowsMaxChunks a request): a team of head_dim / 4
// threads a (query token, query head) row, kThreads / team rows a block. Each thread loads its
// float4 column group of up to kSplitMergeRowsMaxChunks chunks (and their LSEs) before merging
// any, so a row takes one L2 round trip, and no lane states meet in shared memory. The block-per-
// row kernel above spent 128 threads and two waves of blocks on 4,096 rows of 4 chunks.
template <typename T, int kThreads, int kBatch>
__global__ void __launch_bounds__(kThreads, kBatch == kSplitMergeRowsSmallBatch ? kSplitMergeRowsBlocksPerSm : kSplitMergeRowsBlocksPerSm / 2)
    split_merge_rows_kernel(const SplitMergeParams p) {
  const int team = p.head_dim / 4;
  // Threads past the block's whole teams (head_dim 80, 96, 112) take no row.
  if (static_cast<int>(threadIdx.x) >= kThreads / team * team) return;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / team) + threadIdx.x / team;
  const int token = static_cast<int>(row / p.num_qo_heads);
  const int head = static_cast<int>(row % p.num_qo_heads);
  const RowLookup l = start_lookup(p, token);
  if (l.max_splits <= 1) {
    unsplit_wait();
    return;
  }
  if (row >= static_cast<int64_t>(p.total_qo) * p.num_qo_heads) return;
  SplitRow r;
  if (!locate_split_row(p, l, token, head, r)) return;
  prims::grid_dependency_wait();  // as in split_merge_kernel: the lookup needs only the plan
  const int cg = threadIdx.x % team;
  prims::MergeState st;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  merge_chunks<kBatch>(p, r, cg, 0, 1, st, acc);
  store_merged_row<T>(p, token, head, cg, st, acc);
}

// A warp per (n, head) row, rows in int64 (n x num_heads may pass 2^31 at small head_dim), over a
// grid capped at gridDim.x's limit (warps loop past it).
template <typename TIn, typename TOut>
__global__ void merge_states_kernel(const MergeStatesParams p) {
  const int64_t rows = p.n * p.num_heads;
  const int lane = threadIdx.x % 32;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kMergeWarps + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kMergeWarps) {
    const int64_t n = row / p.num_heads;
    const int h = static_cast<int>(row % p.num_heads);
    const TIn* v = static_cast<const TIn*>(p.v) + n * p.v_stride_n + h * p.v_stride_h;
    const float* s = p.s + n * p.s_stride_n + h * p.s_stride_h;
    TOut* out = static_cast<TOut*>(p.v_out) + n * p.out_stride_n + h * p.out_stride_h;
    // Pass 1: the merged max and sum; pass 2: the weighted sum of the states, column by column.
    const prims::MergeState state = prims::warp_merge_lse(s, p.s_stride_s, p.num_states, prims::kLog2e);
    const float inv = state.inv_sum();
    for (int col = lane; col < p.head_dim; col += 32) {
      float acc = 0.f;
      for (int st = 0; st < p.num_states; ++st) {
        const float weight = prims::merge_weight(state, s[st * p.s_stride_s] * prims::kLog2e);
        if (weight != 0.f) acc += weight * prims::to_float(v[st * p.v_stride_s + col]);
      }
      out[col] = prims::from_float<TOut>(acc * inv);
    }
    if (p.s_out != nullptr && lane == 0) p.s_out[n * p.s_out_stride_n + h * p.s_out_stride_h] = state.lse2() * prims::kLn2;
  }
}

template <typename TIn>
void launch_merge_states_from(const MergeStatesParams& p, dim3 grid, dim3 block, cudaStream_t stream) {
  switch (p.out_dtype) {
    case DType::kBF16: merge_states_kernel<TIn, __nv_bfloat16><<<grid, block, 0, stream>>>(p); break;
    case DType::kFP16: merge_states_kernel<TIn, __half><<<grid, block, 0, stream>>>(p); break;
    case DType::kFP32: merge_states_kernel<TIn, float><<<grid, block, 0, stream>>>(p); break;
    default: throw Error("merge_states: v_merged must be bf16, fp16 or fp32");
  }
}

// Launches `kernel` after the stream's previous kernel with programmatic stream serialization
// when `programmatic`: its CTAs may be scheduled once every CTA of the previous kernel has called
// prims::grid_allow_dependents, and wait in prims::grid_dependency_wait (a graph captures the
// edge as a programmatic dependency). Otherwise an ordinary launch.
template <typename... Args>
void launch_programmatic(bool programmatic, void (*kernel)(Args...), dim3 grid, dim3 block, cudaStream_t s,
                         Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = programmatic ? 1 : 0;
  GQ_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

template <int kThreads>
void launch_split_merge_width(DType dtype, const SplitMergeParams& params, dim3 grid, cudaStream_t s) {
  if (dtype == DType::kBF16) {
    launch_programmatic(params.programmatic != 0, split_merge_kernel<__nv_bfloat16, kThreads>, grid, dim3(kThreads), s, params);
  } else {
    launch_programmatic(params.programmatic != 0, split_merge_kernel<__half, kThreads>, grid, dim3(kThreads), s, params);
  }
}

// GQATTN_DISABLE_SPLIT_MERGE_ROWS=1: every plan takes the block-per-row kernels (the A/B of item 147).
bool split_merge_rows_disabled() {
  static const bool disabled = env_flag("GQATTN_DISABLE_SPLIT_MERGE_ROWS");  // read once per process
  return disabled;
}

void launch_split_merge_rows(DType dtype, const SplitMergeParams& params, int64_t rows, cudaStream_t s) {
  constexpr int kThreads = kSplitMergeRowsThreads;
  const int64_t rows_per_block = kThreads / (params.head_dim / 4);
  const dim3 grid(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block));
  const bool small = params.max_splits <= kSplitMergeRowsSmallBatch;
  if (dtype == DType::kBF16) {
    launch_programmatic(params.programmatic != 0,
                        small ? split_merge_rows_kernel<__nv_bfloat16, kThreads, kSplitMergeRowsSmallBatch>
                              : split_merge_rows_kernel<__nv_bfloat16, kThreads, kSplitMergeRowsBatch>,
                        grid, dim3(kThreads), s, params);
  } else {
    launch_programmatic(params.programmatic != 0,
                        small ? split_merge_rows_kernel<__half, kThreads, kSplitMergeRowsSmallBatch>
                              : split_merge_rows_kernel<__half, kThreads, kSplitMergeRowsBatch>,
                        grid, dim3(kThreads), s, params);
  }
}

}  // namespace

bool split_merge_waits_for_attention() {
  // Per device, once: bit d of `known` says that bit d of `waits` holds device d's answer.
  static std::atomic<uint64_t> known{0}, waits{0};
  int device = 0;
  GQ_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t(1) << (device & 63);
  if (known.load(std::memory_order_acquire) & bit) return (waits.load(std::memory_order_relaxed) & bit) != 0;
  // Every merge kernel of this file comes from the same image of its module: one stands for all.
  cudaFuncAttributes attr{};
  GQ_CUDA_CHECK(cudaFuncGetAttributes(&attr, split_merge_rows_kernel<__nv_bfloat16, kSplitMergeRowsThreads, kSplitMergeRowsSmallBatch>));
  if (attr.ptxVersion >= 90) waits.fetch_or(bit, std::memory_order_relaxed);
  known.fetch_or(bit, std::memory_order_acq_rel);
  return attr.ptxVersion >= 90;
}

void launch_split_merge(DType dtype, const SplitMergeParams& params, void* stream) {
  const int64_t rows = static_cast<int64_t>(params.total_qo) * params.num_qo_heads;
  if (rows == 0) return;
  GQ_CHECK(params.head_dim % 4 == 0 && params.head_dim / 4 <= kSplitMergeThreads,
           "split merge: head_dim ", params.head_dim, " must be a multiple of 4, at most ", 4 * kSplitMergeThreads);
  const dim3 grid(static_cast<unsigned>(rows));
  auto s = static_cast<cudaStream_t>(stream);
  // A graph replays the kernel it captured: each is correct for any plan, tuned for the captured
  // one's chunks a request.
  if (params.max_splits <= kSplitMergeRowsMaxChunks && params.head_dim / 4 <= kSplitMergeRowsThreads &&
      !split_merge_rows_disabled()) {
    launch_split_merge_rows(dtype, params, rows, s);
  } else if (params.max_splits >= kSplitMergeWidestFrom && params.programmatic != 0) {
    launch_split_merge_width<kSplitMergeWidestThreads>(dtype, params, grid, s);
  } else if (params.max_splits >= kSplitMergeWideFrom) {
    launch_split_merge_width<kSplitMergeWideThreads>(dtype, params, grid, s);
  } else {
    launch_split_merge_width<kSplitMergeThreads>(dtype, params, grid, s);
  }
  GQ_CUDA_CHECK(cudaGetLastError());
}

void launch_merge_states(const MergeStatesParams& p, void* stream) {
  const int64_t rows = p.n * p.num_heads;
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((rows + kMergeWarps - 1) / kMergeWarps, INT32_MAX)));
  const dim3 block(32 * kMergeWarps);
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.v_dtype) {
    case DType::kBF16: launch_merge_states_from<__nv_bfloat16>(p, grid, block, s); break;
    case DType::kFP16: launch_merge_states_from<__half>(p, grid, block, s); break;
    case DType::kFP32: launch_merge_states_from<float>(p, grid, block, s); break;
    default: throw Error("merge_states: v must be bf16, fp16 or fp32");
  }
  GQ_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gqattn::kernels
