// One test per rejected input: each asserts that gqattn::Error names the argument (and the
// values) and that the output, poisoned beforehand, was not touched.
// Layer: tests/cpu (label cpu). CUDA-only checks (alignment) call the validators directly with
// CUDA-tagged views, which they never dereference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "api/validate.h"
#include "common/expect_error.h"
#include "cpu/attention_problem.h"
#include "plan/planner.h"

namespace gqattn::test {
namespace {

constexpr uint8_t kPoison = 0xAB;

int32_t* ints(HostTensor& t) { return static_cast<int32_t*>(t.data()); }

// ---- plan inputs -------------------------------------------------------------------------------

PlanInputs good_decode_inputs() {
  PlanInputs in;
  in.device = Device::kCPU;
  in.dtype = DType::kBF16;
  in.num_qo_heads = 8;
  in.num_kv_heads = 2;
  in.head_dim = 64;
  in.page_size = 4;
  in.kv_indptr = {0, 4, 6};  // kv_len 13 and 7
  in.kv_last_page_len = {1, 3};
  return in;
}

PlanInputs good_prefill_inputs() {
  PlanInputs in = good_decode_inputs();
  in.causal = true;
  in.qo_indptr = {0, 5, 7};
  return in;
}

TEST(ValidatePlan, GoodInputsPass) {
  EXPECT_NO_THROW(validate_plan_inputs(good_decode_inputs(), true));
  EXPECT_NO_THROW(validate_plan_inputs(good_prefill_inputs(), false));
}

TEST(ValidatePlan, HeadsNotDivisible) {
  PlanInputs in = good_decode_inputs();
  in.num_qo_heads = 32;
  in.num_kv_heads = 5;
  expect_rejected([&] { decode_plan(in, Workspace{}); },
                  {"num_qo_heads (32) must be divisible by num_kv_heads (5)"});
}

TEST(ValidatePlan, ZeroHeads) {
  PlanInputs in = good_decode_inputs();
  in.num_kv_heads = 0;
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"num_kv_heads (0) must be > 0"});
  in = good_decode_inputs();
  in.num_qo_heads = -8;
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"num_qo_heads (-8) must be > 0"});
}

TEST(ValidatePlan, UnsupportedHeadDimOnCpu) {
  PlanInputs in = good_decode_inputs();
  in.head_dim = 600;
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"head_dim (600)", "[1, 512]", "CPU"});
  in.head_dim = 0;
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"head_dim (0) must be >= 1"});
}

TEST(ValidatePlan, CudaPlanWithoutCudaBackend) {
  if (build_info().cuda) GTEST_SKIP() << "this build has the CUDA backend";
  PlanInputs in = good_decode_inputs();
  in.device = Device::kCUDA;
  expect_rejected([&] { validate_plan_inputs(in, true); },
                  {"needs the CUDA backend", "-DGQATTN_CUDA=ON", "head_dim 64"});
}

TEST(ValidatePlan, UnsupportedHeadDimOnCuda) {
  if (!build_info().cuda) GTEST_SKIP() << "this build has no CUDA backend (CudaPlanWithoutCudaBackend covers it)";
  PlanInputs in = good_decode_inputs();
  in.device = Device::kCUDA;
  in.head_dim = 192;  // no generated variant
  expect_rejected([&] { validate_plan_inputs(in, true); }, {"head_dim 192", "GQATTN_HEAD_DIMS"});
}

TEST(ValidatePlan, AttentionDtypes) {
  PlanInputs in = good_decode_inputs();
  in.dtype = DType::kInt32;
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"dtype: int32"});
  in.dtype = DType::kFP32;
  EXPECT_NO_THROW(validate_plan_inputs(in, true));  // the CPU takes fp32
  in.device = Device::kCUDA;
  expect_rejected([&] { validate_plan_inputs(in, true); }, {"dtype: fp32", "CPU backend only"});
  in.device = Device::kCPU;
  in.dtype = static_cast<DType>(7);  // not a DType: its element size would be 0, its stores nothing
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"dtype: unknown dtype value 7"});
}

TEST(ValidatePlan, DecodePageSizeZero) {
  PlanInputs in = good_decode_inputs();
  in.page_size = 0;
  in.kv_last_page_len.clear();
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"page_size (0) must be >= 1", "decode"});
  in.page_size = -2;
  expect_rejected([&] { prefill_plan(in, Workspace{}); }, {"page_size (-2)"});
}

TEST(ValidatePlan, LastPageLenOutOfRange) {
  PlanInputs in = good_decode_inputs();
  in.kv_last_page_len = {1, 5};
  expect_rejected([&] { decode_plan(in, Workspace{}); },
                  {"kv_last_page_len[1] (5) must be in [1, page_size (4)]"});
  in.kv_last_page_len = {0, 3};
  expect_rejected([&] { decode_plan(in, Workspace{}); },
                  {"kv_last_page_len[0] (0) must be in [1, page_size (4)]"});
  in.kv_indptr = {0, 4, 4};  // request 1 owns no page
  in.kv_last_page_len = {1, 2};
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"kv_last_page_len[1] (2) must be 0", "no page"});
}

TEST(ValidatePlan, LastPageLenCount) {
  PlanInputs in = good_decode_inputs();
  in.kv_last_page_len = {1};
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"kv_last_page_len: expected 2 entries", "got 1"});
}

TEST(ValidatePlan, KvIndptrMustBeMonotoneFromZero) {
  PlanInputs in = good_decode_inputs();
  in.kv_indptr = {0, 4, 3};
  expect_rejected([&] { decode_plan(in, Workspace{}); },
                  {"kv_indptr (page indptr) must be non-decreasing", "kv_indptr (page indptr)[2] (3)"});
  in.kv_indptr = {1, 4, 6};
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"[0] must be 0, got 1"});
  in.kv_indptr.clear();
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"kv_indptr", "batch + 1 entries, got none"});
}

TEST(ValidatePlan, QoIndptrSizeAndOrder) {
  PlanInputs in = good_prefill_inputs();
  in.qo_indptr = {0, 5};
  expect_rejected([&] { prefill_plan(in, Workspace{}); }, {"qo_indptr: expected 3 entries", "got 2"});
  in.qo_indptr = {0, 5, 4};
  expect_rejected([&] { prefill_plan(in, Workspace{}); }, {"qo_indptr must be non-decreasing"});
  in = good_decode_inputs();
  in.qo_indptr = {0, 1, 2};
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"qo_indptr: must be empty for decode"});
}

TEST(ValidatePlan, DecodeQoLenRange) {
  PlanInputs in = good_decode_inputs();
  in.qo_len = 0;
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"qo_len (0) must be >= 1"});
  in.qo_len = 9;
  in.device = Device::kCUDA;
  expect_rejected([&] { validate_plan_inputs(in, true); }, {"qo_len (9) must be in [1, 8]", "CUDA decode"});
  in.device = Device::kCPU;
  in.kv_indptr = {0, 4, 8};  // kv_len 13 and 16
  in.kv_last_page_len = {1, 4};
  EXPECT_NO_THROW(validate_plan_inputs(in, true));  // any qo_len <= kv_len on the CPU
}

TEST(ValidatePlan, CausalQoLenBeyondKvLen) {
  PlanInputs in = good_prefill_inputs();
  in.qo_indptr = {0, 5, 13};  // request 1: 8 new tokens, 7 keys
  expect_rejected([&] { prefill_plan(in, Workspace{}); },
                  {"request 1: qo_len (8) exceeds kv_len (7)", "causal"});
  in.causal = false;
  EXPECT_NO_THROW(validate_plan_inputs(in, false));
  in = good_decode_inputs();
  in.qo_len = 8;  // request 1 has 7 keys
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"request 1: qo_len (8) exceeds kv_len (7)"});
}

TEST(ValidatePlan, PackedRowsBeyondInt32Headroom) {
  // Request 0's qo_len x group size is its packed query rows, int32 indices in the work list and
  // the kernels: 2^23 tokens x 128 heads a K/V head is the most; one token more is rejected
  // before anything wraps (an int32 product there would be 2^31 + 128 at 2^24 tokens).
  PlanInputs in = good_prefill_inputs();
  in.causal = false;
  in.num_qo_heads = 256;
  in.num_kv_heads = 2;
  in.qo_indptr = {0, 1 << 23, (1 << 23) + 2};
  EXPECT_NO_THROW(validate_plan_inputs(in, false));
  in.qo_indptr = {0, (1 << 23) + 1, (1 << 23) + 3};
  expect_rejected([&] { prefill_plan(in, Workspace{}); },
                  {"request 0: qo_len (8388609) x group size", "1073741952 packed query rows", "1073741824"});
  in.qo_indptr = {0, 1 << 24, (1 << 24) + 2};
  expect_rejected([&] { prefill_plan(in, Workspace{}); }, {"request 0: qo_len (16777216)", "2147483648 packed"});
}

TEST(ValidatePlan, KvLenBeyondInt32Headroom) {
  // A paged request may list one page many times, so 2^30 keys need no memory to plan; past that
  // the kernels' int32 key indices (a tile past the last key) would wrap.
  PlanInputs in = good_decode_inputs();
  in.kv_indptr = {0, 1 << 28, (1 << 28) + 1};  // 2^28 pages of 4 keys
  in.kv_last_page_len = {4, 1};
  EXPECT_NO_THROW(validate_plan_inputs(in, true));
  in.kv_indptr = {0, 2, (1 << 28) + 3};
  in.kv_last_page_len = {1, 2};
  expect_rejected([&] { decode_plan(in, Workspace{}); },
                  {"kv_len of request 1 (1073741826) exceeds 1073741824 keys"});
  in.kv_indptr = {0, 2, (1 << 29) + 2};  // 2^31 keys: past int32 itself
  in.kv_last_page_len = {1, 4};
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"kv_len of request 1 (2147483648) exceeds"});
  in = good_prefill_inputs();  // ragged: token indptr
  in.causal = false;
  in.page_size = 0;
  in.kv_last_page_len.clear();
  in.kv_indptr = {0, 3, (1 << 30) + 4};
  expect_rejected([&] { prefill_plan(in, Workspace{}); }, {"kv_len of request 1 (1073741825) exceeds"});
}

TEST(ValidatePlan, CheckedModePageOutsidePool) {
  PlanInputs in = good_decode_inputs();
  in.kv_page_indices = {3, 99, 0, 1, 2, 5};
  in.num_pages = 10;
  expect_rejected([&] { decode_plan(in, Workspace{}); },
                  {"kv_page_indices[1] (99) is outside the page pool [0, num_pages (10))"});
  in.kv_page_indices = {3, 9, 0, 1, 2, -1};
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"kv_page_indices[5] (-1) is outside"});
  in.kv_page_indices = {3, 9, 0};
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"kv_page_indices: holds 3 page ids", "kv_indptr[batch] is 6"});
  in.kv_page_indices = {3, 9, 0, 1, 2, 4};
  in.num_pages = -1;
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"num_pages (-1) must be set", "checked mode"});
  in.num_pages = 10;
  EXPECT_NO_THROW(decode_plan(in, Workspace{}));
  in.kv_page_indices.clear();  // a pool size with no page ids: checked, not read as unchecked
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"kv_page_indices: holds 0 page ids", "kv_indptr[batch] is 6"});
}

TEST(ValidatePlan, RaggedTakesNoLastPageLenNorPageIds) {
  PlanInputs in = good_prefill_inputs();
  in.page_size = 0;
  in.kv_indptr = {0, 13, 20};
  expect_rejected([&] { prefill_plan(in, Workspace{}); }, {"kv_last_page_len: must be empty for ragged"});
  in.kv_last_page_len.clear();
  EXPECT_NO_THROW(validate_plan_inputs(in, false));
  in.kv_page_indices = {0};
  in.num_pages = 4;
  expect_rejected([&] { prefill_plan(in, Workspace{}); }, {"kv_page_indices: checked mode needs paged K/V"});
}

TEST(ValidatePlan, MaxNumSplitsNegative) {
  PlanInputs in = good_decode_inputs();
  in.max_num_splits = -1;
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"max_num_splits (-1)"});
}

TEST(ValidatePlan, FixedSplitSizeNegativeOrWithMaxNumSplits) {
  PlanInputs in = good_decode_inputs();
  in.fixed_split_size = -1;
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"fixed_split_size (-1)", ">= 0"});
  in.fixed_split_size = 256;
  in.max_num_splits = 4;
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"fixed_split_size (256)", "max_num_splits (4)"});
  in.max_num_splits = 0;
  EXPECT_NO_THROW(decode_plan(in, Workspace{}));  // the CPU backend plans it (and ignores the chunk)
}

TEST(ValidatePlan, GraphPerSplitWithoutGraphMode) {
  PlanInputs in = good_decode_inputs();
  in.graph_per_split = true;
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"graph_per_split", "enable_cuda_graph"});
}

// An enum value outside Device (a cast integer, an uninitialised field) is not taken for CUDA.
TEST(ValidatePlan, UnknownDevice) {
  PlanInputs in = good_decode_inputs();
  in.device = static_cast<Device>(7);
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"device: unknown device value 7"});
}

TEST(ValidatePlan, NegativeDeviceId) {
  PlanInputs in = good_decode_inputs();
  in.device = Device::kCUDA;
  in.device_id = -1;
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"device_id (-1) must be >= 0"});
  in.device = Device::kCPU;  // the CPU backend ignores device_id
  EXPECT_NO_THROW(validate_plan_inputs(in, true));
}

TEST(ValidatePlan, NumPagesBelowMinusOne) {
  PlanInputs in = good_decode_inputs();
  in.num_pages = -2;
  expect_rejected([&] { decode_plan(in, Workspace{}); }, {"num_pages (-2) must be -1 (unknown) or >= 0"});
  in = good_prefill_inputs();
  in.num_pages = -2;
  expect_rejected([&] { prefill_plan(in, Workspace{}); }, {"num_pages (-2) must be -1 (unknown) or >= 0"});
}

// A decode plan's query tokens (batch x qo_len, the rows of q and o) are int32 row indices: empty
// KVs let a request take any qo_len, so only this check stops 2 x 2^30 tokens.
TEST(ValidatePlan, DecodeQueryTokensBeyondInt32) {
  PlanInputs in = good_decode_inputs();
  in.num_qo_heads = in.num_kv_heads = 2;  // group size 1: 2^30 tokens are 2^30 packed rows, the most
  in.kv_indptr = {0, 0};
  in.kv_last_page_len = {0};
  in.qo_len = 1 << 30;
  EXPECT_NO_THROW(validate_plan_inputs(in, true));
  in.kv_indptr = {0, 0, 0};
  in.kv_last_page_len = {0, 0};
  expect_rejected([&] { decode_plan(in, Workspace{}); },
                  {"batch (2) x qo_len (1073741824) query tokens do not fit in int32"});
}

// ---- decode run ----------------------------------------------------------------------------------

class DecodeRun : public testing::Test {
 protected:
  void SetUp() override {
    p.num_qo_heads = 8;
    p.num_kv_heads = 2;
    p.head_dim = 64;
    p.dtype = DType::kBF16;
    p.qo_len = {1, 1};
    p.kv_len = {13, 7};
    in = make_inputs(p);
    kv = make_paged_kv(in.k, in.v, p.kv_len, 4, KVLayout::kNHD, 3);
    plan = decode_plan(plan_inputs(p, 4, kv.table.kv_page_indptr, kv.table.kv_last_page_len), Workspace{});
    o = HostTensor({2, 8, 64}, DType::kBF16);
    lse = HostTensor({2, 8}, DType::kFP32);
    o.fill_bytes(kPoison);
    lse.fill_bytes(kPoison);
    args.q = in.q.view();
    args.kv = kv.view();
    args.o = o.view();
    args.lse = lse.view();
  }
  void run() { decode_run(plan, args); }
  bool untouched() const { return all_bytes_equal(o, kPoison) && all_bytes_equal(lse, kPoison); }
  void expect_rejected_untouched(std::initializer_list<std::string> needles) {
    expect_rejected([&] { run(); }, needles);
    EXPECT_TRUE(untouched()) << "a rejected call wrote its output";
  }

  Problem p;
  Inputs in;
  PagedKVHost kv;
  Plan plan;
  HostTensor o, lse;
  DecodeArgs args;
};

TEST_F(DecodeRun, GoodCallWrites) {
  run();
  EXPECT_FALSE(all_bytes_equal(o, kPoison));
  EXPECT_FALSE(all_bytes_equal(lse, kPoison));
}

TEST_F(DecodeRun, WrongNdim) {
  args.q.ndim = 2;
  expect_rejected_untouched({"q: expected 3 dims [tokens, num_qo_heads, head_dim], got [2, 8]"});
}

TEST_F(DecodeRun, WrongHeadDim) {
  args.q.shape[2] = 32;
  expect_rejected_untouched({"q: head_dim (dim 2) is 32, expected 64"});
}

TEST_F(DecodeRun, WrongTokenCount) {
  args.o.shape[0] = 3;
  expect_rejected_untouched({"o: tokens (dim 0) is 3, expected 2"});
}

TEST_F(DecodeRun, WrongQoHeads) {
  args.o.shape[1] = 4;
  expect_rejected_untouched({"o: num_qo_heads (dim 1) is 4, expected 8"});
}

TEST_F(DecodeRun, OutputDtypeMismatch) {
  args.o.dtype = DType::kFP16;
  expect_rejected_untouched({"o: dtype is fp16, expected bf16"});
}

TEST_F(DecodeRun, PoolDtypeMismatch) {
  args.kv.v_pages.dtype = DType::kFP16;
  expect_rejected_untouched({"kv.v_pages: dtype is fp16, expected bf16"});
}

TEST_F(DecodeRun, NonInt32Index) {
  args.kv.kv_page_indptr.dtype = DType::kFP32;
  expect_rejected_untouched({"kv.kv_page_indptr: dtype is fp32, expected int32"});
}

TEST_F(DecodeRun, DeviceMismatch) {
  args.q.device = Device::kCUDA;
  expect_rejected_untouched({"q: is on cuda:0 but the plan is on cpu"});
}

TEST_F(DecodeRun, IndexDeviceMismatch) {
  args.kv.kv_page_indices.device = Device::kCUDA;
  expect_rejected_untouched({"kv.kv_page_indices: is on cuda:0"});
}

TEST_F(DecodeRun, NullPointer) {
  args.q.data = nullptr;
  expect_rejected_untouched({"q: data pointer is null", "1024 elements"});
}

TEST_F(DecodeRun, NonContiguousLastDim) {
  args.o.strides[2] = 2;
  expect_rejected_untouched({"o: last dimension must be contiguous"});
}

TEST_F(DecodeRun, LseWrongDtype) {
  args.lse.dtype = DType::kBF16;
  expect_rejected_untouched({"lse: dtype is bf16, expected fp32"});
}

TEST_F(DecodeRun, LseWrongShape) {
  args.lse.shape[1] = 2;
  expect_rejected_untouched({"lse: num_qo_heads (dim 1) is 2, expected 8"});
}

TEST_F(DecodeRun, PoolHeadsMismatch) {
  args.kv.k_pages.shape[2] = 4;  // NHD: [pages, page_size, num_kv_heads, head_dim]
  expect_rejected_untouched({"kv.k_pages: num_kv_heads (dim 2) is 4, expected 2"});
}

TEST_F(DecodeRun, PoolPageSizeMismatch) {
  args.kv.k_pages.shape[1] = 8;
  args.kv.v_pages.shape[1] = 8;
  expect_rejected_untouched({"kv.k_pages: page_size (dim 1) is 8, expected 4"});
}

TEST_F(DecodeRun, LayoutMismatch) {
  args.kv.layout = KVLayout::kHND;  // an NHD pool read as HND: dim 1 holds page_size
  expect_rejected_untouched({"kv.k_pages: num_kv_heads (dim 1) is 4, expected 2"});
}

TEST_F(DecodeRun, PoolHeadDimMismatch) {
  args.kv.k_pages.shape[3] = 128;
  args.kv.v_pages.shape[3] = 128;
  expect_rejected_untouched({"kv.k_pages: head_dim (dim 3) is 128, expected 64"});
}

TEST_F(DecodeRun, VPoolStridesDiffer) {
  args.kv.v_pages.strides[0] += 64;
  expect_rejected_untouched({"kv.v_pages: strides", "differ from kv.k_pages"});
}

// A view with more dims than k_pages: named, and its shape never read past the TensorView's arrays.
TEST_F(DecodeRun, VPoolMoreDims) {
  args.kv.v_pages.ndim = kMaxDims + 1;
  expect_rejected_untouched({"kv.v_pages: 5 dims, expected 4"});
}

TEST_F(DecodeRun, VPoolShapeDiffers) {
  args.kv.v_pages.shape[0] -= 1;
  expect_rejected_untouched({"kv.v_pages: shape", "differs from kv.k_pages"});
}

TEST_F(DecodeRun, IndptrWrongLength) {
  args.kv.kv_page_indptr.shape[0] = 2;
  expect_rejected_untouched({"kv.kv_page_indptr: batch + 1 (dim 0) is 2, expected 3"});
}

TEST_F(DecodeRun, LengthsBeyondThePages) {
  args.kv.kv_page_indices.shape[0] = 5;  // the plan's 13 + 7 keys need 4 + 2 pages
  expect_rejected_untouched({"kv.kv_page_indices: holds 5 page ids", "need 6 pages"});
}

TEST_F(DecodeRun, LastPageLenOutOfRangeAtRun) {
  ints(kv.kv_last_page_len)[1] = 5;
  expect_rejected_untouched({"kv.kv_last_page_len[1] (5) must be in [1, page_size (4)]"});
}

TEST_F(DecodeRun, TableDisagreesWithPlan) {
  ints(kv.kv_last_page_len)[1] = 2;
  expect_rejected_untouched({"request 1 holds 6 keys but the plan was made for 7"});
}

TEST_F(DecodeRun, PageIdOutsidePool) {
  ints(kv.kv_page_indices)[2] = int32_t(kv.table.num_pages);
  expect_rejected_untouched({"kv.kv_page_indices[2]", "is outside the page pool"});
  ints(kv.kv_page_indices)[2] = -1;
  expect_rejected_untouched({"kv.kv_page_indices[2] (-1) is outside the page pool"});
}

// Checked mode keeps the pool size it checked the page ids against: a run on a smaller pool (whose
// page ids the GPU would read without a check) is rejected; a larger one is fine.
TEST_F(DecodeRun, PoolSmallerThanCheckedModesNumPages) {
  PlanInputs checked = plan_inputs(p, 4, kv.table.kv_page_indptr, kv.table.kv_last_page_len);
  checked.kv_page_indices = kv.table.kv_page_indices;
  checked.num_pages = kv.table.num_pages + 1;
  plan = decode_plan(checked, Workspace{});
  EXPECT_EQ(plan.num_pages, kv.table.num_pages + 1);
  expect_rejected_untouched({"kv.k_pages: holds " + std::to_string(kv.table.num_pages) + " pages",
                             "checked its page ids against num_pages (" + std::to_string(kv.table.num_pages + 1) +
                                 ")"});
  const auto& ids = kv.table.kv_page_indices;
  checked.num_pages = *std::max_element(ids.begin(), ids.end()) + 1;  // <= the pool's pages
  plan = decode_plan(checked, Workspace{});
  run();
  EXPECT_FALSE(untouched());
  plan.num_pages = -2;  // a hand-made plan
  expect_rejected([&] { run(); }, {"plan.num_pages (-2) must be -1, or >= 0 in a paged plan"});
}

TEST_F(DecodeRun, KvNotGiven) {
  args.kv = PagedKV{};
  expect_rejected_untouched({"kv: not given"});
}

TEST_F(DecodeRun, PrefillPlan) {
  plan.is_decode = false;
  expect_rejected_untouched({"plan: made by prefill_plan"});
}

// A hand-edited plan whose qo_indptr decreases: request 0's rows would run past q's and o's 2 rows.
TEST_F(DecodeRun, PlanQoIndptrDecreases) {
  plan.qo_indptr = {0, 3, 2};
  expect_rejected_untouched({"plan.qo_indptr must be non-decreasing: plan.qo_indptr[2] (2) < plan.qo_indptr[1] (3)"});
}

// A view claiming more dims than a TensorView holds: rejected before its shape is read past them.
TEST_F(DecodeRun, MoreDimsThanATensorViewHolds) {
  args.q.ndim = kMaxDims + 1;
  expect_rejected_untouched({"q: 5 dims, more than a TensorView holds (4)"});
}

TEST_F(DecodeRun, NonFiniteScale) {
  args.sm_scale = std::numeric_limits<float>::quiet_NaN();
  expect_rejected_untouched({"sm_scale (nan) must be finite"});
}

// The GPU kernels fold the scale into the exponent as a positive factor (a negative one became
// the default 1/sqrt(head_dim) there while the CPU used it): rejected on every device.
TEST_F(DecodeRun, NegativeScale) {
  args.sm_scale = -0.125f;
  expect_rejected_untouched({"sm_scale (-0.125) must be finite and >= 0"});
}

TEST_F(DecodeRun, OutputMayBeQ) {
  args.o = args.q;
  EXPECT_NO_THROW(run());
}

TEST_F(DecodeRun, OutputOverlapsQ) {
  args.o = args.q;
  args.o.strides[0] = 64;  // q's memory read head-major: o's rows are other rows of q
  args.o.strides[1] = 128;
  expect_rejected_untouched({"o: shares memory with q but is not the same view"});
}

TEST_F(DecodeRun, OutputOverlapsPool) {
  args.o.data = args.kv.v_pages.data;
  expect_rejected_untouched({"o: shares memory with kv.v_pages"});
}

TEST_F(DecodeRun, LseOverlapsOutput) {
  args.lse.data = args.o.data;
  expect_rejected_untouched({"o: shares memory with lse"});
}

TEST_F(DecodeRun, BroadcastOutput) {
  args.o.strides[0] = 0;
  expect_rejected_untouched({"o: dim 0 has stride 0", "an output needs distinct elements"});
}

// Rows that share memory without a zero stride: each token's heads start one head row apart, as do
// the tokens, so token 1's head h is token 0's head h + 1.
TEST_F(DecodeRun, OutputRowsShareMemory) {
  args.o.strides[0] = 64;
  args.o.strides[1] = 64;
  expect_rejected_untouched({"o: strides [64, 64, 1] for shape [2, 8, 64] give two elements one address"});
}

// A 0-d lse with a data pointer is a mistake, not "no lse" (data null and 0 dims).
TEST_F(DecodeRun, LseZeroDimsWithData) {
  args.lse.ndim = 0;
  expect_rejected_untouched({"lse: 0 dims but a data pointer"});
}

// A shape whose element count wraps int64 (to 0 here: 2^58 x 4 x 2 x 64 = 2^68) is rejected, not
// taken as empty (which would let a null pointer through).
TEST_F(DecodeRun, ShapeSpansMoreThanMemory) {
  args.kv.k_pages.shape[0] = int64_t(1) << 58;
  args.kv.v_pages.shape[0] = int64_t(1) << 58;
  expect_rejected_untouched({"kv.k_pages: shape [288230376151711744, 4, 2, 64]", "spans more than 2^62 bytes"});
}

TEST_F(DecodeRun, OutputNotGiven) {
  args.o = TensorView{};
  expect_rejected_untouched({"o: not given (undefined tensor); expected [tokens, num_qo_heads, head_dim]"});
}

TEST_F(DecodeRun, NegativeDim) {
  args.q.shape[0] = -2;
  expect_rejected_untouched({"q: tokens (dim 0) is negative (-2)"});
}

TEST_F(DecodeRun, VPoolNotGiven) {
  args.kv.v_pages = TensorView{};
  expect_rejected_untouched({"kv.v_pages: not given (undefined tensor); expected the shape of kv.k_pages [12, 4, 2, 64]"});
}

// kv_last_page_len's values {1, 3} read with stride 2 from {1, 0, 3, 0}: right values, but the
// kernels take index tensors without strides.
TEST_F(DecodeRun, IndexNotContiguous) {
  HostTensor strided = HostTensor::from_int32({1, 0, 3, 0});
  args.kv.kv_last_page_len = strided.view();
  args.kv.kv_last_page_len.shape[0] = 2;
  args.kv.kv_last_page_len.strides[0] = 2;
  expect_rejected_untouched({"kv.kv_last_page_len: must be contiguous (stride 1), got stride 2"});
}

TEST_F(DecodeRun, IndexNullPointer) {
  args.kv.kv_page_indptr.data = nullptr;
  expect_rejected_untouched({"kv.kv_page_indptr: data pointer is null but the tensor holds 3 elements"});
}

// Hand-made plans: the host vectors must agree with batch and total_qo.
TEST_F(DecodeRun, PlanSizesInconsistent) {
  const Plan good = plan;
  plan.kv_len.pop_back();
  expect_rejected_untouched({"plan: inconsistent (batch 2, 1 kv lengths, 3 qo_indptr entries)"});
  plan = good;
  plan.qo_indptr.push_back(2);
  expect_rejected_untouched({"plan: inconsistent (batch 2, 2 kv lengths, 4 qo_indptr entries)"});
  plan = good;
  plan.batch = 3;
  expect_rejected_untouched({"plan: inconsistent (batch 3, 2 kv lengths, 3 qo_indptr entries)"});
  plan = good;
  plan.qo_indptr.clear();
  expect_rejected_untouched({"plan: inconsistent (batch 2, 2 kv lengths, 0 qo_indptr entries)"});
  plan = good;
  plan.total_qo = 3;  // q and o have 2 rows, as qo_indptr says
  expect_rejected_untouched({"plan: total_qo (3) differs from plan.qo_indptr[batch] (2)"});
}

// A hand-made plan whose heads are not a whole group per K/V head: num_kv_heads 0 divided the CPU
// backend by zero; 7 query heads over 2 K/V heads left query head 6 unwritten.
TEST_F(DecodeRun, PlanHeadsNotAGroup) {
  const Plan good = plan;
  const DecodeArgs good_args = args;
  plan.num_kv_heads = 0;
  for (TensorView* pool : {&args.kv.k_pages, &args.kv.v_pages}) pool->shape[2] = 0;  // NHD: no heads
  expect_rejected_untouched({"plan.num_kv_heads (0) must be > 0"});
  plan = good;
  args = good_args;
  plan.num_qo_heads = 7;
  for (TensorView* t : {&args.q, &args.o, &args.lse}) t->shape[1] = 7;
  expect_rejected_untouched({"plan.num_qo_heads (7) must be divisible by num_kv_heads (2)"});
}

// A hand-made plan's scalar fields are checked as plan() checks its inputs. Before: head_dim -1
// read as "any size" in the shape checks, 0 wrote NaN to lse, num_qo_heads -1 returned with
// nothing written, int32 stored truncated values, and an unknown device went to the CUDA backend.
TEST_F(DecodeRun, PlanFieldsOutOfRange) {
  const Plan good = plan;
  plan.head_dim = -1;
  expect_rejected_untouched({"plan.head_dim (-1) must be >= 1; pass a plan returned by decode_plan or prefill_plan"});
  plan = good;
  plan.head_dim = 0;
  expect_rejected_untouched({"plan.head_dim (0) must be >= 1"});
  plan = good;
  plan.num_qo_heads = -1;
  expect_rejected_untouched({"plan.num_qo_heads (-1) must be > 0"});
  plan = good;
  plan.dtype = DType::kInt32;
  expect_rejected_untouched({"plan.dtype: int32 is not an attention dtype"});
  plan = good;
  plan.device = Device(2);
  expect_rejected_untouched({"plan.device: unknown device value 2"});
}

// The CPU backend loads whole elements, so a pointer misaligned for its dtype is rejected on every
// device (it was a misaligned load there).
TEST_F(DecodeRun, PointerNotAlignedToDtype) {
  args.q.data = static_cast<char*>(args.q.data) + 1;
  expect_rejected_untouched({"q: data pointer is not aligned to its dtype bf16 (address % 2 = 1)"});
  args.q = in.q.view();
  args.kv.kv_page_indices.data = static_cast<char*>(args.kv.kv_page_indices.data) + 2;
  expect_rejected_untouched({"kv.kv_page_indices: data pointer is not aligned to its dtype int32 (address % 4 = 2)"});
}

// The most negative stride is rejected without negating it (-INT64_MIN overflows).
TEST_F(DecodeRun, MostNegativeStride) {
  args.q.strides[0] = INT64_MIN;
  expect_rejected_untouched({"q: shape [2, 8, 64]", "spans more than 2^62 bytes"});
}

// The CPU backend reads the index tensors, so their contents are checked before it does.
TEST_F(DecodeRun, IndptrNotFromZeroAtRun) {
  ints(kv.kv_page_indptr)[0] = 1;
  expect_rejected_untouched({"kv.kv_page_indptr[0] must be 0, got 1"});
}

TEST_F(DecodeRun, IndptrDecreasesAtRun) {
  ints(kv.kv_page_indptr)[2] = 3;  // {0, 4, 6} -> {0, 4, 3}
  expect_rejected_untouched({"kv.kv_page_indptr must be non-decreasing: entry 2 (3) < entry 1 (4)"});
}

TEST_F(DecodeRun, LastPageLenOfEmptyRequestAtRun) {
  ints(kv.kv_page_indptr)[2] = 4;  // request 1 owns no page, but its last page holds 3 keys
  expect_rejected_untouched({"kv.kv_last_page_len[1] (3) must be 0: request 1 owns no page"});
}

// CUDA-only checks: the plan is described for CUDA without a GPU, the views are tagged cuda:0,
// and validate_decode_args is called directly (it never dereferences CUDA tensors).
class CudaAlignment : public DecodeRun {
 protected:
  void SetUp() override {
    DecodeRun::SetUp();
    PlanInputs pi = plan_inputs(p, 4, kv.table.kv_page_indptr, kv.table.kv_last_page_len);
    pi.device = Device::kCUDA;
    plan = plan::describe(pi, true);
    for (TensorView* t : {&args.q, &args.o, &args.lse, &args.kv.k_pages, &args.kv.v_pages,
                          &args.kv.kv_page_indptr, &args.kv.kv_page_indices, &args.kv.kv_last_page_len})
      t->device = Device::kCUDA;
  }
  void check() { validate_decode_args(plan, args); }
};

TEST_F(CudaAlignment, AlignedViewsPass) { EXPECT_NO_THROW(check()); }

TEST_F(CudaAlignment, MisalignedPointer) {
  args.q.data = static_cast<char*>(args.q.data) + 2;
  expect_rejected([&] { check(); }, {"q: data pointer must be 16-byte aligned", "% 16 = 2"});
}

TEST_F(CudaAlignment, MisalignedRowStride) {
  args.o.strides[1] = 68;  // 136 bytes
  args.o.strides[0] = 8 * 68;
  expect_rejected([&] { check(); }, {"o: stride of dim 1 (68 elements = 136 bytes)", "multiple of 16"});
}

TEST_F(CudaAlignment, MisalignedPoolStride) {
  for (TensorView* t : {&args.kv.k_pages, &args.kv.v_pages}) {
    t->strides[0] = t->strides[0] + 4;  // 8 bytes more per page
  }
  expect_rejected([&] { check(); }, {"kv.k_pages: stride of dim 0", "multiple of 16"});
}

// The kernels write lse as one contiguous [tokens, num_qo_heads] array (no strides): a view with
// padded rows would get its values in the wrong places. The CPU backend takes any strides.
TEST_F(CudaAlignment, LseRowsNotContiguous) {
  args.lse.strides[0] = 16;  // rows of 8 heads padded to 16
  expect_rejected([&] { check(); }, {"lse: must be contiguous on the GPU", "strides [16, 1]"});
}

TEST_F(CudaAlignment, DeviceIdMismatch) {
  args.o.device_id = 1;
  expect_rejected([&] { check(); }, {"o: is on cuda:1 but the plan is on cuda:0"});
}

// ---- prefill run ---------------------------------------------------------------------------------

class PrefillRun : public testing::Test {
 protected:
  void SetUp() override {
    p.num_qo_heads = 14;
    p.num_kv_heads = 2;
    p.head_dim = 80;
    p.dtype = DType::kFP16;
    p.causal = true;
    p.qo_len = {3, 2};
    p.kv_len = {9, 2};
    in = make_inputs(p);
    ragged = make_ragged_kv(in.k, in.v, p.kv_len);
    paged = make_paged_kv(in.k, in.v, p.kv_len, 3, KVLayout::kHND, 5);
    PlanInputs pi = plan_inputs(p, 0, in.kv_indptr, {});
    pi.qo_indptr = in.qo_indptr;
    plan = prefill_plan(pi, Workspace{});
    qo_indptr = HostTensor::from_int32(in.qo_indptr);
    o = HostTensor({5, 14, 80}, DType::kFP16);
    o.fill_bytes(kPoison);
    args.q = in.q.view();
    args.qo_indptr = qo_indptr.view();
    args.ragged = ragged.view();
    args.causal = true;
    args.o = o.view();
  }
  void expect_rejected_untouched(std::initializer_list<std::string> needles) {
    expect_rejected([&] { prefill_run(plan, args); }, needles);
    EXPECT_TRUE(all_bytes_equal(o, kPoison)) << "a rejected call wrote its output";
  }

  Problem p;
  Inputs in;
  RaggedKVHost ragged;
  PagedKVHost paged;
  Plan plan;
  HostTensor qo_indptr, o;
  PrefillArgs args;
};

TEST_F(PrefillRun, GoodCallWrites) {
  prefill_run(plan, args);
  EXPECT_FALSE(all_bytes_equal(o, kPoison));
}

TEST_F(PrefillRun, RaggedAndPagedBothGiven) {
  args.paged = paged.view();
  expect_rejected_untouched({"paged, ragged: exactly one K/V source must be given, got both"});
}

TEST_F(PrefillRun, NeitherGiven) {
  args.ragged = RaggedKV{};
  expect_rejected_untouched({"paged, ragged: exactly one K/V source must be given, got neither"});
}

TEST_F(PrefillRun, PagedForRaggedPlan) {
  args.ragged = RaggedKV{};
  args.paged = paged.view();
  expect_rejected_untouched({"paged: K/V is paged but the plan was made for ragged K/V"});
}

TEST_F(PrefillRun, CausalDiffersFromPlan) {
  args.causal = false;
  expect_rejected_untouched({"causal: prefill_run was called with causal=false", "causal=true"});
}

TEST_F(PrefillRun, QoIndptrDiffersFromPlan) {
  ints(qo_indptr)[1] = 2;
  expect_rejected_untouched({"qo_indptr[1] (2) differs from the plan's (3)"});
}

TEST_F(PrefillRun, QoIndptrNotInt32) {
  args.qo_indptr.dtype = DType::kFP32;
  expect_rejected_untouched({"qo_indptr: dtype is fp32, expected int32"});
}

TEST_F(PrefillRun, RaggedTooFewRows) {
  args.ragged.k.shape[0] = 10;
  args.ragged.v.shape[0] = 10;
  expect_rejected_untouched({"ragged.k: holds 10 rows", "need 11"});
}

TEST_F(PrefillRun, RaggedIndptrDisagrees) {
  ints(ragged.kv_indptr)[1] = 8;
  expect_rejected_untouched({"ragged.kv_indptr: request 0 holds 8 keys but the plan was made for 9"});
}

TEST_F(PrefillRun, RaggedForPagedPlan) {
  PlanInputs pi = plan_inputs(p, 3, paged.table.kv_page_indptr, paged.table.kv_last_page_len);
  pi.qo_indptr = in.qo_indptr;
  plan = prefill_plan(pi, Workspace{});
  expect_rejected_untouched({"ragged: K/V is ragged but the plan was made for paged K/V (page_size 3)"});
  args.ragged = RaggedKV{};
  args.paged = paged.view();
  EXPECT_NO_THROW(validate_prefill_args(plan, args));
}

// A hand-made plan with a negative kv length: ragged.kv_indptr {0, 13, 11} matches kv_len
// {13, -2} and the sum (11) fits k's 11 rows, but request 0 would read 13 of them.
TEST_F(PrefillRun, PlanKvLenNegative) {
  plan.kv_len = {13, -2};
  ints(ragged.kv_indptr)[1] = 13;
  expect_rejected_untouched({"plan.kv_len[1] (-2) is negative"});
}

// The kernels address ragged K and V with one set of strides (v's rows here overlap, read in bounds).
TEST_F(PrefillRun, RaggedStridesDiffer) {
  args.ragged.v.strides[0] = 80;
  expect_rejected_untouched({"ragged.v: strides [80, 80, 1] differ from ragged.k strides [160, 80, 1]"});
}

TEST_F(PrefillRun, RaggedIndptrNotFromZero) {
  ints(ragged.kv_indptr)[0] = 1;
  expect_rejected_untouched({"ragged.kv_indptr[0] must be 0, got 1"});
}

TEST_F(PrefillRun, RaggedKvHeadsMismatch) {
  args.ragged.v.shape[1] = 1;
  expect_rejected_untouched({"ragged.v: num_kv_heads (dim 1) is 1, expected 2"});
}

TEST_F(PrefillRun, DecodePlan) {
  plan.is_decode = true;
  expect_rejected_untouched({"plan: made by decode_plan"});
}

TEST_F(PrefillRun, QDtypeNotThePlans) {
  args.q.dtype = DType::kBF16;
  expect_rejected_untouched({"q: dtype is bf16, expected fp16"});
}

// ---- append_kv -----------------------------------------------------------------------------------

class AppendKvArgs : public testing::Test {
 protected:
  void SetUp() override {
    const HostTensor k = random_tensor({20, 2, 64}, DType::kBF16, 1);
    kv = make_paged_kv(k, k, {13, 7}, 4, KVLayout::kNHD, 2);
    k_new = random_tensor({3, 2, 64}, DType::kBF16, 3);
    v_new = random_tensor({3, 2, 64}, DType::kBF16, 4);
    batch_indices = HostTensor::from_int32({0, 1, 1});
    positions = HostTensor::from_int32({12, 0, 6});
    kv.k_pages.fill_bytes(kPoison);
    kv.v_pages.fill_bytes(kPoison);
  }
  void call() { call(kv.view()); }
  void call(const PagedKV& view) {
    append_kv(view, k_new.view(), v_new.view(), batch_indices.view(), positions.view());
  }
  void expect_rejected_untouched(std::initializer_list<std::string> needles) {
    expect_view_rejected_untouched(kv.view(), needles);
  }
  // With an edited view of the pools and index tensors (kv's own memory, poisoned).
  void expect_view_rejected_untouched(const PagedKV& view, std::initializer_list<std::string> needles) {
    expect_rejected([&] { call(view); }, needles);
    EXPECT_TRUE(all_bytes_equal(kv.k_pages, kPoison) && all_bytes_equal(kv.v_pages, kPoison))
        << "a rejected call wrote the pools";
  }

  PagedKVHost kv;
  HostTensor k_new, v_new, batch_indices, positions;
};

TEST_F(AppendKvArgs, GoodCallWrites) {
  call();
  EXPECT_FALSE(all_bytes_equal(kv.k_pages, kPoison));
}

// Unknown enum values: the layout was taken as NHD, the device sent the call to the CUDA backend.
TEST_F(AppendKvArgs, UnknownLayoutOrDevice) {
  PagedKV view = kv.view();
  view.layout = KVLayout(5);
  expect_view_rejected_untouched(view, {"kv.layout: unknown layout value 5"});
  view = kv.view();
  view.k_pages.device = Device(2);
  expect_view_rejected_untouched(view, {"kv.k_pages: unknown device value 2"});
}

TEST_F(AppendKvArgs, TokenCountBeyondInt32) {
  k_new.view().shape[0] = (int64_t(1) << 32) + 3;  // would reach the kernel as 3 tokens
  expect_rejected_untouched({"k_new: num_tokens (4294967299) does not fit in int32"});
}

TEST_F(AppendKvArgs, PositionBeyondThePages) {
  ints(positions)[2] = 8;  // request 1 owns 2 pages of 4 tokens
  expect_rejected_untouched({"positions[2] (8) lies outside the pages of request 1", "2 pages of 4 tokens"});
}

TEST_F(AppendKvArgs, NegativePosition) {
  ints(positions)[0] = -1;
  expect_rejected_untouched({"positions[0] (-1)"});
}

TEST_F(AppendKvArgs, BatchIndexOutOfRange) {
  ints(batch_indices)[0] = 2;
  expect_rejected_untouched({"batch_indices[0] (2) is outside [0, batch (2))"});
}

TEST_F(AppendKvArgs, PageIdOutsidePool) {
  ints(kv.kv_page_indices)[4] = 1000;  // request 1's first page
  expect_rejected_untouched({"kv.kv_page_indices[4] (1000) is outside the page pool"});
}

TEST_F(AppendKvArgs, NewKvHeadsMismatch) {
  k_new = random_tensor({3, 3, 64}, DType::kBF16, 3);
  expect_rejected_untouched({"k_new: num_kv_heads (dim 1) is 3, expected 2"});
}

TEST_F(AppendKvArgs, NewKvDtypeMismatch) {
  v_new = random_tensor({3, 2, 64}, DType::kFP16, 3);
  expect_rejected_untouched({"v_new: dtype is fp16, expected bf16"});
}

TEST_F(AppendKvArgs, PositionsNotInt32) {
  positions.view().dtype = DType::kFP32;
  expect_rejected_untouched({"positions: dtype is fp32, expected int32"});
}

TEST_F(AppendKvArgs, SamePoolForKAndV) {
  PagedKV view = kv.view();
  view.v_pages = view.k_pages;
  expect_rejected([&] { append_kv(view, k_new.view(), v_new.view(), batch_indices.view(), positions.view()); },
                  {"kv.k_pages: shares memory with kv.v_pages"});
  EXPECT_TRUE(all_bytes_equal(kv.k_pages, kPoison)) << "a rejected call wrote the pools";
}

// The GPU kernel reads v_new with k_new's strides (as the pools and ragged K/V share theirs).
TEST_F(AppendKvArgs, NewKvStridesDiffer) {
  HostTensor padded({3, 2, 64}, {2 * 80, 80, 1}, DType::kBF16);
  padded.from_doubles(v_new.to_doubles());
  v_new = padded;
  expect_rejected_untouched({"v_new: strides [160, 80, 1] differ from k_new strides [128, 64, 1]"});
}

TEST_F(AppendKvArgs, PositionsWrongLength) {
  positions = HostTensor::from_int32({1, 2});
  expect_rejected_untouched({"positions: num_tokens (dim 0) is 2, expected 3"});
}

TEST_F(AppendKvArgs, KPagesNotGiven) {
  PagedKV view = kv.view();
  view.k_pages = TensorView{};
  expect_view_rejected_untouched(view, {"kv.k_pages: not given (undefined tensor)"});
}

// Without a plan the page size comes from the pools: 0 would divide every position by 0.
TEST_F(AppendKvArgs, PoolPageSizeZero) {
  PagedKV view = kv.view();
  view.k_pages.shape[1] = 0;  // NHD: [pages, page_size, num_kv_heads, head_dim]
  view.v_pages.shape[1] = 0;
  expect_view_rejected_untouched(view, {"kv.k_pages: page_size (0) must be >= 1 (layout NHD)"});
}

// Without a plan the pools' dtype is checked on its own: bf16 or fp16, and fp32 on the CPU only.
// (validate_append_kv is called directly for CUDA-tagged views, which it never dereferences.)
TEST_F(AppendKvArgs, PoolDtypeNotStorable) {
  PagedKV view = kv.view();
  for (TensorView* pool : {&view.k_pages, &view.v_pages}) pool->dtype = DType::kInt32;
  expect_view_rejected_untouched(view, {"kv.k_pages: dtype int32 is not supported on cpu (expected bf16 or fp16 or fp32)"});
  for (TensorView* pool : {&view.k_pages, &view.v_pages}) {
    pool->dtype = DType::kFP32;
    pool->device = Device::kCUDA;
  }
  expect_rejected([&] { validate_append_kv(view, k_new.view(), v_new.view(), batch_indices.view(), positions.view()); },
                  {"kv.k_pages: dtype fp32 is not supported on cuda (expected bf16 or fp16)"});
}

TEST_F(AppendKvArgs, IndexNotContiguous) {
  HostTensor strided = HostTensor::from_int32({12, 0, 0, 0, 6});  // {12, 0, 6} with stride 2
  positions = strided;
  positions.view().shape[0] = 3;
  positions.view().strides[0] = 2;
  expect_rejected_untouched({"positions: must be contiguous (stride 1), got stride 2"});
}

TEST_F(AppendKvArgs, IndptrEmpty) {
  PagedKV view = kv.view();
  view.kv_page_indptr.shape[0] = 0;
  expect_view_rejected_untouched(view, {"kv.kv_page_indptr: must hold batch + 1 entries, got none"});
}

TEST_F(AppendKvArgs, IndptrNotFromZero) {
  ints(kv.kv_page_indptr)[0] = 1;
  expect_rejected_untouched({"kv.kv_page_indptr[0] must be 0, got 1"});
}

TEST_F(AppendKvArgs, IndptrDecreases) {
  ints(kv.kv_page_indptr)[2] = 3;  // {0, 4, 6} -> {0, 4, 3}
  expect_rejected_untouched({"kv.kv_page_indptr must be non-decreasing: entry 2 (3) < entry 1 (4)"});
}

TEST_F(AppendKvArgs, TooFewPageIds) {
  PagedKV view = kv.view();
  view.kv_page_indices.shape[0] = 5;  // kv_page_indptr[batch] is 6
  expect_view_rejected_untouched(view, {"kv.kv_page_indices: holds 5 entries but kv.kv_page_indptr[batch] is 6"});
}

// ---- merge_states --------------------------------------------------------------------------------

class MergeArgs : public testing::Test {
 protected:
  void SetUp() override {
    v = random_tensor({3, 2, 4, 64}, DType::kFP32, 1);
    s = random_tensor({3, 2, 4}, DType::kFP32, 2);
    v_merged = HostTensor({3, 4, 64}, DType::kBF16);
    s_merged = HostTensor({3, 4}, DType::kFP32);
    v_merged.fill_bytes(kPoison);
    s_merged.fill_bytes(kPoison);
  }
  void call() { merge_states(v.view(), s.view(), v_merged.view(), s_merged.view()); }
  void expect_rejected_untouched(std::initializer_list<std::string> needles) {
    expect_rejected([&] { call(); }, needles);
    EXPECT_TRUE(all_bytes_equal(v_merged, kPoison) && all_bytes_equal(s_merged, kPoison))
        << "a rejected call wrote its output";
  }
  HostTensor v, s, v_merged, s_merged;
};

TEST_F(MergeArgs, GoodCallWrites) {
  call();
  EXPECT_FALSE(all_bytes_equal(v_merged, kPoison));
}

TEST_F(MergeArgs, UnknownDevice) {
  v.view().device = Device(2);
  expect_rejected_untouched({"v: unknown device value 2"});
}

TEST_F(MergeArgs, LseShapeMismatch) {
  s = random_tensor({3, 2, 3}, DType::kFP32, 2);
  expect_rejected_untouched({"s: num_heads (dim 2) is 3, expected 4"});
}

TEST_F(MergeArgs, MergedShapeMismatch) {
  v_merged.view().shape[2] = 32;
  expect_rejected_untouched({"v_merged: head_dim (dim 2) is 32, expected 64"});
}

TEST_F(MergeArgs, StateCountMismatch) {
  s = random_tensor({3, 1, 4}, DType::kFP32, 2);
  expect_rejected_untouched({"s: num_states (dim 1) is 1, expected 2"});
}

TEST_F(MergeArgs, LseDtype) {
  s.view().dtype = DType::kBF16;
  expect_rejected_untouched({"s: dtype is bf16, expected fp32"});
  s.view().dtype = DType::kFP32;
  s_merged.view().dtype = DType::kFP16;
  expect_rejected_untouched({"s_merged: dtype is fp16, expected fp32"});
}

TEST_F(MergeArgs, DeviceMismatch) {
  v_merged.view().device = Device::kCUDA;
  expect_rejected_untouched({"v_merged: is on cuda:0 but v is on cpu"});
}

TEST_F(MergeArgs, MergedOverlapsInput) {
  v_merged.view().data = v.data();
  expect_rejected_untouched({"v_merged: shares memory with v"});
}

TEST_F(MergeArgs, DimsBeyondInt32) {
  v.view().shape[2] = int64_t(1) << 31;  // rejected before any shape or memory is looked at
  expect_rejected_untouched({"v: num_states (2), num_heads (2147483648) and head_dim (64) must each fit in int32"});
}

TEST_F(MergeArgs, Int32Values) {
  v.view().dtype = DType::kInt32;
  expect_rejected_untouched({"v: dtype int32 is not supported"});
}

}  // namespace
}  // namespace gqattn::test
