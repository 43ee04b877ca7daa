// How fast can a paged cache be read? (perf-notes item 254.) A standalone probe: a pool of pages
// read in a random page order (a paged K/V cache) or in order, by three loaders, beside the
// benchmarks' streaming-read ceiling (src/kernels/read_bandwidth.cu):
//   ld      each warp loads 4 KB spans (8 x 16 B a lane in flight) straight into registers;
//   cpasync CTAs of 128 threads copy spans of 8 KB into a ring of shared-memory stages with
//           16-byte cp.async (the portable decode kernels' loader), CTA barrier a stage (8 KB
//           spans, or 32 KB as cuDNN's 128-key tiles);
//   bulk    persistent CTAs: one producer warp copies each span with cp.async.bulk (one
//           instruction a page, or a lane a page where pages are smaller than the span) into a
//           ring of mbarrier stages; four consumer warps read each stage and release it.
// Every loader XORs what it reads (kept alive by a sink). Pages: 256 B (hd128 page 1, or an NHD
// row), 4 KB (HND page 16) and 16 KB (page 64); the span's bytes map through the page list.
//   build: bash wip/read_probe/run.sh (nvcc, sm_90a); run: read_probe [POOL_GB=4] [REPS=9]
// READ_PROBE_ONE_CTA=1 (perf-notes item 265): 4 KB pages only, random and in order, the staged
// loaders at one CTA an SM (stages of 16-64 KB) beside their best multi-CTA configurations.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/launch.h"
#include "kernels/median_time.h"
#include "prims/cuda_check.h"
#include "prims/mma.cuh"
#include "prims/sm90.cuh"

namespace {
using namespace gqattn::prims;

struct Pool {
  const char* base;
  const int* pages;  // page list: logical page i lives at base + pages[i] * page_bytes
  int64_t page_bytes;  // a power of two
  int page_shift;      // log2(page_bytes)
  int64_t total;       // logical bytes
};

__device__ __forceinline__ const char* at(const Pool& p, int64_t g) {
  return p.base + (int64_t(p.pages[g >> p.page_shift]) << p.page_shift) + (g & (p.page_bytes - 1));
}

__device__ __forceinline__ uint32_t x4(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// ld: a warp a 4 KB span at a time, 8 loads a lane in flight.
__global__ void ld_kernel(Pool p, unsigned* sink) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  uint32_t acc = 0;
  for (int64_t s = warp; s * 4096 < p.total; s += warps) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __ldcs(reinterpret_cast<const uint4*>(at(p, s * 4096 + 16 * (lane + 32 * j))));
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= x4(v[j]);
  }
  if (acc == 0x12345678u) *sink = acc;
}

// cpasync: 128 threads, kStages stages of one span each (kSpan bytes: 8 KB, K and V of 16 keys at
// hd128, or 32 KB), a CTA barrier a stage.
template <int kStages, int kSpan>
__global__ void __launch_bounds__(128) cpasync_kernel(Pool p, unsigned* sink) {
  extern __shared__ __align__(128) char smem[];
  const int t = threadIdx.x;
  const int64_t spans = p.total / kSpan;
  uint32_t acc = 0;
  auto issue = [&](int64_t s, int slot) {
    if (s < spans) {
#pragma unroll
      for (int j = 0; j < kSpan / 16 / 128; ++j) {
        const int c = t + 128 * j;
        cp_async_16(smem + slot * kSpan + 16 * c, at(p, s * kSpan + 16 * c), true);
      }
    }
    cp_async_commit();
  };
  int64_t s = blockIdx.x;
  for (int i = 0; i < kStages - 1; ++i) issue(s + int64_t(i) * gridDim.x, i);
  for (int i = 0; s < spans; ++i, s += gridDim.x) {
    issue(s + int64_t(kStages - 1) * gridDim.x, (i + kStages - 1) % kStages);
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const int slot = i % kStages;
#pragma unroll
    for (int j = 0; j < kSpan / 16 / 128; ++j)
      acc ^= x4(*reinterpret_cast<const uint4*>(smem + slot * kSpan + 16 * (t + 128 * j)));
    __syncthreads();
  }
  if (acc == 0x12345678u) *sink = acc;
}

// bulk: warp 0 produces, warps 1..4 consume; kStages stages of one span, full / empty mbarriers.
template <int kStages, int kSpan>
__global__ void __launch_bounds__(160) bulk_kernel(Pool p, unsigned* sink) {
  extern __shared__ __align__(128) char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kSpan);
  uint64_t* empty = full + kStages;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      sm90::mbar_init(&full[i], 1);
      sm90::mbar_init(&empty[i], 4);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int64_t spans = p.total / kSpan;
  const int64_t piece = p.page_bytes < kSpan ? p.page_bytes : kSpan;  // bytes a copy
  const int pieces = int(kSpan / piece);                              // copies a span
  if (warp == 0) {
    int i = 0;
    for (int64_t s = blockIdx.x; s < spans; s += gridDim.x, ++i) {
      const int slot = i % kStages;
      sm90::mbar_wait(&empty[slot], ((i / kStages) & 1) ^ 1);
      if (lane == 0) sm90::mbar_arrive_expect_tx(&full[slot], kSpan);
      __syncwarp();
      for (int q = lane; q < pieces; q += 32)
        sm90::bulk_load_1d(smem + slot * kSpan + q * piece, at(p, s * kSpan + q * piece), uint32_t(piece),
                           &full[slot]);
    }
  } else {
    const int t = threadIdx.x - 32;
    uint32_t acc = 0;
    int i = 0;
    for (int64_t s = blockIdx.x; s < spans; s += gridDim.x, ++i) {
      const int slot = i % kStages;
      sm90::mbar_wait(&full[slot], (i / kStages) & 1);
#pragma unroll
      for (int j = 0; j < kSpan / 16 / 128; ++j)
        acc ^= x4(*reinterpret_cast<const uint4*>(smem + slot * kSpan + 16 * (t + 128 * j)));
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(&empty[slot]);
    }
    if (acc == 0x12345678u) *sink = acc;
  }
}

template <int S, int B>
struct Stages {  // a staged loader's configuration: S stages of B bytes
  static constexpr int kStages = S, kSpan = B;
};

template <typename F>
double time_gbps(F launch, int64_t bytes, int reps) {  // the read ceiling's timing (median_time.h)
  const float ms = gqattn::kernels::median_ms_after_warmup(launch, reps, nullptr);
  GQ_CUDA_CHECK(cudaGetLastError());
  return double(bytes) / (ms * 1e-3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t pool_bytes = int64_t(argc > 1 ? std::atof(argv[1]) : 4.0) * (int64_t(1) << 30);
  const int reps = argc > 2 ? std::atoi(argv[2]) : 9;
  int sms = 0;
  cudaDeviceProp prop{};
  GQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  sms = prop.multiProcessorCount;
  char* base = nullptr;
  unsigned* sink = nullptr;
  GQ_CUDA_CHECK(cudaMalloc(&base, pool_bytes));
  GQ_CUDA_CHECK(cudaMalloc(&sink, 16));
  GQ_CUDA_CHECK(cudaMemset(base, 0x5A, pool_bytes));
  std::printf("# device %s, %d SMs; pool %.1f GB; median of %d runs after >= 100 ms of warm-up\n", prop.name, sms,
              pool_bytes / 1e9, reps);
  std::printf("loader,page_bytes,order,stages,ctas_per_sm,span,GBps\n");
  std::printf("ceiling,,,,,,%.0f\n", gqattn::kernels::measure_read_bandwidth_gbps(size_t(pool_bytes), reps, nullptr));
  // Orders of the page list: random (a paged cache), in_order (the grid's spans side by side, one
  // global stream) and items (each CTA reads whole 128 KB items, contiguous, one after another: K
  // of an MHA request x head of 512 keys, as the peers read contiguous K/V).
  std::mt19937_64 rng(1234);
  int* d_ids = nullptr;
  GQ_CUDA_CHECK(cudaMalloc(&d_ids, (pool_bytes / 256) * sizeof(int)));
  const bool one_cta = std::getenv("READ_PROBE_ONE_CTA") != nullptr;
  for (int64_t page : {int64_t(256), int64_t(4096), int64_t(16384)}) {
    if (one_cta && page != 4096) continue;
    const int64_t n = pool_bytes / page;
    std::vector<int> random_ids(n), ids(n);
    std::iota(random_ids.begin(), random_ids.end(), 0);
    std::shuffle(random_ids.begin(), random_ids.end(), rng);
    const Pool p{base, d_ids, page, __builtin_ctzll(uint64_t(page)), n * page};
    for (const char* order : {"random", "in_order", "items"}) {
      const std::string o = order;
      if (one_cta && o == "items") continue;
      // The page list for a grid of `grid` CTAs whose spans (of `span` bytes) go round robin.
      auto upload = [&](int64_t grid, int64_t span) {
        if (o == "random") {
          ids = random_ids;
        } else if (o == "in_order") {
          std::iota(ids.begin(), ids.end(), 0);
        } else {  // logical span s is CTA s % grid's (s / grid)-th: item (j / per_item) * grid + c
          const int64_t spans = p.total / span, per_item = (int64_t(128) << 10) / span;
          const int64_t items = spans / per_item;
          for (int64_t s = 0; s < spans; ++s) {
            const int64_t c = s % grid, j = s / grid;
            int64_t item = (j / per_item) * grid + c;
            if (item >= items) item = s / per_item;  // the last partial round: in order
            const int64_t phys = item * per_item + j % per_item;
            for (int64_t b = 0; b < span; b += page) ids[(s * span + b) / page] = int((phys * span + b) / page);
          }
        }
        GQ_CUDA_CHECK(cudaMemcpy(d_ids, ids.data(), n * sizeof(int), cudaMemcpyHostToDevice));
      };
      const bool items = o == "items";
      for (int cps : {4, 8}) {
        if (one_cta || (items && page > 4096)) break;  // an item's spans are whole pages
        upload(int64_t(sms) * cps * 256 / 32, 4096);
        const double g = time_gbps([&] { ld_kernel<<<sms * cps, 256>>>(p, sink); }, p.total, reps);
        std::printf("ld,%lld,%s,,%d,4096,%.0f\n", (long long)page, order, cps, g);
      }
      // One staged loader's run: `threads` a CTA, `stages` x `span` bytes of shared memory (+ `extra`).
      auto staged = [&](const char* name, auto kernel, int threads, int extra, int stages, int span, int cps) {
        if (items && page > span) return;
        const int smem = stages * span + extra;
        GQ_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        upload(int64_t(sms) * cps, span);
        const double g = time_gbps([&] { kernel<<<sms * cps, threads, smem>>>(p, sink); }, p.total, reps);
        std::printf("%s,%lld,%s,%d,%d,%d,%.0f\n", name, (long long)page, order, stages, cps, span, g);
      };
      auto cpasync = [&](auto cfg, int cps) {
        using C = decltype(cfg);
        staged("cpasync", cpasync_kernel<C::kStages, C::kSpan>, 128, 0, C::kStages, C::kSpan, cps);
      };
      auto bulk = [&](auto cfg, int cps) {  // + the full / empty barriers
        using C = decltype(cfg);
        staged("bulk", bulk_kernel<C::kStages, C::kSpan>, 160, 2 * C::kStages * 8, C::kStages, C::kSpan, cps);
      };
      if (one_cta) {  // one CTA an SM (the decode rows of one long item an SM), and two references
        cpasync(Stages<2, 65536>{}, 1), cpasync(Stages<3, 65536>{}, 1), cpasync(Stages<4, 32768>{}, 1);
        cpasync(Stages<6, 32768>{}, 1), cpasync(Stages<12, 16384>{}, 1), cpasync(Stages<3, 32768>{}, 2);
        bulk(Stages<3, 65536>{}, 1), bulk(Stages<6, 32768>{}, 1), bulk(Stages<12, 16384>{}, 1);
        cpasync(Stages<2, 32768>{}, 3), bulk(Stages<3, 32768>{}, 2);
        continue;
      }
      // (stages, span) at CTAs an SM that fill ~192 KB of shared memory an SM (or 128 KB)
      cpasync(Stages<4, 8192>{}, 4), cpasync(Stages<4, 8192>{}, 6), cpasync(Stages<8, 8192>{}, 2);
      cpasync(Stages<8, 8192>{}, 3), cpasync(Stages<2, 32768>{}, 3), cpasync(Stages<3, 32768>{}, 2);
      bulk(Stages<4, 8192>{}, 4), bulk(Stages<8, 8192>{}, 2), bulk(Stages<8, 8192>{}, 3), bulk(Stages<16, 8192>{}, 1);
      bulk(Stages<12, 8192>{}, 2), bulk(Stages<3, 32768>{}, 2), bulk(Stages<6, 32768>{}, 1);
    }
  }
  GQ_CUDA_CHECK(cudaFree(d_ids));
  GQ_CUDA_CHECK(cudaFree(base));
  return 0;
}
