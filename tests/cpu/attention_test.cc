// The CPU backend (the test oracle) against an independent naive formula, and the equivalences
// every backend must satisfy: GQA/MQA == MHA on expanded K/V, paged == ragged, HND == NHD,
// split + merge_states == unsplit, empty KV, causal alignment, speculative decode, strides.
// Layer: tests/cpu (label cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/attention_problem.h"

namespace gqattn::test {
namespace {

constexpr double kLseTol = 1e-5;  // lse is fp32 of values of order 1..10

// The library stores the exactly-rounded double result, so against the naive formula (rounded
// the same way) it is off by at most one rounding of the output dtype (|o| <= 1).
double output_tol(DType dtype) { return 2.0 * dtype_eps(dtype); }

void expect_matches_naive(const Problem& p, const Inputs& in, const Output& out, bool causal) {
  const NaiveOutput ref = naive_attention(p, in, causal);
  const Diff od = compare(out.o, round_to(ref.o, p.dtype));
  const Diff ld = compare(out.lse, ref.lse);
  EXPECT_EQ(od.nan_count, 0);
  EXPECT_EQ(ld.nan_count, 0);
  EXPECT_LE(od.max_abs, output_tol(p.dtype)) << "rel_l2 " << od.rel_l2;
  EXPECT_LE(ld.max_abs, kLseTol);
}

// ---- the reference over heads, dtypes, head dims, page sizes, layouts -------------------------

struct RefCase {
  int num_qo_heads, num_kv_heads, head_dim;
  DType dtype;
  int page_size;  // 0: ragged
  KVLayout layout;
  bool causal;
};

std::string case_name(const testing::TestParamInfo<RefCase>& info) {
  const RefCase& c = info.param;
  std::ostringstream os;
  os << "h" << c.num_qo_heads << "kv" << c.num_kv_heads << "_d" << c.head_dim << "_"
     << dtype_name(c.dtype) << "_p" << c.page_size << "_" << layout_name(c.layout)
     << (c.causal ? "_causal" : "_full");
  return os.str();
}

// Group sizes 1, 2, 4, 7, 8 and H (MQA); head dims 64, 128, 80; pages 1, 3, 16 and ragged;
// each dtype meets every head configuration.
std::vector<RefCase> ref_cases() {
  const int heads[][2] = {{4, 4}, {4, 2}, {8, 2}, {14, 2}, {16, 2}, {6, 1}};
  const DType dtypes[] = {DType::kFP32, DType::kBF16, DType::kFP16};
  const int head_dims[] = {64, 128, 80};
  const int pages[] = {1, 3, 16, 0};
  std::vector<RefCase> cases;
  int i = 0;
  for (const auto& h : heads) {
    for (DType dtype : dtypes) {
      cases.push_back({h[0], h[1], head_dims[i % 3], dtype, pages[i % 4],
                       (i % 2) ? KVLayout::kHND : KVLayout::kNHD, (i % 3) != 1});
      ++i;
    }
  }
  return cases;
}

void PrintTo(const RefCase& c, std::ostream* os) {
  *os << case_name(testing::TestParamInfo<RefCase>(c, 0));
}

class ReferenceTest : public testing::TestWithParam<RefCase> {};

TEST_P(ReferenceTest, PrefillMatchesNaiveFormula) {
  const RefCase& c = GetParam();
  Problem p;
  p.num_qo_heads = c.num_qo_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.dtype = c.dtype;
  p.causal = c.causal;
  p.qo_len = {5, 1, 7, 0};
  p.kv_len = {17, 33, 7, 4};
  p.seed = 11;
  const Inputs in = make_inputs(p);
  expect_matches_naive(p, in, run_prefill(p, in, c.page_size, c.layout), c.causal);
}

TEST_P(ReferenceTest, DecodeMatchesNaiveFormula) {
  const RefCase& c = GetParam();
  Problem p;
  p.num_qo_heads = c.num_qo_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.dtype = c.dtype;
  p.qo_len = {1, 1, 1};
  p.kv_len = {19, 1, 48};
  p.seed = 12;
  const Inputs in = make_inputs(p);
  const int page_size = c.page_size == 0 ? 5 : c.page_size;  // decode reads paged K/V only
  expect_matches_naive(p, in, run_decode(p, in, page_size, c.layout), true);
}

INSTANTIATE_TEST_SUITE_P(Cpu, ReferenceTest, testing::ValuesIn(ref_cases()), case_name);

// ---- GQA / MQA == MHA on K/V expanded per query head -------------------------------------------

TEST(Equivalence, GroupedEqualsMhaOnExpandedKv) {
  for (const int kv_heads : {1, 2, 4, 8}) {  // group sizes 8 (MQA-like H), 4, 2, 1
    for (const bool decode : {false, true}) {
      Problem p;
      p.num_qo_heads = 8;
      p.num_kv_heads = kv_heads;
      p.head_dim = 64;
      p.dtype = DType::kBF16;
      p.causal = true;
      p.qo_len = decode ? std::vector<int32_t>{2, 2} : std::vector<int32_t>{6, 3};
      p.kv_len = {21, 9};
      const Inputs in = make_inputs(p);
      Problem mha = p;
      mha.num_kv_heads = p.num_qo_heads;
      Inputs in_mha = in;
      in_mha.k = expand_kv_per_query_head(in.k, p.num_qo_heads);
      in_mha.v = expand_kv_per_query_head(in.v, p.num_qo_heads);
      const Output gqa = decode ? run_decode(p, in, 3) : run_prefill(p, in, 3);
      const Output ref = decode ? run_decode(mha, in_mha, 3) : run_prefill(mha, in_mha, 3);
      EXPECT_EQ(compare(gqa.o, ref.o).max_abs, 0.0) << "kv_heads " << kv_heads << " decode " << decode;
      EXPECT_EQ(compare(gqa.lse, ref.lse).max_abs, 0.0) << "kv_heads " << kv_heads;
    }
  }
}

// ---- paged == ragged, HND == NHD, page size does not matter -------------------------------------

TEST(Equivalence, PagedEqualsRaggedInEveryLayoutAndPageSize) {
  Problem p;
  p.num_qo_heads = 14;
  p.num_kv_heads = 2;
  p.head_dim = 80;
  p.dtype = DType::kFP16;
  p.causal = true;
  p.qo_len = {4, 9, 1};
  p.kv_len = {30, 9, 65};
  const Inputs in = make_inputs(p);
  const Output ragged = run_prefill(p, in, 0);
  for (const int page_size : {1, 3, 16}) {
    for (const KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      const Output paged = run_prefill(p, in, page_size, layout);
      EXPECT_EQ(compare(paged.o, ragged.o).max_abs, 0.0) << page_size << layout_name(layout);
      EXPECT_EQ(compare(paged.lse, ragged.lse).max_abs, 0.0) << page_size << layout_name(layout);
    }
  }
}

TEST(Equivalence, RandomPageTablesDoNotChangeDecode) {
  Problem p;
  p.num_qo_heads = 8;
  p.num_kv_heads = 1;
  p.head_dim = 64;
  p.dtype = DType::kBF16;
  p.qo_len = {1, 1, 1, 1};
  p.kv_len = {1, 16, 17, 50};
  const Inputs in = make_inputs(p);
  const Output ragged = run_prefill(p, in, 0);
  for (uint64_t seed : {1, 2, 3}) {
    p.seed = seed;  // only the page table (and the pool's garbage) changes: inputs stay
    const Output paged = run_decode(p, in, 16, seed % 2 ? KVLayout::kHND : KVLayout::kNHD);
    EXPECT_EQ(compare(paged.o, ragged.o).max_abs, 0.0);
  }
}

// A K/V pair stored as one [num_pages, 2, page_size, heads, dim] tensor: k and v are strided
// views into it, and the result equals the separately stored pools.
TEST(Equivalence, InterleavedKvPoolThroughStrides) {
  Problem p;
  p.num_qo_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 64;
  p.dtype = DType::kBF16;
  p.qo_len = {1, 1};
  p.kv_len = {20, 7};
  const Inputs in = make_inputs(p);
  const int page_size = 8;
  PagedKVHost sep = make_paged_kv(in.k, in.v, p.kv_len, page_size, KVLayout::kNHD, 5);
  const int64_t pages = sep.table.num_pages, h = p.num_kv_heads, d = p.head_dim;
  const int64_t page_elems = page_size * h * d;
  HostTensor both({pages, 2 * page_elems}, p.dtype);
  for (int64_t pg = 0; pg < pages; ++pg)
    for (int64_t e = 0; e < page_elems; ++e) {
      both.set({pg, e}, load_as_double(sep.k_pages.data(), p.dtype, pg * page_elems + e));
      both.set({pg, page_elems + e}, load_as_double(sep.v_pages.data(), p.dtype, pg * page_elems + e));
    }
  PagedKV kv = sep.view();
  const int64_t strides[4] = {2 * page_elems, h * d, d, 1};
  for (TensorView* t : {&kv.k_pages, &kv.v_pages}) {
    for (int i = 0; i < 4; ++i) t->strides[i] = strides[i];
  }
  kv.k_pages.data = both.data();
  kv.v_pages.data = static_cast<char*>(both.data()) + page_elems * dtype_size(p.dtype);

  PlanInputs pi = plan_inputs(p, page_size, sep.table.kv_page_indptr, sep.table.kv_last_page_len);
  const Plan plan = decode_plan(pi, Workspace{});
  Output got = make_output(p, 2), ref = make_output(p, 2);
  DecodeArgs args;
  args.q = in.q.view();
  args.kv = kv;
  args.o = got.o.view();
  decode_run(plan, args);
  args.kv = sep.view();
  args.o = ref.o.view();
  decode_run(plan, args);
  EXPECT_EQ(compare(got.o, ref.o).max_abs, 0.0);
}

// One K/V head: the heads dim has size 1 and is only ever indexed at 0, so V's stride there may
// differ from K's (a one-head pool viewed from HND as NHD): accepted, the same results.
TEST(Equivalence, SizeOneDimStridesMayDifferBetweenKAndV) {
  Problem p;
  p.num_qo_heads = 4;
  p.num_kv_heads = 1;
  p.head_dim = 32;
  p.dtype = DType::kBF16;
  p.qo_len = {3, 2};
  p.kv_len = {19, 6};
  p.causal = true;
  const Inputs in = make_inputs(p);
  const int page_size = 4;
  PagedKVHost paged = make_paged_kv(in.k, in.v, p.kv_len, page_size, KVLayout::kNHD, 3);
  PlanInputs pi = plan_inputs(p, page_size, paged.table.kv_page_indptr, paged.table.kv_last_page_len);
  pi.qo_indptr = in.qo_indptr;
  const Plan plan = prefill_plan(pi, Workspace{});
  HostTensor qo_indptr = HostTensor::from_int32(in.qo_indptr);
  Output got = make_output(p, in.qo_indptr.back()), ref = make_output(p, in.qo_indptr.back());
  PrefillArgs args;
  args.q = in.q.view();
  args.qo_indptr = qo_indptr.view();
  args.causal = true;
  args.paged = paged.view();
  args.o = ref.o.view();
  prefill_run(plan, args);
  args.paged.v_pages.strides[2] = 12345;  // NHD [pages, page_size, 1, head_dim]
  args.o = got.o.view();
  prefill_run(plan, args);
  EXPECT_EQ(compare(got.o, ref.o).max_abs, 0.0);

  RaggedKVHost ragged = make_ragged_kv(in.k, in.v, p.kv_len);
  PlanInputs ri = plan_inputs(p, 0, in.kv_indptr, {});
  ri.qo_indptr = in.qo_indptr;
  const Plan rplan = prefill_plan(ri, Workspace{});
  PrefillArgs rargs = args;
  rargs.paged = PagedKV{};
  rargs.ragged = ragged.view();
  rargs.ragged.v.strides[1] = 7;  // [kv_tokens, 1, head_dim]
  Output rgot = make_output(p, in.qo_indptr.back());
  rargs.o = rgot.o.view();
  prefill_run(rplan, rargs);
  EXPECT_EQ(compare(rgot.o, ref.o).max_abs, 0.0);
}

// ---- strided q / o / lse -----------------------------------------------------------------------

TEST(Strides, PaddedRowsOfQOAndLse) {
  Problem p;
  p.num_qo_heads = 6;
  p.num_kv_heads = 3;
  p.head_dim = 64;
  p.dtype = DType::kFP16;
  p.causal = true;
  p.qo_len = {3, 5};
  p.kv_len = {10, 5};
  const Inputs in = make_inputs(p);
  const Output ref = run_prefill(p, in, 0);

  const int64_t tokens = 8, hq = 6, d = 64;
  // q, o and lse with padded token and head strides.
  HostTensor q({tokens, hq, d}, {hq * 80 + 16, 80, 1}, p.dtype);
  HostTensor o({tokens, hq, d}, {hq * 72, 72, 1}, p.dtype);
  HostTensor lse({tokens, hq}, {hq + 3, 1}, DType::kFP32);
  fill_random(q, 99);
  fill_random(o, 98);
  q.from_doubles(in.q.to_doubles());
  RaggedKVHost ragged = make_ragged_kv(in.k, in.v, p.kv_len);
  HostTensor qo_indptr = HostTensor::from_int32(in.qo_indptr);
  PlanInputs pi = plan_inputs(p, 0, in.kv_indptr, {});
  pi.qo_indptr = in.qo_indptr;
  const Plan plan = prefill_plan(pi, Workspace{});
  PrefillArgs args;
  args.q = q.view();
  args.qo_indptr = qo_indptr.view();
  args.ragged = ragged.view();
  args.causal = true;
  args.o = o.view();
  args.lse = lse.view();
  prefill_run(plan, args);
  EXPECT_EQ(compare(o, ref.o).max_abs, 0.0);
  EXPECT_EQ(compare(lse, ref.lse).max_abs, 0.0);
}

// ---- sm_scale ----------------------------------------------------------------------------------

TEST(Scale, ExplicitScaleMatchesNaive) {
  Problem p;
  p.num_qo_heads = 4;
  p.num_kv_heads = 4;
  p.head_dim = 128;
  p.sm_scale = 0.37f;
  p.qo_len = {4};
  p.kv_len = {12};
  const Inputs in = make_inputs(p);
  expect_matches_naive(p, in, run_prefill(p, in, 16), false);
}

// ---- empty KV ----------------------------------------------------------------------------------

TEST(EmptyKv, ZeroOutputAndMinusInfLseNeverNan) {
  for (const DType dtype : {DType::kFP32, DType::kBF16, DType::kFP16}) {
    Problem p;
    p.num_qo_heads = 8;
    p.num_kv_heads = 2;
    p.head_dim = 64;
    p.dtype = dtype;
    p.causal = true;
    p.qo_len = {1, 1, 1};
    p.kv_len = {0, 5, 0};
    const Inputs in = make_inputs(p);
    const Output dec = run_decode(p, in, 16);
    Problem pre = p;
    pre.qo_len = {3, 2, 0};
    const Inputs in_pre = make_inputs(pre);
    const Output pf = run_prefill(pre, in_pre, 0);
    for (const Output* out : {&dec, &pf}) {
      const std::vector<double> o = out->o.to_doubles(), lse = out->lse.to_doubles();
      for (double x : o) ASSERT_FALSE(std::isnan(x));
      for (double x : lse) ASSERT_FALSE(std::isnan(x));
    }
    // Decode request 0 and 2, prefill request 0 (rows 0..2): all zero and -inf.
    for (const int64_t row : {int64_t(0), int64_t(2)}) {
      for (int64_t h = 0; h < 8; ++h) {
        EXPECT_EQ(dec.lse.at({row, h}), -INFINITY);
        for (int64_t d = 0; d < 64; ++d) EXPECT_EQ(dec.o.at({row, h, d}), 0.0);
      }
    }
    for (int64_t row = 0; row < 3; ++row) {
      for (int64_t h = 0; h < 8; ++h) {
        EXPECT_EQ(pf.lse.at({row, h}), -INFINITY);
        for (int64_t d = 0; d < 64; ++d) EXPECT_EQ(pf.o.at({row, h, d}), 0.0);
      }
    }
    expect_matches_naive(p, in, dec, true);
    expect_matches_naive(pre, in_pre, pf, true);
  }
}

// ---- causal alignment --------------------------------------------------------------------------

// Chunked prefill (qo_len < kv_len): query token i sees keys 0 .. kv_len - qo_len + i. Changing
// the first key it must not see leaves its row alone and changes the next row.
TEST(Causal, AlignedToTheEndOfTheKv) {
  Problem p;
  p.num_qo_heads = 2;
  p.num_kv_heads = 1;
  p.head_dim = 64;
  p.causal = true;
  p.qo_len = {4};
  p.kv_len = {11};
  const Inputs in = make_inputs(p);
  const Output base = run_prefill(p, in, 3);
  expect_matches_naive(p, in, base, true);
  for (int64_t i = 0; i + 1 < 4; ++i) {
    const int64_t hidden_key = 11 - 4 + i + 1;  // the first key token i must not see
    Inputs changed = in;
    for (int64_t d = 0; d < 64; ++d) {
      changed.k.set({hidden_key, 0, d}, 0.5);
      changed.v.set({hidden_key, 0, d}, -0.75);
    }
    const Output out = run_prefill(p, changed, 3);
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t r = 0; r < 4; ++r) {
        double diff = 0;
        for (int64_t d = 0; d < 64; ++d) diff = std::max(diff, std::abs(out.o.at({r, h, d}) - base.o.at({r, h, d})));
        if (r <= i) {
          EXPECT_EQ(diff, 0.0) << "token " << r << " saw key " << hidden_key;
        } else {
          EXPECT_GT(diff, 0.0) << "token " << r << " missed key " << hidden_key;
        }
      }
    }
  }
}

// The last token of a causal chunk sees every key: it equals a plain decode of that token, and
// a non-causal prefill of one token.
TEST(Causal, LastChunkTokenEqualsDecode) {
  Problem p;
  p.num_qo_heads = 16;
  p.num_kv_heads = 2;
  p.head_dim = 128;
  p.dtype = DType::kBF16;
  p.causal = true;
  p.qo_len = {6};
  p.kv_len = {40};
  const Inputs in = make_inputs(p);
  const Output chunk = run_prefill(p, in, 16);
  Problem dec = p;
  dec.qo_len = {1};
  Inputs in_dec = in;
  in_dec.qo_indptr = {0, 1};
  in_dec.q = HostTensor({1, 16, 128}, p.dtype);
  for (int64_t h = 0; h < 16; ++h)
    for (int64_t d = 0; d < 128; ++d) in_dec.q.set({0, h, d}, in.q.at({5, h, d}));
  const Output single = run_decode(dec, in_dec, 16);
  for (int64_t h = 0; h < 16; ++h) {
    EXPECT_EQ(single.lse.at({0, h}), chunk.lse.at({5, h}));
    for (int64_t d = 0; d < 128; ++d) EXPECT_EQ(single.o.at({0, h, d}), chunk.o.at({5, h, d}));
  }
}

// Speculative decode: qo_len 2 and 4 new tokens per request, causal among themselves; equals
// the naive formula and a causal prefill of the same tokens.
TEST(Causal, SpeculativeDecodeQoLen2And4) {
  for (const int qo_len : {2, 4}) {
    Problem p;
    p.num_qo_heads = 32;
    p.num_kv_heads = 8;
    p.head_dim = 64;
    p.dtype = DType::kFP16;
    p.causal = true;
    p.qo_len = {qo_len, qo_len, qo_len};
    p.kv_len = {qo_len, 20, 37};
    const Inputs in = make_inputs(p);
    const Output dec = run_decode(p, in, 16, KVLayout::kHND);
    expect_matches_naive(p, in, dec, true);
    const Output pf = run_prefill(p, in, 0);
    EXPECT_EQ(compare(dec.o, pf.o).max_abs, 0.0);
    EXPECT_EQ(compare(dec.lse, pf.lse).max_abs, 0.0);
  }
}

// ---- split + merge_states == unsplit -------------------------------------------------------------

// Attention over keys [0, s) and [s, kv_len) separately (non-causal, fp32 partials with LSE),
// merged, equals attention over all keys. Includes an empty part (-inf LSE) and a row whose
// parts are all empty.
TEST(MergeStates, MergingSplitsEqualsUnsplit) {
  Problem p;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 64;
  p.qo_len = {3, 2, 2};
  p.kv_len = {30, 9, 0};
  const Inputs in = make_inputs(p);
  const Output full = run_prefill(p, in, 0);

  const std::vector<int32_t> split = {11, 0, 0};  // request 1's first part is empty
  const int64_t n = 7, hq = 8, d = 64;
  HostTensor v({n, 2, hq, d}, DType::kFP32), s({n, 2, hq}, DType::kFP32);
  for (int part = 0; part < 2; ++part) {
    Problem pp = p;
    Inputs ip = in;
    std::vector<int32_t> first(3);
    for (int b = 0; b < 3; ++b) {
      first[b] = part == 0 ? 0 : split[b];
      pp.kv_len[b] = part == 0 ? split[b] : p.kv_len[b] - split[b];
    }
    ip.kv_indptr = token_indptr(pp.kv_len);
    ip.k = HostTensor({ip.kv_indptr.back(), 2, d}, p.dtype);
    ip.v = HostTensor({ip.kv_indptr.back(), 2, d}, p.dtype);
    for (int b = 0; b < 3; ++b)
      for (int64_t j = 0; j < pp.kv_len[b]; ++j)
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t e = 0; e < d; ++e) {
            ip.k.set({ip.kv_indptr[b] + j, h, e}, in.k.at({in.kv_indptr[b] + first[b] + j, h, e}));
            ip.v.set({ip.kv_indptr[b] + j, h, e}, in.v.at({in.kv_indptr[b] + first[b] + j, h, e}));
          }
    const Output out = run_prefill(pp, ip, part == 0 ? 0 : 3);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t h = 0; h < hq; ++h) {
        s.set({r, part, h}, out.lse.at({r, h}));
        for (int64_t e = 0; e < d; ++e) v.set({r, part, h, e}, out.o.at({r, h, e}));
      }
  }
  for (const DType out_dtype : {DType::kFP32, DType::kBF16}) {
    HostTensor v_merged({n, hq, d}, out_dtype), s_merged({n, hq}, DType::kFP32);
    merge_states(v.view(), s.view(), v_merged.view(), s_merged.view());
    const Diff od = compare(v_merged, round_to(full.o.to_doubles(), out_dtype));
    EXPECT_EQ(od.nan_count, 0);
    EXPECT_LE(od.max_abs, out_dtype == DType::kFP32 ? 1e-6 : output_tol(out_dtype));
    const Diff ld = compare(s_merged, full.lse);
    EXPECT_EQ(ld.nan_count, 0);
    EXPECT_LE(ld.max_abs, 1e-5);
    for (int64_t r = 5; r < 7; ++r)  // request 2: no keys at all
      for (int64_t h = 0; h < hq; ++h) EXPECT_EQ(s_merged.at({r, h}), -INFINITY);
  }
}

TEST(MergeStates, SingleStateIsIdentityAndLseIsOptional) {
  HostTensor v = random_tensor({3, 1, 2, 64}, DType::kFP16, 4);
  HostTensor s = random_tensor({3, 1, 2}, DType::kFP32, 5);
  HostTensor out({3, 2, 64}, DType::kFP16);
  merge_states(v.view(), s.view(), out.view(), TensorView{});
  EXPECT_EQ(compare_values(out.to_doubles(), v.to_doubles()).max_abs, 0.0);
}

// ---- append_kv ---------------------------------------------------------------------------------

// Tokens appended (in shuffled order) into the pages of a table give the same decode as pools
// filled directly; pool slots not written keep their bytes.
TEST(AppendKv, WritesEveryTokenIntoItsSlot) {
  for (const KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
    Problem p;
    p.num_qo_heads = 4;
    p.num_kv_heads = 2;
    p.head_dim = 64;
    p.dtype = DType::kBF16;
    p.qo_len = {1, 1};
    p.kv_len = {10, 21};
    const Inputs in = make_inputs(p);
    PagedKVHost direct = make_paged_kv(in.k, in.v, p.kv_len, 4, layout, 8);
    PagedKVHost appended = direct;
    fill_random(appended.k_pages, 1234);
    fill_random(appended.v_pages, 1235);
    const HostTensor untouched = appended.k_pages;

    std::vector<int32_t> order(31), batch(31), pos(31);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(3));
    HostTensor k_new({31, 2, 64}, p.dtype), v_new({31, 2, 64}, p.dtype);
    for (int t = 0; t < 31; ++t) {
      const int row = order[t];
      batch[t] = row < 10 ? 0 : 1;
      pos[t] = row < 10 ? row : row - 10;
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < 64; ++d) {
          k_new.set({t, h, d}, in.k.at({row, h, d}));
          v_new.set({t, h, d}, in.v.at({row, h, d}));
        }
    }
    HostTensor bt = HostTensor::from_int32(batch), ps = HostTensor::from_int32(pos);
    append_kv(appended.view(), k_new.view(), v_new.view(), bt.view(), ps.view());

    // Every slot of a used page row < kv_len equals the direct pools; the rest is unchanged.
    const TensorView& pool = direct.k_pages.view();
    for (int b = 0; b < 2; ++b)
      for (int64_t j = 0; j < p.kv_len[b]; ++j)
        for (int64_t h = 0; h < 2; ++h) {
          const int64_t page = direct.table.kv_page_indices[direct.table.kv_page_indptr[b] + j / 4];
          const int64_t off = pool_offset(pool, layout, page, h, j % 4);
          for (int64_t d = 0; d < 64; ++d) {
            ASSERT_EQ(load_as_double(appended.k_pages.data(), p.dtype, off + d),
                      load_as_double(direct.k_pages.data(), p.dtype, off + d));
            ASSERT_EQ(load_as_double(appended.v_pages.data(), p.dtype, off + d),
                      load_as_double(direct.v_pages.data(), p.dtype, off + d));
          }
        }
    const int64_t unused_page = [&] {
      std::vector<bool> used(size_t(direct.table.num_pages), false);
      for (int32_t pg : direct.table.kv_page_indices) used[size_t(pg)] = true;
      for (size_t pg = 0; pg < used.size(); ++pg)
        if (!used[pg]) return int64_t(pg);
      return int64_t(-1);
    }();
    ASSERT_GE(unused_page, 0);
    const int64_t page_bytes = 4 * 2 * 64 * 2;
    EXPECT_EQ(0, std::memcmp(static_cast<const char*>(appended.k_pages.data()) + unused_page * page_bytes,
                             static_cast<const char*>(untouched.data()) + unused_page * page_bytes,
                             size_t(page_bytes)));

    PlanInputs pi = plan_inputs(p, 4, direct.table.kv_page_indptr, direct.table.kv_last_page_len);
    const Plan plan = decode_plan(pi, Workspace{});
    Output a = make_output(p, 2), b = make_output(p, 2);
    DecodeArgs args;
    args.q = in.q.view();
    args.kv = appended.view();
    args.o = a.o.view();
    decode_run(plan, args);
    args.kv = direct.view();
    args.o = b.o.view();
    decode_run(plan, args);
    EXPECT_EQ(compare(a.o, b.o).max_abs, 0.0);
  }
}

// ---- threads ---------------------------------------------------------------------------------

// Rows [begin, end) of a [rows, ...] tensor as a tensor of their own.
HostTensor slice_rows(const HostTensor& t, int64_t begin, int64_t end) {
  std::vector<int64_t> shape(t.view().shape, t.view().shape + t.view().ndim);
  shape[0] = end - begin;
  HostTensor out(shape, t.dtype());
  const size_t row_bytes = t.bytes() / size_t(std::max<int64_t>(t.view().shape[0], 1));
  if (end > begin) std::memcpy(out.data(), static_cast<const uint8_t*>(t.data()) + size_t(begin) * row_bytes, out.bytes());
  return out;
}

// The CPU backend spreads a large call's rows over threads (GQATTN_CPU_THREADS, else every core)
// and runs small ones on the caller's: a batch large enough to be spread gives the same bits as
// each of its requests alone, each small enough to run on one thread. Causal prefill with a
// cached prefix, G = 4, fp32 output (every bit of the sum shows) and bf16.
TEST(Threads, LargeCallEqualsEachRequestAlone) {
  for (DType dtype : {DType::kFP32, DType::kBF16}) {
    Problem p{/*num_qo_heads=*/8, /*num_kv_heads=*/2, /*head_dim=*/64, dtype, {}, {}, /*causal=*/true};
    for (int b = 0; b < 16; ++b) {  // 16 x ~2.5M multiply-adds: each alone under the threads' bar, together over it
      p.qo_len.push_back(b == 5 ? 0 : 30 + (b * 13) % 41);
      p.kv_len.push_back(p.qo_len.back() + (b * 7) % 29);
    }
    p.seed = 31;
    const Inputs in = make_inputs(p);
    const Output all = run_prefill(p, in, 0);
    for (size_t b = 0; b < p.qo_len.size(); ++b) {
      SCOPED_TRACE("request " + std::to_string(b));
      Problem one = p;
      one.qo_len = {p.qo_len[b]};
      one.kv_len = {p.kv_len[b]};
      Inputs sub;
      sub.qo_indptr = token_indptr(one.qo_len);
      sub.kv_indptr = token_indptr(one.kv_len);
      sub.q = slice_rows(in.q, in.qo_indptr[b], in.qo_indptr[b + 1]);
      sub.k = slice_rows(in.k, in.kv_indptr[b], in.kv_indptr[b + 1]);
      sub.v = slice_rows(in.v, in.kv_indptr[b], in.kv_indptr[b + 1]);
      const Output alone = run_prefill(one, sub, 0);
      const HostTensor o = slice_rows(all.o, in.qo_indptr[b], in.qo_indptr[b + 1]);
      const HostTensor lse = slice_rows(all.lse, in.qo_indptr[b], in.qo_indptr[b + 1]);
      EXPECT_EQ(o.storage(), alone.o.storage());
      EXPECT_EQ(lse.storage(), alone.lse.storage());
    }
  }
}

// ---- batch 0 -----------------------------------------------------------------------------------

TEST(EdgeCases, EmptyBatchIsANoOp) {
  Problem p;
  p.qo_len = {};
  p.kv_len = {};
  const Inputs in = make_inputs(p);
  const Output pf = run_prefill(p, in, 16);
  const Output dec = run_decode(p, in, 16);
  EXPECT_EQ(pf.o.view().numel(), 0);
  EXPECT_EQ(dec.o.view().numel(), 0);
}

}  // namespace
}  // namespace gqattn::test
