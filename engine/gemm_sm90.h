// The engine's own GEMM for decode steps on Hopper: y[n, m] = x[n, k] . w[m, k]^T with few tokens
// (n <= 128), where the time is reading w once. Each CTA streams a tile of w's rows (128 or 256)
// through a TMA + mbarrier pipeline and multiplies it by all n tokens with wgmma. A thread-block
// cluster holds `mcast` neighbouring tiles on one k slice, which share each block of x by TMA
// multicast (the L2 sends x once per mcast tiles: it, not HBM, limited the first version), times
// `splits` slices of k, whose fp32 partial tiles are added in a fixed order through distributed
// shared memory (bit-repeatable, no workspace). The CUDA compute device times its variants beside
// cuBLASLt's candidates and keeps whichever is fastest (cuda_compute.cu).
// Layer: engine (CUDA only; the kernel is compiled for sm_90a, see GQATTN_ENGINE_SM90).
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "gqattn/tensor.h"

namespace gqattn::engine::gemm_sm90 {

constexpr int kMaxTokens = 128;      // two consumer warpgroups of 64 token rows
constexpr int kMaxSplits = 8;        // k slices a tile
constexpr int kMaxClusterSize = 8;   // the portable cluster size: splits x mcast
constexpr int kMaxCandidates = 8;    // variants the tuner times per shape

struct Variant {
  int tile_m = 0;  // rows of w per CTA: 128 or 256
  int splits = 0;  // CTAs sharing one tile, each a slice of k
  int mcast = 1;   // tiles sharing each x block by TMA multicast: 1, 2 or 4
};

// Whether the kernel was built (GQATTN_CUDA_ARCHS has 90a) and the device `device_id` is sm_90.
bool available(int device_id);
// Whether these views fit the kernel: x and w bf16, y bf16 or fp32, all on one device, 1 <= n <=
// kMaxTokens, k and m multiples of 8, 16-byte aligned pointers and row strides, unit column stride.
bool fits(const TensorView& x, const TensorView& w, const TensorView& y);
// Whether the variant exists (tile 128 or 256, mcast 1, 2 or 4, splits x mcast <= kMaxClusterSize).
bool valid(Variant v);
// The variants worth timing for m outputs over k on the current device: the kMaxCandidates of the
// least predicted time (waves of clusters the device holds at once x what a CTA reads through the L2).
std::vector<Variant> candidates(int m, int k);
// CTAs (variants without a cluster) or clusters the current device holds at once; -1 when the
// query fails or the variant is invalid. For the tuner's model and its log.
int max_active_clusters(Variant v);
// Launches the variant on `stream` (graph-capturable: no allocation, no sync). Throws gqattn::Error
// when the views do not fit, the variant is invalid, or the launch fails.
void launch(const TensorView& x, const TensorView& w, const TensorView& y, Variant v, cudaStream_t stream);

}  // namespace gqattn::engine::gemm_sm90
