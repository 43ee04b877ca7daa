// GPU decode, prefill, append_kv and merge_states against the CPU float64 oracle, on fresh random
// inputs with poisoned outputs. Layer: tests (label gpu; skipped with a message without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "api/env_flag.h"
#include "dispatch/select_kernel.h"
#include "common/random_cases.h"
#include "gpu/gpu_util.h"

namespace gqattn::test {
namespace {

struct Heads {
  int qo, kv;
};
// Group sizes 1, 2, 4, 7, 8 and num_qo_heads (MQA), plus an MQA group wider than 16 rows.
const Heads kHeadSets[] = {{4, 4}, {8, 4}, {8, 2}, {14, 2}, {16, 2}, {8, 1}, {32, 1}};

std::string describe_case(DType dtype, Heads h, int head_dim, int page_size, int qo_len, KVLayout layout,
                          const std::vector<int32_t>& kv_len) {
  std::ostringstream os;
  os << dtype_name(dtype) << " heads " << h.qo << "/" << h.kv << " hd " << head_dim << " page " << page_size
     << " qo_len " << qo_len << " " << layout_name(layout) << " kv_len [";
  for (int32_t l : kv_len) os << l << " ";
  os << "]";
  return os.str();
}

// Random lengths in [lo, hi], with the edges mixed in when asked: 0 keys, and the fewest keys a
// request with qo_len new tokens can have (qo_len: with the causal mask they are the last keys).
std::vector<int32_t> random_lengths(int batch, int lo, int hi, uint64_t seed, bool edges, int qo_len = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<int32_t> out(batch);
  for (int& l : out) l = dist(rng);
  if (edges && batch >= 3) {
    out[0] = 0;
    out[1] = qo_len;
  }
  return out;
}

void expect_close(const HostTensor& got, const HostTensor& ref, DType dtype, const std::string& what) {
  const Diff d = compare(got, ref);
  EXPECT_EQ(d.nan_count, 0) << what << ": NaN or unwritten elements";
  EXPECT_LE(d.max_abs, max_abs_tol(dtype)) << what;
  EXPECT_LE(d.rel_l2, rel_l2_tol(dtype)) << what;
}

void expect_lse_close(const HostTensor& got, const HostTensor& ref, const std::string& what) {
  const Diff d = compare(got, ref);
  EXPECT_EQ(d.nan_count, 0) << what << ": NaN in lse";
  EXPECT_LE(d.max_abs, kLseTol) << what << " (lse)";
}

bool head_dim_built(const BuildInfo& info, int head_dim) {
  return std::find(info.head_dims.begin(), info.head_dims.end(), head_dim) != info.head_dims.end();
}

// Device 0's SM count and compute capability (major x 10 + minor).
struct DeviceSms {
  int count = 0;
  int arch = 0;
};
DeviceSms device_sms() {
  int count = 0, major = 0, minor = 0;
  GQ_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, 0));
  GQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  GQ_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  return DeviceSms{count, major * 10 + minor};
}

struct DecodeResult {
  HostTensor o, lse;
};

// Runs one decode configuration on the CPU oracle and the GPU and compares. far: the GPU's pages
// past 4 GiB of their pools (DevicePagedKV).
void check_decode(DType dtype, Heads h, int head_dim, int page_size, int qo_len, KVLayout layout,
                  const std::vector<int32_t>& kv_len, uint64_t seed, int max_num_splits = 0,
                  DecodeResult* gpu_out = nullptr, Plan* gpu_plan = nullptr, bool far = false,
                  int fixed_split_size = 0) {
  const std::string what = describe_case(dtype, h, head_dim, page_size, qo_len, layout, kv_len);
  SCOPED_TRACE(what);
  const int batch = static_cast<int>(kv_len.size());
  int64_t total_kv = 0;
  for (int32_t l : kv_len) total_kv += l;
  const HostTensor k = random_tensor({total_kv, h.kv, head_dim}, dtype, seed);
  const HostTensor v = random_tensor({total_kv, h.kv, head_dim}, dtype, seed + 1);
  const PagedKVHost paged = make_paged_kv(k, v, kv_len, page_size, layout, seed + 2);
  const HostTensor q = random_tensor({int64_t(batch) * qo_len, h.qo, head_dim}, dtype, seed + 3);

  PlanInputs in;
  in.device = Device::kCPU;
  in.dtype = dtype;
  in.num_qo_heads = h.qo;
  in.num_kv_heads = h.kv;
  in.head_dim = head_dim;
  in.page_size = page_size;
  in.qo_len = qo_len;
  in.kv_indptr = paged.table.kv_page_indptr;
  in.kv_last_page_len = paged.table.kv_last_page_len;
  HostTensor o_ref({int64_t(batch) * qo_len, h.qo, head_dim}, dtype);
  HostTensor lse_ref({int64_t(batch) * qo_len, h.qo}, DType::kFP32);
  const Plan cpu_plan = decode_plan(in, Workspace{});
  decode_run(cpu_plan, DecodeArgs{q.view(), paged.view(), o_ref.view(), lse_ref.view()});

  in.device = Device::kCUDA;
  in.max_num_splits = max_num_splits;
  in.fixed_split_size = fixed_split_size;
  DeviceWorkspace ws;
  const Plan plan = decode_plan(in, ws.get());
  DeviceTensor dq(q);
  DevicePagedKV dkv(paged, far);
  DeviceTensor d_o(o_ref), d_lse(lse_ref);
  d_o.poison();
  d_lse.poison();
  decode_run(plan, DecodeArgs{dq.view(), dkv.view(), d_o.view(), d_lse.view()});
  sync_and_check();
  const HostTensor o = d_o.to_host(o_ref);
  const HostTensor lse = d_lse.to_host(lse_ref);
  expect_close(o, o_ref, dtype, what);
  expect_lse_close(lse, lse_ref, what);
  if (gpu_out) *gpu_out = DecodeResult{o, lse};
  if (gpu_plan) *gpu_plan = plan;
}

TEST(GpuDecode, GroupSizesPageSizesQoLens) {
  GQ_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const Heads& h : kHeadSets) {
    for (int page_size : {1, 3, 16, 64, 256}) {
      for (int qo_len : {1, 2, 4}) {
        const KVLayout layout = (seed % 2) ? KVLayout::kHND : KVLayout::kNHD;
        const std::vector<int32_t> kv_len = random_lengths(5, qo_len, 700, seed, true, qo_len);
        check_decode(DType::kBF16, h, 128, page_size, qo_len, layout, kv_len, seed++);
      }
    }
  }
}

TEST(GpuDecode, EveryHeadDimAndDtypeBuilt) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  uint64_t seed = 900;
  for (DType dtype : info.dtypes) {
    for (int head_dim : info.head_dims) {
      for (const Heads& h : {Heads{8, 8}, Heads{32, 4}, Heads{16, 1}}) {
        for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
          check_decode(dtype, h, head_dim, 16, 1 + static_cast<int>(seed % 3), layout,
                       random_lengths(4, 3, 1200, seed, false), seed);
          ++seed;
        }
      }
    }
  }
}

// The decode matrix's page sizes, kv_len 0 and 1, lengths off the tile and a split long context
// at every head dim built other than 128 (GroupSizesPageSizesQoLens and the split tests below
// cover 128): the decode family's tile differs per head dim (32 keys at hd256). 32 query heads on
// one K/V head take decode_mid (hd64) or decode_wide (hd256).
TEST(GpuDecode, PageSizesEveryHeadDimBuilt) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  uint64_t seed = 1300;
  for (int head_dim : info.head_dims) {
    if (head_dim == 128) continue;
    for (const Heads& h : {Heads{8, 8}, Heads{8, 4}, Heads{14, 2}, Heads{32, 8}, Heads{16, 1}, Heads{32, 1}}) {
      for (int page_size : {1, 3, 16, 64, 256}) {
        const KVLayout layout = (seed % 2) ? KVLayout::kHND : KVLayout::kNHD;
        check_decode(info.dtypes.front(), h, head_dim, page_size, 1, layout, random_lengths(5, 1, 700, seed, true), seed);
        ++seed;
      }
    }
    check_decode(info.dtypes.front(), Heads{32, 8}, head_dim, 16, 1, KVLayout::kNHD, {20011}, seed++);
  }
}

// Draft tokens (2 and 4 new tokens, causal among them) at every head dim built other than 128
// (GroupSizesPageSizesQoLens covers 128) on each decode family that takes them there: decode (G 4
// and 7 x 2 tokens, G 4 x 4), decode_mid (G 7 x 4, G 16 x 2: 28 and 32 rows; decode_wide at hd256)
// and decode_wide (G 16 x 4, and MQA with 64 query heads x 1 token: 64 rows). Page sizes in turn,
// both layouts, kv_len 0 and qo_len (1 for one token), lengths off the page and the tile; the
// 64-row MQA case split and unsplit.
TEST(GpuDecode, DraftTokensEveryHeadDimBuilt) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  const int page_sizes[] = {1, 3, 16, 64, 256};
  uint64_t seed = 5300;
  for (int head_dim : info.head_dims) {
    if (head_dim == 128) continue;
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    std::vector<kernels::Family> seen;
    auto run = [&](Heads h, int page_size, int qo_len, int max_num_splits) {
      const KVLayout layout = (seed % 2) ? KVLayout::kHND : KVLayout::kNHD;
      Plan plan;
      check_decode(info.dtypes[seed % info.dtypes.size()], h, head_dim, page_size, qo_len, layout,
                   random_lengths(5, qo_len, 700, seed, true, qo_len), seed, max_num_splits, nullptr, &plan);
      seen.push_back(dispatch::kernel_by_id(plan.kernel_id).family);
      ++seed;
    };
    int i = 0;
    for (const Heads& h : {Heads{32, 8}, Heads{14, 2}, Heads{16, 1}}) {
      for (int qo_len : {2, 4}) run(h, page_sizes[i++ % 5], qo_len, 0);
    }
    for (int max_num_splits : {0, 1}) run(Heads{64, 1}, 3, 1, max_num_splits);
    auto reached = [&](kernels::Family f) { return std::find(seen.begin(), seen.end(), f) != seen.end(); };
    EXPECT_TRUE(reached(kernels::Family::kDecode));
    EXPECT_TRUE(reached(kernels::Family::kDecodeWide));
    if (head_dim <= kernels::kDecodeMidMaxHeadDim) {
      EXPECT_TRUE(reached(kernels::Family::kDecodeMid));
    }
  }
}

// Batch 1 with a long context: the planner splits the keys over many CTAs and merges them.
TEST(GpuDecode, SplitKVLongContextMatchesUnsplit) {
  GQ_REQUIRE_GPU();
  for (const Heads& h : {Heads{32, 8}, Heads{32, 1}, Heads{8, 8}}) {
    const std::vector<int32_t> kv_len = {20011};
    DecodeResult split, whole;
    check_decode(DType::kBF16, h, 128, 16, 1, KVLayout::kNHD, kv_len, 7, 0, &split);
    check_decode(DType::kBF16, h, 128, 16, 1, KVLayout::kNHD, kv_len, 7, 1, &whole);
  }
}

// The split merge after a decode-family kernel is a programmatic dependent launch on sm_90+ only
// where its code waits for the attention grid before it reads the partial rows (code compiled for
// sm_90+: kernels::split_merge_waits_for_attention); on sm_90 with sm_90a code built it is.
TEST(GpuDecode, ProgrammaticMergeOnlyWhereItWaits) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  Plan plan;
  check_decode(info.dtypes.front(), Heads{32, 8}, info.head_dims.front(), 16, 1, KVLayout::kNHD, {20011}, 4600, 0,
               nullptr, &plan);
  ASSERT_TRUE(plan.split);
  ASSERT_TRUE(kernels::merge_starts_early(dispatch::kernel_by_id(plan.kernel_id).family));
  const int arch = device_sms().arch;
  const bool waits = kernels::split_merge_waits_for_attention();
  EXPECT_EQ(plan.merge_programmatic, !env_flag("GQATTN_DISABLE_PDL") && arch >= 90 && waits);
  const bool sm90_built = std::find(info.cuda_archs.begin(), info.cuda_archs.end(), 90) != info.cuda_archs.end();
  if (arch == 90 && sm90_built) {
    EXPECT_TRUE(waits);
  }
}

// 17..32 packed rows at hd128 with at most SMs / 64 requests x K/V heads run as two 16-row items of
// the decode family (select_kernel), here with draft tokens: G 8 x 4 tokens (each item two whole
// tokens), G 12 x 2 (token 1's rows in both items) and G 16 x 2, causal among the new tokens, so
// the two items of a request mask different keys. One and two requests (a request of exactly
// qo_len keys beside a long one), pages of 16 and 3, both layouts, split and unsplit.
TEST(GpuDecode, DraftTokensInTwoSixteenRowItems) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 128)) GTEST_SKIP() << "head_dim 128 is not built";
  const int sms = device_sms().count;
  uint64_t seed = 5400;
  struct Case {
    Heads h;
    int qo_len;
  };
  for (const Case& c : {Case{Heads{8, 1}, 4}, Case{Heads{12, 1}, 2}, Case{Heads{16, 1}, 2}}) {
    const Heads h = c.h;
    const int qo_len = c.qo_len;
    const std::vector<std::vector<int32_t>> batches = {{qo_len, 9000}, {5000}};
    for (size_t b = 0; b < batches.size(); ++b) {
      for (int max_num_splits : {0, 1}) {
        Plan plan;
        check_decode(info.dtypes[seed % info.dtypes.size()], h, 128, b == 0 ? 16 : 3, qo_len,
                     b == 0 ? KVLayout::kNHD : KVLayout::kHND, batches[b], seed, max_num_splits, nullptr, &plan);
        // Two 16-row items where requests x K/V heads x 64 <= SMs (2 on an H100 or H200).
        if (int64_t(batches[b].size()) * h.kv * 64 <= sms) {
          EXPECT_EQ(dispatch::kernel_by_id(plan.kernel_id).family, kernels::Family::kDecode);
          EXPECT_EQ(plan.cta_rows, 16);
        }
        EXPECT_EQ(plan.max_splits > 1, max_num_splits != 1);
        ++seed;
      }
    }
  }
}

// PlanInputs::fixed_split_size: every request longer than the chunk (rounded up to the kernel's key
// tile) runs as ceil(kv_len / chunk) chunks, whatever the planner would choose, and the results
// match the oracle: chunks of one tile, a chunk between tiles, one that holds every request whole;
// requests of 0 and qo_len keys and of lengths off the page and the tile; the decode families (G 4,
// 8 and 32 with one and four new tokens: 4 .. 128 packed rows, the wgmma kernel's too on sm_90).
TEST(GpuDecode, FixedSplitSize) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  uint64_t seed = 5700;
  for (const Heads h : {Heads{32, 8}, Heads{8, 1}, Heads{32, 1}}) {
    for (int qo_len : {1, 4}) {
      const std::vector<int32_t> kv_len{0, qo_len, 300, 4097, 2000};  // causal: qo_len <= kv_len, or 0
      for (int fixed : {1, 200, 5000}) {
        Plan plan;
        check_decode(info.dtypes[seed % info.dtypes.size()], h, info.head_dims.front(), 16, qo_len,
                     seed % 2 ? KVLayout::kHND : KVLayout::kNHD, kv_len, seed, 0, nullptr, &plan, false, fixed);
        const int tile = dispatch::kernel_by_id(plan.kernel_id).kv_tile;
        const int chunk = (fixed + tile - 1) / tile * tile;
        SCOPED_TRACE("fixed_split_size " + std::to_string(fixed) + ", tile " + std::to_string(tile));
        EXPECT_EQ(plan.kv_chunk, chunk >= 4097 ? 0 : chunk);
        EXPECT_EQ(plan.max_splits, chunk >= 4097 ? 1 : (4097 + chunk - 1) / chunk);
        ++seed;
      }
    }
  }
}

// The split merge's kernels (perf-notes items 147, 272): teams of threads a row for plans of <= 8
// chunks a request (in one load batch or two), blocks of 128, 256 and 1024 threads a row above, by
// the chunks. Requests of 0 and 1 keys beside split ones, one and four query tokens, G 32 and 4,
// the chunk count capped on each side of the kernels' bounds. At hd128, and at the head dims built
// whose teams of head_dim / 4 threads do not divide the blocks (80, 96, 112: the blocks' last
// threads idle).
TEST(GpuDecode, SplitMergeEveryKernel) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  uint64_t seed = 4700;
  const std::vector<std::vector<int32_t>> batches = {{0, 1, 3000, 300, 7000, 17}, {33000}};
  for (int head_dim : info.head_dims) {
    if (head_dim != 128 && 128 % (head_dim / 4) == 0) continue;
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    // The merge kernel and width by the plan's most chunks a request (launch_split_merge).
    int seen_small = 0, seen_large = 0, seen_narrow = 0, seen_wide = 0, seen_widest = 0;
    for (const Heads& h : {Heads{32, 1}, Heads{32, 8}}) {
      for (int qo_len : {1, 4}) {
        for (std::vector<int32_t> kv_len : batches) {
          for (int32_t& len : kv_len) len = len == 0 ? 0 : std::max(len, qo_len);  // causal: >= the new tokens
          for (int cap : {0, 3, 6, 9, 24, 64}) {
            Plan plan;
            check_decode(DType::kBF16, h, head_dim, 16, qo_len, KVLayout::kHND, kv_len, seed++, cap, nullptr, &plan);
            const int c = plan.max_splits;
            seen_small += c > 1 && c <= 4;
            seen_large += c > 4 && c <= 8;
            seen_narrow += c > 8 && c < 32;
            seen_wide += c >= 32 && c < 128;
            seen_widest += c >= 128;
          }
        }
      }
    }
    EXPECT_GT(seen_small, 0) << "plans of 2..4 chunks a request";
    EXPECT_GT(seen_large, 0) << "plans of 5..8 chunks a request";
    EXPECT_GT(seen_narrow, 0) << "plans of 9..31 chunks a request";
    EXPECT_GT(seen_wide, 0) << "plans of 32..127 chunks a request";
    EXPECT_GT(seen_widest, 0) << "plans of >= 128 chunks a request";
  }
}

// MQA with 4 draft tokens is one 128-row item a request: the wgmma kernel on sm_90 (the portable
// prefill kernel elsewhere), split into key chunks and merged when few requests would leave the
// GPU idle; every head dim built, split and unsplit, both layouts.
TEST(GpuDecode, DraftTokensWithManyRowsSplitLikeUnsplit) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  uint64_t seed = 1500;
  for (int head_dim : info.head_dims) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      const std::vector<int32_t> kv_len = {20011, 4, 1300};
      check_decode(info.dtypes.front(), Heads{32, 1}, head_dim, 16, 4, layout, kv_len, seed, /*max_num_splits=*/0);
      check_decode(info.dtypes.front(), Heads{32, 1}, head_dim, 16, 4, layout, kv_len, seed, /*max_num_splits=*/1);
      ++seed;
    }
  }
}

// 17..64 packed rows with a request for nearly every SM: on sm_90 at hd128 the wgmma kernel
// (select_kernel's requests_x_kv_heads) with its two consumer warpgroups on the halves of each
// K/V tile (Plan::split_item_keys), elsewhere decode_mid / decode_wide. MQA with 32 query heads
// and 1 or 2 query tokens (32 or 64 rows), one request an SM, kv_len 0 and 1 among them, page 16
// (gathers); page 128 (whole tiles by TMA) with one request of 9000 keys (the plan may split it);
// 8 query heads a K/V head with 4 draft tokens (32 rows, causal among the new tokens).
TEST(GpuDecode, WideRowsWithARequestForEverySm) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 128)) GTEST_SKIP() << "head_dim 128 is not built";
  const DeviceSms dev = device_sms();
  const int sms = dev.count;
  const bool split_keys = dev.arch == 90 && !dispatch::sm90_disabled() &&
                          !env_flag("GQATTN_DISABLE_SPLIT_ITEM_KEYS");
  uint64_t seed = 1600;
  struct Case {
    Heads h;
    int qo_len, page_size, long_request;
  };
  const Case cases[] = {{Heads{32, 1}, 1, 16, 0}, {Heads{32, 1}, 2, 16, 0}, {Heads{32, 1}, 1, 128, 9000},
                        {Heads{64, 8}, 4, 16, 0}};
  for (const Case& c : cases) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      const int batch = (sms + c.h.kv - 1) / c.h.kv;
      std::vector<int32_t> kv_len = random_lengths(batch, 1, 700, seed, true, c.qo_len);
      if (c.long_request > 0) kv_len[2] = c.long_request;
      Plan plan;
      check_decode(info.dtypes[seed % info.dtypes.size()], c.h, 128, c.page_size, c.qo_len, layout, kv_len, seed, 0,
                   nullptr, &plan);
      EXPECT_EQ(plan.split_item_keys, split_keys);
      ++seed;
    }
  }
}

// 17..64 packed rows at hd128 with requests x K/V heads between a fifth of the SMs and the SMs: on
// sm_90 the wgmma kernel with both consumer warpgroups on the halves of each K/V tile
// (Plan::split_item_keys) and, with so few items, split-KV: the partial rows and the merge of
// split_item_keys items (WideRowsWithARequestForEverySm has an item an SM and splits nothing).
// MQA with 32 query heads x 1 and 2 tokens (32 and 64 rows) and 32 requests, page 16 (gathers)
// and 128 (whole tiles by TMA); G 8 x 4 draft tokens with 4 requests of 8 K/V heads; requests of
// 9000 and 3001 keys beside kv_len 0, qo_len and short ones; both layouts.
TEST(GpuDecode, WideRowsSplitOnTheWgmmaKernel) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 128)) GTEST_SKIP() << "head_dim 128 is not built";
  const DeviceSms dev = device_sms();
  const bool built = std::find(info.cuda_archs.begin(), info.cuda_archs.end(), 90) != info.cuda_archs.end();
  const bool wgmma = dev.arch == 90 && built && !dispatch::sm90_disabled();
  const bool split_keys = wgmma && !env_flag("GQATTN_DISABLE_SPLIT_ITEM_KEYS");
  uint64_t seed = 5100;
  struct Case {
    Heads h;
    int qo_len, page_size, batch;
  };
  const Case cases[] = {{Heads{32, 1}, 1, 16, 32}, {Heads{32, 1}, 2, 128, 32}, {Heads{64, 8}, 4, 16, 4}};
  for (const Case& c : cases) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      std::vector<int32_t> kv_len = random_lengths(c.batch, c.qo_len, 700, seed, true, c.qo_len);
      kv_len[2] = 9000;
      if (c.batch > 3) kv_len[3] = 3001;
      Plan plan;
      check_decode(info.dtypes[seed % info.dtypes.size()], c.h, 128, c.page_size, c.qo_len, layout, kv_len, seed, 0,
                   nullptr, &plan);
      if (wgmma && int64_t(c.batch) * c.h.kv < dev.count) {
        EXPECT_EQ(dispatch::kernel_by_id(plan.kernel_id).family, kernels::Family::kPrefillSm90);
        EXPECT_EQ(plan.split_item_keys, split_keys);
        EXPECT_GT(plan.max_splits, 1);
      }
      ++seed;
    }
  }
}

// Enough requests x K/V heads for decode_many on sm_90 (>= 3 x SMs): 32-key tiles, four CTAs an
// SM (other devices run the decode family on the same plans). G = 1 and 4, one and two tokens,
// both layouts, page 16 and page 1, lengths 0, 1 and 2..300 (mostly not multiples of the tile).
TEST(GpuDecode, ManyRequestsOnTheSmallTileFamily) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 128)) GTEST_SKIP() << "head_dim 128 is not built";
  const DeviceSms dev = device_sms();
  const int sms = dev.count;
  uint64_t seed = 1700;
  for (Heads h : {Heads{8, 8}, Heads{16, 4}}) {
    const int batch = (3 * sms + h.kv - 1) / h.kv + 1;
    for (int qo_len : {1, 2}) {
      for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
        const DType dtype = info.dtypes[seed % info.dtypes.size()];
        if (dev.arch == 90 && !dispatch::decode_many_disabled()) {
          EXPECT_EQ(dispatch::select_kernel(dtype, 128, h.qo / h.kv * qo_len, 90, int64_t(batch) * h.kv, sms).family,
                    kernels::Family::kDecodeMany);
        }
        check_decode(dtype, h, 128, layout == KVLayout::kNHD ? 16 : 1, qo_len, layout,
                     random_lengths(batch, 2, 300, seed, true, qo_len), seed);
        ++seed;
      }
    }
  }
}

// decode_many where the planner splits it: 400 requests x K/V heads on an H200 (3 x SMs + 4, fewer
// than its 4 x SMs CTAs) with three requests of 2222..4000 keys among ones of up to 300 (a mean far
// below 4096), so the long ones take several 32-key-tile chunks and the merge. G = 4 with one token and
// four draft tokens (16 rows: a whole row tile), page 16 NHD and page 3 HND, kv_len 0 and qo_len.
TEST(GpuDecode, ManyRequestsSplitOnTheSmallTileFamily) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 128)) GTEST_SKIP() << "head_dim 128 is not built";
  const DeviceSms dev = device_sms();
  const bool expect_many = dev.arch == 90 && !dispatch::decode_many_disabled();
  const Heads h{16, 4};
  const int batch = (3 * dev.count + h.kv - 1) / h.kv + 1;
  uint64_t seed = 5200;
  for (int qo_len : {1, 4}) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      std::vector<int32_t> kv_len = random_lengths(batch, std::max(2, qo_len), 300, seed, true, qo_len);
      kv_len[2] = 4000;
      kv_len[5] = 3100;
      kv_len[9] = 2222;
      Plan plan;
      check_decode(info.dtypes[seed % info.dtypes.size()], h, 128, layout == KVLayout::kNHD ? 16 : 3, qo_len, layout,
                   kv_len, seed, 0, nullptr, &plan);
      if (expect_many) {
        EXPECT_EQ(dispatch::kernel_by_id(plan.kernel_id).family, kernels::Family::kDecodeMany);
        EXPECT_GT(plan.max_splits, 1);
      }
      ++seed;
    }
  }
}

// A few hundred requests x K/V heads of >= 2048 keys on average at hd64: decode_long on sm_90
// (128-key tiles, two CTAs an SM; other devices run the decode family on the same plans). G = 4
// with one, two and four tokens (16 rows), 256 and 128 items (the planner may split the latter),
// both layouts, page 16 and page 3, lengths 0, qo_len and 2300..2900 (not multiples of the tile).
TEST(GpuDecode, LongRequestsOnTheLongTileFamily) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 64)) GTEST_SKIP() << "head_dim 64 is not built";
  const bool expect_long = device_sms().arch == 90 && !dispatch::decode_long_disabled();
  uint64_t seed = 1900;
  for (int batch : {32, 16}) {
    for (int qo_len : {1, 2, 4}) {
      for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
        const DType dtype = info.dtypes[seed % info.dtypes.size()];
        Plan plan;
        check_decode(dtype, Heads{32, 8}, 64, layout == KVLayout::kNHD ? 16 : 3, qo_len, layout,
                     random_lengths(batch, 2300, 2900, seed, true, qo_len), seed, 0, nullptr, &plan);
        const kernels::Family family = dispatch::kernel_by_id(plan.kernel_id).family;
        if (expect_long) EXPECT_EQ(family, kernels::Family::kDecodeLong) << "batch " << batch;
        else EXPECT_NE(family, kernels::Family::kDecodeLong);
        ++seed;
      }
    }
  }
}

// Two runs of one decode configuration on the same inputs (check_decode against the oracle each
// time) give the same bits in o and lse. Returns the first run's plan.
Plan expect_same_bits_twice(DType dtype, Heads h, int head_dim, int page_size, int qo_len, KVLayout layout,
                            const std::vector<int32_t>& kv_len, uint64_t seed) {
  DecodeResult a, b;
  Plan plan;
  check_decode(dtype, h, head_dim, page_size, qo_len, layout, kv_len, seed, 0, &a, &plan);
  check_decode(dtype, h, head_dim, page_size, qo_len, layout, kv_len, seed, 0, &b);
  SCOPED_TRACE("family " + std::to_string(int(dispatch::kernel_by_id(plan.kernel_id).family)) + ", max_splits " +
               std::to_string(plan.max_splits));
  EXPECT_EQ(a.o.storage(), b.o.storage());
  EXPECT_EQ(a.lse.storage(), b.lse.storage());
  return plan;
}

TEST(GpuDecode, BitwiseDeterministic) {
  GQ_REQUIRE_GPU();
  expect_same_bits_twice(DType::kBF16, Heads{32, 8}, 128, 16, 2, KVLayout::kNHD, {5000, 17, 3333}, 42);
}

// The same bits on a second run on every other decode path (issue 3; BitwiseDeterministic: the
// decode family). On sm_90 at hd128: decode_many (its split too), the wgmma kernel's decode items
// with both consumers on halves of the keys (split_item_keys) unsplit and split, MQA x 4 draft
// tokens (128-row items); decode_mid / decode_wide (17..64 rows, requests x K/V heads fewer than a
// fifth of the SMs); hd64's decode_long; fp16 where built. Other devices run what their selection
// picks for the same cases.
TEST(GpuDecode, BitwiseDeterministicEveryFamily) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  const int sms = device_sms().count;
  struct Case {
    int head_dim;
    Heads h;
    int qo_len, page_size;
    std::vector<int32_t> kv_len;
  };
  auto lengths = [](int batch, int lo, int hi, uint64_t seed) { return random_lengths(batch, lo, hi, seed, true, 4); };
  std::vector<Case> cases = {
      {128, {16, 4}, 1, 16, lengths((3 * sms + 3) / 4 + 1, 4, 300, 1)},  // decode_many
      {128, {16, 4}, 4, 3, lengths((3 * sms + 3) / 4 + 1, 4, 300, 2)},   // decode_many, split below
      {128, {32, 1}, 1, 16, lengths(sms, 4, 700, 3)},                    // wgmma, split_item_keys
      {128, {32, 1}, 2, 128, lengths(32, 4, 700, 4)},                    // the same, split below
      {128, {32, 1}, 4, 16, {20011, 4, 1300}},                           // 128-row items
      {128, {32, 1}, 1, 1, lengths(8, 4, 3000, 5)},                      // decode_mid (32 rows, 8 requests)
      {128, {64, 1}, 1, 64, lengths(8, 4, 3000, 6)},                     // decode_wide (64 rows)
      {64, {32, 8}, 2, 16, lengths(32, 2300, 2900, 7)},                  // decode_long
  };
  cases[1].kv_len[2] = 4000;
  cases[3].kv_len[2] = 9000;
  uint64_t seed = 5600;
  std::vector<kernels::Family> seen;
  for (const Case& c : cases) {
    if (!head_dim_built(info, c.head_dim)) continue;
    for (DType dtype : info.dtypes) {
      const KVLayout layout = seed % 2 ? KVLayout::kHND : KVLayout::kNHD;
      const Plan plan = expect_same_bits_twice(dtype, c.h, c.head_dim, c.page_size, c.qo_len, layout, c.kv_len, seed);
      seen.push_back(dispatch::kernel_by_id(plan.kernel_id).family);
      ++seed;
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_GE(std::unique(seen.begin(), seen.end()) - seen.begin(), 2) << "families reached";
}

// A graph captured once, with the first step's plan, replays correctly after plan() is called
// again with each step's lengths (one batch size) and another page table (written into the same
// fixed-capacity index buffers, as an engine does). The steps' lengths must make every plan split
// unless max_num_splits is 1. Without graph_per_split the graph holds the attention kernel and the
// merge; with it, the merge only when the plans split. grid_covers_work: the plans are of an
// mma.sync kernel, whose graph grid is never smaller than its work list (finish_plan).
const std::vector<std::vector<int32_t>> kGraphReplaySteps = {{5000, 30, 6001}, {2, 7777, 16}, {9000, 9001, 4095}};
void check_graph_replay_with_new_lengths(bool graph_per_split, int max_num_splits, Heads h = {32, 8},
                                         const std::vector<std::vector<int32_t>>& steps = kGraphReplaySteps,
                                         bool grid_covers_work = false, std::vector<Plan>* plans = nullptr) {
  const DType dtype = DType::kBF16;
  const int head_dim = 128, page_size = 16, qo_len = 2;
  const int batch = static_cast<int>(steps[0].size());
  const int64_t pool_pages = 1500;
  const auto shape = pool_shape(KVLayout::kNHD, pool_pages, h.kv, page_size, head_dim);
  PagedKVHost host;
  host.layout = KVLayout::kNHD;
  host.k_pages = random_tensor(shape, dtype, 1);
  host.v_pages = random_tensor(shape, dtype, 2);
  const HostTensor q = random_tensor({batch * qo_len, h.qo, head_dim}, dtype, 4);
  DeviceTensor dq(q), dk(host.k_pages), dv(host.v_pages);
  DeviceTensor d_indptr(HostTensor::from_int32(std::vector<int32_t>(batch + 1, 0)));
  DeviceTensor d_indices(HostTensor::from_int32(std::vector<int32_t>(pool_pages, 0)));
  DeviceTensor d_last(HostTensor::from_int32(std::vector<int32_t>(batch, 0)));
  HostTensor o_like({batch * qo_len, h.qo, head_dim}, dtype);
  HostTensor lse_like({batch * qo_len, h.qo}, DType::kFP32);
  DeviceTensor d_o(o_like), d_lse(lse_like);
  DeviceWorkspace ws;
  PagedKV dkv;
  dkv.k_pages = dk.view();
  dkv.v_pages = dv.view();
  dkv.layout = KVLayout::kNHD;
  dkv.kv_page_indptr = d_indptr.view();
  dkv.kv_page_indices = d_indices.view();
  dkv.kv_last_page_len = d_last.view();
  const DecodeArgs args{dq.view(), dkv, d_o.view(), d_lse.view()};

  cudaStream_t stream;
  GQ_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaGraphExec_t exec = nullptr;
  uint64_t seed = 10;
  for (const auto& kv_len : steps) {
    SCOPED_TRACE(describe_case(dtype, h, head_dim, page_size, qo_len, KVLayout::kNHD, kv_len));
    int64_t needed = 0;
    for (int32_t l : kv_len) needed += (l + page_size - 1) / page_size;
    const PageTable table = make_random_page_table(kv_len, page_size, seed++, pool_pages - needed);
    host.table = table;
    host.kv_page_indptr = HostTensor::from_int32(table.kv_page_indptr);
    host.kv_page_indices = HostTensor::from_int32(table.kv_page_indices);
    host.kv_last_page_len = HostTensor::from_int32(table.kv_last_page_len);
    PlanInputs in;
    in.dtype = dtype;
    in.num_qo_heads = h.qo;
    in.num_kv_heads = h.kv;
    in.head_dim = head_dim;
    in.page_size = page_size;
    in.qo_len = qo_len;
    in.kv_indptr = table.kv_page_indptr;
    in.kv_last_page_len = table.kv_last_page_len;
    in.device = Device::kCPU;
    HostTensor o_ref = o_like, lse_ref = lse_like;
    decode_run(decode_plan(in, Workspace{}), DecodeArgs{q.view(), host.view(), o_ref.view(), lse_ref.view()});

    in.device = Device::kCUDA;
    in.enable_cuda_graph = true;
    in.graph_per_split = graph_per_split;
    in.max_num_splits = max_num_splits;
    const Plan plan = decode_plan(in, ws.get(), stream);
    if (plans != nullptr) plans->push_back(plan);
    EXPECT_EQ(plan.max_splits > 1, max_num_splits != 1);
    EXPECT_EQ(plan.split, !graph_per_split || plan.max_splits > 1);
    if (grid_covers_work) {
      EXPECT_GE(plan.num_ctas, plan.num_work);
    }
    GQ_CUDA_CHECK(cudaMemcpyAsync(d_indptr.view().data, table.kv_page_indptr.data(), (batch + 1) * 4,
                                  cudaMemcpyHostToDevice, stream));
    GQ_CUDA_CHECK(cudaMemcpyAsync(d_indices.view().data, table.kv_page_indices.data(),
                                  table.kv_page_indices.size() * 4, cudaMemcpyHostToDevice, stream));
    GQ_CUDA_CHECK(cudaMemcpyAsync(d_last.view().data, table.kv_last_page_len.data(), batch * 4,
                                  cudaMemcpyHostToDevice, stream));
    if (exec == nullptr) {  // capture once, with the first step's plan
      cudaGraph_t graph;
      GQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      decode_run(plan, args, stream);
      GQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      size_t nodes = 0;
      GQ_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
      EXPECT_EQ(nodes, plan.split ? 2u : 1u) << "kernels in the captured graph";
      GQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      GQ_CUDA_CHECK(cudaGraphDestroy(graph));
    }
    GQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    d_o.poison();
    d_lse.poison();
    GQ_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    GQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    expect_close(d_o.to_host(o_like), o_ref, dtype, "graph replay");
    expect_lse_close(d_lse.to_host(lse_like), lse_ref, "graph replay");
  }
  GQ_CUDA_CHECK(cudaGraphExecDestroy(exec));
  GQ_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(GpuDecode, CudaGraphReplayWithNewLengths) {
  GQ_REQUIRE_GPU();
  check_graph_replay_with_new_lengths(false, 0);
}

// More work items than CTAs fill the GPU (MHA, 20 requests x 32 K/V heads: decode_many's 640 items
// against 528 CTAs on an H200; no split, as in the engine's MHA steps): the graph's grid is the
// captured work list; lengths 0 and 2 (the two new tokens alone) and lengths off the page and tile
// among them.
TEST(GpuDecode, CudaGraphReplayWithMoreItemsThanSlots) {
  GQ_REQUIRE_GPU();
  std::vector<std::vector<int32_t>> steps(3, std::vector<int32_t>(20));
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < 20; ++i) steps[s][i] = (i * 53 + s * 197 + 1) % 700;
    steps[s][s] = 0;
    steps[s][s + 1] = 2;
  }
  check_graph_replay_with_new_lengths(true, 1, Heads{32, 32}, steps, true);
}

TEST(GpuDecode, CudaGraphPerSplit) {
  GQ_REQUIRE_GPU();
  {
    SCOPED_TRACE("plans that split");
    check_graph_replay_with_new_lengths(true, 0);
  }
  {
    SCOPED_TRACE("plans that split nothing: no merge in the graph");
    check_graph_replay_with_new_lengths(true, 1);
  }
}

// 32 and 64 packed rows a request (G 16 and 32 x 2 tokens) with 3 requests: decode_mid and
// decode_wide (too few items for the wgmma kernel on sm_90), each plan split, captured once and
// replayed after plans of new lengths.
TEST(GpuDecode, CudaGraphReplayOnDecodeMidAndWide) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 128)) GTEST_SKIP() << "head_dim 128 is not built";
  for (const Heads& h : {Heads{16, 1}, Heads{32, 1}}) {
    std::vector<Plan> plans;
    check_graph_replay_with_new_lengths(false, 0, h, kGraphReplaySteps, false, &plans);
    const kernels::Family want = h.qo == 16 ? kernels::Family::kDecodeMid : kernels::Family::kDecodeWide;
    for (const Plan& plan : plans) EXPECT_EQ(dispatch::kernel_by_id(plan.kernel_id).family, want);
  }
}

// MQA with 32 query heads x 2 tokens (64 rows) and 32 requests: on sm_90 the wgmma kernel
// (persistent CTAs, split_item_keys), whose graph grid is one CTA an SM. Captured once with the
// first step's plan, replayed after plans of new lengths (one request of 6000..8000 keys a step, so
// every plan splits; kv_len 0 and 2 among them) that move the long request and the chunk count.
TEST(GpuDecode, CudaGraphReplayOnTheWgmmaKernel) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 128)) GTEST_SKIP() << "head_dim 128 is not built";
  std::vector<std::vector<int32_t>> steps(3, std::vector<int32_t>(32));
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < 32; ++i) steps[s][i] = 2 + (i * 71 + s * 113) % 400;
    steps[s][s] = 0;
    steps[s][s + 1] = 2;
    steps[s][7 + s] = 6000 + 1000 * s;
  }
  std::vector<Plan> plans;
  check_graph_replay_with_new_lengths(false, 0, Heads{32, 1}, steps, false, &plans);
  const DeviceSms dev = device_sms();
  const bool built = std::find(info.cuda_archs.begin(), info.cuda_archs.end(), 90) != info.cuda_archs.end();
  if (dev.arch == 90 && built && !dispatch::sm90_disabled()) {
    for (const Plan& plan : plans) {
      EXPECT_EQ(dispatch::kernel_by_id(plan.kernel_id).family, kernels::Family::kPrefillSm90);
      EXPECT_EQ(plan.split_item_keys, !env_flag("GQATTN_DISABLE_SPLIT_ITEM_KEYS"));
    }
  }
}

// ---------------------------------------------------------------------------------------------

// One prefill configuration: CPU oracle vs GPU, K/V ragged (page_size 0) or paged.
// Runs the GPU prefill twice with one plan (the persistent sm_90a kernel's work counter must be
// back at zero after a run) and checks both against the CPU; with `graph`, the plan is made for
// CUDA graphs and the run is captured once and replayed twice.
// late_jumps: K of two keys of every request (a third and three quarters in) set to 16 and 64 in
// every column, so that the rows whose query sums are positive see their max jump by tens of
// log2 units in a late tile (O rescaled by factors near 0), the others not at all.
// far: the GPU's pages past 4 GiB of their pools (DevicePagedKV), or contiguous K/V rows spread
// past 4 GiB (DeviceSpreadRows).
void check_prefill(DType dtype, Heads h, int head_dim, int page_size, bool causal, KVLayout layout,
                   const std::vector<int32_t>& qo_len, const std::vector<int32_t>& kv_len, uint64_t seed,
                   bool graph = false, Plan* plan_out = nullptr, bool late_jumps = false, bool far = false) {
  std::ostringstream what_os;
  what_os << describe_case(dtype, h, head_dim, page_size, -1, layout, kv_len) << " causal " << causal << " qo [";
  for (int32_t l : qo_len) what_os << l << " ";
  what_os << "]";
  const std::string what = what_os.str();
  SCOPED_TRACE(what);
  const std::vector<int32_t> qo_indptr = token_indptr(qo_len);
  const std::vector<int32_t> kv_indptr = token_indptr(kv_len);
  HostTensor k = random_tensor({kv_indptr.back(), h.kv, head_dim}, dtype, seed);
  const HostTensor v = random_tensor({kv_indptr.back(), h.kv, head_dim}, dtype, seed + 1);
  const HostTensor q = random_tensor({qo_indptr.back(), h.qo, head_dim}, dtype, seed + 2);
  const HostTensor d_qo_indptr_host = HostTensor::from_int32(qo_indptr);
  if (late_jumps) {
    for (size_t b = 0; b < kv_len.size(); ++b) {
      for (const auto& [num, den, value] : {std::tuple{1, 3, 16.0}, std::tuple{3, 4, 64.0}}) {
        const int64_t key = kv_indptr[b] + static_cast<int64_t>(kv_len[b]) * num / den;
        if (key >= kv_indptr[b + 1]) continue;
        for (int kh = 0; kh < h.kv; ++kh)
          for (int c = 0; c < head_dim; ++c) k.set({key, kh, c}, value);
      }
    }
  }

  PlanInputs in;
  in.device = Device::kCPU;
  in.dtype = dtype;
  in.num_qo_heads = h.qo;
  in.num_kv_heads = h.kv;
  in.head_dim = head_dim;
  in.page_size = page_size;
  in.causal = causal;
  in.qo_indptr = qo_indptr;
  PagedKVHost paged;
  RaggedKVHost ragged;
  if (page_size > 0) {
    paged = make_paged_kv(k, v, kv_len, page_size, layout, seed + 3);
    in.kv_indptr = paged.table.kv_page_indptr;
    in.kv_last_page_len = paged.table.kv_last_page_len;
  } else {
    ragged = make_ragged_kv(k, v, kv_len);
    in.kv_indptr = kv_indptr;
  }
  HostTensor o_ref({qo_indptr.back(), h.qo, head_dim}, dtype);
  HostTensor lse_ref({qo_indptr.back(), h.qo}, DType::kFP32);
  PrefillArgs cpu_args;
  cpu_args.q = q.view();
  cpu_args.qo_indptr = d_qo_indptr_host.view();
  if (page_size > 0) cpu_args.paged = paged.view(); else cpu_args.ragged = ragged.view();
  cpu_args.causal = causal;
  cpu_args.o = o_ref.view();
  cpu_args.lse = lse_ref.view();
  prefill_run(prefill_plan(in, Workspace{}), cpu_args);

  in.device = Device::kCUDA;
  in.enable_cuda_graph = graph;
  cudaStream_t stream = nullptr;
  if (graph) GQ_CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceWorkspace ws;
  const Plan plan = prefill_plan(in, ws.get(), stream);
  DeviceTensor dq(q), d_qo_indptr(d_qo_indptr_host), d_o(o_ref), d_lse(lse_ref);
  std::unique_ptr<DevicePagedKV> dpaged;
  std::unique_ptr<DeviceSpreadRows> dk_far, dv_far;
  DeviceTensor dk, dv, d_kv_indptr;
  PrefillArgs args;
  args.q = dq.view();
  args.qo_indptr = d_qo_indptr.view();
  if (page_size > 0) {
    dpaged = std::make_unique<DevicePagedKV>(paged, far);
    args.paged = dpaged->view();
  } else {
    d_kv_indptr = DeviceTensor(ragged.kv_indptr);
    if (far) {
      const int64_t stride = spread_past_4gib(ragged.k.view().shape[0], dtype);
      dk_far = std::make_unique<DeviceSpreadRows>(ragged.k, stride);
      dv_far = std::make_unique<DeviceSpreadRows>(ragged.v, stride);
      args.ragged = RaggedKV{dk_far->view(), dv_far->view(), d_kv_indptr.view()};
    } else {
      dk = DeviceTensor(ragged.k);
      dv = DeviceTensor(ragged.v);
      args.ragged = RaggedKV{dk.view(), dv.view(), d_kv_indptr.view()};
    }
  }
  args.causal = causal;
  args.o = d_o.view();
  args.lse = d_lse.view();
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g = nullptr;
    GQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    GQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    prefill_run(plan, args, stream);
    GQ_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    GQ_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    GQ_CUDA_CHECK(cudaGraphDestroy(g));
  }
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run) + (graph ? " (graph replay)" : ""));
    d_o.poison();
    d_lse.poison();
    if (graph) {
      GQ_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      GQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    } else {
      prefill_run(plan, args);
    }
    sync_and_check();
    expect_close(d_o.to_host(o_ref), o_ref, dtype, what);
    expect_lse_close(d_lse.to_host(lse_ref), lse_ref, what);
  }
  if (graph) {
    GQ_CUDA_CHECK(cudaGraphExecDestroy(exec));
    GQ_CUDA_CHECK(cudaStreamDestroy(stream));
  }
  if (plan_out != nullptr) *plan_out = plan;
}

// Ragged and paged K/V (pages of 1, 3, 16, 32 and 64 keys: every one gathered, none a whole tile),
// causal and not, each in both layouts over the group sizes (the layout flips with the group).
TEST(GpuPrefill, OddLengthsAllGroupSizesRaggedAndPaged) {
  GQ_REQUIRE_GPU();
  uint64_t seed = 300;
  int group = 0;
  for (const Heads& h : {Heads{4, 4}, Heads{8, 2}, Heads{14, 2}, Heads{16, 2}, Heads{8, 1}}) {
    for (int page_size : {0, 1, 3, 16, 32, 64}) {
      for (bool causal : {true, false}) {
        // 256: every K/V tile of the wgmma kernel's items whole (no predicated last tile).
        const std::vector<int32_t> len = {1, 17, 97, 0, 300, 256};
        check_prefill(DType::kBF16, h, 128, page_size, causal, (seed + group) % 2 ? KVLayout::kHND : KVLayout::kNHD,
                      len, len, seed);
        ++seed;
      }
    }
    ++group;
  }
}

// hd64 over group sizes that divide 64 (1 .. 16: on sm_90 the epilogue's TMA store of O where a
// warpgroup's 64 packed rows are whole) and ones that do not (3, 7: the register stores), ragged
// and paged, causal and not; lengths whose last rows fill part of an item, and a request of none.
TEST(GpuPrefill, GroupSizesAtHeadDim64) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 64)) GTEST_SKIP() << "head_dim 64 is not built";
  uint64_t seed = 3400;
  for (const Heads& h : {Heads{4, 4}, Heads{8, 4}, Heads{8, 2}, Heads{6, 2}, Heads{14, 2}, Heads{16, 2}, Heads{16, 1}}) {
    for (int page_size : {0, 16}) {
      for (bool causal : {true, false}) {
        const std::vector<int32_t> len = {1, 17, 97, 0, 300, 256};
        check_prefill(info.dtypes[0], h, 64, page_size, causal, seed % 2 ? KVLayout::kHND : KVLayout::kNHD, len, len, seed);
        ++seed;
      }
    }
  }
}

// Lengths of 1000 and 2049 (many tiles, the last partial): causal over pages of 16, and non-causal
// over contiguous (ragged) K/V; MHA, GQA-4 and MQA.
TEST(GpuPrefill, LongSequence2049) {
  GQ_REQUIRE_GPU();
  for (const Heads& h : {Heads{4, 4}, Heads{16, 4}, Heads{8, 1}}) {
    check_prefill(DType::kBF16, h, 128, 16, true, KVLayout::kNHD, {1000, 2049}, {1000, 2049}, 11);
    check_prefill(DType::kBF16, h, 128, 0, false, KVLayout::kNHD, {1000, 2049}, {1000, 2049}, 12);
  }
}

// Chunked prefill / prefix caching: new tokens attend to a cached prefix (qo_len < kv_len).
TEST(GpuPrefill, CachedPrefixCausalAlignment) {
  GQ_REQUIRE_GPU();
  uint64_t seed = 500;
  for (const Heads& h : {Heads{8, 8}, Heads{8, 2}, Heads{14, 2}, Heads{8, 1}}) {
    for (int page_size : {0, 1, 16}) {
      check_prefill(DType::kBF16, h, 128, page_size, true, KVLayout::kNHD, {5, 64, 0, 130, 1},
                    {900, 64, 40, 1300, 1}, seed++);
    }
  }
}

// Pages that hold whole K/V tiles (a multiple of the sm_90a kernel's 64- or 128-key tile): the
// Hopper kernel loads those tiles with TMA (paged rank 4, or rank 3 with one K/V head) and the
// partial last tile with gathers; both layouts, every head dim built. Causal and not in turn over
// the heads and page sizes, so that each page size and layout runs both ways.
TEST(GpuPrefill, WholeTilePagesEveryHeadDim) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  uint64_t seed = 900;
  for (int head_dim : info.head_dims) {
    int heads_turn = 0;
    for (const Heads& h : {Heads{8, 8}, Heads{8, 2}, Heads{8, 1}}) {
      for (int page_size : {128, 256}) {
        const bool causal = (heads_turn + page_size / 128) % 2 == 1;
        for (KVLayout layout : {KVLayout::kHND, KVLayout::kNHD}) {
          SCOPED_TRACE("head_dim " + std::to_string(head_dim) + " page " + std::to_string(page_size) + " " +
                       layout_name(layout));
          check_prefill(info.dtypes[0], h, head_dim, page_size, causal, layout, {300, 0, 129, 40},
                        {1000, 7, 129, 40}, seed);
          ++seed;
        }
      }
      ++heads_turn;
    }
  }
}

// Rows whose max jumps by tens of log2 units late in the row (check_prefill's late_jumps): O is
// rescaled by factors near 0 after many tiles, on every head dim built, contiguous and paged,
// causal and not, short rows (decode-shaped items) and long ones.
TEST(GpuPrefill, RowMaxJumpsLate) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  uint64_t seed = 3100;
  for (int head_dim : info.head_dims) {
    for (const Heads& h : {Heads{4, 4}, Heads{16, 2}, Heads{8, 1}}) {
      for (int page_size : {0, 16}) {
        for (bool causal : {true, false}) {
          SCOPED_TRACE("head_dim " + std::to_string(head_dim));
          check_prefill(info.dtypes[0], h, head_dim, page_size, causal, KVLayout::kNHD, {260, 1, 3, 130},
                        {1400, 900, 2000, 130}, seed++, false, nullptr, true);
        }
      }
    }
  }
}

// Pages smaller than the sm_90a kernel's tile at head_dim 256: pages of 32 keys load whole 64-key
// tiles by TMA, one box per page (each box its own page id; perf-notes item 41), the partial last
// tile by gathers; pages of 8 and 16 take the gathers (item 115), as the other head dims do. Both
// layouts, and one K/V head (the rank-3 map). Causal and not in turn over the heads and page
// sizes, so that each page size and layout runs both ways.
TEST(GpuPrefill, SmallPageBoxesHeadDim256) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 256)) GTEST_SKIP() << "head_dim 256 is not built (-DGQATTN_HEAD_DIMS)";
  uint64_t seed = 1900;
  int turn = 0;
  for (const Heads& h : {Heads{8, 8}, Heads{8, 2}, Heads{8, 1}}) {
    for (int page_size : {8, 16, 32}) {
      const bool causal = turn++ % 2 == 0;
      for (KVLayout layout : {KVLayout::kHND, KVLayout::kNHD}) {
        SCOPED_TRACE("page " + std::to_string(page_size) + " " + layout_name(layout));
        check_prefill(info.dtypes[0], h, 256, page_size, causal, layout, {200, 0, 70, 1}, {457, 5, 70, 129}, seed);
        ++seed;
      }
    }
  }
}

// Causal MHA items at head_dim 256 whose first consumer warpgroup's rows end a whole 64-key tile
// before the item's keys do: on the sm_90a kernel that warpgroup skips the tiles past its keys
// (waits for them, releases them, takes their turns). Queries aligned to the end of the keys
// (the first warpgroup skips one tile an item) or after a cached prefix of 64 or 37 keys (the
// boundary between the warpgroups' last tiles moves); 8 / 2 heads (a skip only where a tile
// boundary falls between the two warpgroups' last rows); a request of one token and one of 65;
// contiguous (TMA), pages of 32 (one box a page) and 16 (gathers), both layouts. MHA's 160 items
// on at most one CTA an SM: several items a CTA, so skipped turns must keep the consumers' turn
// ring paired across items. Small enough for racecheck.
TEST(GpuPrefill, CausalTilesPastAWarpgroupsRowsHeadDim256) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 256)) GTEST_SKIP() << "head_dim 256 is not built (-DGQATTN_HEAD_DIMS)";
  struct Case {
    Heads h;
    int prefix, page_size;
  };
  const Case cases[] = {{Heads{16, 16}, 0, 0},  {Heads{16, 16}, 0, 32}, {Heads{16, 16}, 0, 16}, {Heads{16, 16}, 37, 0},
                        {Heads{16, 16}, 64, 16}, {Heads{8, 2}, 0, 0},    {Heads{8, 2}, 37, 16}};
  const std::vector<int32_t> qo = {520, 1, 65, 300};
  uint64_t seed = 3300;
  for (const Case& c : cases) {
    std::vector<int32_t> kv;
    for (int32_t n : qo) kv.push_back(n + c.prefix);
    SCOPED_TRACE("heads " + std::to_string(c.h.qo) + "/" + std::to_string(c.h.kv) + " prefix " +
                 std::to_string(c.prefix) + " page " + std::to_string(c.page_size));
    check_prefill(info.dtypes[seed % info.dtypes.size()], c.h, 256, c.page_size, true,
                  seed % 2 ? KVLayout::kHND : KVLayout::kNHD, qo, kv, seed);
    ++seed;
  }
}

// The sm_90a kernel's hd256 epilogue by the item's keys (Sm90Shape::kStagedOMaxKeys = 2048):
// items of at most 2048 keys store O through shared memory, longer ones straight from the
// accumulators. Requests on both sides of the limit (2047, 2048, 2049, 3001 keys) beside
// nine of one to nine keys, in one launch of more items than an H200 has SMs (MHA: 16 items a
// request), so that no request is split (split rows take the partial stores) and CTAs take
// items of both kinds; causal and not, contiguous (TMA) and pages of 16 (gathers).
TEST(GpuPrefill, StagedOutputKeyLimitHeadDim256) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 256)) GTEST_SKIP() << "head_dim 256 is not built (-DGQATTN_HEAD_DIMS)";
  const std::vector<int32_t> qo = {65, 1, 1, 70, 1, 1, 1, 66, 1, 1, 1, 1, 67};
  const std::vector<int32_t> kv = {2049, 1, 4, 2048, 9, 2, 7, 3001, 1, 5, 3, 8, 2047};
  uint64_t seed = 3400;
  for (bool causal : {true, false}) {
    const int page_size = causal ? 0 : 16;
    Plan plan;
    check_prefill(info.dtypes[seed % info.dtypes.size()], Heads{16, 16}, 256, page_size, causal,
                  seed % 2 ? KVLayout::kHND : KVLayout::kNHD, qo, kv, seed, false, &plan);
    EXPECT_FALSE(plan.split) << "a split request: its rows would not reach the epilogue's two paths";
    ++seed;
  }
}

// More work items than the sm_90a kernel's persistent CTAs (one an SM): each CTA runs several
// items back to back, the next item's Q and first K/V tile loaded while the current one finishes
// (on hd <= 128 its first S GEMM issued with the last P V of the one before). Items of one K/V
// tile, items of none (non-causal rows over an empty KV) and partial row tiles among them; the
// tests above have fewer items than CTAs. Also as a CUDA-graph plan (a fixed grid).
TEST(GpuPrefill, ManyItemsPerCta) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  std::vector<int32_t> qo, kv_causal, kv_any;
  for (int b = 0; b < 48; ++b) {
    qo.push_back(60 + (b * 37) % 71);  // 240 .. 520 packed rows: 2 .. 5 row tiles a K/V head
    kv_causal.push_back(qo.back() + (b * 53) % 101);
    kv_any.push_back(b % 11 == 4 ? 0 : (b % 7 == 2 ? 33 : kv_causal.back()));
  }
  uint64_t seed = 2100;
  for (int head_dim : info.head_dims) {
    for (bool causal : {true, false}) {
      for (int page_size : {0, 16}) {
        if (head_dim != 128 && page_size == 0) continue;  // every path at hd128, one paged run per other head dim
        SCOPED_TRACE("head_dim " + std::to_string(head_dim));
        check_prefill(info.dtypes[0], Heads{8, 2}, head_dim, page_size, causal, seed % 2 ? KVLayout::kHND : KVLayout::kNHD,
                      qo, causal ? kv_causal : kv_any, seed, /*graph=*/causal && page_size == 16);
        ++seed;
      }
    }
  }
}

// hd64 prefill with >= 4096 packed rows a request and K/V head on average and its 192-row items
// covering the SMs: on sm_90 prefill_sm90_wide (three consumer warpgroups), elsewhere the same
// plans on the other kernels. MQA (32 query heads) and G = 8; ragged lengths that are not
// multiples of the 192-row item or the 128-key tile, one request of one token, one of no keys;
// causal and not; contiguous (TMA) and pages of 16 and 64 (gathers), NHD and HND; several items a
// CTA. A CUDA-graph plan of the same batch keeps prefill_sm90 (the rows are not known to it).
TEST(GpuPrefill, WideItemsAtHeadDim64) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 64)) GTEST_SKIP() << "head_dim 64 is not built";
  const bool built = std::find(info.cuda_archs.begin(), info.cuda_archs.end(), 90) != info.cuda_archs.end();
  const DeviceSms dev = device_sms();
  const bool sm90 = dev.arch == 90 && built && !dispatch::sm90_disabled();
  const bool wide = sm90 && !dispatch::sm90_wide_disabled();
  struct Case {
    Heads h;
    std::vector<int32_t> qo;
  };
  // MQA: 32 x 4324 rows on average, 8 x 23 items; G = 8: 4776 rows, 4 x 2 x 25 items (>= 132 SMs).
  const Case cases[] = {{Heads{32, 1}, {150, 171, 133, 1, 190, 147, 160, 129}}, {Heads{16, 2}, {520, 613, 700, 555}}};
  uint64_t seed = 2600;
  for (const Case& c : cases) {
    for (bool causal : {true, false}) {
      const int page_size = causal ? 16 : (c.h.kv == 1 ? 0 : 64);
      std::vector<int32_t> kv;
      for (size_t b = 0; b < c.qo.size(); ++b) kv.push_back(c.qo[b] + static_cast<int32_t>((b * 97) % 301));
      if (!causal) kv[1] = 0;
      Plan plan;
      check_prefill(info.dtypes[seed % info.dtypes.size()], c.h, 64, page_size, causal,
                    seed % 2 ? KVLayout::kHND : KVLayout::kNHD, c.qo, kv, seed, /*graph=*/false, &plan);
      const kernels::Family family = dispatch::kernel_by_id(plan.kernel_id).family;
      if (wide) {
        EXPECT_EQ(family, kernels::Family::kPrefillSm90Wide);
        EXPECT_EQ(plan.cta_rows, 192);
      } else if (sm90) {
        EXPECT_EQ(family, kernels::Family::kPrefillSm90);
      }
      ++seed;
    }
  }
  if (sm90) {
    Plan plan;
    check_prefill(info.dtypes[0], Heads{32, 1}, 64, 16, true, KVLayout::kNHD, cases[0].qo, cases[0].qo, seed,
                  /*graph=*/true, &plan);
    EXPECT_EQ(dispatch::kernel_by_id(plan.kernel_id).family, kernels::Family::kPrefillSm90);
  }
}

// WideItemsAtHeadDim64's shapes with K/V loaded by TMA where it gathers them or uses one map:
// pages of 128 and 256 keys (whole tiles; the rank-3 map with one K/V head, rank 4 in HND and NHD)
// and contiguous K/V with two K/V heads; causal and not. A separate test, so that the
// sanitizers' runs of WideItemsAtHeadDim64 stay short.
TEST(GpuPrefill, WideItemsWholeTilePagesAtHeadDim64) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  if (!head_dim_built(info, 64)) GTEST_SKIP() << "head_dim 64 is not built";
  const bool built = std::find(info.cuda_archs.begin(), info.cuda_archs.end(), 90) != info.cuda_archs.end();
  const DeviceSms dev = device_sms();
  const bool wide = dev.arch == 90 && built && !dispatch::sm90_disabled() && !dispatch::sm90_wide_disabled();
  struct Case {
    Heads h;
    int page_size;
    bool causal;
    KVLayout layout;
  };
  const Case cases[] = {{Heads{32, 1}, 128, true, KVLayout::kNHD},
                        {Heads{16, 2}, 0, false, KVLayout::kNHD},
                        {Heads{16, 2}, 128, true, KVLayout::kHND},
                        {Heads{16, 2}, 256, false, KVLayout::kNHD}};
  uint64_t seed = 5500;
  for (const Case& c : cases) {
    // The rows of WideItemsAtHeadDim64: >= 4096 packed rows a request and K/V head, items for every SM.
    const std::vector<int32_t> qo = c.h.kv == 1 ? std::vector<int32_t>{150, 171, 133, 1, 190, 147, 160, 129}
                                                : std::vector<int32_t>{520, 613, 700, 555};
    std::vector<int32_t> kv;
    for (size_t b = 0; b < qo.size(); ++b) kv.push_back(qo[b] + static_cast<int32_t>((b * 89) % 263));
    if (!c.causal) kv[1] = 0;
    Plan plan;
    check_prefill(info.dtypes[seed % info.dtypes.size()], c.h, 64, c.page_size, c.causal, c.layout, qo, kv, seed,
                  /*graph=*/false, &plan);
    if (wide) {
      EXPECT_EQ(dispatch::kernel_by_id(plan.kernel_id).family, kernels::Family::kPrefillSm90Wide);
    }
    ++seed;
  }
}

// A prefill plan made for CUDA graphs (a fixed grid of CTAs that loop over the work list) runs
// from a captured graph, replayed twice.
TEST(GpuPrefill, CudaGraphReplay) {
  GQ_REQUIRE_GPU();
  uint64_t seed = 950;
  for (const Heads& h : {Heads{8, 8}, Heads{8, 2}, Heads{8, 1}}) {
    for (int page_size : {0, 16}) {
      check_prefill(DType::kBF16, h, 128, page_size, true, KVLayout::kNHD, {500, 3, 0, 1200}, {700, 3, 9, 1200},
                    seed++, /*graph=*/true);
    }
  }
}

// Short query chunks in the prefill API run on the decode families (packed rows <= 16 and <= 64).
TEST(GpuPrefill, ShortQueriesOnDecodeFamilies) {
  GQ_REQUIRE_GPU();
  uint64_t seed = 800;
  for (const Heads& h : {Heads{8, 1}, Heads{4, 4}, Heads{14, 2}}) {
    for (bool causal : {true, false}) {
      check_prefill(DType::kBF16, h, 128, 16, causal, KVLayout::kHND, {3, 1, 0, 4}, {100, 1, 7, 2000}, seed++);
    }
  }
}

TEST(GpuPrefill, EveryHeadDimAndDtypeBuilt) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  uint64_t seed = 700;
  for (DType dtype : info.dtypes) {
    for (int head_dim : info.head_dims) {
      for (const Heads& h : {Heads{8, 8}, Heads{8, 2}, Heads{8, 1}, Heads{14, 2}, Heads{16, 2}}) {
        check_prefill(dtype, h, head_dim, seed % 2 ? 16 : 0, true, KVLayout::kNHD, {33, 200, 7}, {33, 300, 7}, seed);
        ++seed;
      }
      // Non-causal, HND, groups 7 and 8 with a cached prefix (qo_len < kv_len).
      for (const Heads& h : {Heads{14, 2}, Heads{16, 2}}) {
        check_prefill(dtype, h, head_dim, seed % 2 ? 3 : 0, false, KVLayout::kHND, {33, 0, 130}, {70, 5, 130}, seed);
        ++seed;
      }
    }
  }
}

// On an sm_90 device with sm_90a code built, prefill-sized work runs on the wgmma kernel, so the
// prefill tests above exercise it (gpu_check.sh runs them again with GQATTN_DISABLE_SM90=1 for
// the portable kernel). select_kernel's rules for sm_90 need no device: this test runs wherever
// sm_90a code is built (CI too).
TEST(GpuPrefill, HopperPathSelectedOnSm90) {
  const BuildInfo info = build_info();
  const bool built = std::find(info.cuda_archs.begin(), info.cuda_archs.end(), 90) != info.cuda_archs.end();
  if (!built) GTEST_SKIP() << "sm_90a code is not built";
  // Every head dim built (80, 96 and 112 in hd128's tiles) has the wgmma kernel.
  for (int hd : info.head_dims) {
    SCOPED_TRACE(testing::Message() << "head_dim " << hd);
    EXPECT_TRUE(kernels::sm90_head_dim(hd));
    const DType dt = info.dtypes[0];
    const dispatch::KernelChoice c = dispatch::select_kernel(dt, hd, 1 << 20, 90);
    if (dispatch::sm90_disabled()) {
      EXPECT_EQ(c.family, kernels::Family::kPrefill);
      EXPECT_EQ(dispatch::select_kernel(dt, hd, 65, 90, 1024, 132).family, kernels::Family::kPrefill);
      continue;
    }
    EXPECT_EQ(c.family, kernels::Family::kPrefillSm90);
    EXPECT_EQ(dispatch::select_kernel(dt, hd, 16, 90).family, kernels::Family::kDecode);
    // 17..32 rows: decode_mid, which exists up to head_dim 128 (decode_wide above).
    const kernels::Family mid = hd <= kernels::kDecodeMidMaxHeadDim ? kernels::Family::kDecodeMid
                                                                  : kernels::Family::kDecodeWide;
    EXPECT_EQ(dispatch::select_kernel(dt, hd, 17, 90).family, mid);
    EXPECT_EQ(dispatch::select_kernel(dt, hd, 32, 90).family, mid);
    EXPECT_EQ(dispatch::select_kernel(dt, hd, 33, 90).family, kernels::Family::kDecodeWide);
    EXPECT_EQ(dispatch::select_kernel(dt, hd, 65, 90).family, kernels::Family::kPrefillSm90);
    EXPECT_EQ(dispatch::select_kernel(dt, hd, 65, 90, 1024, 132).family, kernels::Family::kPrefillSm90);
    // The wgmma kernel takes decode rows at hd128 only (measured there): 32 and 64 rows elsewhere
    // stay on decode_mid / decode_wide however many requests.
    if (hd != 128) {
      EXPECT_EQ(dispatch::select_kernel(dt, hd, 32, 90, 1024, 132).family, mid);
      EXPECT_EQ(dispatch::select_kernel(dt, hd, 64, 90, 1024, 132).family, kernels::Family::kDecodeWide);
    }
  }
  if (!dispatch::sm90_disabled()) {
    // hd64 with >= 2048 rows a request and K/V head on average (4096 causal), items for every SM:
    // prefill_sm90_wide.
    if (head_dim_built(info, 64)) {
      const DType dt = info.dtypes[0];
      const kernels::Family wide =
          dispatch::sm90_wide_disabled() ? kernels::Family::kPrefillSm90 : kernels::Family::kPrefillSm90Wide;
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 1 << 14, 90, 32, 132, 16384, 16384).family, wide);
      // 4096 rows: 22 items of 192 a request and K/V head; 6 x 22 = 132 items cover 132 SMs, 5 x 22 do not.
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 4096, 90, 6, 132, 2048, 4096).family, wide);
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 4096, 90, 5, 132, 2048, 4096).family, kernels::Family::kPrefillSm90);
      // 2048 rows: 11 items; 12 x 11 = 132 items cover 132 SMs, 11 x 11 do not.
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 2048, 90, 12, 132, 2048, 2048).family, wide);
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 2048, 90, 11, 132, 2048, 2048).family, kernels::Family::kPrefillSm90);
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 2047, 90, 512, 132, 2048, 2047).family, kernels::Family::kPrefillSm90);
      // Causal plans from 4096 rows.
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 2048, 90, 512, 132, 2048, 2048, 0, true).family,
                kernels::Family::kPrefillSm90);
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 4095, 90, 512, 132, 2048, 4095, 0, true).family,
                kernels::Family::kPrefillSm90);
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 4096, 90, 6, 132, 2048, 4096, 0, true).family, wide);
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 1 << 14, 90, 32, 132, 16384, 0).family, kernels::Family::kPrefillSm90);
      if (head_dim_built(info, 128)) {
        EXPECT_EQ(dispatch::select_kernel(dt, 128, 1 << 14, 90, 32, 132, 16384, 16384).family, kernels::Family::kPrefillSm90);
      }
    }
    // 17..64 rows at hd128 with an item for at least a fifth of the SMs: the wgmma kernel.
    if (head_dim_built(info, 128)) {
      const DType dt = info.dtypes[0];
      EXPECT_EQ(dispatch::select_kernel(dt, 128, 32, 90, 27, 132).family, kernels::Family::kPrefillSm90);
      EXPECT_EQ(dispatch::select_kernel(dt, 128, 64, 90, 128, 132).family, kernels::Family::kPrefillSm90);
      EXPECT_EQ(dispatch::select_kernel(dt, 128, 32, 90, 26, 132).family, kernels::Family::kDecodeMid);
      // <= 16 rows with >= 3 x SMs requests x K/V heads: decode_many (sm_90 only).
      const kernels::Family many =
          dispatch::decode_many_disabled() ? kernels::Family::kDecode : kernels::Family::kDecodeMany;
      EXPECT_EQ(dispatch::select_kernel(dt, 128, 16, 90, 4096, 132).family, many);
      EXPECT_EQ(dispatch::select_kernel(dt, 128, 1, 90, 396, 132).family, many);
      EXPECT_EQ(dispatch::select_kernel(dt, 128, 16, 90, 395, 132).family, kernels::Family::kDecode);
      EXPECT_EQ(dispatch::select_kernel(dt, 128, 16, 80, 4096, 132).family, kernels::Family::kDecode);
      // ... with at most 4096 keys a request on average, where the plan knows the lengths.
      EXPECT_EQ(dispatch::select_kernel(dt, 128, 16, 90, 4096, 132, 4096).family, many);
      EXPECT_EQ(dispatch::select_kernel(dt, 128, 16, 90, 4096, 132, 4097).family, kernels::Family::kDecode);
      // 17..32 rows with at most SMs / 64 requests x K/V heads: two 16-row items each.
      EXPECT_EQ(dispatch::select_kernel(dt, 128, 32, 90, 1, 132).family, kernels::Family::kDecode);
      EXPECT_EQ(dispatch::select_kernel(dt, 128, 17, 90, 2, 132).family, kernels::Family::kDecode);
      EXPECT_EQ(dispatch::select_kernel(dt, 128, 32, 90, 3, 132).family, kernels::Family::kDecodeMid);
      EXPECT_EQ(dispatch::select_kernel(dt, 128, 33, 90, 1, 132).family, kernels::Family::kDecodeWide);
    }
    // <= 16 rows at hd64 with 128 .. 3 x SMs - 1 requests x K/V heads of >= 2048 keys on average:
    // decode_long (sm_90, lengths known).
    if (head_dim_built(info, 64)) {
      const DType dt = info.dtypes[0];
      const kernels::Family lng =
          dispatch::decode_long_disabled() ? kernels::Family::kDecode : kernels::Family::kDecodeLong;
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 8, 90, 256, 132, 8192).family, lng);
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 16, 90, 128, 132, 2048).family, lng);
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 16, 90, 395, 132, 2048).family, lng);
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 16, 90, 127, 132, 8192).family, kernels::Family::kDecode);
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 16, 90, 396, 132, 8192).family, kernels::Family::kDecode);
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 16, 90, 256, 132, 2047).family, kernels::Family::kDecode);
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 16, 90, 256, 132, 0).family, kernels::Family::kDecode);
      EXPECT_EQ(dispatch::select_kernel(dt, 64, 16, 80, 256, 132, 8192).family, kernels::Family::kDecode);
    }
  }
}

// The kernel select_kernel() picks fits the device's shared memory a CTA (finish_plan passes
// cudaDevAttrMaxSharedMemoryPerBlockOptin): on sm_86 / sm_89 / sm_120 (99 KB) the decode family at
// hd128 (100 KB), decode_mid and decode_wide there and the decode family at hd256 would not launch
// (cudaFuncSetAttribute refused them at plan time); where every kernel fits (sm_80's 163 KB, sm_90's
// 227 KB) the choice is the one made without a limit. Needs no device, as the test above.
TEST(SelectKernel, ChoiceFitsTheDevicesSharedMemory) {
  const BuildInfo info = build_info();
  struct DeviceLimit {
    int sm, smem;
  };
  for (const DeviceLimit dev : {DeviceLimit{86, 99 * 1024}, DeviceLimit{89, 99 * 1024}, DeviceLimit{120, 99 * 1024},
                                DeviceLimit{80, 163 * 1024}, DeviceLimit{90, 227 * 1024}}) {
    for (DType dt : info.dtypes) {
      for (int hd : info.head_dims) {
        for (int rows : {1, 8, 16, 17, 32, 33, 64, 65, 1 << 20}) {
          for (int64_t items : {int64_t(1), int64_t(27), int64_t(4096)}) {
            SCOPED_TRACE(testing::Message() << "sm " << dev.sm << " " << dtype_name(dt) << " hd " << hd << " rows "
                                            << rows << " requests x K/V heads " << items);
            const dispatch::KernelChoice c = dispatch::select_kernel(dt, hd, rows, dev.sm, items, 132, 0, 0, dev.smem);
            EXPECT_GT(c.smem_bytes, 0);
            EXPECT_LE(c.smem_bytes, dev.smem);
            if (dev.sm == 80 || dev.sm == 90) {
              EXPECT_EQ(c.id, dispatch::select_kernel(dt, hd, rows, dev.sm, items, 132).id);
            }
          }
        }
      }
      if (head_dim_built(info, 128)) {  // an ordinary decode step on 99 KB: 32-key tiles, 52 KB
        EXPECT_EQ(dispatch::select_kernel(dt, 128, 4, dev.sm, 64, 132, 0, 0, dev.smem).family,
                  dev.smem < 100 * 1024 ? kernels::Family::kDecodeMany : kernels::Family::kDecode);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------

// append_kv of new tokens in random order, on both sides of page boundaries (positions 15 | 16
// and 63 | 64 of one request: the last slot of a page and the first of the next at pages of 16 and
// 64; first and last slots at pages of 3 and 1), on the GPU against the CPU, the written pools
// byte for byte. far: the GPU's pages past 4 GiB of their pools (DevicePagedKV).
void check_append_kv(KVLayout layout, int page_size, uint64_t seed, bool far = false) {
  SCOPED_TRACE(std::string(layout_name(layout)) + " page " + std::to_string(page_size) + (far ? " far" : ""));
  const Heads h{8, 2};
  const int head_dim = 128;
  const std::vector<int32_t> kv_len = {40, 1, 77};
  const HostTensor k = random_tensor({118, h.kv, head_dim}, DType::kBF16, seed);
  const HostTensor v = random_tensor({118, h.kv, head_dim}, DType::kBF16, seed + 1);
  PagedKVHost cpu_kv = make_paged_kv(k, v, kv_len, page_size, layout, seed + 2);
  const std::vector<int32_t> batch_idx = {2, 0, 1, 0, 2, 2, 0, 2, 0, 2, 2};
  const std::vector<int32_t> positions = {76, 39, 0, 5, 3, 50, 16, 63, 15, 64, 6};
  const int64_t num_new = static_cast<int64_t>(positions.size());
  const HostTensor k_new = random_tensor({num_new, h.kv, head_dim}, DType::kBF16, seed + 3);
  const HostTensor v_new = random_tensor({num_new, h.kv, head_dim}, DType::kBF16, seed + 4);
  const HostTensor b_t = HostTensor::from_int32(batch_idx), p_t = HostTensor::from_int32(positions);
  DevicePagedKV gpu_kv(cpu_kv, far);
  DeviceTensor dk_new(k_new), dv_new(v_new), db(b_t), dp(p_t);
  append_kv(cpu_kv.view(), k_new.view(), v_new.view(), b_t.view(), p_t.view());
  append_kv(gpu_kv.view(), dk_new.view(), dv_new.view(), db.view(), dp.view());
  sync_and_check();
  EXPECT_EQ(gpu_kv.k_pages.to_host(cpu_kv.k_pages).storage(), cpu_kv.k_pages.storage());
  EXPECT_EQ(gpu_kv.v_pages.to_host(cpu_kv.v_pages).storage(), cpu_kv.v_pages.storage());
}

// check_append_kv at pages of 1, 3, 16 and 64, both layouts.
TEST(GpuAppendKV, MatchesCpuForBothLayoutsAndOddPageSizes) {
  GQ_REQUIRE_GPU();
  uint64_t seed = 50;
  for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND})
    for (int page_size : {1, 3, 16, 64}) check_append_kv(layout, page_size, seed++);
}

// Random shapes against the oracle (tests/common/random_cases.h; tests/cpu/random_cases_test.cc
// plans these very cases for every head-dim and dtype list a build can report): 40 decode cases
// from a fixed seed over the head dims and dtypes built, group sizes 1..32 (not only powers of
// two) over 1..8 K/V heads, pages of 1..256 keys in both layouts, 1..8 new tokens, 1..24
// requests with kv_len 0, qo_len and up to 2500; the planner picks the kernel family and the
// split as it would for a user.
TEST(GpuRandomShapes, DecodeMatchesTheOracle) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  std::mt19937_64 rng(kRandomDecodeSeed);
  for (int i = 0; i < kRandomCasesPerTest; ++i) {
    const RandomCase c = random_decode_case(rng, info.head_dims, info.dtypes);
    SCOPED_TRACE("random decode case " + std::to_string(i));
    check_decode(c.dtype, Heads{c.num_qo_heads, c.num_kv_heads}, c.head_dim, c.page_size, c.qo_len, c.layout,
                 c.kv_len, kRandomDecodeSeed + i);
  }
}

// 40 prefill cases as above: 1..5 requests of 0..200 query tokens over cached prefixes of 0..600
// keys, causal or not (not causal: empty KVs and fewer keys than query tokens among them),
// contiguous K/V or pages of 1..256 keys.
TEST(GpuRandomShapes, PrefillMatchesTheOracle) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  std::mt19937_64 rng(kRandomPrefillSeed);
  for (int i = 0; i < kRandomCasesPerTest; ++i) {
    const RandomCase c = random_prefill_case(rng, info.head_dims, info.dtypes);
    SCOPED_TRACE("random prefill case " + std::to_string(i));
    check_prefill(c.dtype, Heads{c.num_qo_heads, c.num_kv_heads}, c.head_dim, c.page_size, c.causal, c.layout,
                  c.qo_lens, c.kv_len, kRandomPrefillSeed + i);
  }
}

// Pools past 4 GiB (a serving engine's cache on a 141 GB GPU): every page the requests use lies
// past 2^31 elements and 2^32 bytes of its pool (DevicePagedKV's far pages), so a 32-bit page
// offset anywhere on the way shows. At every head dim built: G = 4 (the decode family; a batch of 4
// splits, so the merge's partial rows too) and MQA's 32 rows over 8 requests (decode_mid, at hd256
// decode_wide: too few requests x K/V heads for the wgmma kernel). At hd128: page 1 (the largest
// page ids, ~16.8 M) with MQA x 2 draft tokens over 32 requests, and GQA-8 x 4 draft tokens over 4
// requests x 8 K/V heads (both 32 items or more: the wgmma kernel on sm_90, its items of <= 64 rows
// splitting keys; decode_wide / decode_mid elsewhere); decode_many's request count; at hd64
// decode_long's lengths (sm_90). Both layouts, pages of 1, 3 and 16. Each case allocates ~8.6 GB.
TEST(GpuLargePools, DecodePastFourGiB) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  const DeviceSms dev = device_sms();
  uint64_t seed = 7100;
  auto dtype = [&] { return info.dtypes[seed % info.dtypes.size()]; };
  for (int head_dim : info.head_dims) {
    check_decode(dtype(), Heads{32, 8}, head_dim, 16, 1, KVLayout::kNHD, {0, 1, 700, 3001}, seed, 0, nullptr,
                 nullptr, /*far=*/true);
    ++seed;
    check_decode(dtype(), Heads{32, 1}, head_dim, 16, 1, KVLayout::kHND, random_lengths(8, 1, 900, seed, true),
                 seed, 0, nullptr, nullptr, /*far=*/true);
    ++seed;
  }
  if (head_dim_built(info, 128)) {
    struct Case {
      Heads h;
      int qo_len, page_size, batch, max_len;
      KVLayout layout;
    };
    const Case cases[] = {{Heads{32, 1}, 2, 1, 32, 700, KVLayout::kNHD},
                          {Heads{64, 8}, 4, 16, 4, 3000, KVLayout::kHND},
                          {Heads{16, 4}, 1, 3, (3 * dev.count + 3) / 4 + 1, 300, KVLayout::kNHD}};
    for (const Case& c : cases) {
      check_decode(dtype(), c.h, 128, c.page_size, c.qo_len, c.layout,
                   random_lengths(c.batch, c.qo_len, c.max_len, seed, true, c.qo_len), seed, 0, nullptr, nullptr,
                   /*far=*/true);
      ++seed;
    }
  }
  if (head_dim_built(info, 64)) {
    check_decode(dtype(), Heads{32, 8}, 64, 3, 1, KVLayout::kHND, random_lengths(32, 2300, 2900, seed, true), seed,
                 0, nullptr, nullptr, /*far=*/true);
  }
}

// Prefill with its K/V past 4 GiB, at every head dim built: pages of 16 (gathered) and 128 (whole
// tiles: TMA boxes on sm_90) past 4 GiB of their pools, and contiguous K/V whose last quarter of
// rows lies past 4 GiB (DeviceSpreadRows); hd64's wide MQA items. Causal and not, both layouts.
TEST(GpuLargePools, PrefillPastFourGiB) {
  GQ_REQUIRE_GPU();
  const BuildInfo info = build_info();
  uint64_t seed = 7200;
  for (int head_dim : info.head_dims) {
    int turn = 0;
    for (int page_size : {16, 128, 0}) {
      const bool causal = turn % 2 == 0;
      const KVLayout layout = turn == 1 ? KVLayout::kHND : KVLayout::kNHD;
      check_prefill(info.dtypes[seed % info.dtypes.size()], page_size == 128 ? Heads{8, 1} : Heads{8, 2}, head_dim,
                    page_size, causal, layout, {300, 0, 129, 40}, {1000, 7, 129, 40}, seed, false, nullptr, false,
                    /*far=*/true);
      ++seed;
      ++turn;
    }
  }
  if (head_dim_built(info, 64)) {
    const std::vector<int32_t> qo = {150, 171, 133, 1, 190, 147, 160, 129};
    std::vector<int32_t> kv;
    for (size_t b = 0; b < qo.size(); ++b) kv.push_back(qo[b] + static_cast<int32_t>((b * 97) % 301));
    check_prefill(info.dtypes[0], Heads{32, 1}, 64, 16, true, KVLayout::kNHD, qo, kv, seed, false, nullptr, false,
                  /*far=*/true);
  }
}

// append_kv into pages past 4 GiB of their pools (check_append_kv's far): pages of 1 and 16, both
// layouts.
TEST(GpuLargePools, AppendKVPastFourGiB) {
  GQ_REQUIRE_GPU();
  uint64_t seed = 7300;
  for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND})
    for (int page_size : {1, 16}) check_append_kv(layout, page_size, seed++, /*far=*/true);
}

TEST(GpuMergeStates, MatchesCpuWithEmptyStates) {
  GQ_REQUIRE_GPU();
  const int n = 37, states = 5, heads = 6, head_dim = 128;
  const HostTensor v = random_tensor({n, states, heads, head_dim}, DType::kFP32, 1);
  HostTensor s = random_tensor({n, states, heads}, DType::kFP32, 2);
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < heads; ++h) {
      s.set({i, (i + h) % states, h}, -INFINITY);  // one empty state in every row
      if (i == 3)
        for (int st = 0; st < states; ++st) s.set({i, st, h}, -INFINITY);  // a fully empty row
    }
  HostTensor o_ref({n, heads, head_dim}, DType::kBF16), s_ref({n, heads}, DType::kFP32);
  merge_states(v.view(), s.view(), o_ref.view(), s_ref.view());
  DeviceTensor dv(v), ds(s), d_o(o_ref), d_s(s_ref);
  d_o.poison();
  d_s.poison();
  merge_states(dv.view(), ds.view(), d_o.view(), d_s.view());
  sync_and_check();
  expect_close(d_o.to_host(o_ref), o_ref, DType::kBF16, "merge_states");
  expect_lse_close(d_s.to_host(s_ref), s_ref, "merge_states");
}

}  // namespace
}  // namespace gqattn::test
