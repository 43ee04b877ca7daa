// The portable attention kernel's shared-memory tiles, checked on the host for every family and
// head dim the generator writes (src/kernels/tile_layout.h): the threads' copies cover each chunk of
// a Q and a K/V tile exactly once, the chunks' offsets are distinct and inside the tile, and the
// eight rows of one chunk that an ldmatrix phase reads fall into eight different 16-byte bank
// groups (no conflict), at 64 / 128 / 256 (XOR swizzle) and 80 / 96 / 112 (rows of an odd number
// of chunks). Layer: tests/cpu (label cpu).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "kernels/tile_layout.h"

namespace gqattn::kernels {
namespace {

// A tile of Rows rows copied by kThreads threads in LoadSlots' passes, stored by swizzle<HeadDim>.
template <int HeadDim, int kThreads, int Rows>
void check_tile(const std::string& what) {
  SCOPED_TRACE(what + ": head_dim " + std::to_string(HeadDim) + ", " + std::to_string(kThreads) + " threads, " +
               std::to_string(Rows) + " rows");
  constexpr int kChunks = HeadDim / 8;
  using Slots = LoadSlots<kThreads, kChunks>;
  std::vector<int> copies(Rows * kChunks, 0);
  for (int t = 0; t < kThreads; ++t) {
    const Slots slots(t);
    for (int i = 0; i < Slots::template passes<Rows>(); ++i) {
      const int r = slots.row(i);
      if (!Slots::template in_tile<Rows>(r)) continue;
      const int c = slots.chunk(i);
      ASSERT_TRUE(r >= 0 && r < Rows && c >= 0 && c < kChunks) << "thread " << t << " pass " << i;
      ++copies[r * kChunks + c];
    }
  }
  for (int u = 0; u < Rows * kChunks; ++u) ASSERT_EQ(copies[u], 1) << "row " << u / kChunks << " chunk " << u % kChunks;

  std::set<int> offsets;
  for (int r = 0; r < Rows; ++r) {
    for (int c = 0; c < kChunks; ++c) {
      const int off = swizzle<HeadDim>(r, c);
      ASSERT_EQ(off % 8, 0);
      ASSERT_TRUE(off >= 0 && off + 8 <= Rows * smem_row_elems(HeadDim)) << "row " << r << " chunk " << c;
      ASSERT_TRUE(offsets.insert(off).second) << "row " << r << " chunk " << c << " overlaps another";
    }
  }
  // ldmatrix: each phase reads one chunk of eight consecutive rows from a multiple of 8 (Q, K and V
  // alike); 16-byte bank group = (byte offset / 16) % 8 of a tile that starts on 128 bytes.
  for (int r0 = 0; r0 + 8 <= Rows; r0 += 8) {
    for (int c = 0; c < kChunks; ++c) {
      std::set<int> groups;
      for (int j = 0; j < 8; ++j) groups.insert((swizzle<HeadDim>(r0 + j, c) * 2 / 16) % 8);
      ASSERT_EQ(groups.size(), 8u) << "rows " << r0 << ".." << r0 + 7 << " chunk " << c;
    }
  }
}

template <Family F, int HeadDim>
void check_family(const std::string& name) {
  using Shape = AttnShape<F, HeadDim>;
  check_tile<HeadDim, Shape::kThreads, Shape::kCtaRows>(name + " Q");
  check_tile<HeadDim, Shape::kThreads, AttnConfig<F, HeadDim>::kKVTile>(name + " K/V");
  // Q, then each stage's K and V tiles: every tile starts on 128 bytes (the bank groups above).
  EXPECT_EQ(Shape::kQBytes % 128, 0) << name;
  EXPECT_EQ(Shape::kStageBytes % 256, 0) << name;
}

template <int HeadDim>
void check_head_dim() {
  check_family<Family::kDecode, HeadDim>("decode");
  if constexpr (HeadDim <= kDecodeMidMaxHeadDim) check_family<Family::kDecodeMid, HeadDim>("decode_mid");
  if constexpr (HeadDim == kDecodeManyHeadDim) check_family<Family::kDecodeMany, HeadDim>("decode_many");
  if constexpr (HeadDim == kDecodeLongHeadDim) check_family<Family::kDecodeLong, HeadDim>("decode_long");
  check_family<Family::kDecodeWide, HeadDim>("decode_wide");
  check_family<Family::kPrefill, HeadDim>("prefill");
}

TEST(TileLayout, SwizzledHeadDims) {
  check_head_dim<64>();
  check_head_dim<128>();
  check_head_dim<256>();
}

TEST(TileLayout, PaddedRowHeadDims) {
  check_head_dim<80>();
  check_head_dim<96>();
  check_head_dim<112>();
  EXPECT_EQ(smem_row_elems(80), 88);
  EXPECT_EQ(smem_row_elems(96), 104);
  EXPECT_EQ(smem_row_elems(112), 120);
}

}  // namespace
}  // namespace gqattn::kernels
