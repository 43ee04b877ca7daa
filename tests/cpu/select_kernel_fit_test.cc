// dispatch::fit_shared_memory(): the kernel that select_kernel() picks must fit the device's
// shared memory a CTA. The rows are this build's kernel-table rows as add_families() lists them,
// with the shared memory of attention_config.h, so the test needs no CUDA build.
// Layer: tests/cpu (label cpu).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dispatch/select_kernel.h"

namespace gqattn::dispatch {
namespace {

using kernels::AttnShape;
using kernels::Family;

// Dynamic shared memory a CTA may take (cudaDevAttrMaxSharedMemoryPerBlockOptin).
constexpr int kSm86Smem = 99 * 1024;   // sm_86, sm_89, sm_120
constexpr int kSm80Smem = 163 * 1024;  // sm_80, sm_87
constexpr int kSm90Smem = 227 * 1024;  // sm_90

template <Family F, int HeadDim>
FamilyFit row() {
  return FamilyFit{F, AttnShape<F, HeadDim>::kCtaRows, AttnShape<F, HeadDim>::kSmemBytes};
}

// One head dim's rows in select_kernel.cc's table order (add_families), the Hopper one included.
template <int HeadDim>
std::vector<FamilyFit> table_rows() {
  std::vector<FamilyFit> t;
  t.push_back(row<Family::kDecode, HeadDim>());
  if constexpr (HeadDim <= kernels::kDecodeMidMaxHeadDim) t.push_back(row<Family::kDecodeMid, HeadDim>());
  if constexpr (HeadDim == kernels::kDecodeManyHeadDim) t.push_back(row<Family::kDecodeMany, HeadDim>());
  if constexpr (HeadDim == kernels::kDecodeLongHeadDim) t.push_back(row<Family::kDecodeLong, HeadDim>());
  t.push_back(row<Family::kDecodeWide, HeadDim>());
  t.push_back(row<Family::kPrefill, HeadDim>());
  if constexpr (kernels::sm90_head_dim(HeadDim)) t.push_back(row<Family::kPrefillSm90, HeadDim>());
  return t;
}

int index_of(const std::vector<FamilyFit>& rows, Family f) {
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].family == f) return static_cast<int>(i);
  return -1;
}

Family family_for(const std::vector<FamilyFit>& rows, Family wanted, int packed_rows, int max_smem) {
  const int i = fit_shared_memory(rows, index_of(rows, wanted), packed_rows, max_smem);
  return i < 0 ? Family::kPrefillSm90Wide : rows[i].family;  // (no portable row: a value no test expects)
}

// The decode family at hd128 takes 100 KB: on a 99 KB device the <= 16 rows of an ordinary decode
// step run on decode_many (32-key tiles, 52 KB); decode_mid's 17..32 rows and decode_wide's 33..64
// (104 and 112 KB) on the prefill family (exactly 99 KB).
TEST(FitSharedMemory, Hd128OnA99KbDevice) {
  const std::vector<FamilyFit> rows = table_rows<128>();
  ASSERT_GT((AttnShape<Family::kDecode, 128>::kSmemBytes), kSm86Smem);
  EXPECT_EQ(family_for(rows, Family::kDecode, 1, kSm86Smem), Family::kDecodeMany);
  EXPECT_EQ(family_for(rows, Family::kDecode, 16, kSm86Smem), Family::kDecodeMany);
  EXPECT_EQ(family_for(rows, Family::kDecodeMid, 32, kSm86Smem), Family::kPrefill);
  EXPECT_EQ(family_for(rows, Family::kDecodeWide, 64, kSm86Smem), Family::kPrefill);
  EXPECT_EQ(family_for(rows, Family::kPrefill, 1 << 20, kSm86Smem), Family::kPrefill);
}

// hd256 decode (104 KB) on decode_wide (97.5 KB, listed before prefill's rows of the same count).
TEST(FitSharedMemory, Hd256DecodeOnA99KbDevice) {
  const std::vector<FamilyFit> rows = table_rows<256>();
  EXPECT_EQ(family_for(rows, Family::kDecode, 8, kSm86Smem), Family::kDecodeWide);
  EXPECT_EQ(family_for(rows, Family::kDecodeWide, 64, kSm86Smem), Family::kDecodeWide);
}

// Every head dim, every family select_kernel may want and every row count: the row taken fits the
// device and is a portable one; where the wanted row fits (every row on sm_80 and sm_90, or no
// limit known) it is kept.
template <int HeadDim>
void check_every_choice_fits() {
  SCOPED_TRACE("head_dim " + std::to_string(HeadDim));
  const std::vector<FamilyFit> rows = table_rows<HeadDim>();
  for (int limit : {kSm86Smem, kSm80Smem, kSm90Smem, 0}) {
    for (size_t wanted = 0; wanted < rows.size(); ++wanted) {
      for (int packed : {1, 16, 17, 32, 33, 64, 65, 128, 4096}) {
        SCOPED_TRACE(testing::Message() << "limit " << limit << ", wanted row " << wanted << ", " << packed << " rows");
        const int got = fit_shared_memory(rows, static_cast<int>(wanted), packed, limit);
        ASSERT_GE(got, 0);
        if (limit == 0 || rows[wanted].smem_bytes <= limit) {
          EXPECT_EQ(got, static_cast<int>(wanted));
          continue;
        }
        EXPECT_LE(rows[got].smem_bytes, limit);
        EXPECT_FALSE(kernels::is_sm90_family(rows[got].family));
      }
    }
  }
}

TEST(FitSharedMemory, EveryHeadDimFitsEveryDevice) {
  check_every_choice_fits<64>();
  check_every_choice_fits<80>();
  check_every_choice_fits<96>();
  check_every_choice_fits<112>();
  check_every_choice_fits<128>();
  check_every_choice_fits<256>();
}

// A device that holds none of the rows: -1 (select_kernel throws, naming the limit).
TEST(FitSharedMemory, NoneFits) {
  const std::vector<FamilyFit> rows = table_rows<128>();
  EXPECT_EQ(fit_shared_memory(rows, index_of(rows, Family::kDecode), 16, 48 * 1024), -1);
}

}  // namespace
}  // namespace gqattn::dispatch
