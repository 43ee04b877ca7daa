// TensorView methods, dtype / device / layout names, the PagedKV accessors, and the
// block-table <-> CSR helpers with their errors. Layer: tests/cpu (label cpu).
#include <gtest/gtest.h>

#include <string>

#include "common/test_util.h"
#include "gqattn/paged_kv.h"
#include "gqattn/tensor.h"

namespace gqattn::test {
namespace {

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Tensor, ContiguousViewAndDescribe) {
  float buf[24];
  const TensorView t = TensorView::contiguous(buf, {2, 3, 4}, DType::kFP32);
  EXPECT_EQ(t.ndim, 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(1), 4);
  EXPECT_EQ(t.stride(2), 1);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.last_dim_contiguous());
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.describe(), "[2, 3, 4] fp32 cpu");
  const TensorView g = TensorView::contiguous(buf, {4, 2}, DType::kBF16, Device::kCUDA, 1);
  EXPECT_EQ(g.describe(), "[4, 2] bf16 cuda:1");
  EXPECT_EQ(TensorView{}.describe(), "undefined");
  EXPECT_EQ(TensorView{}.numel(), 0);
  EXPECT_FALSE(TensorView{}.defined());
}

TEST(Tensor, StridedViewIsNotContiguous) {
  HostTensor padded({2, 3}, {8, 1}, DType::kFP16);
  EXPECT_FALSE(padded.view().is_contiguous());
  EXPECT_TRUE(padded.view().last_dim_contiguous());
  HostTensor col({2, 3}, {1, 2}, DType::kFP16);
  EXPECT_FALSE(col.view().last_dim_contiguous());
  HostTensor ones({1, 3}, {100, 1}, DType::kFP16);  // a size-1 dim's stride does not matter
  EXPECT_TRUE(ones.view().is_contiguous());
}

TEST(Tensor, ContiguousRejectsBadShapes) {
  EXPECT_NE(error_of([] { TensorView::contiguous(nullptr, {1, 2, 3, 4, 5}, DType::kFP32); }).find("1 to 4 dims"),
            std::string::npos);
  EXPECT_NE(error_of([] { TensorView::contiguous(nullptr, {2, -1}, DType::kFP32); }).find("negative"),
            std::string::npos);
}

TEST(Tensor, Names) {
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kFP16), 2u);
  EXPECT_EQ(dtype_size(DType::kFP32), 4u);
  EXPECT_EQ(dtype_size(DType::kInt32), 4u);
  EXPECT_STREQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_STREQ(dtype_name(DType::kFP16), "fp16");
  EXPECT_STREQ(dtype_name(DType::kFP32), "fp32");
  EXPECT_STREQ(dtype_name(DType::kInt32), "int32");
  EXPECT_STREQ(device_name(Device::kCPU), "cpu");
  EXPECT_STREQ(device_name(Device::kCUDA), "cuda");
  EXPECT_STREQ(layout_name(KVLayout::kNHD), "NHD");
  EXPECT_STREQ(layout_name(KVLayout::kHND), "HND");
}

TEST(PagedKVDescriptor, AccessorsFollowTheLayout) {
  HostTensor k = random_tensor({10, 3, 4, 64}, DType::kBF16, 1);
  PagedKV kv;
  kv.k_pages = k.view();
  kv.layout = KVLayout::kHND;  // [pages, heads, page_size, dim]
  EXPECT_EQ(kv.num_pages(), 10);
  EXPECT_EQ(kv.num_kv_heads(), 3);
  EXPECT_EQ(kv.page_size(), 4);
  EXPECT_EQ(kv.head_dim(), 64);
  EXPECT_EQ(kv.head_stride(), 4 * 64);
  EXPECT_EQ(kv.token_stride(), 64);
  kv.layout = KVLayout::kNHD;  // [pages, page_size, heads, dim]
  EXPECT_EQ(kv.num_kv_heads(), 4);
  EXPECT_EQ(kv.page_size(), 3);
  EXPECT_EQ(kv.head_stride(), 64);
  EXPECT_EQ(kv.token_stride(), 4 * 64);
  EXPECT_EQ(kv.page_stride(), 3 * 4 * 64);
}

// ---- block table <-> CSR -------------------------------------------------------------------------

TEST(PageTable, BlockTableCsrRoundTrip) {
  for (const int page_size : {1, 3, 16}) {
    const std::vector<int32_t> kv_len = {0, 1, 16, 17, 47, 3};
    const PageTable t = make_random_page_table(kv_len, page_size, 9);
    PageTableCSR csr{t.kv_page_indptr, t.kv_page_indices, t.kv_last_page_len};
    const BlockTable table = csr_to_block_table(csr, page_size);
    EXPECT_EQ(table.batch, 6);
    EXPECT_EQ(table.kv_len, kv_len);
    EXPECT_EQ(table.max_pages, (47 + page_size - 1) / page_size);
    const PageTableCSR back = block_table_to_csr(table, page_size);
    EXPECT_EQ(back.kv_page_indptr, csr.kv_page_indptr);
    EXPECT_EQ(back.kv_page_indices, csr.kv_page_indices);
    EXPECT_EQ(back.kv_last_page_len, csr.kv_last_page_len);
    EXPECT_EQ(kv_lengths(csr.kv_page_indptr, csr.kv_last_page_len, page_size), kv_len);
  }
}

TEST(PageTable, BlockTableWithSpareColumns) {
  BlockTable table;
  table.batch = 2;
  table.max_pages = 4;
  table.pages = {7, 3, -1, -1, 5, 0, 2, 9};
  table.kv_len = {5, 13};
  const PageTableCSR csr = block_table_to_csr(table, 4);
  EXPECT_EQ(csr.kv_page_indptr, (std::vector<int32_t>{0, 2, 6}));
  EXPECT_EQ(csr.kv_page_indices, (std::vector<int32_t>{7, 3, 5, 0, 2, 9}));
  EXPECT_EQ(csr.kv_last_page_len, (std::vector<int32_t>{1, 1}));
}

TEST(PageTable, LengthNeedsMorePagesThanTheRowHolds) {
  BlockTable table;
  table.batch = 2;
  table.max_pages = 2;
  table.pages = {0, 1, 2, 3};
  table.kv_len = {8, 9};
  const std::string msg = error_of([&] { block_table_to_csr(table, 4); });
  EXPECT_NE(msg.find("kv_len[1] (9) needs 3 pages of 4 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_pages (2)"), std::string::npos) << msg;
}

TEST(PageTable, ConversionErrors) {
  BlockTable table;
  table.batch = 1;
  table.max_pages = 1;
  table.pages = {0};
  table.kv_len = {-1};
  EXPECT_NE(error_of([&] { block_table_to_csr(table, 4); }).find("kv_len[0] (-1) is negative"), std::string::npos);
  table.kv_len = {1};
  EXPECT_NE(error_of([&] { block_table_to_csr(table, 0); }).find("page_size (0) must be >= 1"), std::string::npos);
  table.pages = {0, 1};
  EXPECT_NE(error_of([&] { block_table_to_csr(table, 4); }).find("pages holds 2 entries"), std::string::npos);

  EXPECT_NE(error_of([] { kv_lengths({0, 2}, {5}, 4); }).find("kv_last_page_len[0] (5) must be in [1, page_size (4)]"),
            std::string::npos);
  EXPECT_NE(error_of([] { kv_lengths({0, 2, 1}, {1, 1}, 4); }).find("non-decreasing"), std::string::npos);
  EXPECT_NE(error_of([] { kv_lengths({0, 2}, {1, 1}, 4); }).find("kv_last_page_len: expected 1 entries"),
            std::string::npos);
  EXPECT_NE(error_of([] { kv_lengths({0, 0}, {3}, 4); }).find("must be 0"), std::string::npos);
  PageTableCSR csr{{0, 3}, {1, 2}, {2}};
  EXPECT_NE(error_of([&] { csr_to_block_table(csr, 4); }).find("kv_page_indices: holds 2 entries"),
            std::string::npos);
}

}  // namespace
}  // namespace gqattn::test
