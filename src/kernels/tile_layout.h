// The portable attention kernel's tiles in shared memory: where 16-byte chunk c of row r of a Q,
// K or V tile lies, and which chunks each thread copies. Layer: src/kernels (host-includable, so
// tests/cpu/tile_layout_test.cc checks every family's layout without a GPU).
#pragma once

#include "kernels/attention_config.h"
#include "prims/host_device.h"

namespace gqattn::kernels {

// Element offset of 16-byte chunk `chunk` of row `row` in a [rows][HeadDim] tile, laid out so that
// ldmatrix's eight row addresses hit eight different bank groups: chunks XOR-swizzled by the row,
// or rows of an odd number of chunks (smem_row_elems).
template <int HeadDim>
GQ_HOST_DEVICE int swizzle(int row, int chunk) {
  if constexpr (xor_swizzled_rows(HeadDim)) {
    return row * HeadDim + ((chunk ^ (row & 7)) << 3);
  } else {
    return row * smem_row_elems(HeadDim) + (chunk << 3);
  }
}

// Pass i of a tile's loads: the row and 16-byte chunk that a thread copies. Where the chunks of a
// row divide the threads, a thread copies the same chunk of every kThreads / kChunks-th row; else
// (head_dim 80, 96, 112) thread t copies chunk u % kChunks of row u / kChunks, u = t + i * kThreads,
// and a tile's last pass may reach past its rows (the caller's in_tile).
template <int kThreads, int kChunks>
struct LoadSlots {
  static constexpr bool kSameChunk = kThreads % kChunks == 0;
  int tid, row0, chunk0;  // row0, chunk0: pass 0's
  GQ_HOST_DEVICE explicit LoadSlots(int t) : tid(t), row0(t / kChunks), chunk0(t % kChunks) {}
  GQ_HOST_DEVICE int row(int i) const {
    return kSameChunk ? row0 + i * (kThreads / kChunks) : (tid + i * kThreads) / kChunks;
  }
  GQ_HOST_DEVICE int chunk(int i) const { return kSameChunk ? chunk0 : (tid + i * kThreads) % kChunks; }
  // The passes that cover Rows rows, and whether pass i's row r is one of them.
  template <int Rows>
  static constexpr int passes() { return (Rows * kChunks + kThreads - 1) / kThreads; }
  template <int Rows>
  GQ_HOST_DEVICE static bool in_tile(int r) {
    return (Rows * kChunks) % kThreads == 0 || r < Rows;
  }
};

}  // namespace gqattn::kernels
