// gqattn-bench's figures (bench/bench_case.cc): the bytes a decode case moves and the FLOPs of a
// prefill case, counted as bench/peers.py counts them, so that ours / peer compares times.
// Layer: tests/cpu (label cpu).
#include <gtest/gtest.h>

#include <algorithm>

#include "bench_case.h"

namespace gqattn::bench {
namespace {

// Visible (query, key) pairs of one request, one by one: causal aligned to the end of the KV,
// query i of qo_len sees keys [0, kv_len - qo_len + i].
double visible_pairs(int qo_len, int kv_len, bool causal) {
  double pairs = 0;
  for (int i = 0; i < qo_len; ++i) pairs += causal ? std::min(kv_len, kv_len - qo_len + i + 1) : kv_len;
  return pairs;
}

BenchCase make_case(const char* family, int num_qo_heads, int num_kv_heads, int head_dim, int batch, int qo_len,
                    int kv_len) {
  BenchCase c;
  c.family = family;
  c.num_qo_heads = num_qo_heads;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.batch = batch;
  c.qo_len = qo_len;
  c.kv_len = kv_len;
  return c;
}

TEST(BenchCase, PrefillFlopsCountTheVisiblePairs) {
  struct Shape { int qo_len, kv_len; bool causal; };
  for (const Shape s : {Shape{4, 4, true}, Shape{4, 4, false}, Shape{1024, 1024, true}, Shape{2, 5, true},
                        Shape{512, 8704, true}, Shape{3, 7, false}}) {
    BenchCase c = make_case("prefill", 4, 2, 64, 3, s.qo_len, s.kv_len);
    c.causal = s.causal;
    EXPECT_DOUBLE_EQ(prefill_flops(c), 4.0 * visible_pairs(s.qo_len, s.kv_len, s.causal) * 4 * 64 * 3)
        << s.qo_len << " x " << s.kv_len << " causal " << s.causal;
  }
}

// K and V once per KV head (not per query head) for the request's kv_len (not padded to whole
// pages), Q and O for every new token, at qo_len > 1 too.
TEST(BenchCase, DecodeBytesCountKvOncePerKvHead) {
  BenchCase c = make_case("decode", 32, 8, 128, 2, 4, 1000);
  c.page_size = 16;
  EXPECT_DOUBLE_EQ(decode_bytes(c), 2.0 * (2 * 1000 * 8 * 128) * 2 + 2.0 * (2 * 4 * 32 * 128) * 2);
}

// The middle value, or the mean of the two middle ones (Python's statistics.median, as peers.py).
TEST(BenchCase, MedianOfEvenCountsAveragesTheMiddlePair) {
  EXPECT_DOUBLE_EQ(median_of({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median_of({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(median_of({7}), 7);
}

}  // namespace
}  // namespace gqattn::bench
