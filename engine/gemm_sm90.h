// The engine's own GEMM for decode steps on Hopper: y[n, m] = x[n, k] . w[m, k]^T with few tokens
// (n <= 128), where the time is reading w once. Each CTA streams a tile of w's rows (128 or 256)
// through a TMA + mbarrier pipeline and multiplies it by all n tokens with wgmma; k may be split
// over several CTAs, whose fp32 partial tiles are added in a fixed order (bit-repeatable) either
// through distributed shared memory (the CTAs of one thread-block cluster) or through a workspace
// in global memory (the tile's last CTA to finish adds them up). The CUDA compute device times its
// variants beside cuBLASLt's candidates and keeps whichever is fastest (cuda_compute.cu).
// Layer: engine (CUDA only; the kernel is compiled for sm_90a, see GQATTN_ENGINE_SM90).
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "gqattn/tensor.h"

namespace gqattn::engine::gemm_sm90 {

constexpr int kMaxTokens = 128;     // two consumer warpgroups of 64 token rows
constexpr int kMaxSplits = 8;       // the portable cluster size
constexpr int kMaxCandidates = 12;  // variants the tuner times per shape

struct Variant {
  int tile_m = 0;          // rows of w per CTA: 128 or 256
  int splits = 0;          // CTAs sharing one tile, each a slice of k (1..kMaxSplits)
  bool workspace = false;  // splits added through a global workspace, not a cluster's shared memory
};

// Whether the kernel was built (GQATTN_CUDA_ARCHS has 90a) and the device `device_id` is sm_90.
bool available(int device_id);
// Whether these views fit the kernel: x and w bf16, y bf16 or fp32, all on `device_id`, 1 <= n <=
// kMaxTokens, k and m multiples of 8, 16-byte aligned pointers and row strides, unit column stride.
bool fits(const TensorView& x, const TensorView& w, const TensorView& y);
// The variants worth timing for this shape: for each tile size, the three split counts of the
// fewest predicted waves of CTAs over `num_sms`, each split one in both modes (<= kMaxCandidates).
std::vector<Variant> candidates(int m, int k, int num_sms);
// Bytes of the workspace a variant needs for m outputs (0 for cluster variants). The caller
// allocates it zeroed once; every launch leaves its counters at zero again. One workspace serves
// one stream at a time.
size_t workspace_bytes(int m, Variant v);
// Clusters of the variant that the device can hold at once (cudaOccupancyMaxActiveClusters; 0 for
// variants without a cluster, -1 when the query fails): for the tuner's log.
int max_active_clusters(Variant v);
// Launches the variant on `stream` (graph-capturable: no allocation, no sync). Throws gqattn::Error
// when the views do not fit, the variant is invalid, a workspace variant has no workspace, or the
// launch fails.
void launch(const TensorView& x, const TensorView& w, const TensorView& y, Variant v, cudaStream_t stream,
            void* workspace = nullptr);

}  // namespace gqattn::engine::gemm_sm90
