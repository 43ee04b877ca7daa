// The engine's weight-streaming GEMM on Hopper (gemm_sm90.h): y[n, m] = x[n, k] . w[m, k]^T for
// n <= 128 tokens. Layer: engine (CUDA; the kernel body exists only in the sm_90a pass).
//
// A CTA owns rows [m0, m0 + kTileM) of w and a slice of k; the `splits` CTAs of one cluster own the
// same rows and together all of k. Three warpgroups:
//   producer (warpgroup 0, registers lowered): one thread streams each 64-wide k block of x (64 or
//     128 token rows) and of the w tile by TMA into a stage, signalling the stage's "full"
//     mbarrier by transaction bytes, after waiting for its "empty" one;
//   consumers (warpgroups 1 and 2, token rows 0..63 and 64..127; the second idles when n <= 64):
//     acc[64 x kTileM] += x_rows . w_tile^T by wgmma with both operands in shared memory (128-byte
//     swizzle, K-major), one commit group per stage, releasing a stage once the next group is
//     issued and the one before has completed.
// Epilogue: each consumer writes its fp32 accumulators into the (now free) pipeline memory, the
// cluster synchronises, and CTA `rank` adds up its share of the tile's elements over the cluster's
// CTAs in rank order through distributed shared memory (the same order whichever CTA finishes
// first: repeatable bits), converts and stores them. Rows past n and columns past m are never
// stored (TMA reads zeros past the ends of x, w and k).
#include "gemm_sm90.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "gqattn/error.h"
#include "prims/cuda_check.h"
#include "prims/sm90.cuh"
#include "prims/tma_encoder.h"
#include "prims/wgmma_ops.cuh"

namespace gqattn::engine::gemm_sm90 {
namespace {

constexpr int kThreads = 384;
constexpr int kKBlock = 64;                            // k per stage: one 128-byte swizzled row of bf16
constexpr int kHalfXBytes = 64 * kKBlock * 2;          // one consumer's 64 token rows of a k block
constexpr int kXBytes = 2 * kHalfXBytes;
constexpr int kPipeBytes = 192 * 1024;                 // stages fill this much: one CTA an SM

template <int kTileM>
struct Shape {
  static constexpr int kWBytes = kTileM * kKBlock * 2;
  static constexpr int kStageBytes = kXBytes + kWBytes;
  static constexpr int kStages = kPipeBytes / kStageBytes;  // 6 at 128 rows, 4 at 256
  static constexpr int kRedStride = kTileM + 8;  // floats a row of the epilogue buffer (float2 stores spread over banks)
  static constexpr int kRedBytes = kMaxTokens * kRedStride * 4;
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8 + 16;  // + the "last CTA" flag
  static_assert(kRedBytes <= kStages * kStageBytes, "the epilogue buffer reuses the pipeline's memory");
  static_assert(kStageBytes % 1024 == 0 && kSmemBytes <= 227 * 1024, "stages of whole swizzle atoms, in one SM");
};

struct Sum8 {
  float v[8];
};

struct Maps {
  CUtensorMap x, w;  // {k, n} and {k, m}, boxes of 64 x 64 and 64 x kTileM, 128-byte swizzle
};

struct Params {
  void* y;
  int64_t ldy;
  int n, m, k, splits;
  float* partials;  // workspace mode: [tiles x splits][kMaxTokens][kTileM] fp32; nullptr: cluster mode
  int* arrivals;    // workspace mode: [tiles] counters, zero between launches
};

template <int kTileM, bool kF32Out>
__global__ void __launch_bounds__(kThreads, 1) gemm_kernel(const __grid_constant__ Maps maps, const Params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  namespace sm90 = prims::sm90;
  using S = Shape<kTileM>;
  constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128 x 40 + 256 x 232 <= 65536
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kStages * S::kStageBytes);
  uint64_t* empty = full + S::kStages;

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int rank = static_cast<int>(blockIdx.x) % p.splits;  // the CTA's rank in its cluster
  const int m0 = static_cast<int>(blockIdx.x) / p.splits * kTileM;
  const int kblocks = (p.k + kKBlock - 1) / kKBlock;
  const int kb0 = rank * kblocks / p.splits;
  const int num_kb = (rank + 1) * kblocks / p.splits - kb0;
  const int consumers = p.n > 64 ? 2 : 1;
  if (tid == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      sm90::mbar_init(&full[s], 1);                // the producer's arrival + the TMA bytes
      sm90::mbar_init(&empty[s], 4 * consumers);   // one lane per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----------------------------------------------------------------------------
    sm90::setmaxnreg_dec<kProducerRegs>();
    if (tid == 0) {
      const uint32_t bytes = static_cast<uint32_t>(consumers * kHalfXBytes + S::kWBytes);
      for (int i = 0; i < num_kb; ++i) {
        const int s = i % S::kStages;
        sm90::mbar_wait(&empty[s], ((i / S::kStages) & 1) ^ 1);
        sm90::mbar_arrive_expect_tx(&full[s], bytes);
        unsigned char* stage = smem + s * S::kStageBytes;
        const int kc = (kb0 + i) * kKBlock;
        for (int h = 0; h < consumers; ++h) sm90::tma_load_2d(stage + h * kHalfXBytes, &maps.x, &full[s], kc, h * 64);
        sm90::tma_load_2d(stage + kXBytes, &maps.w, &full[s], kc, m0);
      }
    }
    __syncwarp();
    if (p.partials == nullptr) {
      // The epilogue's two cluster barriers (every thread of the cluster arrives at each), here so
      // that no code after the register release runs in the consumers' budget.
      sm90::cluster_sync();
      sm90::cluster_sync();
    }
    return;
  }

  // ---- consumers -----------------------------------------------------------------------------
  sm90::setmaxnreg_inc<kConsumerRegs>();
  {
    const int cw = wg - 1;
    if (cw < consumers) {
      const int warp = (tid / 32) & 3, lane = tid & 31;
      float acc[kTileM / 2];
#pragma unroll
      for (int j = 0; j < kTileM / 2; ++j) acc[j] = 0.f;
      for (int i = 0; i < num_kb; ++i) {
        const int s = i % S::kStages;
        sm90::mbar_wait(&full[s], (i / S::kStages) & 1);
        const unsigned char* stage = smem + s * S::kStageBytes;
        const uint64_t x_desc = sm90::smem_desc_sw128(stage + cw * kHalfXBytes, 16, 1024);
        const uint64_t w_desc = sm90::smem_desc_sw128(stage + kXBytes, 16, 1024);
        sm90::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kKBlock / 16; ++kk)  // 16 columns = 32 bytes = 2 descriptor units
          sm90::Wgmma<__nv_bfloat16, kTileM>::ss(acc, x_desc + 2 * kk, w_desc + 2 * kk, 1);
        sm90::wgmma_commit();
        sm90::wgmma_wait<1>();  // the previous stage's group has completed: release that stage
        if (i > 0 && lane == 0) sm90::mbar_arrive(&empty[(i - 1) % S::kStages]);
      }
      sm90::wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < kTileM / 2; ++j) sm90::fence_operand(acc[j]);
      if (p.partials != nullptr) {
        // Workspace mode: this CTA's fp32 partial tile (rows < n) into its slot of the workspace.
        float* slot = p.partials + static_cast<int64_t>(blockIdx.x) * (kMaxTokens * kTileM);
#pragma unroll
        for (int j = 0; j < kTileM / 8; ++j) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int row = cw * 64 + warp * 16 + (lane >> 2) + 8 * i;
            if (row < p.n)
              *reinterpret_cast<float2*>(slot + row * kTileM + 8 * j + 2 * (lane & 3)) =
                  make_float2(acc[4 * j + 2 * i], acc[4 * j + 2 * i + 1]);
          }
        }
      } else {
        // Cluster mode: every consumer's wgmma has read its last stage before the stages become
        // the epilogue buffer.
        sm90::named_barrier_sync(1, 128 * consumers);
        float* red = reinterpret_cast<float*>(smem);
#pragma unroll
        for (int j = 0; j < kTileM / 8; ++j) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {  // fragment: row lane / 4 + 8 i of the warp's 16, columns 8 j + 2 (lane % 4) + {0, 1}
            const int row = cw * 64 + warp * 16 + (lane >> 2) + 8 * i;
            *reinterpret_cast<float2*>(red + row * S::kRedStride + 8 * j + 2 * (lane & 3)) =
                make_float2(acc[4 * j + 2 * i], acc[4 * j + 2 * i + 1]);
          }
        }
      }
    }
  }

  // The tile's sum over the splits, in rank order (the same bits whichever CTA adds them up), in
  // units of 8 output columns: rows < n, columns < m (a multiple of 8: a unit is wholly in or out).
  constexpr int kUnitsPerRow = kTileM / 8;
  const int ct = tid - 128;  // 0..255: both consumer warpgroups share the sum
  auto store_unit = [&](int row, int col, const Sum8& sum) {
    const float* v = sum.v;
    if constexpr (kF32Out) {
      float* dst = static_cast<float*>(p.y) + row * p.ldy + col;
      reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      uint4 packed;
      packed.x = prims::pack2<__nv_bfloat16>(v[0], v[1]);
      packed.y = prims::pack2<__nv_bfloat16>(v[2], v[3]);
      packed.z = prims::pack2<__nv_bfloat16>(v[4], v[5]);
      packed.w = prims::pack2<__nv_bfloat16>(v[6], v[7]);
      *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.y) + row * p.ldy + col) = packed;
    }
  };
  // The sum over `splits` partial units (part[2 q], part[2 q + 1]) in rank order from 0, so that the
  // bits do not depend on which CTA adds them up.
  auto sum_parts = [](const float4 (&part)[2 * kMaxSplits], int splits) {
    Sum8 sum{{0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}};
    float* v = sum.v;
#pragma unroll
    for (int q = 0; q < kMaxSplits; ++q) {
      if (q < splits) {
        const float4 lo = part[2 * q], hi = part[2 * q + 1];
        v[0] += lo.x, v[1] += lo.y, v[2] += lo.z, v[3] += lo.w;
        v[4] += hi.x, v[5] += hi.y, v[6] += hi.z, v[7] += hi.w;
      }
    }
    return sum;
  };
  if (p.partials != nullptr) {
    // The last of the tile's CTAs to arrive adds up every split's partial tile from the workspace
    // (L2) and resets the tile's counter for the next launch.
    volatile int* s_last = reinterpret_cast<volatile int*>(empty + S::kStages);
    __threadfence();
    sm90::named_barrier_sync(1, 256);
    if (ct == 0) {
      const int tile = static_cast<int>(blockIdx.x) / p.splits;
      const int arrived = atomicAdd(p.arrivals + tile, 1);
      *s_last = arrived == p.splits - 1;
      if (arrived == p.splits - 1) p.arrivals[tile] = 0;
    }
    sm90::named_barrier_sync(1, 256);
    if (*s_last == 0) return;
    __threadfence();
    const float* first = p.partials + static_cast<int64_t>(blockIdx.x - rank) * (kMaxTokens * kTileM);
    for (int u = ct; u < p.n * kUnitsPerRow; u += 256) {
      const int row = u / kUnitsPerRow, c8 = u % kUnitsPerRow;
      const int col = m0 + 8 * c8;
      if (col >= p.m) continue;
      float4 part[2 * kMaxSplits];  // every split's loads in flight at once, then added in rank order
#pragma unroll
      for (int q = 0; q < kMaxSplits; ++q) {
        if (q < p.splits) {
          const float4* src =
              reinterpret_cast<const float4*>(first + q * (kMaxTokens * kTileM) + row * kTileM + 8 * c8);
          part[2 * q] = __ldcg(src);
          part[2 * q + 1] = __ldcg(src + 1);
        }
      }
      store_unit(row, col, sum_parts(part, p.splits));
    }
    return;
  }
  sm90::cluster_sync();  // every CTA's partial tile is in its shared memory
  {
    const int units = p.n * kUnitsPerRow;
    const int u_end = (rank + 1) * units / p.splits;
    const float* red = reinterpret_cast<const float*>(smem);
    for (int u = rank * units / p.splits + ct; u < u_end; u += 256) {
      const int row = u / kUnitsPerRow, c8 = u % kUnitsPerRow;
      const int col = m0 + 8 * c8;
      if (col >= p.m) continue;
      const float* local = red + row * S::kRedStride + 8 * c8;
      float4 part[2 * kMaxSplits];  // every rank's loads in flight at once (a remote load is a round
                                    // trip over the cluster), then added in rank order
#pragma unroll
      for (int q = 0; q < kMaxSplits; ++q) {
        if (q < p.splits) {
          const uint32_t a = sm90::cluster_map(local, static_cast<uint32_t>(q));
          part[2 * q] = sm90::ld_cluster_f4(a);
          part[2 * q + 1] = sm90::ld_cluster_f4(a + 16);
        }
      }
      store_unit(row, col, sum_parts(part, p.splits));
    }
  }
  sm90::cluster_sync();  // no CTA leaves while another still reads its shared memory
#endif
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

CUtensorMap make_map(const TensorView& t, int box_rows) {
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(t.shape[1]), static_cast<cuuint64_t>(t.shape[0])};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(t.strides[0]) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kKBlock), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const PFN_cuTensorMapEncodeTiled_v12000 encode = prims::tensor_map_encoder();
  GQ_CHECK(encode != nullptr, "gemm_sm90: the driver offers no cuTensorMapEncodeTiled");
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, t.data, dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  GQ_CHECK(r == CUDA_SUCCESS, "gemm_sm90: cuTensorMapEncodeTiled failed (", static_cast<int>(r), ") for ",
           t.describe());
  return map;
}

template <int kTileM, bool kF32Out>
void launch_variant(const Maps& maps, const Params& p, int tiles, bool cluster, cudaStream_t stream) {
  static std::once_flag once;
  std::call_once(once, [] {
    GQ_CUDA_CHECK(cudaFuncSetAttribute(gemm_kernel<kTileM, kF32Out>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Shape<kTileM>::kSmemBytes));
  });
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(tiles * p.splits));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = Shape<kTileM>::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(p.splits);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = cluster && p.splits > 1 ? 1 : 0;
  GQ_CUDA_CHECK(cudaLaunchKernelEx(&config, gemm_kernel<kTileM, kF32Out>, maps, p));
}

constexpr size_t kCounterBytes = 256;  // per 64 tiles: the workspace's counters, before the partial tiles

size_t counter_bytes(int tiles) { return (size_t(tiles) + 63) / 64 * kCounterBytes; }

}  // namespace

bool available(int device_id) {
#if defined(GQATTN_ENGINE_SM90)
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device_id) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return prop.major == 9 && prop.minor == 0 && prims::tensor_map_encoder() != nullptr;
#else
  (void)device_id;
  return false;
#endif
}

bool fits(const TensorView& x, const TensorView& w, const TensorView& y) {
  if (x.dtype != DType::kBF16 || w.dtype != DType::kBF16 || (y.dtype != DType::kBF16 && y.dtype != DType::kFP32))
    return false;
  if (x.ndim != 2 || w.ndim != 2 || y.ndim != 2) return false;
  if (x.device != Device::kCUDA || w.device != Device::kCUDA || y.device != Device::kCUDA ||
      x.device_id != w.device_id || y.device_id != w.device_id)
    return false;
  const int64_t n = x.shape[0], k = x.shape[1], m = w.shape[0];
  if (n < 1 || n > kMaxTokens || w.shape[1] != k || y.shape[0] != n || y.shape[1] != m) return false;
  if (k % 8 != 0 || m % 8 != 0 || k <= 0 || m <= 0) return false;
  if (x.strides[1] != 1 || w.strides[1] != 1 || y.strides[1] != 1) return false;
  const int64_t y_elem = y.dtype == DType::kFP32 ? 4 : 2;
  return aligned16(x.data) && aligned16(w.data) && aligned16(y.data) && (x.strides[0] * 2) % 16 == 0 &&
         (w.strides[0] * 2) % 16 == 0 && (y.strides[0] * y_elem) % 16 == 0 && x.strides[0] >= k &&
         w.strides[0] >= k && y.strides[0] >= m;
}

std::vector<Variant> candidates(int m, int k, int num_sms) {
  struct Scored {
    double cost;
    int splits;
  };
  std::vector<Variant> out;
  const int kblocks = (k + kKBlock - 1) / kKBlock;
  for (const int tile : {256, 128}) {
    const int tiles = (m + tile - 1) / tile;
    std::vector<Scored> scored;
    for (int s = 1; s <= std::min(kMaxSplits, kblocks); ++s) {
      const int waves = (tiles * s + num_sms - 1) / num_sms;
      // w rows x k blocks a CTA streams in sequence, plus ~2 blocks' worth for the sum of splits.
      const double cost = double(waves) * tile * ((kblocks + s - 1) / s + (s > 1 ? 2 : 0));
      scored.push_back({cost, s});
    }
    std::stable_sort(scored.begin(), scored.end(), [](const Scored& a, const Scored& b) { return a.cost < b.cost; });
    for (size_t i = 0; i < scored.size() && i < 3; ++i) {
      out.push_back(Variant{tile, scored[i].splits, false});
      if (scored[i].splits > 1) out.push_back(Variant{tile, scored[i].splits, true});
    }
  }
  if (out.size() > size_t(kMaxCandidates)) out.resize(kMaxCandidates);
  return out;
}

size_t workspace_bytes(int m, Variant v) {
  if (!v.workspace || v.tile_m <= 0) return 0;
  const int tiles = (m + v.tile_m - 1) / v.tile_m;
  return counter_bytes(tiles) + size_t(tiles) * v.splits * kMaxTokens * v.tile_m * sizeof(float);
}

int max_active_clusters(Variant v) {
  if (v.splits <= 1 || v.workspace) return 0;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(v.splits * 64));
  config.blockDim = dim3(kThreads);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(v.splits);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  int clusters = 0;
  cudaError_t status;
  if (v.tile_m == 256) {
    config.dynamicSmemBytes = Shape<256>::kSmemBytes;
    cudaFuncSetAttribute(gemm_kernel<256, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape<256>::kSmemBytes);
    status = cudaOccupancyMaxActiveClusters(&clusters, gemm_kernel<256, false>, &config);
  } else {
    config.dynamicSmemBytes = Shape<128>::kSmemBytes;
    cudaFuncSetAttribute(gemm_kernel<128, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape<128>::kSmemBytes);
    status = cudaOccupancyMaxActiveClusters(&clusters, gemm_kernel<128, false>, &config);
  }
  if (status != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return clusters;
}

void launch(const TensorView& x, const TensorView& w, const TensorView& y, Variant v, cudaStream_t stream,
            void* workspace) {
  GQ_CHECK(fits(x, w, y), "gemm_sm90: x ", x.describe(), " . w ", w.describe(), "^T -> y ", y.describe(),
           " does not fit the kernel (bf16, n <= ", kMaxTokens, ", k and m multiples of 8, 16-byte aligned rows)");
  GQ_CHECK((v.tile_m == 128 || v.tile_m == 256) && v.splits >= 1 && v.splits <= kMaxSplits,
           "gemm_sm90: no variant with tile ", v.tile_m, " and ", v.splits, " splits");
  GQ_CHECK(!v.workspace || workspace != nullptr, "gemm_sm90: the workspace variant needs a workspace");
  const int n = int(x.shape[0]), k = int(x.shape[1]), m = int(w.shape[0]);
  const int kblocks = (k + kKBlock - 1) / kKBlock;
  GQ_CHECK(v.splits <= kblocks, "gemm_sm90: ", v.splits, " splits of ", kblocks, " k blocks");
  Maps maps;
  maps.x = make_map(x, 64);
  maps.w = make_map(w, v.tile_m);
  const int tiles = (m + v.tile_m - 1) / v.tile_m;
  Params p{y.data, y.strides[0], n, m, k, v.splits, nullptr, nullptr};
  if (v.workspace) {
    p.arrivals = static_cast<int*>(workspace);
    p.partials = reinterpret_cast<float*>(static_cast<char*>(workspace) + counter_bytes(tiles));
  }
  const bool f32 = y.dtype == DType::kFP32, cluster = !v.workspace;
  if (v.tile_m == 256) {
    f32 ? launch_variant<256, true>(maps, p, tiles, cluster, stream)
        : launch_variant<256, false>(maps, p, tiles, cluster, stream);
  } else {
    f32 ? launch_variant<128, true>(maps, p, tiles, cluster, stream)
        : launch_variant<128, false>(maps, p, tiles, cluster, stream);
  }
}

}  // namespace gqattn::engine::gemm_sm90
