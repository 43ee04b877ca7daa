// The engine's weight-streaming GEMM on Hopper (gemm_sm90.h): y[n, m] = x[n, k] . w[m, k]^T for
// n <= 128 tokens. Layer: engine (CUDA; the kernel body exists only in the sm_90a pass).
//
// A CTA owns rows [m0, m0 + kTileM) of w and a slice of k. A cluster holds `mcast` x `splits` CTAs:
// `mcast` neighbouring tiles of w on the same k slice, which share each block of x (one TMA load
// per CTA of a 1 / mcast share of its rows, multicast to all of them: the L2 delivers x once per
// mcast tiles), times `splits` slices of k of each tile. Three warpgroups:
//   producer (warpgroup 0, registers lowered): one thread streams each 64-wide k block of x (64 or
//     128 token rows) and of the w tile by TMA into a stage, signalling the stage's "full"
//     mbarrier by transaction bytes, after its "empty" mbarrier has heard from the consumers of
//     every CTA that the stage's x reaches;
//   consumers (warpgroups 1 and 2, token rows 0..63 and 64..127; the second idles when n <= 64
//     and x is not shared): acc[64 x kTileM] += x_rows . w_tile^T by wgmma with both operands in
//     shared memory (128-byte swizzle, K-major), one commit group per stage, releasing a stage
//     once the next group is issued and the one before has completed.
// Epilogue: each consumer writes its fp32 accumulators into the (now free) pipeline memory, the
// cluster synchronises, and the CTA of split q adds up its share of its tile's elements over the
// tile's `splits` CTAs in split order through distributed shared memory (the same order whichever
// CTA finishes first: repeatable bits), converts and stores them. Rows past n and columns past m
// are never stored (TMA reads zeros past the ends of x, w and k).
#include "gemm_sm90.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

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
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;
  static_assert(kRedBytes <= kStages * kStageBytes, "the epilogue buffer reuses the pipeline's memory");
  static_assert(kStageBytes % 1024 == 0 && kSmemBytes <= 227 * 1024, "stages of whole swizzle atoms, in one SM");
};

struct Maps {
  CUtensorMap x, w;  // {k, n} and {k, m}, boxes of 64 x 64 and 64 x kTileM, 128-byte swizzle
};

struct Params {
  void* y;
  int64_t ldy;
  int n, m, k;
  int splits;  // CTAs along k a tile
  int mcast;   // tiles (CTAs along m) sharing each x block by multicast: 1, 2 or 4
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
  const int csize = p.splits * p.mcast;                      // CTAs a cluster
  const int rank = static_cast<int>(blockIdx.x) % csize;     // rank in the cluster (1-D clusters)
  const int split = rank % p.splits, mi = rank / p.splits;   // k slice, tile within the cluster
  const int m0 = (static_cast<int>(blockIdx.x) / csize * p.mcast + mi) * kTileM;
  const int kblocks = (p.k + kKBlock - 1) / kKBlock;
  const int kb0 = split * kblocks / p.splits;
  const int num_kb = (split + 1) * kblocks / p.splits - kb0;
  const int consumers = p.mcast > 1 || p.n > 64 ? 2 : 1;  // shared x blocks always hold 128 rows
  if (tid == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      sm90::mbar_init(&full[s], 1);                          // the producer's arrival + the TMA bytes
      sm90::mbar_init(&empty[s], 4 * consumers * p.mcast);   // a lane per consumer warp of each sharing CTA
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  sm90::cluster_sync();  // every CTA's barriers exist before any multicast or remote arrival reaches them

  if (wg == 0) {
    // ---- producer ----------------------------------------------------------------------------
    sm90::setmaxnreg_dec<kProducerRegs>();
    if (tid == 0) {
      const int x_rows = consumers * 64;
      const int part_rows = x_rows / p.mcast;  // this CTA's share of each x block
      uint16_t mask = 0;                       // the CTAs on this k slice
      for (int j = 0; j < p.mcast; ++j) mask = static_cast<uint16_t>(mask | (1u << (split + p.splits * j)));
      const uint32_t bytes = static_cast<uint32_t>(x_rows * kKBlock * 2 + S::kWBytes);
      for (int i = 0; i < num_kb; ++i) {
        const int s = i % S::kStages;
        sm90::mbar_wait(&empty[s], ((i / S::kStages) & 1) ^ 1);
        sm90::mbar_arrive_expect_tx(&full[s], bytes);
        unsigned char* stage = smem + s * S::kStageBytes;
        const int kc = (kb0 + i) * kKBlock;
        if (p.mcast == 1) {
          for (int h = 0; h < consumers; ++h)
            sm90::tma_load_2d(stage + h * kHalfXBytes, &maps.x, &full[s], kc, h * 64);
        } else {
          sm90::tma_load_2d_multicast(stage + mi * part_rows * kKBlock * 2, &maps.x, &full[s], kc, mi * part_rows,
                                      mask);
        }
        sm90::tma_load_2d(stage + kXBytes, &maps.w, &full[s], kc, m0);
      }
    }
    __syncwarp();
    // The epilogue's two cluster barriers (every thread of the cluster arrives at each), here so
    // that no code after the register release runs in the consumers' budget.
    sm90::cluster_sync();
    sm90::cluster_sync();
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
        if (i > 0 && lane < p.mcast) {  // lane j tells the j-th CTA on this k slice (whose x it also holds)
          uint64_t* bar = &empty[(i - 1) % S::kStages];
          if (p.mcast == 1) {
            sm90::mbar_arrive(bar);
          } else {
            sm90::mbar_arrive_cluster(sm90::cluster_map(bar, static_cast<uint32_t>(split + p.splits * lane)));
          }
        }
      }
      sm90::wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < kTileM / 2; ++j) sm90::fence_operand(acc[j]);
      // Every consumer's wgmma has read its last stage before the stages become the epilogue buffer.
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

  sm90::cluster_sync();  // every CTA's partial tile is in its shared memory
  {
    // The tile's sum over its splits in split order from 0, in units of 8 output columns: rows < n,
    // columns < m (a multiple of 8: a unit is wholly in or out); every split's loads in flight at
    // once (a remote load is a round trip over the cluster), then added.
    constexpr int kUnitsPerRow = kTileM / 8;
    const int units = p.n * kUnitsPerRow;
    const int u_end = (split + 1) * units / p.splits;
    const float* red = reinterpret_cast<const float*>(smem);
    for (int u = split * units / p.splits + (tid - 128); u < u_end; u += 256) {
      const int row = u / kUnitsPerRow, c8 = u % kUnitsPerRow;
      const int col = m0 + 8 * c8;
      if (col >= p.m) continue;
      const float* local = red + row * S::kRedStride + 8 * c8;
      float4 part[2 * kMaxSplits];
#pragma unroll
      for (int q = 0; q < kMaxSplits; ++q) {
        if (q < p.splits) {
          const uint32_t a = sm90::cluster_map(local, static_cast<uint32_t>(mi * p.splits + q));
          part[2 * q] = sm90::ld_cluster_f4(a);
          part[2 * q + 1] = sm90::ld_cluster_f4(a + 16);
        }
      }
      float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int q = 0; q < kMaxSplits; ++q) {
        if (q < p.splits) {
          const float4 lo = part[2 * q], hi = part[2 * q + 1];
          v[0] += lo.x, v[1] += lo.y, v[2] += lo.z, v[3] += lo.w;
          v[4] += hi.x, v[5] += hi.y, v[6] += hi.z, v[7] += hi.w;
        }
      }
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
void set_smem_limit() {
  static std::once_flag once;
  std::call_once(once, [] {
    GQ_CUDA_CHECK(cudaFuncSetAttribute(gemm_kernel<kTileM, kF32Out>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Shape<kTileM>::kSmemBytes));
  });
}

cudaLaunchConfig_t launch_config(int tile_m, unsigned grid, cudaLaunchAttribute& cluster_attr, int cluster_size,
                                 cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = tile_m == 256 ? Shape<256>::kSmemBytes : Shape<128>::kSmemBytes;
  config.stream = stream;
  cluster_attr = cudaLaunchAttribute{};
  cluster_attr.id = cudaLaunchAttributeClusterDimension;
  cluster_attr.val.clusterDim.x = static_cast<unsigned>(cluster_size);
  cluster_attr.val.clusterDim.y = 1;
  cluster_attr.val.clusterDim.z = 1;
  config.attrs = &cluster_attr;
  config.numAttrs = cluster_size > 1 ? 1 : 0;
  return config;
}

// Tiles of w, rounded up to whole clusters (a cluster's last tiles may lie past m: their w is read
// as zeros and nothing of them is stored).
int grid_tiles(int m, Variant v) {
  const int tiles = (m + v.tile_m - 1) / v.tile_m;
  return (tiles + v.mcast - 1) / v.mcast * v.mcast;
}

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

bool valid(Variant v) {
  return (v.tile_m == 128 || v.tile_m == 256) && (v.mcast == 1 || v.mcast == 2 || v.mcast == 4) && v.splits >= 1 &&
         v.splits * v.mcast <= kMaxClusterSize;
}

int max_active_clusters(Variant v) {
  if (!valid(v)) return -1;
  cudaLaunchAttribute attr;
  const int size = v.splits * v.mcast;
  cudaLaunchConfig_t config = launch_config(v.tile_m, static_cast<unsigned>(size * 64), attr, size, nullptr);
  if (size == 1) config.numAttrs = 0;
  int clusters = 0;
  cudaError_t status;
  if (v.tile_m == 256) {
    set_smem_limit<256, false>();
    status = size > 1 ? cudaOccupancyMaxActiveClusters(&clusters, gemm_kernel<256, false>, &config)
                      : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&clusters, gemm_kernel<256, false>, kThreads,
                                                                      Shape<256>::kSmemBytes);
  } else {
    set_smem_limit<128, false>();
    status = size > 1 ? cudaOccupancyMaxActiveClusters(&clusters, gemm_kernel<128, false>, &config)
                      : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&clusters, gemm_kernel<128, false>, kThreads,
                                                                      Shape<128>::kSmemBytes);
  }
  if (status != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  if (size == 1) {  // per SM: the device holds that many CTAs on each SM
    int device = 0, sms = 0;
    GQ_CUDA_CHECK(cudaGetDevice(&device));
    GQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    clusters *= sms;
  }
  return clusters;
}

std::vector<Variant> candidates(int m, int k) {
  struct Scored {
    double cost;
    Variant v;
  };
  // Clusters the device holds at once, per variant shape (cached: the answer depends on the
  // device, the tile's shared memory and the cluster size only).
  static std::mutex mutex;
  static std::map<std::pair<int, int>, int> held;
  std::vector<Scored> scored;
  const int kblocks = (k + kKBlock - 1) / kKBlock;
  for (const int tile : {256, 128}) {
    for (const int mcast : {1, 2, 4}) {
      for (int splits = 1; splits * mcast <= kMaxClusterSize && splits <= kblocks; ++splits) {
        const Variant v{tile, splits, mcast};
        int clusters = 0;
        {
          const std::lock_guard<std::mutex> lock(mutex);
          const auto key = std::make_pair(tile, splits * mcast);
          auto it = held.find(key);
          if (it == held.end()) it = held.emplace(key, max_active_clusters(v)).first;
          clusters = it->second;
        }
        if (clusters <= 0) continue;
        const int ctas = grid_tiles(m, v) * splits;
        const int waves = (ctas + clusters * splits * mcast - 1) / (clusters * splits * mcast);
        // A wave's time ~ what its CTAs read through the L2 (w, plus x once per mcast tiles),
        // in w rows x k blocks, plus ~2 blocks' worth for the split sum.
        const double per_cta = double((kblocks + splits - 1) / splits) * (tile + 128.0 / mcast) + (splits > 1 ? 2.0 * tile : 0);
        scored.push_back({waves * per_cta, v});
      }
    }
  }
  std::stable_sort(scored.begin(), scored.end(), [](const Scored& a, const Scored& b) { return a.cost < b.cost; });
  std::vector<Variant> out;
  for (size_t i = 0; i < scored.size() && i < size_t(kMaxCandidates); ++i) out.push_back(scored[i].v);
  return out;
}

void launch(const TensorView& x, const TensorView& w, const TensorView& y, Variant v, cudaStream_t stream) {
  GQ_CHECK(fits(x, w, y), "gemm_sm90: x ", x.describe(), " . w ", w.describe(), "^T -> y ", y.describe(),
           " does not fit the kernel (bf16, n <= ", kMaxTokens, ", k and m multiples of 8, 16-byte aligned rows)");
  GQ_CHECK(valid(v), "gemm_sm90: no variant with tile ", v.tile_m, ", ", v.splits, " splits and multicast ", v.mcast);
  const int n = int(x.shape[0]), k = int(x.shape[1]), m = int(w.shape[0]);
  const int kblocks = (k + kKBlock - 1) / kKBlock;
  GQ_CHECK(v.splits <= kblocks, "gemm_sm90: ", v.splits, " splits of ", kblocks, " k blocks");
  Maps maps;
  maps.x = make_map(x, v.mcast == 1 ? 64 : kMaxTokens / v.mcast);  // one consumer's rows, or a CTA's share
  maps.w = make_map(w, v.tile_m);
  const Params p{y.data, y.strides[0], n, m, k, v.splits, v.mcast};
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config =
      launch_config(v.tile_m, static_cast<unsigned>(grid_tiles(m, v) * v.splits), attr, v.splits * v.mcast, stream);
  const bool f32 = y.dtype == DType::kFP32;
  if (v.tile_m == 256) {
    if (f32) {
      set_smem_limit<256, true>();
      GQ_CUDA_CHECK(cudaLaunchKernelEx(&config, gemm_kernel<256, true>, maps, p));
    } else {
      set_smem_limit<256, false>();
      GQ_CUDA_CHECK(cudaLaunchKernelEx(&config, gemm_kernel<256, false>, maps, p));
    }
  } else {
    if (f32) {
      set_smem_limit<128, true>();
      GQ_CUDA_CHECK(cudaLaunchKernelEx(&config, gemm_kernel<128, true>, maps, p));
    } else {
      set_smem_limit<128, false>();
      GQ_CUDA_CHECK(cudaLaunchKernelEx(&config, gemm_kernel<128, false>, maps, p));
    }
  }
}

}  // namespace gqattn::engine::gemm_sm90
