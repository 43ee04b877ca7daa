// The GPU side of gqattn-bench: the ceilings (streaming read, device copy, cuBLAS bf16 GEMM) and
// timing of one decode or prefill case through the public plan/run API.
// Layer: bench. Timing per ../shared/BENCHMARKS.md: random data, random page tables over a larger
// pool, buffer sets rotated past the L2, CUDA-graph replays timed with events (each after a 200 us
// spin kernel, as the peers), median of reps.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "api/env_flag.h"
#include "bench_case.h"
#include "gqattn/attention.h"
#include "gqattn/error.h"
#include "kernels/launch.h"
#include "prims/counter_random.h"
#include "prims/cuda_check.h"

namespace gqattn::bench {
namespace {

constexpr size_t kL2RotateBytes = size_t(240) << 20;  // 4x the H200's 60 MB L2
constexpr int kMaxSets = 8;
constexpr size_t kL2FlushBytes = size_t(256) << 20;  // read before each call where the sets stay under kL2RotateBytes
constexpr int kCeilingReps = 30;  // BENCHMARKS.md: medians of >= 30 repetitions

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<void, CudaFree>;
DeviceBuffer alloc(size_t bytes) {
  void* p = nullptr;
  GQ_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  return DeviceBuffer(p);
}

__global__ void fill_random_kernel(uint16_t* data, size_t n, uint64_t seed, bool fp16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t x = prims::random_bits(seed, 0, i);
    const float u = static_cast<float>(x >> 40) / static_cast<float>(1ull << 24) * 2.f - 1.f;  // [-1, 1)
    const float val = u == 0.f ? 0.5f : u;
    if (fp16) {
      __half h = __float2half_rn(val);
      data[i] = *reinterpret_cast<uint16_t*>(&h);
    } else {
      __nv_bfloat16 b = __float2bfloat16_rn(val);
      data[i] = *reinterpret_cast<uint16_t*>(&b);
    }
  }
}

// Holds the stream for `cycles` clock cycles: launched before a timed replay's start event, it lets
// the host enqueue the event and the graph while the GPU is busy, so the time measured is the
// GPU's, not the launch latency of an idle device (bench/peers.py times its peers the same way,
// with torch.cuda._sleep for 200 us).
__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// 200 us of the SM clock, or 0 with GQATTN_BENCH_NO_SPIN set (the timing of sessions 1-7).
long long spin_cycles() {
  static const long long cycles = [] {
    if (env_flag("GQATTN_BENCH_NO_SPIN")) return 0LL;
    int device = 0, khz = 0;
    GQ_CUDA_CHECK(cudaGetDevice(&device));
    GQ_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
    constexpr long long kSpinUs = 200;
    return kSpinUs * khz / 1000;
  }();
  return cycles;
}

void fill_random(void* p, size_t elems, uint64_t seed, DType dtype) {
  fill_random_kernel<<<1024, 256>>>(static_cast<uint16_t*>(p), elems, seed, dtype == DType::kFP16);
  GQ_CUDA_CHECK(cudaGetLastError());
}

template <typename Fn>
double median_us(Fn&& fn, int iters) {
  cudaEvent_t start, stop;
  GQ_CUDA_CHECK(cudaEventCreate(&start));
  GQ_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) fn(i);
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    GQ_CUDA_CHECK(cudaEventRecord(start));
    fn(i);
    GQ_CUDA_CHECK(cudaEventRecord(stop));
    GQ_CUDA_CHECK(cudaEventSynchronize(stop));
    GQ_CUDA_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
  }
  GQ_CUDA_CHECK(cudaEventDestroy(start));
  GQ_CUDA_CHECK(cudaEventDestroy(stop));
  return median_of(std::vector<double>(ms.begin(), ms.end())) * 1e3;
}

void check_cublas(cublasStatus_t s, const char* what) {
  GQ_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLAS error ", static_cast<int>(s), " in ", what);
}

// Every case's buffers come from one device allocation made at the first case and kept for the
// process, as a serving engine allocates its K/V pool once. Allocating and freeing per case made
// the same case up to 12% slower late in a sweep than alone (docs/perf-notes.md, item 15): where a
// fresh allocation lands depends on what was allocated and freed before, and the random page
// tables of paged K/V are sensitive to it.
class Arena {
 public:
  // Space for one case: every take() after reset() is carved from the start of the allocation.
  void reset() { used_ = 0; }
  void* take(size_t bytes) {
    if (base_ == nullptr) {
      size_t free_bytes = 0, total_bytes = 0;
      GQ_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
      const size_t keep = size_t(6) << 30;  // for cuBLAS, graphs and the driver
      GQ_CHECK(free_bytes > keep + kAlign, "gqattn-bench: only ", free_bytes, " bytes of device memory free");
      capacity_ = (free_bytes - keep) / kAlign * kAlign;
      // GQATTN_BENCH_ARENA_GIB caps it: ncu's kernel replay saves and restores the memory a kernel
      // can reach, and fails on an allocation of the whole card (scripts/ncu_decode.sh sets it).
      if (const char* cap = std::getenv("GQATTN_BENCH_ARENA_GIB"); cap != nullptr && *cap != '\0') {
        char* end = nullptr;
        const long gib = std::strtol(cap, &end, 10);
        GQ_CHECK(*end == '\0' && gib > 0, "GQATTN_BENCH_ARENA_GIB: expected a positive number of GiB, got '",
                 cap, "'");
        capacity_ = std::min(capacity_, size_t(gib) << 30);
      }
      GQ_CUDA_CHECK(cudaMalloc(&base_, capacity_));
    }
    const size_t size = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    GQ_CHECK(used_ + size <= capacity_, "gqattn-bench: the case needs more than the ", capacity_,
             " bytes of device memory the bench holds");
    void* p = static_cast<char*>(base_) + used_;
    used_ += size;
    return p;
  }

 private:
  static constexpr size_t kAlign = size_t(2) << 20;
  void* base_ = nullptr;  // freed when the process exits
  size_t capacity_ = 0, used_ = 0;
};
Arena& case_arena() {
  static Arena arena;
  return arena;
}

// One buffer set of a case: pools (or ragged K/V), page table, q, o, and the captured run.
struct CaseSet {
  void *k = nullptr, *v = nullptr, *q = nullptr, *o = nullptr, *indptr = nullptr, *indices = nullptr, *last = nullptr,
       *qo_indptr = nullptr;
  cudaGraphExec_t exec = nullptr;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Ceilings gpu_measure_ceilings() {
  Ceilings c;
  const size_t read_bytes = size_t(4) << 30;
  c.read_gbps = kernels::measure_read_bandwidth_gbps(read_bytes, kCeilingReps, nullptr);
  DeviceBuffer buf = alloc(read_bytes);
  fill_random(buf.get(), read_bytes / 2, 1, DType::kBF16);

  const size_t copy_bytes = size_t(2) << 30;
  DeviceBuffer dst = alloc(copy_bytes);
  const double copy_us =
      median_us([&](int) { GQ_CUDA_CHECK(cudaMemcpyAsync(dst.get(), buf.get(), copy_bytes, cudaMemcpyDeviceToDevice)); }, kCeilingReps);
  c.copy_gbps = 2.0 * copy_bytes / copy_us * 1e-3;
  dst.reset();
  buf.reset();

  const int n = 8192;
  DeviceBuffer a = alloc(size_t(n) * n * 2), b = alloc(size_t(n) * n * 2), d = alloc(size_t(n) * n * 2);
  fill_random(a.get(), size_t(n) * n, 2, DType::kBF16);
  fill_random(b.get(), size_t(n) * n, 3, DType::kBF16);
  cublasHandle_t handle;
  check_cublas(cublasCreate(&handle), "cublasCreate");
  const float alpha = 1.f, beta = 0.f;
  const double gemm_us = median_us(
      [&](int) {
        check_cublas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n, b.get(),
                                  CUDA_R_16BF, n, &beta, d.get(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
      },
      kCeilingReps);
  check_cublas(cublasDestroy(handle), "cublasDestroy");
  c.gemm_tflops = 2.0 * n * n * double(n) / gemm_us * 1e-6;
  GQ_CUDA_CHECK(cudaDeviceSynchronize());
  return c;
}

BenchResult gpu_run_case(const BenchCase& c, const Ceilings& ceilings, int iters) {
  const bool decode = c.family == "decode";
  const bool paged = c.page_size > 0;
  const int qo_len = c.qo_len;
  const int64_t kv_total_tokens = int64_t(c.batch) * c.kv_len;
  const size_t elem = 2;
  const size_t kv_bytes_one = size_t(kv_total_tokens) * c.num_kv_heads * c.head_dim * elem * 2;
  const size_t q_bytes = size_t(c.batch) * qo_len * c.num_qo_heads * c.head_dim * elem;
  const int sets = static_cast<int>(std::min<size_t>(kMaxSets, std::max<size_t>(1, ceil_div(kL2RotateBytes, kv_bytes_one + 2 * q_bytes))));
  // Where kMaxSets sets stay under kL2RotateBytes (decode rows of up to ~30 MB), the sets alone would
  // leave the next call's K/V in the L2: a read of kL2FlushBytes before each call evicts them, as
  // peers.py does for the peers (BENCHMARKS.md: the L2 never holds the working set).
  // GQATTN_BENCH_NO_L2_FLUSH=1: without it (the timing before session 71).
  static const bool no_l2_flush = env_flag("GQATTN_BENCH_NO_L2_FLUSH");
  const bool flush_l2 = !no_l2_flush && size_t(sets) * (kv_bytes_one + 2 * q_bytes) < kL2RotateBytes;

  cudaStream_t stream;
  GQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Arena& arena = case_arena();
  arena.reset();
  void* workspace = arena.take(kRecommendedWorkspaceBytes);

  // Lengths and the plan (identical for every set: only addresses differ).
  const int page_size = paged ? c.page_size : 1;
  const int64_t pages_per_req = ceil_div(c.kv_len, page_size);
  const int64_t pages_needed = pages_per_req * c.batch;
  const int64_t pool_pages = pages_needed + pages_needed / 8 + 1;  // random pages from a larger pool
  std::vector<int32_t> kv_indptr(c.batch + 1), last(c.batch), qo_indptr(c.batch + 1);
  for (int b = 0; b <= c.batch; ++b) {
    kv_indptr[b] = static_cast<int32_t>(paged ? b * pages_per_req : int64_t(b) * c.kv_len);
    qo_indptr[b] = b * qo_len;
  }
  for (int b = 0; b < c.batch; ++b) last[b] = static_cast<int32_t>(c.kv_len - (pages_per_req - 1) * page_size);
  PlanInputs in;
  in.device = Device::kCUDA;
  in.dtype = c.dtype;
  in.num_qo_heads = c.num_qo_heads;
  in.num_kv_heads = c.num_kv_heads;
  in.head_dim = c.head_dim;
  in.page_size = paged ? c.page_size : 0;
  in.causal = c.causal;
  in.max_num_splits = c.max_num_splits;
  in.fixed_split_size = c.fixed_split_size;
  // --cuda-graph: the plan the engine's captured decode steps make (a fixed grid, kernels chosen
  // from the batch alone, the merge only where this plan splits).
  in.enable_cuda_graph = c.cuda_graph;
  in.graph_per_split = c.cuda_graph;
  in.kv_indptr = kv_indptr;
  if (paged) in.kv_last_page_len = last;
  if (decode) in.qo_len = qo_len; else in.qo_indptr = qo_indptr;
  const Plan plan = decode ? decode_plan(in, {workspace, kRecommendedWorkspaceBytes}, stream)
                           : prefill_plan(in, {workspace, kRecommendedWorkspaceBytes}, stream);

  std::vector<CaseSet> set(sets);
  std::mt19937_64 rng(1234);
  static const bool pages_in_order = env_flag("GQATTN_BENCH_PAGES_IN_ORDER");
  for (int s = 0; s < sets; ++s) {
    CaseSet& cs = set[s];
    const int64_t pool_tokens = paged ? pool_pages * page_size : kv_total_tokens;
    const size_t kv_elems = size_t(pool_tokens) * c.num_kv_heads * c.head_dim;
    cs.k = arena.take(kv_elems * elem);
    cs.v = arena.take(kv_elems * elem);
    fill_random(cs.k, kv_elems, 10 + s, c.dtype);
    fill_random(cs.v, kv_elems, 20 + s, c.dtype);
    const size_t q_elems = size_t(c.batch) * qo_len * c.num_qo_heads * c.head_dim;
    cs.q = arena.take(q_elems * elem);
    cs.o = arena.take(q_elems * elem);
    fill_random(cs.q, q_elems, 30 + s, c.dtype);
    cs.indptr = arena.take(kv_indptr.size() * 4);
    cs.last = arena.take(last.size() * 4);
    cs.qo_indptr = arena.take(qo_indptr.size() * 4);
    GQ_CUDA_CHECK(cudaMemcpy(cs.indptr, kv_indptr.data(), kv_indptr.size() * 4, cudaMemcpyHostToDevice));
    GQ_CUDA_CHECK(cudaMemcpy(cs.last, last.data(), last.size() * 4, cudaMemcpyHostToDevice));
    GQ_CUDA_CHECK(cudaMemcpy(cs.qo_indptr, qo_indptr.data(), qo_indptr.size() * 4, cudaMemcpyHostToDevice));
    if (paged) {
      // A random permutation of a larger pool (BENCHMARKS.md); GQATTN_BENCH_PAGES_IN_ORDER=1, a
      // diagnostic: pages 0, 1, 2, ... in order, so that each request's K/V (and at one K/V head, or
      // NHD, each item's) is one contiguous span read through the page table (perf-notes item 263).
      std::vector<int32_t> perm(pool_pages);
      std::iota(perm.begin(), perm.end(), 0);
      if (!pages_in_order) std::shuffle(perm.begin(), perm.end(), rng);
      cs.indices = arena.take(pages_needed * 4);
      GQ_CUDA_CHECK(cudaMemcpy(cs.indices, perm.data(), pages_needed * 4, cudaMemcpyHostToDevice));
    }

    const int64_t tokens = int64_t(c.batch) * qo_len;
    const TensorView q = TensorView::contiguous(cs.q, {tokens, c.num_qo_heads, c.head_dim}, c.dtype, Device::kCUDA);
    const TensorView o = TensorView::contiguous(cs.o, {tokens, c.num_qo_heads, c.head_dim}, c.dtype, Device::kCUDA);
    PagedKV kv;
    RaggedKV ragged;
    if (paged) {
      auto pool_view = [&](void* data) {
        return c.layout == KVLayout::kHND
                   ? TensorView::contiguous(data, {pool_pages, c.num_kv_heads, c.page_size, c.head_dim}, c.dtype,
                                            Device::kCUDA)
                   : TensorView::contiguous(data, {pool_pages, c.page_size, c.num_kv_heads, c.head_dim}, c.dtype,
                                            Device::kCUDA);
      };
      kv.k_pages = pool_view(cs.k);
      kv.v_pages = pool_view(cs.v);
      kv.layout = c.layout;
      kv.kv_page_indptr = TensorView::contiguous(cs.indptr, {c.batch + 1}, DType::kInt32, Device::kCUDA);
      kv.kv_page_indices = TensorView::contiguous(cs.indices, {pages_needed}, DType::kInt32, Device::kCUDA);
      kv.kv_last_page_len = TensorView::contiguous(cs.last, {c.batch}, DType::kInt32, Device::kCUDA);
    } else {
      ragged.k = TensorView::contiguous(cs.k, {kv_total_tokens, c.num_kv_heads, c.head_dim}, c.dtype, Device::kCUDA);
      ragged.v = TensorView::contiguous(cs.v, {kv_total_tokens, c.num_kv_heads, c.head_dim}, c.dtype, Device::kCUDA);
      ragged.kv_indptr = TensorView::contiguous(cs.indptr, {c.batch + 1}, DType::kInt32, Device::kCUDA);
    }
    cudaGraph_t graph;
    GQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    GQ_CUDA_CHECK(cudaDeviceSynchronize());
    GQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      if (decode) {
        decode_run(plan, DecodeArgs{q, kv, o, TensorView{}, 0.f}, stream);
      } else {
        PrefillArgs args;
        args.q = q;
        args.qo_indptr = TensorView::contiguous(cs.qo_indptr, {c.batch + 1}, DType::kInt32, Device::kCUDA);
        if (paged) args.paged = kv; else args.ragged = ragged;
        args.causal = c.causal;
        args.o = o;
        prefill_run(plan, args, stream);
      }
    } catch (...) {  // end the capture, or every later CUDA call on this thread fails
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream, &broken);
      if (broken) cudaGraphDestroy(broken);
      throw;
    }
    GQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    GQ_CUDA_CHECK(cudaGraphInstantiate(&cs.exec, graph, 0));
    GQ_CUDA_CHECK(cudaGraphDestroy(graph));
  }

  cudaEvent_t start, stop;
  GQ_CUDA_CHECK(cudaEventCreate(&start));
  GQ_CUDA_CHECK(cudaEventCreate(&stop));
  if (c.settle_ms > 0) {  // the GPU idle meanwhile: its power average falls (perf-notes item 153)
    GQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::this_thread::sleep_for(std::chrono::milliseconds(c.settle_ms));
  }
  // The flush buffer (its contents never matter) and the read's sink, once a process, outside the arena.
  static DeviceBuffer l2_flush;
  if (flush_l2 && !l2_flush) l2_flush = alloc(kL2FlushBytes + 16);
  const auto flush = [&] {
    if (!flush_l2) return;
    const auto base = static_cast<char*>(l2_flush.get());
    kernels::launch_read(base, kL2FlushBytes, reinterpret_cast<unsigned*>(base + kL2FlushBytes), /*streaming=*/false,
                         stream);
  };
  for (int i = 0; i < 2 * sets; ++i) {
    flush();
    GQ_CUDA_CHECK(cudaGraphLaunch(set[i % sets].exec, stream));
  }
  std::vector<float> ms(iters);
  const long long spin = spin_cycles();
  for (int i = 0; i < iters; ++i) {
    flush();
    if (spin > 0) {
      spin_kernel<<<1, 1, 0, stream>>>(spin);
      GQ_CUDA_CHECK(cudaGetLastError());
    }
    GQ_CUDA_CHECK(cudaEventRecord(start, stream));
    GQ_CUDA_CHECK(cudaGraphLaunch(set[i % sets].exec, stream));
    GQ_CUDA_CHECK(cudaEventRecord(stop, stream));
    GQ_CUDA_CHECK(cudaEventSynchronize(stop));
    GQ_CUDA_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
  }
  GQ_CUDA_CHECK(cudaEventDestroy(start));
  GQ_CUDA_CHECK(cudaEventDestroy(stop));
  for (CaseSet& cs : set) GQ_CUDA_CHECK(cudaGraphExecDestroy(cs.exec));
  GQ_CUDA_CHECK(cudaStreamDestroy(stream));

  BenchResult r;
  r.median_us = median_of(std::vector<double>(ms.begin(), ms.end())) * 1e3;
  if (decode) {
    r.unit = "GB/s";
    r.achieved = decode_bytes(c) / r.median_us * 1e-3;
    r.pct_of_ceiling = ceilings.read_gbps > 0 ? 100.0 * r.achieved / ceilings.read_gbps : 0;
  } else {
    r.unit = "TFLOP/s";
    r.achieved = prefill_flops(c) / r.median_us * 1e-6;
    r.pct_of_ceiling = ceilings.gemm_tflops > 0 ? 100.0 * r.achieved / ceilings.gemm_tflops : 0;
  }
  r.status = "ok";
  r.plan = "kernel " + std::to_string(plan.kernel_id) + " rows " + std::to_string(plan.cta_rows) + " chunk " + std::to_string(plan.kv_chunk) + " items " +
           std::to_string(plan.num_work) + " ctas " + std::to_string(plan.num_ctas) +
           (plan.split_item_keys ? " split-keys" : "");
  return r;
}

}  // namespace gqattn::bench
